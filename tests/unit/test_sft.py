"""SFT data: assistant-only loss mask, packing with per-conversation positions/attention, mixing, curriculum resume."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from vepo_mcore.config.data import SFTPhaseConfig
from vepo_mcore.config.job import JobConfig
from vepo_mcore.data.sft import (
    block_causal_mask,
    cu_seqlens,
    mixture_order,
    pack_conversations,
    read_conversations,
    tokenize_conversation,
    tokenize_conversations,
)
from vepo_mcore.data.sft_flores import SOURCES, build_flores_sft_set, default_sft_phases
from vepo_mcore.data.sft_splits import build_sft_datasets
from vepo_mcore.languages import EXPANDED_LANGS, LANGS, language, load_flores
from vepo_mcore.tokenizer import load_tokenizer

CONV = [
    {"role": "system", "content": "You translate."},
    {"role": "user", "content": "Translate into Thai: Good morning."},
    {"role": "assistant", "content": "สวัสดีตอนเช้า"},
    {"role": "user", "content": "And into Khmer?\nPlease."},
    {"role": "assistant", "content": "អរុណសួស្តី\n\n(morning greeting)"},
]


def assistant_text(messages) -> str:
    return "".join(m["content"] + "<|im_end|>" for m in messages if m["role"] == "assistant")


def test_loss_mask_covers_exactly_the_assistant_tokens():
    tok = load_tokenizer()
    ids, mask = tokenize_conversation(tok, CONV)
    assert tok.decode(ids.tolist()) == tok.apply_chat(CONV)
    # Piecewise encoding equals encoding the whole ChatML text at once for ordinary text.
    assert ids.tolist() == tok.encode(tok.apply_chat(CONV))
    assert tok.decode(ids[mask].tolist()) == assistant_text(CONV)
    # The masked tokens are exactly each assistant content, encoded alone, plus its <|im_end|>.
    want = []
    for m in CONV:
        if m["role"] == "assistant":
            want += tok.encode(m["content"]) + [tok.im_end_id]
    assert ids[mask].tolist() == want
    # Nothing of the headers: every <|im_start|> and the token after it are unmasked.
    starts = np.flatnonzero(ids == tok.im_start_id)
    assert not mask[starts].any() and not mask[starts + 1].any()


def test_batched_tokenizing_equals_one_by_one():
    tok = load_tokenizer()
    convs = [CONV, CONV[1:3], [{"role": "user", "content": ""}, {"role": "assistant", "content": "ok"}]]
    batched = tokenize_conversations(tok, convs)
    for conv, (ids, mask) in zip(convs, batched):
        assert tok.decode(ids.tolist()) == tok.apply_chat(conv)
        assert tok.decode(ids[mask].tolist()) == assistant_text(conv)
        assert ids.tolist() == tok.encode(tok.apply_chat(conv))


def test_ids_equal_transformers_chat_template():
    """Reference: Qwen2.5's own chat template through transformers (with a system message it adds
    no default one) gives the same ids."""
    from transformers import AutoTokenizer

    tok = load_tokenizer()
    hf = AutoTokenizer.from_pretrained(str(tok.path))
    ref = hf.apply_chat_template(CONV, tokenize=True)
    ref = ref["input_ids"] if isinstance(ref, dict) or hasattr(ref, "keys") else ref
    assert tokenize_conversation(tok, CONV)[0].tolist() == list(ref)


def test_packed_labels_and_loss_mask_stay_inside_each_conversation():
    tok = load_tokenizer()
    convs = [CONV, CONV[1:3], [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]]
    encoded = [tokenize_conversation(tok, c) for c in convs]
    packed = pack_conversations(encoded, seq_length=128, pad_id=tok.pad_id)
    assert packed.tokens.shape == (1, 128)
    row = 0
    offset = 0
    for segment, (ids, mask) in enumerate(encoded):
        n = len(ids) - 1
        span = slice(offset, offset + n)
        assert packed.tokens[row, span].tolist() == ids[:-1].tolist()
        assert packed.labels[row, span].tolist() == ids[1:].tolist()
        assert packed.loss_mask[row, span].tolist() == mask[1:].astype(float).tolist()
        assert packed.position_ids[row, span].tolist() == list(range(n))
        assert (packed.segment_ids[row, span] == segment).all()
        offset += n
    assert (packed.segment_ids[row, offset:] == -1).all() and packed.loss_mask[row, offset:].sum() == 0
    trained = packed.labels[row][packed.loss_mask[row] > 0]
    assert tok.decode(trained.tolist()) == "".join(assistant_text(c) for c in convs)


def test_block_causal_mask_matches_naive_loop():
    segments = torch.tensor([[0, 0, 0, 1, 1, 2, -1, -1], [0, 0, 0, 0, 0, 0, 0, 0]])
    mask = block_causal_mask(segments)
    assert mask.shape == (2, 1, 8, 8)
    for b in range(2):
        for i in range(8):
            for j in range(8):
                allowed = j <= i and segments[b, i] == segments[b, j]
                assert bool(mask[b, 0, i, j]) == (not allowed)
    assert not mask.all(dim=-1).any()  # no fully masked row (softmax would give NaN)


def test_cu_seqlens_marks_every_conversation_and_row():
    segments = torch.tensor([[0, 0, 0, 1, 1, 2, -1, -1], [0, 0, 0, 0, 0, 0, 0, 0], [0, 1, 1, 1, 1, 1, 1, 1]])
    # Naive: walk the tokens, cut at each row start and segment change.
    cuts, previous = [], None
    for b in range(3):
        for i in range(8):
            if i == 0 or segments[b, i] != previous:
                cuts.append(b * 8 + i)
            previous = segments[b, i]
    assert cu_seqlens(segments).tolist() == cuts + [24]
    assert cu_seqlens(segments).dtype == torch.int32


def test_padding_mode_and_truncation():
    tok = load_tokenizer()
    encoded = [tokenize_conversation(tok, CONV[1:3]), tokenize_conversation(tok, CONV)]
    padded = pack_conversations(encoded, seq_length=40, pad_id=tok.pad_id, packing=False)
    assert padded.tokens.shape == (2, 40)
    assert set(padded.segment_ids[0].tolist()) == {0, -1}
    assert padded.truncated == (len(encoded[1][0]) > 41)


def test_mixture_order_keeps_ratio_in_every_prefix_and_one_pass_covers_all():
    order = mixture_order(
        {"general": 50, "multilingual": 7}, {"general": 5.0, "multilingual": 1.0}, 600, seed=3
    )
    sources = np.array([s == "general" for s, _ in order])
    assert sources.sum() == 500
    for prefix in (6, 60, 61, 300, 600):
        assert abs(sources[:prefix].mean() - 5 / 6) <= 1 / prefix + 1e-9
    # The 7 multilingual conversations are cycled: each used 14 or 15 times.
    counts = np.bincount([i for s, i in order if s == "multilingual"], minlength=7)
    assert counts.min() >= 14 and counts.max() <= 15
    once = mixture_order({"a": 5, "b": 3}, {"a": 9.0}, 0, seed=0)
    assert sorted(once) == [("a", i) for i in range(5)] + [("b", i) for i in range(3)]


@pytest.mark.parametrize(
    "line, reason",
    [
        ('{"messages": [{"role": "user", "content": "hi"}]}', "no assistant message"),
        ('{"messages": [{"role": "bot", "content": "hi"}]}', "messages[0].role is 'bot'"),
        ('{"messages": [{"role": "assistant", "content": 5}]}', "content must be a string"),
        ('{"msgs": []}', '"messages" list'),
        ('{"messages": [', "bad JSON"),
    ],
)
def test_bad_conversation_names_file_and_line(tmp_path, line, reason):
    path = tmp_path / "c.jsonl"
    good = json.dumps({"messages": CONV})
    path.write_text(f"{good}\n{good}\n{line}\n")
    with pytest.raises(ValueError) as err:
        read_conversations(path)
    assert f"{path}:3:" in str(err.value) and reason in str(err.value)


@pytest.fixture(scope="module")
def sft_files(tmp_path_factory) -> dict[str, str]:
    return build_flores_sft_set(tmp_path_factory.mktemp("sft"), per_source=40, seed=1)


def test_flores_sft_set_is_chatml_and_answers_are_right(sft_files):
    assert set(sft_files) == set(SOURCES)
    names = {language(lang).name: lang for lang in LANGS}
    for row in read_conversations(sft_files["translation"]):
        user, answer = row[-2]["content"], row[-1]["content"]
        match = re.fullmatch(r"Translate the following (\w+) text into (\w+)\.\n\n(.*)", user, flags=re.S)
        src, tgt, text = names[match[1]], names[match[2]], match[3]
        assert src in EXPANDED_LANGS or tgt in EXPANDED_LANGS
        i = load_flores(src, "dev").index(text)
        assert answer == load_flores(tgt, "dev")[i]
    general = read_conversations(sft_files["general"])
    assert len(general) == 40 and all("English" in c[-2]["content"] for c in general)


def sft_config(sft_files, num_samples=30, seq_length=256) -> JobConfig:
    cfg = JobConfig()
    cfg.data.mode = "sft"
    cfg.data.sft_phases = default_sft_phases(sft_files, num_samples)
    cfg.training.seq_length = seq_length
    return cfg


def test_curriculum_runs_phases_in_order_with_5_to_1_mixing(sft_files):
    curriculum = build_sft_datasets(sft_config(sft_files, num_samples=60))
    names = [p.name for p in curriculum.phases]
    assert names == ["instruction_following", "asean_translation", "translation_reasoning"]
    assert curriculum.phases[0].source_counts == {"general": 50, "multilingual": 10}
    assert curriculum.phases[2].source_counts == {"general": 50, "translation": 5, "reasoning": 5}
    first, last = curriculum.phase_of(0), curriculum.phase_of(len(curriculum) - 1)
    assert first == (0, names[0]) and last == (2, names[2])
    boundary = len(curriculum.phases[0])
    assert curriculum.phase_of(boundary) == (1, names[1])
    assert torch.equal(curriculum[boundary]["tokens"], curriculum.phases[1][0]["tokens"])
    sample = curriculum[0]
    assert sample["attention_mask"].shape == (1, 256, 256)
    assert torch.equal(sample["attention_mask"], block_causal_mask(sample["segment_ids"]))


def test_same_config_gives_same_samples_and_phases_validate(sft_files):
    cfg = sft_config(sft_files, num_samples=12, seq_length=128)
    a, b = build_sft_datasets(cfg), build_sft_datasets(cfg)
    assert len(a) == len(b) and all(torch.equal(a[i]["tokens"], b[i]["tokens"]) for i in range(len(a)))
    bad = JobConfig()
    bad.data.sft_phases = [SFTPhaseConfig(name="p", paths={"a": "x.jsonl"}, weights={"b": 1.0})]
    with pytest.raises(ValueError, match=r"data.sft_phases\[0\].weights.b: no such source"):
        bad.data.validate()
    missing = JobConfig()
    missing.data.sft_phases = [
        SFTPhaseConfig(name="p", paths={"a": str(Path(sft_files["general"]).parent / "no")})
    ]
    with pytest.raises(FileNotFoundError, match="SFT file .*no does not exist"):
        build_sft_datasets(missing)
