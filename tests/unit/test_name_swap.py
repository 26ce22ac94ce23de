"""Name-swapped SFT pairs (vepo_mcore/data/name_swap.py) and their share of the toy's SFT phase."""

from __future__ import annotations

import json
import random
import re

import pytest

from vepo_mcore.data.name_swap import name_swapped_chats, swap_names, synthetic_name


def test_a_name_both_sides_keep_becomes_one_made_up_name_on_both():
    source = "Ring's CEO, Jamie Siminoff, said the PBS show earned 2 awards."
    target = "giám đốc Jamie Siminoff của Ring nói chương trình PBS nhận 2 giải."
    new_source, new_target = swap_names(source, target, random.Random(3))
    for old in ("Jamie", "Siminoff", "PBS"):
        assert old not in new_source and old not in new_target
    # what replaced them is the same on both sides; "Ring" opens the source, so it is no name: kept
    words = lambda text: set(re.findall(r"[A-Z][A-Za-z]+", text))  # noqa: E731
    assert words(new_source) - {"CEO"} == words(new_target) and "Ring" in words(new_target)
    assert "2" in new_source and "2" in new_target  # numbers are kept
    acronym = re.search(r"the ([A-Z]+) show", new_source).group(1)
    assert len(acronym) == 3 and acronym != "PBS"  # an acronym stays an acronym of its length


def test_pairs_that_a_swap_could_make_disagree_are_left_out():
    rng = random.Random(0)
    assert swap_names("He met Jamie today.", "Anh ấy gặp hôm nay.", rng) is None  # the target drops it
    assert swap_names("He met Siminoff.", "Anh ấy gặp Siminoffs.", rng) is None  # not bounded in the target
    assert swap_names("He met Jamie and Jamie.", "Anh ấy gặp Jamie.", rng) is None  # counts differ
    assert swap_names("Jamie met them.", "Jamie gặp họ.", rng) is None  # a first word is no name
    assert swap_names("It cost 5 dollars.", "Nó giá 5 đô.", rng) is None  # numbers only


def test_made_up_names_are_capitalised_words_and_differ():
    rng = random.Random(1)
    names = {synthetic_name("Siminoff", rng) for _ in range(50)}
    assert len(names) > 40 and all(n[0].isupper() and n[1:].islower() and n.isalpha() for n in names)


def test_chats_keep_the_instruction_and_are_reproducible():
    rows = [{"messages": [{"role": "user", "content": "Translate into Vietnamese.\n\nHe met Jamie Siminoff."},
                          {"role": "assistant", "content": "Anh ấy gặp Jamie Siminoff."}]},
            {"messages": [{"role": "user", "content": "Translate into Vietnamese.\n\nHe left."},
                          {"role": "assistant", "content": "Anh ấy đi."}]}]  # fmt: skip
    out = name_swapped_chats(rows, seed=7)
    assert (
        len(out) == 1 and out == name_swapped_chats(rows, seed=7) and out != name_swapped_chats(rows, seed=8)
    )
    user = out[0]["messages"][0]["content"]
    assert user.startswith("Translate into Vietnamese.\n\nHe met ") and "Jamie" not in user
    assert user.split("met ")[1].rstrip(".") in out[0]["messages"][1]["content"]
    bad = [{"messages": [{"role": "user", "content": "no source"}, {"role": "assistant", "content": "x"}]}]
    with pytest.raises(ValueError, match="without a blank line before its source"):
        name_swapped_chats(bad, seed=0)


def test_the_toy_sft_phase_gives_the_swapped_pairs_their_share(tmp_path):
    from recipes.toy.recipe import ToyPlan, sft_phase
    from vepo_mcore.eval.heldout import read_records, write_records

    translation, bitext = tmp_path / "translation.jsonl", tmp_path / "bitext.jsonl"
    chat = {"messages": [{"role": "user", "content": "Translate into Thai.\n\nOpen Firefox now."},
                         {"role": "assistant", "content": "เปิด Firefox เลย"}]}  # fmt: skip
    write_records([chat], translation)
    write_records([chat, chat], bitext)
    plain = sft_phase(ToyPlan(out=tmp_path, bitext=True), translation, bitext)
    assert plain["weights"] == {"translation": pytest.approx(0.3), "bitext": 0.7}
    phase = sft_phase(ToyPlan(out=tmp_path, bitext=True, name_swap=0.2), translation, bitext)
    assert phase["weights"] == pytest.approx({"translation": 0.24, "bitext": 0.56, "names": 0.2})
    swapped = read_records(phase["paths"]["names"])
    assert len(swapped) == 3 and all("Firefox" not in json.dumps(r) for r in swapped)
    assert not list(tmp_path.glob("*.partial"))
