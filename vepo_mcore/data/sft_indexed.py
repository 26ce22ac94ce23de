"""SFT conversations on disk: tokenised ChatML in Megatron indexed files, read memory-mapped, blended and packed.

    preprocess_sft(["general.jsonl"], "data/sft/general")      # tools/preprocess_sft.py
    # data/sft/general_conversation_document.bin/.idx   token ids, one document per conversation
    # data/sft/general_loss_spans_document.bin/.idx     the loss mask as [start, end) pairs per conversation
    # data/sft/general_sft.json                         counts and the tokenizer the ids come from
    curriculum, valid = build_indexed_sft(cfg)             # data.sft_phases' paths are such prefixes

Both files are megatron.core IndexedDatasets (written by indexed.DocumentWriter, read by
megatron's memory-mapped reader), one document per conversation, so the conversation
boundaries are the document boundaries. The mask is stored as spans rather than a second
per-token file: an assistant turn is one run of masked tokens, so a conversation costs a few
int32 instead of one entry per token. Token ids and masks are exactly what sft.tokenize_conversations
gives (the in-memory path), and the data does not depend on seq_length or packing: Megatron-Bridge
packs offline into per-seq_length files; here packing is decided at start-up like megatron's
GPTDataset indices.

At start-up only the sample plan is computed (which conversations, in which order, which ones
share a packed sequence): the phase's mixture order (sft.mixture_arrays, the same draws as the
in-memory path) and greedy packing over the conversation lengths read from the .idx. The plan is
a few arrays of 8-byte ints, saved like megatron's dataset index caches
(data.cache_dir or `sft_plan_cache/` beside the first source) and memory-mapped on every later
start, so a restart neither re-tokenises nor re-plans. Samples are assembled on access, exactly
as sft.pack_conversations lays them out.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
import warnings
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vepo_mcore.config.job import JobConfig
from vepo_mcore.data.indexed import DocumentWriter, dataset_prefix
from vepo_mcore.data.sft import (
    SFTCurriculum,
    block_causal_mask,
    iter_conversations,
    mixture_arrays,
    split_indices,
    tokenize_conversations,
)
from vepo_mcore.tokenizer import Tokenizer, load_tokenizer

# Imported where used: megatron.core (heavy: only the memory-mapped reader needs it, not tokenising SFT data;
# the trainers import this module before they take the save folder's lock).

FORMAT = "vepo_mcore.sft_indexed"
_SPAN_VOCAB = 1 << 31  # spans are token offsets: DocumentWriter then stores int32
_PLAN_VERSION = 1


def sft_files(prefix: str | Path) -> tuple[str, str, str]:
    """(ids prefix, loss-span prefix, metadata json) of an SFT output prefix."""
    return (
        dataset_prefix(prefix, key="conversation"),
        dataset_prefix(prefix, key="loss_spans"),
        f"{prefix}_sft.json",
    )


def mask_spans(mask: np.ndarray) -> np.ndarray:
    """Loss mask [n] bool -> [start0, end0, start1, end1, ...] int64 of its runs of True."""
    edges = np.diff(np.concatenate([[0], mask.astype(np.int8), [0]]))
    return np.stack([np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)], axis=1).reshape(-1)


def spans_mask(spans: np.ndarray, length: int) -> np.ndarray:
    """Inverse of mask_spans: [2k] spans -> mask [length] bool."""
    mask = np.zeros(length, dtype=bool)
    for start, end in spans.reshape(-1, 2).tolist():
        mask[start:end] = True
    return mask


# ---------------------------------------------------------------- writing


class SFTDiskWriter:
    """Writes tokenised conversations (ids [n], mask [n]) to an SFT output prefix; on an exception
    inside the `with` block nothing is left behind."""

    def __init__(self, prefix: str | Path, tok: Tokenizer, inputs: Iterable[str] = ()):
        self.prefix, self.tok, self.inputs = str(prefix), tok, [str(i) for i in inputs]
        ids_prefix, spans_prefix, self.meta_path = sft_files(prefix)
        if os.path.exists(self.meta_path):  # the json marks a complete dataset: not while rewriting it
            os.remove(self.meta_path)
        self.ids = DocumentWriter(ids_prefix, vocab_size=len(tok))
        self.spans = DocumentWriter(spans_prefix, vocab_size=_SPAN_VOCAB)

    def add_batch(self, encoded: list[tuple[np.ndarray, np.ndarray]]) -> None:
        if not encoded:
            return
        self.ids.add_many(np.concatenate([ids for ids, _ in encoded]), [len(ids) for ids, _ in encoded])
        spans = [mask_spans(mask) for _, mask in encoded]
        self.spans.add_many(np.concatenate(spans), [len(s) for s in spans])

    def __enter__(self) -> SFTDiskWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.ids.abort()
            self.spans.abort()
            return
        self.ids.finalize()
        self.spans.finalize()
        meta = {
            "format": FORMAT,
            "conversations": self.ids.num_documents,
            "tokens": self.ids.num_tokens,
            "vocab_size": len(self.tok),
            "tokenizer": str(self.tok.path),
            "inputs": self.inputs,
        }
        _write_atomic(self.meta_path, json.dumps(meta, indent=1).encode())


def preprocess_sft(
    inputs: list[str], output_prefix: str | Path, tokenizer_dir: str | None = None, chunk_size: int = 4096
) -> dict:
    """Tokenise ChatML jsonl files (in order) into one SFT output prefix; returns its metadata.

    A bad line raises ValueError naming file and line, and leaves no output files.
    """
    tok = load_tokenizer(tokenizer_dir)
    with SFTDiskWriter(output_prefix, tok, inputs) as writer:
        for path in inputs:
            batch = []
            for _, conversation in iter_conversations(path):
                batch.append(conversation)
                if len(batch) == chunk_size:
                    writer.add_batch(tokenize_conversations(tok, batch))
                    batch = []
            writer.add_batch(tokenize_conversations(tok, batch))
        if writer.ids.num_documents == 0:
            raise ValueError(f"no conversations in {', '.join(inputs)}")
    return json.loads(Path(writer.meta_path).read_text())


# ---------------------------------------------------------------- reading


class IndexedSFTSource:
    """One SFT output prefix, memory-mapped: len, per-conversation lengths, get(i) -> (ids, mask)."""

    def __init__(self, prefix: str | Path, vocab_size: int | None = None):
        from megatron.core.datasets.indexed_dataset import IndexedDataset

        self.prefix = str(prefix)
        ids_prefix, spans_prefix, meta_path = sft_files(prefix)
        needed = [meta_path] + [p + suffix for p in (ids_prefix, spans_prefix) for suffix in (".bin", ".idx")]
        missing = [p for p in needed if not os.path.isfile(p)]
        if missing:
            raise FileNotFoundError(
                f"SFT file {prefix} does not exist: a source is a .jsonl file or the output prefix of "
                f"tools/preprocess_sft.py (missing {', '.join(missing)})"
            )
        self.meta = json.loads(Path(meta_path).read_text())
        if self.meta.get("format") != FORMAT:
            raise ValueError(f"{meta_path} is not an SFT dataset of tools/preprocess_sft.py")
        if vocab_size is not None and self.meta["vocab_size"] != vocab_size:
            raise ValueError(
                f"{meta_path}: written with a tokenizer of {self.meta['vocab_size']} ids "
                f"({self.meta['tokenizer']}), but this run's tokenizer has {vocab_size}; "
                "preprocess again with tokenizer.path's tokenizer"
            )
        self.ids = IndexedDataset(ids_prefix, multimodal=False, mmap=True)
        self.spans = IndexedDataset(spans_prefix, multimodal=False, mmap=True)
        if not len(self.ids) == len(self.spans) == self.meta["conversations"]:
            raise ValueError(
                f"SFT dataset {prefix}: {len(self.ids)} conversations, {len(self.spans)} loss masks, "
                f"{self.meta['conversations']} in {meta_path}; preprocess it again"
            )

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def lengths(self) -> np.ndarray:
        """Tokens per conversation [n] int32 (a view of the .idx)."""
        return self.ids.sequence_lengths

    def get(self, idx: int) -> tuple[np.ndarray, np.ndarray]:
        """Conversation idx -> (ids [n] int64, loss mask [n] bool), as tokenize_conversation gives them."""
        ids = self.ids[idx].astype(np.int64)
        return ids, spans_mask(self.spans[idx], len(ids))

    def signature(self) -> list:
        """What the sample plan depends on: the file and its .idx (size, modification time)."""
        idx = sft_files(self.prefix)[0] + ".idx"
        stat = os.stat(idx)
        return [os.path.abspath(self.prefix), stat.st_size, stat.st_mtime_ns]


# ---------------------------------------------------------------- planning


def pack_bins(lengths: np.ndarray, seq_length: int, packing: bool = True) -> np.ndarray:
    """Per-conversation token counts [n] (each 1..seq_length) -> sample starts [num_samples + 1] int64.

    Sample k holds conversations starts[k] .. starts[k+1]-1: greedy in order, a new sample when the
    next conversation does not fit (sft.pack_conversations' rule). One bisection per sample over
    the running sum, in windows so that memory stays bounded.
    """
    n = len(lengths)
    if not packing or n == 0:
        return np.arange(n + 1, dtype=np.int64)
    cum = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=cum[1:])
    starts = array("q")
    window = max(1 << 16, 2 * seq_length + 2)  # more conversations than one sample can hold
    p = 0
    while p < n:
        hi = min(n, p + window)
        c = cum[p : hi + 1].tolist()  # c[j] = tokens before conversation p + j
        last, j = hi - p, 0
        while j < last:
            q = bisect_right(c, c[j] + seq_length, j + 1) - 1  # the sample is j .. q-1
            if q == last and hi < n:
                break  # it may go on past the window: continue from j in the next one
            starts.append(p + j)
            j = q
        p += j
    starts.append(n)
    return np.frombuffer(starts, dtype=np.int64).copy()


@dataclass
class SamplePlan:
    """Which conversations make up each sample of a dataset."""

    source_of: np.ndarray
    """[n] int32: source (position in the dataset's source list) of the n-th packed conversation."""
    item_of: np.ndarray
    """[n] int64: its conversation index in that source."""
    starts: np.ndarray
    """[num_samples + 1] int64: sample k packs conversations starts[k] .. starts[k+1]-1."""
    truncated: int
    """Conversations cut to seq_length + 1 tokens."""
    source_counts: dict[str, int]
    """Conversations drawn per source name (before dropping ones too short to train on)."""


def make_plan(
    source_of: np.ndarray,
    item_of: np.ndarray,
    lengths: np.ndarray,
    seq_length: int,
    packing: bool,
    source_counts: dict[str, int],
) -> SamplePlan:
    """The order's conversations with their token counts [n] -> their SamplePlan."""
    if seq_length < 2:
        raise ValueError(f"seq_length must be >= 2 for SFT, got {seq_length}")
    keep = lengths >= 2  # a conversation needs one (token, label) pair
    lengths = lengths[keep]
    truncated = int((lengths > seq_length + 1).sum())
    starts = pack_bins(np.minimum(lengths, seq_length + 1) - 1, seq_length, packing)
    return SamplePlan(
        source_of[keep].astype(np.int32), item_of[keep].astype(np.int64), starts, truncated, source_counts
    )


def _tmp_name(path: str | Path) -> str:
    return f"{path}.tmp{uuid.uuid4().hex}"  # unique across ranks and nodes sharing the folder


def _write_atomic(path: str | Path, data: bytes) -> None:
    tmp = _tmp_name(path)
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def cached_plan(cache_dir: str | Path, description: dict, compute: Callable[[], SamplePlan]) -> SamplePlan:
    """The plan `description` names, memory-mapped from cache_dir; computed and saved first if not
    there (each file written whole and renamed; the json last, so a present json means a complete
    plan), then mapped back, so a first start holds what a restart holds. Ranks computing the same
    plan at once write the same bytes. A folder that cannot be written: the computed plan, in memory."""
    key = hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:24]
    base = Path(cache_dir) / f"sft_plan_{key}"
    fields = ("source_of", "item_of", "starts")
    meta_path = Path(f"{base}.json")

    def load() -> SamplePlan:
        meta = json.loads(meta_path.read_text())
        arrays = {name: np.load(f"{base}_{name}.npy", mmap_mode="r") for name in fields}
        return SamplePlan(**arrays, truncated=meta["truncated"], source_counts=meta["source_counts"])

    if meta_path.is_file():
        return load()
    plan = compute()
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        for name in fields:
            tmp = _tmp_name(f"{base}_{name}.npy")
            with open(tmp, "wb") as f:
                np.save(f, getattr(plan, name))
            os.replace(tmp, f"{base}_{name}.npy")
        meta = {"truncated": plan.truncated, "source_counts": plan.source_counts, "description": description}
        _write_atomic(meta_path, json.dumps(meta, indent=1).encode())
    except OSError as exc:  # a read-only data folder: train anyway, plan again next start
        warnings.warn(f"SFT sample plan not cached in {cache_dir} ({exc}); set data.cache_dir", stacklevel=2)
        return plan
    del plan  # the first start then holds what a restart holds: the saved plan, memory-mapped
    return load()


# ---------------------------------------------------------------- datasets


class IndexedSFTDataset(torch.utils.data.Dataset):
    """Packed (or padded) SFT samples assembled on access from memory-mapped sources; the same
    samples as sft.PackedSFTDataset over the same conversations in the same order."""

    def __init__(
        self,
        name: str,
        sources: list[IndexedSFTSource],
        plan: SamplePlan,
        seq_length: int,
        pad_id: int,
        attention_mask: bool = True,
    ):
        self.name, self.sources, self.plan = name, sources, plan
        self.seq_length, self.pad_id, self.attention_mask = seq_length, pad_id, attention_mask
        self.source_counts, self.truncated = plan.source_counts, plan.truncated

    def __len__(self) -> int:
        return len(self.plan.starts) - 1

    def conversations(self, idx: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """The (ids, mask) of the conversations packed into sample idx."""
        if not 0 <= idx < len(self):
            raise IndexError(f"sample {idx} outside {self.name!r} of {len(self)} samples")
        lo, hi = int(self.plan.starts[idx]), int(self.plan.starts[idx + 1])
        sources, items = self.plan.source_of[lo:hi].tolist(), self.plan.item_of[lo:hi].tolist()
        return [self.sources[s].get(i) for s, i in zip(sources, items)]

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        s = self.seq_length
        tokens = np.full(s, self.pad_id, dtype=np.int64)
        labels = np.full(s, self.pad_id, dtype=np.int64)
        loss_mask = np.zeros(s, dtype=np.float32)
        position_ids = np.zeros(s, dtype=np.int64)
        segment_ids = np.full(s, -1, dtype=np.int64)
        offset = 0
        for segment, (ids, mask) in enumerate(self.conversations(idx)):
            ids, mask = ids[: s + 1], mask[: s + 1]
            end = offset + len(ids) - 1
            tokens[offset:end], labels[offset:end], loss_mask[offset:end] = ids[:-1], ids[1:], mask[1:]
            position_ids[offset:end] = np.arange(end - offset)
            segment_ids[offset:end] = segment
            offset = end
        position_ids[offset:] = np.arange(s - offset)  # as pack_conversations: padding keeps counting
        sample = {
            "tokens": torch.from_numpy(tokens),
            "labels": torch.from_numpy(labels),
            "loss_mask": torch.from_numpy(loss_mask),
            "position_ids": torch.from_numpy(position_ids),
            "segment_ids": torch.from_numpy(segment_ids),
        }
        if self.attention_mask:
            sample["attention_mask"] = block_causal_mask(sample["segment_ids"])
        return sample


def _lengths(sources: list[IndexedSFTSource], source_of: np.ndarray, item_of: np.ndarray) -> np.ndarray:
    lengths = np.empty(len(item_of), dtype=np.int64)
    for k, source in enumerate(sources):
        chosen = source_of == k
        lengths[chosen] = source.lengths[item_of[chosen]]
    return lengths


def build_indexed_sft(cfg: JobConfig) -> tuple[SFTCurriculum, IndexedSFTDataset | None]:
    """sft.build_memory_sft for sources that are SFT output prefixes: the same phases, draws,
    validation split and packing, read from disk."""
    d, t = cfg.data, cfg.training
    tok = load_tokenizer(cfg.tokenizer.path)
    opened: dict[str, IndexedSFTSource] = {}

    def source(path: str) -> IndexedSFTSource:
        if path not in opened:
            opened[path] = IndexedSFTSource(path, vocab_size=len(tok))
        return opened[path]

    def description(kind: str, sources: list[IndexedSFTSource], **extra) -> dict:
        return {
            "version": _PLAN_VERSION, "kind": kind, "sources": [s.signature() for s in sources],
            "seq_length": t.seq_length, "packing": d.sft_packing,
            "valid_fraction": d.sft_valid_fraction, "split_seed": t.seed, **extra,
        }  # fmt: skip

    def train_ids(src: IndexedSFTSource) -> np.ndarray:
        return split_indices(len(src), d.sft_valid_fraction, t.seed, src.prefix)[0]

    first = next((p for phase in d.sft_phases for p in phase.paths.values()), ".")
    cache_dir = d.cache_dir or os.path.join(os.path.dirname(os.path.abspath(first)), "sft_plan_cache")
    phases = []
    for k, phase in enumerate(d.sft_phases):
        if not phase.paths:
            raise ValueError(f"SFT phase {phase.name!r} has no sources (paths is empty)")
        names = list(phase.paths)
        sources = [source(phase.paths[name]) for name in names]

        def compute(phase=phase, names=names, sources=sources, seed=t.seed + k) -> SamplePlan:
            splits = [train_ids(src) for src in sources]
            sizes = {name: len(ids) for name, ids in zip(names, splits)}
            source_of, local = mixture_arrays(sizes, phase.weights, phase.num_samples, seed)
            item_of = np.empty_like(local)
            for j, ids in enumerate(splits):
                item_of[source_of == j] = ids[local[source_of == j]]
            counts = {name: int((source_of == j).sum()) for j, name in enumerate(names)}
            lengths = _lengths(sources, source_of, item_of)
            return make_plan(source_of, item_of, lengths, t.seq_length, d.sft_packing, counts)

        desc = description(
            "phase",
            sources,
            names=names,
            weights=phase.weights,
            num_samples=phase.num_samples,
            seed=t.seed + k,
        )
        plan = cached_plan(cache_dir, desc, compute)
        phases.append(
            IndexedSFTDataset(phase.name, sources, plan, t.seq_length, tok.pad_id, d.sft_attention_mask)
        )
    valid = None
    if d.sft_valid_fraction > 0:
        # Every distinct file once, in order of first use; its held-out conversations in file order.
        distinct = list(opened.values())

        def compute_valid() -> SamplePlan:
            held = [split_indices(len(s), d.sft_valid_fraction, t.seed, s.prefix)[1] for s in distinct]
            source_of = np.concatenate([np.full(len(h), j, dtype=np.int64) for j, h in enumerate(held)])
            item_of = np.concatenate(held)
            counts = {s.prefix: len(h) for s, h in zip(distinct, held)}
            lengths = _lengths(distinct, source_of, item_of)
            return make_plan(source_of, item_of, lengths, t.seq_length, d.sft_packing, counts)

        plan = cached_plan(cache_dir, description("valid", distinct), compute_valid)
        valid = IndexedSFTDataset("valid", distinct, plan, t.seq_length, tok.pad_id, d.sft_attention_mask)
    return SFTCurriculum(phases), valid
