"""Megatron indexed datasets (.bin/.idx): naming, token dtype, writing documents, reading them back.

The files are megatron.core's IndexedDataset format, the one Megatron-LM's
tools/preprocess_data.py writes, so either tool's output feeds either trainer. Writing needs
numpy only (no megatron.core, no torch); reading goes through megatron.core's IndexedDataset:

    prefix = dataset_prefix("out/cpt", "th")          # out/cpt_th_text_document
    with DocumentWriter(prefix, vocab_size=len(tok)) as writer:
        writer.add(ids)                                # one document (EOD already appended)
    docs = read_documents(prefix)                      # list of numpy arrays
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

# Imported where used: megatron.core (heavy, with torch: only reading datasets back needs it; the tokenising
# tool writes them without it, and the trainers import this module before they take the save folder's lock).


def dataset_prefix(output_prefix: str | Path, lang: str | None = None, key: str = "text") -> str:
    """Megatron-LM naming: `<output_prefix>[_<lang>]_<key>_document` (no .bin/.idx suffix)."""
    parts = [str(output_prefix)]
    if lang:
        parts.append(lang)
    parts.append(f"{key}_document")
    return "_".join(parts)


# megatron.core.datasets.indexed_dataset's .idx layout (_IndexWriter), written here so that the
# tokenising tool does not import megatron.core (and torch): that import was most of its start-up.
# tests/unit/test_preprocess_identical.py checks the bytes against megatron.core's own writer.
_INDEX_HEADER = b"MMIDIDX\x00\x00"
_INDEX_VERSION = 1
_DTYPE_CODES = {np.uint16: 8, np.int32: 4}  # megatron.core's DType enum values


def token_dtype(vocab_size: int) -> type[np.number]:
    """Smallest dtype Megatron-LM picks for the ids (DType.optimal_dtype): uint16 below 65,500 ids, else int32."""
    return np.uint16 if vocab_size < 65500 else np.int32


class DocumentWriter:
    """Writes documents to `<prefix>.bin` / `<prefix>.idx` in megatron.core's IndexedDataset format.

    One document = one sequence (Megatron-LM's default without sentence splitting); the files
    are byte for byte what megatron.core's IndexedDatasetBuilder.add_document + finalize write.
    On an exception inside the `with` block the partial files are removed, so a failed run
    never leaves a .bin without its .idx.
    """

    def __init__(self, prefix: str | Path, vocab_size: int):
        self.prefix = str(prefix)
        self.dtype = token_dtype(vocab_size)
        Path(self.prefix).parent.mkdir(parents=True, exist_ok=True)
        self._data_file = open(self.prefix + ".bin", "wb")  # noqa: SIM115 (closed by finalize/abort)
        self._lengths: list[np.ndarray] = []
        self.num_documents = 0
        self.num_tokens = 0

    def add(self, ids: np.ndarray | list[int]) -> None:
        """Append one document of token ids [n] (n > 0)."""
        ids = np.asarray(ids, dtype=self.dtype)
        self.add_many(ids, [ids.size])

    def add_many(self, flat: np.ndarray, lengths: np.ndarray | list[int]) -> None:
        """Append len(lengths) documents stored back to back in flat [sum(lengths)] (one write call)."""
        flat = np.ascontiguousarray(flat, dtype=self.dtype)
        lengths = np.asarray(lengths, dtype=np.int64)
        if int(lengths.sum()) != flat.size:
            raise ValueError(f"lengths sum to {int(lengths.sum())} but {flat.size} tokens were given")
        if not lengths.size:
            return
        self._data_file.write(flat.data)
        self._lengths.append(lengths)
        self.num_documents += int(lengths.size)
        self.num_tokens += int(flat.size)

    def finalize(self) -> None:
        """Close the .bin and write the .idx: header, counts, lengths, byte offsets, document bounds."""
        self._data_file.close()
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int64)
        offsets = np.zeros(lengths.size, dtype=np.int64)
        np.cumsum(lengths[:-1] * np.dtype(self.dtype).itemsize, out=offsets[1:])
        # One sequence per document, so document d ends after sequence d: bounds are 0..n.
        bounds = np.arange(lengths.size + 1, dtype=np.int64)
        with open(self.prefix + ".idx", "wb") as f:
            f.write(_INDEX_HEADER)
            f.write(struct.pack("<Q", _INDEX_VERSION))
            f.write(struct.pack("<B", _DTYPE_CODES[self.dtype]))
            f.write(struct.pack("<Q", lengths.size))  # sequences
            f.write(struct.pack("<Q", bounds.size))  # document bounds (documents + 1)
            f.write(lengths.astype(np.int32).tobytes())
            f.write(offsets.tobytes())
            f.write(bounds.tobytes())

    def abort(self) -> None:
        self._data_file.close()
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
