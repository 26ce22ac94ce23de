"""Megatron indexed datasets (.bin/.idx): naming, token dtype, writing documents, reading them back.

The files are megatron.core's IndexedDataset format, the one Megatron-LM's
tools/preprocess_data.py writes, so either tool's output feeds either trainer:

    prefix = dataset_prefix("out/cpt", "th")          # out/cpt_th_text_document
    with DocumentWriter(prefix, vocab_size=len(tok)) as writer:
        writer.add(ids)                                # one document (EOD already appended)
    docs = read_documents(prefix)                      # list of numpy arrays
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def dataset_prefix(output_prefix: str | Path, lang: str | None = None, key: str = "text") -> str:
    """Megatron-LM naming: `<output_prefix>[_<lang>]_<key>_document` (no .bin/.idx suffix)."""
    parts = [str(output_prefix)]
    if lang:
        parts.append(lang)
    parts.append(f"{key}_document")
    return "_".join(parts)


def token_dtype(vocab_size: int) -> type[np.number]:
    """Smallest dtype Megatron-LM picks for the ids: uint16 below 65,500 ids, else int32."""
    from megatron.core.datasets.indexed_dataset import DType

    return DType.optimal_dtype(vocab_size)


class DocumentWriter:
    """Writes documents to `<prefix>.bin` / `<prefix>.idx` through megatron.core's IndexedDatasetBuilder.

    One document = one sequence (Megatron-LM's default without sentence splitting). On an
    exception inside the `with` block the partial files are removed, so a failed run never
    leaves a .bin without its .idx.
    """

    def __init__(self, prefix: str | Path, vocab_size: int):
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

        self.prefix = str(prefix)
        self.dtype = token_dtype(vocab_size)
        Path(self.prefix).parent.mkdir(parents=True, exist_ok=True)
        self._builder = IndexedDatasetBuilder(self.prefix + ".bin", dtype=self.dtype)
        self.num_documents = 0
        self.num_tokens = 0

    def add(self, ids: np.ndarray | list[int]) -> None:
        """Append one document of token ids [n] (n > 0)."""
        ids = np.asarray(ids, dtype=self.dtype)
        self._builder.add_document(ids, [int(ids.size)])
        self.num_documents += 1
        self.num_tokens += int(ids.size)

    def add_many(self, flat: np.ndarray, lengths: np.ndarray) -> None:
        """Append len(lengths) documents stored back to back in flat [sum(lengths)] (one write call).

        Same bytes and index entries as add() per document; used by the preprocessing loop,
        where per-document calls cost more than the tokenising workers on small documents.
        """
        flat = np.ascontiguousarray(flat, dtype=self.dtype)
        lengths = [int(n) for n in lengths]
        if sum(lengths) != flat.size:
            raise ValueError(f"lengths sum to {sum(lengths)} but {flat.size} tokens were given")
        if not lengths:
            return
        b = self._builder
        b.data_file.write(flat.tobytes(order="C"))
        first = len(b.sequence_lengths)
        b.sequence_lengths.extend(lengths)
        b.document_indices.extend(range(first + 1, first + len(lengths) + 1))
        self.num_documents += len(lengths)
        self.num_tokens += flat.size

    def finalize(self) -> None:
        self._builder.finalize(self.prefix + ".idx")

    def abort(self) -> None:
        self._builder.data_file.close()
        for suffix in (".bin", ".idx"):
            if os.path.exists(self.prefix + suffix):
                os.remove(self.prefix + suffix)

    def __enter__(self) -> DocumentWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.finalize()
        else:
            self.abort()


def check_prefix(prefix: str | Path) -> str:
    """Raise FileNotFoundError unless both `<prefix>.bin` and `<prefix>.idx` exist."""
    prefix = str(prefix)
    for suffix in (".bin", ".idx"):
        if not os.path.isfile(prefix + suffix):
            raise FileNotFoundError(
                f"indexed dataset {prefix} has no {suffix} file (expected {prefix}.bin and {prefix}.idx; "
                "build them with tools/preprocess_data.py)"
            )
    return prefix


def read_documents(prefix: str | Path) -> list[np.ndarray]:
    """All documents of an indexed dataset as int64 arrays, in order."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    dataset = IndexedDataset(check_prefix(prefix), multimodal=False, mmap=True)
    starts = dataset.document_indices
    docs = []
    for d in range(len(starts) - 1):
        parts = [dataset[i] for i in range(starts[d], starts[d + 1])]
        docs.append(np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64))
    return docs


def count_tokens(prefix: str | Path) -> int:
    """Total tokens of an indexed dataset (from its .idx only)."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    dataset = IndexedDataset(check_prefix(prefix), multimodal=False, mmap=True)
    # Sum while `dataset` is alive: sequence_lengths is a view of its mmap, closed when it is collected.
    total = int(dataset.sequence_lengths.sum())
    del dataset
    return total
