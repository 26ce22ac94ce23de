"""SFT data: ChatML conversations -> token ids with an assistant-only loss mask, packed or padded, in curriculum phases.

    curriculum, valid = build_sft_splits(cfg)     # data/sft_splits.py; map-style: phase 1 samples, then phase 2, ...
    sample = curriculum[i]   # tokens, labels, loss_mask, position_ids, segment_ids [s] (+ attention_mask [1, s, s])
    curriculum.phase_of(i)   # -> (phase index, phase name) for logs

Input: jsonl, one conversation per line: {"messages": [{"role": "user", "content": ...}, ...]}.
A conversation is encoded as Tokenizer.apply_chat writes it, piece by piece:
`<|im_start|>` + encode(role + "\\n") + encode(content) + `<|im_end|>` + encode("\\n"). Encoding
the assistant content on its own is how the rollout engine sees it (generation starts right
after "<|im_start|>assistant\\n"), and it makes the mask exact: the loss covers the assistant
content tokens and their closing <|im_end|>, never role headers, other turns or the "\\n".

Labels are shifted per conversation (tokens = ids[:-1], labels = ids[1:]), so no label ever
crosses into the next packed conversation. Packing fills each sequence greedily in order;
position ids restart at 0 per conversation and `segment_ids` (conversation index within the
sequence, -1 on padding) gives the block-diagonal causal attention mask.

A phase draws `num_samples` conversations from its sources by weight (5:1 general :
multilingual in the default curriculum, SPEC section 3), each source cycling through seeded
permutations, interleaved so every prefix keeps the ratios. Position in the curriculum is one
number (consumed samples), so resuming is exact. data.sft_valid_fraction holds out a seeded share
of every source file for the validation set.

This module tokenises `.jsonl` sources in memory at start-up; sources given as prefixes of
tools/preprocess_sft.py are read from disk by data/sft_indexed.py with the same results.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from vepo_mcore.config.data import SFTPhaseConfig
from vepo_mcore.config.job import JobConfig
from vepo_mcore.tokenizer import Tokenizer, load_tokenizer

ROLES = ("system", "user", "assistant", "tool")


# ---------------------------------------------------------------- reading


def validate_messages(messages: object) -> list[dict[str, str]]:
    """Check one conversation; ValueError with what is wrong (the caller adds file and line)."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list")
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise ValueError(f"messages[{i}] must be an object with 'role' and 'content'")
        role, content = msg.get("role"), msg.get("content")
        if role not in ROLES:
            raise ValueError(f"messages[{i}].role is {role!r}; expected one of {ROLES}")
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string, got {type(content).__name__}")
    if not any(msg["role"] == "assistant" for msg in messages):
        raise ValueError("no assistant message: nothing to train on")
    return [{"role": msg["role"], "content": msg["content"]} for msg in messages]


def iter_conversations(path: str | Path) -> Iterator[tuple[int, list[dict[str, str]]]]:
    """(line number, conversation) for every non-blank line of a ChatML jsonl file, streamed;
    ValueError naming file and line on a bad line, FileNotFoundError if the file is missing."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"SFT file {path} does not exist")
    with path.open("rb") as f:
        for line_no, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
                if not line.strip():
                    continue
                record = json.loads(line)
                if not isinstance(record, dict) or "messages" not in record:
                    raise ValueError('expected an object with a "messages" list')
                conversation = validate_messages(record["messages"])
            except UnicodeDecodeError as exc:
                raise ValueError(f"{path}:{line_no}: invalid UTF-8 at byte {exc.start}") from None
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{line_no}: bad JSON ({exc.msg} at column {exc.colno})") from None
            except ValueError as exc:
                raise ValueError(f"{path}:{line_no}: {exc}") from None
            yield line_no, conversation


def read_conversations(path: str | Path) -> list[list[dict[str, str]]]:
    """All conversations of a ChatML jsonl file; ValueError naming file and line on a bad line."""
    conversations = [conversation for _, conversation in iter_conversations(path)]
    if not conversations:
        raise ValueError(f"SFT file {path} has no conversations")
    return conversations


# ---------------------------------------------------------------- tokenising


def tokenize_conversation(tok: Tokenizer, messages: list[dict[str, str]]) -> tuple[np.ndarray, np.ndarray]:
    """ChatML conversation -> (ids [n] int64, loss mask [n] bool), mask on assistant content + its <|im_end|>.

    decode(ids) == tok.apply_chat(messages).
    """
    return tokenize_conversations(tok, [messages])[0]


def tokenize_conversations(
    tok: Tokenizer, conversations: list[list[dict[str, str]]]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """tokenize_conversation for many conversations: all contents go through one encode_batch call
    (the Rust tokenizer's thread pool) and role headers are encoded once per role."""
    newline = tok.encode("\n")
    headers: dict[str, list[int]] = {}
    contents = tok.encode_batch([msg["content"] for conv in conversations for msg in conv])
    out = []
    k = 0
    for conv in conversations:
        ids: list[int] = []
        mask: list[bool] = []
        for msg in conv:
            role = msg["role"]
            if role not in headers:
                headers[role] = [tok.im_start_id] + tok.encode(f"{role}\n")
            header, body = headers[role], contents[k] + [tok.im_end_id]
            k += 1
            ids += header + body + newline
            mask += [False] * len(header) + [role == "assistant"] * len(body) + [False] * len(newline)
        out.append((np.asarray(ids, dtype=np.int64), np.asarray(mask, dtype=bool)))
    return out


@dataclass
class Packed:
    """Samples of one phase as [num_samples, s] arrays, stored compactly (int32 ids, uint8 mask);
    SFTPhaseDataset hands out int64 / float32 tensors."""

    tokens: np.ndarray
    labels: np.ndarray
    loss_mask: np.ndarray
    position_ids: np.ndarray
    segment_ids: np.ndarray
    truncated: int = 0
    """Conversations cut to seq_length + 1 tokens."""

    def tensors(self, rows: int | slice = slice(None)) -> dict[str, torch.Tensor]:
        """Samples `rows` as the training step takes them: int64 ids, float32 loss mask."""
        sample = {
            key: torch.from_numpy(getattr(self, key)[rows].astype(np.int64))
            for key in ("tokens", "labels", "position_ids", "segment_ids")
        }
        sample["loss_mask"] = torch.from_numpy(self.loss_mask[rows].astype(np.float32))
        return sample


def pack_conversations(
    encoded: list[tuple[np.ndarray, np.ndarray]], seq_length: int, pad_id: int, packing: bool = True
) -> Packed:
    """[(ids [n], mask [n]), ...] -> Packed samples of seq_length tokens.

    Each conversation contributes tokens ids[:-1], labels ids[1:], loss mask mask[1:] (a label
    is trained when its token is an assistant token), position ids 0..n-2. packing=False puts
    one conversation per sample. Too-long conversations are truncated to seq_length + 1 ids.
    """
    if seq_length < 2:
        raise ValueError(f"seq_length must be >= 2 for SFT, got {seq_length}")
    samples: list[list[tuple[np.ndarray, np.ndarray]]] = []
    current: list[tuple[np.ndarray, np.ndarray]] = []
    used = 0
    truncated = 0
    for ids, mask in encoded:
        if len(ids) < 2:
            continue  # a conversation needs one (token, label) pair
        if len(ids) > seq_length + 1:
            ids, mask = ids[: seq_length + 1], mask[: seq_length + 1]
            truncated += 1
        length = len(ids) - 1
        if current and (not packing or used + length > seq_length):
            samples.append(current)
            current, used = [], 0
        current.append((ids, mask))
        used += length
    if current:
        samples.append(current)

    n = len(samples)
    out = Packed(
        tokens=np.full((n, seq_length), pad_id, dtype=np.int32),
        labels=np.full((n, seq_length), pad_id, dtype=np.int32),
        loss_mask=np.zeros((n, seq_length), dtype=np.uint8),
        position_ids=np.zeros((n, seq_length), dtype=np.int32),
        segment_ids=np.full((n, seq_length), -1, dtype=np.int32),
        truncated=truncated,
    )
    for row, parts in enumerate(samples):
        offset = 0
        for segment, (ids, mask) in enumerate(parts):
            length = len(ids) - 1
            span = slice(offset, offset + length)
            out.tokens[row, span] = ids[:-1]
            out.labels[row, span] = ids[1:]
            out.loss_mask[row, span] = mask[1:]
            out.position_ids[row, span] = np.arange(length)
            out.segment_ids[row, span] = segment
            offset += length
        # Padding continues the positions so RoPE sees ordinary values; it is masked out anyway.
        out.position_ids[row, offset:] = np.arange(seq_length - offset)
    return out


def block_causal_mask(segment_ids: torch.Tensor) -> torch.Tensor:
    """segment_ids [..., s] -> attention mask [..., 1, s, s] bool, True = masked out (megatron's convention).

    Token i may attend to token j iff j <= i and both belong to the same segment (padding,
    segment -1, forms one block of its own, so no row is fully masked).
    """
    s = segment_ids.shape[-1]
    same = segment_ids.unsqueeze(-1) == segment_ids.unsqueeze(-2)
    causal = torch.ones(s, s, dtype=torch.bool, device=segment_ids.device).tril()
    return (~(same & causal)).unsqueeze(-3)


def cu_seqlens(segment_ids: torch.Tensor) -> torch.Tensor:
    """segment_ids [b, s] -> cumulative sequence lengths [n + 1] int32 of the b*s tokens laid end to end.

    A new sequence starts at every row start and every change of segment id (padding is a
    sequence of its own). This is what megatron's PackedSeqParams (cu_seqlens_q/kv, THD
    format) wants on the Transformer Engine path, where no [s, s] mask is built.
    """
    b, s = segment_ids.shape
    flat = segment_ids.reshape(-1)
    starts = torch.ones_like(flat, dtype=torch.bool)
    starts[1:] = flat[1:] != flat[:-1]
    starts[::s] = True
    idx = torch.nonzero(starts).reshape(-1)
    return torch.cat([idx, torch.tensor([b * s], device=idx.device)]).to(torch.int32)


# ---------------------------------------------------------------- mixing


def _largest_remainder(weights: np.ndarray, total: int) -> np.ndarray:
    raw = weights / weights.sum() * total
    counts = np.floor(raw).astype(np.int64)
    for i in np.argsort(-(raw - counts), kind="stable")[: total - counts.sum()]:
        counts[i] += 1
    return counts


def mixture_arrays(
    sizes: dict[str, int], weights: dict[str, float], num_samples: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """mixture_order as arrays: (source position in `sizes` [n] int64, conversation index [n] int64)."""
    names = list(sizes)
    if any(sizes[name] <= 0 for name in names):
        raise ValueError(f"every SFT source needs conversations; sizes: {sizes}")
    w = np.array([weights.get(name, 1.0) for name in names], dtype=np.float64)
    if num_samples > 0:
        if w.sum() <= 0:
            raise ValueError(f"SFT source weights must not all be 0: {weights}")
        counts = _largest_remainder(w, num_samples)
    else:
        counts = np.array([sizes[name] for name in names], dtype=np.int64)
    draws = []
    for k, name in enumerate(names):
        rng = np.random.default_rng([seed, k])
        epochs = -(-int(counts[k]) // sizes[name])
        perm = np.concatenate([rng.permutation(sizes[name]) for _ in range(max(epochs, 1))])
        draws.append(perm[: counts[k]])
    # Item j of source k sits at (j + 0.5) / count_k of the way through the phase; sorting by
    # that position interleaves the sources so any prefix is within one item per source of the
    # target ratios (vectorised: a 7M-sample phase sorts in seconds).
    live = [k for k, c in enumerate(counts) if c > 0]
    if not live:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    keys = np.concatenate([(np.arange(counts[k]) + 0.5) / counts[k] for k in live])
    source_of = np.concatenate([np.full(counts[k], k, dtype=np.int64) for k in live])
    item_of = np.concatenate([draws[k] for k in live]).astype(np.int64)
    order = np.argsort(keys, kind="stable")
    return source_of[order], item_of[order]


def mixture_order(
    sizes: dict[str, int], weights: dict[str, float], num_samples: int, seed: int
) -> list[tuple[str, int]]:
    """(source, conversation index) in the order a phase trains on them.

    num_samples > 0: counts per source by weight (largest remainder); each source cycles through
    seeded permutations of its conversations. num_samples == 0: every conversation once.
    The sources are interleaved evenly, so every prefix of the order keeps the ratios (within
    one conversation per source), as megatron's blending index does for CPT.
    """
    names = list(sizes)
    source_of, item_of = mixture_arrays(sizes, weights, num_samples, seed)
    return [(names[k], i) for k, i in zip(source_of.tolist(), item_of.tolist())]


def split_indices(
    size: int, valid_fraction: float, seed: int, source: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    """(train, valid) conversation indices [*] int64 (each sorted) of a source of `size` conversations.

    round(size * valid_fraction) conversations (at least one when the fraction is > 0) are held out,
    chosen by a permutation seeded with (seed, size): the same conversations whatever phase or
    file format reads the source. valid_fraction == 0 keeps every conversation for training.
    """
    if valid_fraction <= 0:
        return np.arange(size, dtype=np.int64), np.zeros(0, np.int64)
    n_valid = max(1, int(round(size * valid_fraction)))
    if n_valid >= size:
        raise ValueError(
            f"data.sft_valid_fraction={valid_fraction} holds out all {size} conversations of {source or 'a source'}; "
            "lower it or add conversations"
        )
    held = np.zeros(size, dtype=bool)
    held[np.random.default_rng([seed, size]).permutation(size)[:n_valid]] = True
    return np.flatnonzero(~held), np.flatnonzero(held)


# ---------------------------------------------------------------- datasets


class PackedSFTDataset(torch.utils.data.Dataset):
    """Packed (or padded) samples held in memory as a Packed."""

    def __init__(self, name: str, packed: Packed, attention_mask: bool = True):
        self.name, self.packed, self.attention_mask = name, packed, attention_mask

    def __len__(self) -> int:
        return len(self.packed.tokens)

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        sample = self.packed.tensors(idx)
        if self.attention_mask:
            sample["attention_mask"] = block_causal_mask(sample["segment_ids"])
        return sample


class SFTPhaseDataset(PackedSFTDataset):
    """The packed (or padded) samples of one curriculum phase, tokenised in memory from jsonl.

    valid_fraction > 0 holds out split_indices(..., split_seed) of every source; the phase draws
    from the rest only.
    """

    def __init__(
        self,
        phase: SFTPhaseConfig,
        tok: Tokenizer,
        seq_length: int,
        *,
        seed: int = 1234,
        packing: bool = True,
        attention_mask: bool = True,
        valid_fraction: float = 0.0,
        split_seed: int = 1234,
    ):
        if not phase.paths:
            raise ValueError(f"SFT phase {phase.name!r} has no sources (paths is empty)")
        sources = {}
        for name, path in phase.paths.items():
            conversations = read_conversations(path)
            train, _ = split_indices(len(conversations), valid_fraction, split_seed, path)
            sources[name] = [conversations[i] for i in train]
        sizes = {name: len(convs) for name, convs in sources.items()}
        self.order = mixture_order(sizes, phase.weights, phase.num_samples, seed)
        # Each drawn conversation is tokenised once, however often the phase repeats it.
        unique = sorted(set(self.order))
        tokenized = tokenize_conversations(tok, [sources[name][i] for name, i in unique])
        lookup = dict(zip(unique, tokenized))
        encoded = [lookup[key] for key in self.order]
        self.source_counts = {name: sum(1 for s, _ in self.order if s == name) for name in sources}
        super().__init__(
            phase.name, pack_conversations(encoded, seq_length, tok.pad_id, packing), attention_mask
        )


class SFTCurriculum(torch.utils.data.Dataset):
    """Phases run in order as one map-style dataset: index i < len(phase 0) is phase 0, and so on."""

    def __init__(self, phases: list[SFTPhaseDataset]):
        if not phases:
            raise ValueError("an SFT curriculum needs at least one phase (data.sft_phases is empty)")
        self.phases = phases
        self.boundaries = np.cumsum([len(p) for p in phases])

    def __len__(self) -> int:
        return int(self.boundaries[-1])

    def phase_of(self, idx: int) -> tuple[int, str]:
        """(phase index, phase name) of sample idx."""
        if not 0 <= idx < len(self):
            raise IndexError(f"sample {idx} outside the curriculum of {len(self)} samples")
        k = int(np.searchsorted(self.boundaries, idx, side="right"))
        return k, self.phases[k].name

    def __getitem__(self, idx: int) -> dict[str, torch.Tensor]:
        k, _ = self.phase_of(idx)
        start = int(self.boundaries[k - 1]) if k else 0
        return self.phases[k][idx - start]


def build_memory_sft(cfg: JobConfig) -> tuple[SFTCurriculum, torch.utils.data.Dataset | None]:
    """(curriculum, validation set or None) of cfg.data.sft_phases whose sources are `.jsonl` files,
    tokenised in memory, at cfg.training.seq_length, the same on every rank (data/sft_splits.py
    chooses between this and the on-disk path). data.sft_valid_fraction > 0 holds out that share of
    every distinct source file: the validation set is those conversations, packed like training.
    """
    paths = [path for phase in cfg.data.sft_phases for path in phase.paths.values()]
    tok = load_tokenizer(cfg.tokenizer.path)
    d = cfg.data
    phases = [
        SFTPhaseDataset(
            phase,
            tok,
            cfg.training.seq_length,
            seed=cfg.training.seed + k,
            packing=d.sft_packing,
            attention_mask=d.sft_attention_mask,
            valid_fraction=d.sft_valid_fraction,
            split_seed=cfg.training.seed,
        )
        for k, phase in enumerate(d.sft_phases)
    ]
    valid = None
    if d.sft_valid_fraction > 0:
        held_out = []
        for path in dict.fromkeys(paths):  # each file once, in order of first use
            conversations = read_conversations(path)
            _, held = split_indices(len(conversations), d.sft_valid_fraction, cfg.training.seed, path)
            held_out += [conversations[i] for i in held]
        encoded = tokenize_conversations(tok, held_out)
        packed = pack_conversations(encoded, cfg.training.seq_length, tok.pad_id, d.sft_packing)
        valid = PackedSFTDataset("valid", packed, d.sft_attention_mask)
    return SFTCurriculum(phases), valid


def is_jsonl(path: str | Path) -> bool:
    """Whether an SFT source is a ChatML jsonl file (else: an indexed prefix of tools/preprocess_sft.py)."""
    return str(path).endswith(".jsonl")
