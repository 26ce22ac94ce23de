"""SFT on disk (data/sft_indexed.py, tools/preprocess_sft.py): the same ids, masks, draws and packed
batches as the in-memory jsonl path; exact resume from the cached plan; a disjoint validation
split; bad input named by file and line."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from vepo_mcore.config.job import JobConfig
from vepo_mcore.data.indexed import read_documents
from vepo_mcore.data.sft import read_conversations, tokenize_conversations
from vepo_mcore.data.sft_flores import build_flores_sft_set, default_sft_phases
from vepo_mcore.data.sft_indexed import (
    IndexedSFTSource,
    mask_spans,
    pack_bins,
    preprocess_sft,
    sft_files,
    spans_mask,
)
from vepo_mcore.data.sft_splits import build_sft_splits
from vepo_mcore.tokenizer import load_tokenizer
from vepo_mcore.training.sampler import micro_batches

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def sft_data(tmp_path_factory) -> tuple[dict[str, str], dict[str, str]]:
    """(source -> jsonl file, source -> on-disk prefix) of a small FLORES SFT set."""
    root = tmp_path_factory.mktemp("sft_disk")
    jsonl = build_flores_sft_set(root / "jsonl", per_source=40, seed=1)
    prefixes = {name: str(root / "disk" / name) for name in jsonl}
    for name, path in jsonl.items():
        preprocess_sft([path], prefixes[name], chunk_size=16)  # several chunks per file
    return jsonl, prefixes


def sft_config(paths, num_samples=60, seq_length=256, packing=True, valid_fraction=0.0) -> JobConfig:
    cfg = JobConfig()
    cfg.data.mode = "sft"
    cfg.data.sft_phases = default_sft_phases(paths, num_samples)
    cfg.data.sft_packing = packing
    cfg.data.sft_valid_fraction = valid_fraction
    cfg.training.seq_length = seq_length
    return cfg


def assert_same_samples(a, b) -> None:
    assert len(a) == len(b)
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert x.keys() == y.keys()
        for key in x:
            assert x[key].dtype == y[key].dtype and torch.equal(x[key], y[key]), (i, key)


def test_on_disk_ids_and_masks_equal_tokenizing_in_memory(sft_data):
    jsonl, prefixes = sft_data
    tok = load_tokenizer()
    for name in jsonl:
        encoded = tokenize_conversations(tok, read_conversations(jsonl[name]))
        source = IndexedSFTSource(prefixes[name], vocab_size=len(tok))
        assert len(source) == len(encoded) == source.meta["conversations"]
        for i, (ids, mask) in enumerate(encoded):
            got_ids, got_mask = source.get(i)
            assert np.array_equal(got_ids, ids) and np.array_equal(got_mask, mask)
        # Plain megatron IndexedDatasets: documents = conversations.
        docs = read_documents(sft_files(prefixes[name])[0])
        assert [d.tolist() for d in docs] == [ids.tolist() for ids, _ in encoded]


def test_mask_spans_roundtrip():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 100):
        for _ in range(20):
            mask = rng.random(n) < 0.5
            assert np.array_equal(spans_mask(mask_spans(mask), n), mask)
    assert mask_spans(np.array([False, True, True, False, True])).tolist() == [1, 3, 4, 5]


@pytest.mark.parametrize(
    "seq_length, packing, valid_fraction",
    [(256, True, 0.0), (256, False, 0.1), (48, True, 0.1)],  # 48: many conversations are truncated
    ids=["packed", "padded_valid", "truncated_valid"],
)
def test_on_disk_batches_equal_in_memory_batches(sft_data, seq_length, packing, valid_fraction):
    """Golden test: same jsonl, two paths, identical samples (every field, every phase, the
    validation set) and identical micro-batches."""
    jsonl, prefixes = sft_data
    memory = build_sft_splits(sft_config(jsonl, 60, seq_length, packing, valid_fraction))
    disk = build_sft_splits(sft_config(prefixes, 60, seq_length, packing, valid_fraction))
    (mem_train, mem_valid), (disk_train, disk_valid) = memory, disk
    assert [len(p) for p in disk_train.phases] == [len(p) for p in mem_train.phases]
    for mem_phase, disk_phase in zip(mem_train.phases, disk_train.phases):
        assert disk_phase.name == mem_phase.name
        assert disk_phase.source_counts == mem_phase.source_counts
        assert disk_phase.truncated == mem_phase.packed.truncated
    if seq_length == 48:
        assert disk_train.phases[0].truncated > 0
    assert_same_samples(mem_train, disk_train)
    mem_batches, disk_batches = micro_batches(mem_train, 8, 4, 1, 2), micro_batches(disk_train, 8, 4, 1, 2)
    for _ in range(5):
        a, b = next(mem_batches), next(disk_batches)
        assert all(torch.equal(a[k], b[k]) for k in a)
    if valid_fraction:
        assert len(disk_valid) > 0
        assert_same_samples(mem_valid, disk_valid)
    else:
        assert mem_valid is None and disk_valid is None


def test_pack_bins_follows_the_greedy_rule_across_windows():
    """150k conversations cross the 65,536-conversation window of pack_bins; a naive loop of
    pack_conversations' rule gives the same sample starts."""
    rng = np.random.default_rng(4)
    for seq_length in (16, 300):
        lengths = rng.integers(1, seq_length + 1, size=150_000)
        want, used = [], 0
        for i, length in enumerate(lengths.tolist()):
            if not want or used + length > seq_length:
                want.append(i)
                used = 0
            used += length
        want.append(len(lengths))
        assert pack_bins(lengths, seq_length).tolist() == want
    assert pack_bins(np.array([3, 3]), 4, packing=False).tolist() == [0, 1, 2]
    assert pack_bins(np.zeros(0, np.int64), 4).tolist() == [0]


def test_resume_reads_the_samples_an_uninterrupted_run_reads(sft_data, tmp_path):
    """A restart rebuilds the dataset from the cached plan (memory-mapped) and, from the saved
    consumed_samples, reads exactly the micro-batches the uninterrupted run read."""
    _, prefixes = sft_data
    cfg = sft_config(prefixes, 30, 128, valid_fraction=0.1)
    cfg.data.cache_dir = str(tmp_path / "cache")
    mbs, dp, gbs, steps, k = 2, 2, 8, 10, 4
    first, _ = build_sft_splits(cfg)  # plans computed and saved
    assert len(list((tmp_path / "cache").glob("sft_plan_*.json"))) == 4  # 3 phases + the validation set
    # ... and mapped back from the cache: a first start ends holding what a restart holds.
    assert all(isinstance(p.plan.item_of, np.memmap) for p in first.phases)
    uninterrupted = {r: micro_batches(first, 0, mbs, r, dp) for r in range(dp)}
    per_step = gbs // (mbs * dp)
    stream = {r: [next(uninterrupted[r]) for _ in range(steps * per_step)] for r in range(dp)}
    resumed_data, _ = build_sft_splits(cfg)  # a new process would do the same: load, not plan
    assert all(isinstance(p.plan.starts, np.memmap) for p in resumed_data.phases)
    for r in range(dp):
        resumed = micro_batches(resumed_data, k * gbs, mbs, r, dp)
        for want in stream[r][k * per_step :]:
            got = next(resumed)
            assert all(torch.equal(got[key], want[key]) for key in want)
    # The stream runs past the end (wraps around), so it crosses every phase boundary.
    assert steps * gbs > len(first)
    # Another phase size is another plan, not a stale cache hit.
    cfg.data.sft_phases = default_sft_phases(prefixes, 60)
    other, _ = build_sft_splits(cfg)
    assert len(other.phases[0]) > len(first.phases[0])


def test_validation_split_is_disjoint_from_training(sft_data):
    jsonl, prefixes = sft_data
    fraction = 0.2
    train, valid = build_sft_splits(sft_config(prefixes, 400, 256, valid_fraction=fraction))
    held = {(valid.sources[s].prefix, i) for s, i in zip(valid.plan.source_of, valid.plan.item_of)}
    for prefix in set(prefixes.values()):
        assert sum(1 for p, _ in held if p == prefix) == round(40 * fraction)
    drawn = set()
    for phase in train.phases:
        drawn |= {(phase.sources[s].prefix, i) for s, i in zip(phase.plan.source_of, phase.plan.item_of)}
    assert drawn and not drawn & held
    # 400 draws per phase (33 of the rarest source) over 32 training conversations per source reach all of them.
    assert all(sum(1 for p, _ in drawn if p == prefix) == 32 for prefix in prefixes.values())
    # By content too: no held-out conversation's token ids appear as a packed training conversation.
    held_ids = {tuple(ids.tolist()) for k in range(len(valid)) for ids, _ in valid.conversations(k)}
    for phase in train.phases:
        for k in range(len(phase)):
            assert not any(tuple(ids.tolist()) in held_ids for ids, _ in phase.conversations(k))
    with pytest.raises(ValueError, match=r"data.sft_valid_fraction must be in \[0, 1\)"):
        sft_config(prefixes, valid_fraction=1.0).data.validate()


def test_bad_line_names_file_and_line_and_leaves_no_files(tmp_path, capsys):
    path = tmp_path / "chat.jsonl"
    good = json.dumps(
        {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]}
    )
    path.write_text(f"{good}\n{good}\n" + json.dumps({"text": "not a conversation"}) + f"\n{good}\n")
    prefix = tmp_path / "out" / "chat"
    with pytest.raises(ValueError) as err:
        preprocess_sft([str(path)], prefix, chunk_size=1)  # the first two are already written
    assert f"{path}:3:" in str(err.value) and '"messages" list' in str(err.value)
    assert not list((tmp_path / "out").iterdir())
    sys.path.insert(0, str(ROOT / "tools"))
    import preprocess_sft as tool

    assert tool.main(["--input", str(path), "--output-prefix", str(prefix)]) == 1
    assert f"{path}:3:" in capsys.readouterr().err


def test_wrong_tokenizer_missing_files_and_mixed_sources_are_named(sft_data, tmp_path):
    jsonl, prefixes = sft_data
    _, _, meta = sft_files(prefixes["general"])
    with pytest.raises(
        ValueError, match=f"{meta}: written with a tokenizer of .* this run's tokenizer has 1000"
    ):
        IndexedSFTSource(prefixes["general"], vocab_size=1000)
    with pytest.raises(FileNotFoundError, match=r"SFT file .*nothing does not exist.*preprocess_sft"):
        IndexedSFTSource(tmp_path / "nothing")
    mixed = {**prefixes, "general": jsonl["general"]}
    with pytest.raises(ValueError, match="mixes .jsonl files and indexed prefixes"):
        build_sft_splits(sft_config(mixed))
    assert os.path.isfile(meta)
