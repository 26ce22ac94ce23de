"""What a translation carries over as written: the source's numbers and Latin-script names.

    carried_items("He met Jamie Siminoff in 2013.")   # ['Jamie', 'Siminoff', '2013']

A capitalised word that opens the source is no name (every sentence opens with one). The held-out
evaluation counts how many of these a hypothesis keeps (eval/heldout.py, copy_rate); the SFT data
swaps the names for synthetic ones to teach copying (data/name_swap.py).
"""

from __future__ import annotations

import re

_CARRIED = re.compile(r"\d+(?:[.,:]\d+)*|(?<=\s)[A-Z][\w'’-]*[A-Za-z0-9]|(?<=\s)[A-Z]")


def carried_items(source: str) -> list[str]:
    """Numbers and Latin-script capitalised words inside the source (not its first word): what a
    translation into any of our languages keeps as written."""
    return _CARRIED.findall(" " + source.split(None, 1)[1] if len(source.split(None, 1)) > 1 else "")


def is_number(item: str) -> bool:
    """A carried item that is a number (the others are names)."""
    return item[0].isdigit()
