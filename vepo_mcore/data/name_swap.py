"""Name-swapped SFT pairs: the same translation with its names replaced by made-up ones.

    swap_names("Ring's CEO, Jamie Siminoff, said", "Giám đốc Jamie Siminoff nói", random.Random(0))
    # ("Ring's CEO, Brainchir Varchoul, said", "Giám đốc Brainchir Varchoul nói")
    chats = name_swapped_chats(conversations, seed=0)   # ChatML conversations, one per pair with names

A small model learns the names its data repeats (product names of UI text) but does not copy a new
one from its source. Every Latin-script name (translation/carried.py) that a pair keeps verbatim on
both sides becomes the same synthetic name on both sides, so the only way to get it right is to
copy it. Capitalised names become pronounceable made-up words of one to three syllables; all-capital
names (acronyms) stay all-capital of the same length. A pair where a name is not bounded by non-Latin
characters on both sides the same number of times is left out: a swap must never make the two sides
disagree. Numbers are kept (the toy already copies them).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from vepo_mcore.translation.carried import carried_items, is_number

_ONSETS = ("b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "ch", "dr",
           "gr", "kl", "sh", "st", "tr")  # fmt: skip
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ei", "ou")
_CODAS = ("", "", "", "n", "r", "s", "l", "k", "m")
_LETTERS = "ABCDEFGHIJKLMNOPRSTVWZ"


def synthetic_name(like: str, rng: random.Random) -> str:
    """A made-up name shaped like `like`: an acronym of as many capitals, or a capitalised word."""
    if like.isupper() and len(like) > 1:
        return "".join(rng.choice(_LETTERS) for _ in like)
    syllables = rng.randint(1, 3) if len(like) > 3 else 1
    word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables))
    return word[0].upper() + word[1:]


def _bounded(name: str) -> re.Pattern:
    return re.compile(rf"(?<![A-Za-z0-9]){re.escape(name)}(?![A-Za-z0-9])")


def swap_names(source: str, target: str, rng: random.Random) -> tuple[str, str] | None:
    """(source, target) with every name both keep verbatim replaced by one synthetic name on both
    sides; None when the pair keeps no name or a name is not bounded the same number of times on
    both sides."""
    names = {i for i in carried_items(source) if not is_number(i) and len(i) > 1 and i in target}
    if not names:
        return None
    for name in sorted(names, key=lambda n: (-len(n), n)):  # a longer name before its parts
        pattern = _bounded(name)
        found = len(pattern.findall(source))
        if found == 0 or found != len(pattern.findall(target)):
            return None
        new = synthetic_name(name, rng)
        source, target = pattern.sub(new, source), pattern.sub(new, target)
    return source, target


def name_swapped_chats(conversations: Sequence[dict], seed: int) -> list[dict]:
    """For each ChatML translation conversation (user: instruction, a blank line, the source;
    assistant: the translation) whose pair keeps a name, the same conversation with its names swapped
    (swap_names); in the input's order, reproducible from `seed`."""
    rng, out = random.Random(seed), []
    for conversation in conversations:
        user, answer = conversation["messages"][0]["content"], conversation["messages"][1]["content"]
        instruction, sep, source = user.rpartition("\n\n")
        if not sep:
            raise ValueError(
                f"translation conversation without a blank line before its source: {user[:80]!r}"
            )
        swapped = swap_names(source, answer, rng)
        if swapped is not None:
            out.append({"messages": [{"role": "user", "content": f"{instruction}\n\n{swapped[0]}"},
                                     {"role": "assistant", "content": swapped[1]}]})  # fmt: skip
    return out
