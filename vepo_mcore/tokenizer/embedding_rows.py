"""Embedding rows for an expanded vocabulary: the pure part of the resize (SPEC section 1).

A new token's row (input embedding and output layer alike) is the mean of the base rows of its
base-tokenizer encoding; original rows are copied unchanged; padding rows are zero.

    sources = new_row_sources(load_tokenizer(), load_tokenizer("out/qwen2.5-expanded"))
    weight = resize_embedding(weight, new_vocab_size, padded_rows, sources)   # [padded_rows, hidden]

Megatron/HF wiring (gathering vocab-parallel shards, first/last pipeline stage, tied weights,
re-padding by the model builder's padding rule) lives with the checkpoint code and calls these.
"""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer as HFTokenizer


def _backend(tokenizer) -> HFTokenizer:
    """A `tokenizers.Tokenizer` from our wrapper, a `tokenizers.Tokenizer` or a directory path."""
    if isinstance(tokenizer, HFTokenizer):
        return tokenizer
    if isinstance(tokenizer, (str, Path)):
        return HFTokenizer.from_file(str(Path(tokenizer) / "tokenizer.json"))
    if hasattr(tokenizer, "backend"):
        return tokenizer.backend
    raise ValueError(
        f"expected a vepo Tokenizer, tokenizers.Tokenizer or directory, got {type(tokenizer).__name__}"
    )


def _pieces(base: HFTokenizer, token: str) -> list[int]:
    # Spec path: decode the token to text and encode that with the base tokenizer. A byte-level token
    # can end inside a UTF-8 character (decodes to U+FFFD) or be changed by NFC; then the base BPE model
    # segments the token's bytes directly, which still yields pieces that concatenate to the token.
    text = base.decoder.decode([token])
    ids = base.encode(text, add_special_tokens=False).ids
    if ids and "".join(base.id_to_token(i) for i in ids) == token:
        return ids
    return [t.id for t in base.model.tokenize(token)]


def new_row_sources(base_tokenizer, expanded_tokenizer) -> dict[int, list[int]]:
    """new id -> base ids whose embedding rows are averaged for it.

    Checks that the expanded tokenizer keeps every base id (same token string).
    """
    base, expanded = _backend(base_tokenizer), _backend(expanded_tokenizer)
    base_size = base.get_vocab_size(with_added_tokens=True)
    new_size = expanded.get_vocab_size(with_added_tokens=True)
    if new_size < base_size:
        raise ValueError(f"expanded tokenizer has {new_size} ids, fewer than the base's {base_size}")
    for token_id in range(base_size):
        if base.id_to_token(token_id) != expanded.id_to_token(token_id):
            raise ValueError(
                f"id {token_id} is {base.id_to_token(token_id)!r} in the base tokenizer but "
                f"{expanded.id_to_token(token_id)!r} in the expanded one; existing ids must keep their meaning"
            )
    return {new_id: _pieces(base, expanded.id_to_token(new_id)) for new_id in range(base_size, new_size)}


def resize_embedding(
    weight: torch.Tensor,
    new_vocab_size: int,
    padded_rows: int,
    sources: dict[int, list[int]],
    chunk: int = 4096,
) -> torch.Tensor:
    """Embedding (or output layer) matrix for the expanded vocabulary.

    weight: [rows, hidden], rows >= base vocab size (padding rows beyond it are ignored).
    sources: new_row_sources(...); its ids must be exactly base_vocab..new_vocab_size-1, where
    base_vocab = new_vocab_size - len(sources).
    Returns [padded_rows, hidden] in weight's dtype/device: rows < base_vocab copied bit for bit,
    new rows = mean of their source rows (accumulated in float32, float64 for float64 weights),
    rows >= new_vocab_size zero. `chunk` new ids are averaged at a time (bounds the gathered rows).
    """
    if weight.dim() != 2:
        raise ValueError(f"embedding weight must be [rows, hidden], got shape {tuple(weight.shape)}")
    base_vocab = new_vocab_size - len(sources)
    if sorted(sources) != list(range(base_vocab, new_vocab_size)):
        raise ValueError(f"sources must cover new ids {base_vocab}..{new_vocab_size - 1} exactly")
    if weight.shape[0] < base_vocab:
        raise ValueError(f"embedding has {weight.shape[0]} rows, fewer than the base vocabulary {base_vocab}")
    if padded_rows < new_vocab_size:
        raise ValueError(f"padded_rows {padded_rows} is smaller than the new vocabulary {new_vocab_size}")
    for new_id, ids in sources.items():
        if not ids or min(ids) < 0 or max(ids) >= base_vocab:
            raise ValueError(f"new id {new_id}: source ids {ids} must be non-empty and < {base_vocab}")
    out = torch.zeros(padded_rows, weight.shape[1], dtype=weight.dtype, device=weight.device)
    out[:base_vocab] = weight[:base_vocab]
    # Vectorised in chunks of new ids (a per-token loop took minutes for 28k tokens at hidden 3584):
    # gather all source rows, sum them per new id with index_add_, divide by the piece count.
    acc_dtype = torch.promote_types(weight.dtype, torch.float32)
    new_ids = sorted(sources)
    for start in range(0, len(new_ids), chunk):
        ids = new_ids[start : start + chunk]
        flat = torch.tensor([i for new_id in ids for i in sources[new_id]], device=weight.device)
        counts = torch.tensor([len(sources[new_id]) for new_id in ids], device=weight.device)
        segment = torch.repeat_interleave(torch.arange(len(ids), device=weight.device), counts)
        sums = torch.zeros(len(ids), weight.shape[1], dtype=acc_dtype, device=weight.device)
        sums.index_add_(0, segment, weight[flat].to(acc_dtype))
        out[ids[0] : ids[-1] + 1] = (sums / counts.unsqueeze(1).to(acc_dtype)).to(weight.dtype)
    return out
