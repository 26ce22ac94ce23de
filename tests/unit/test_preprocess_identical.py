"""The .bin/.idx bytes of tools/preprocess_data.py stay what they were, and match megatron.core's writer.

GOLDEN holds the sha256 of the files that preprocess() wrote at commit 2ea52c0 (before the
throughput work of issue 19, when the writer was megatron.core's IndexedDatasetBuilder and
workers were always processes) for the corpus below: FLORES documents in all ten languages,
edge cases (empty and blank-only text, a literal <|endoftext|>, CRLF, emoji, a long
document), bad lines skipped, and all input formats, with two workers in small chunks and with
one worker without EOD. The same bytes must come out of every way of running it: threads in
this process, a process pool, any chunk size.
"""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vepo_mcore.data import preprocess as preprocess_module
from vepo_mcore.data.corpus import flores_documents
from vepo_mcore.data.indexed import DocumentWriter, read_documents, token_dtype
from vepo_mcore.data.preprocess import preprocess
from vepo_mcore.languages import LANGS
from vepo_mcore.tokenizer import load_tokenizer

GOLDEN = {
    "two_workers": {
        ".bin": "891c41b3d2f116a999cec0674e4338f4d1b20ef76d63caf97cdd08bab1d8fb42",
        ".idx": "55a4e7c2962ad81c6ebacdfe754c270f6e5d0d7025d02084138d050058a7383f",
    },
    "inline_no_eod": {
        ".bin": "48a295c1925621908de12f9845a1b2aac96c877805ba63830114abe7c942dea5",
        ".idx": "c24c59971baac47dc586ace113fcf80103861c2f828f2c672237251b6c7e1f2b",
    },
}
# What the same runs counted (documents, tokens, empty documents, bad lines skipped).
GOLDEN_COUNTS = {"two_workers": (152, 53252, 2, 7), "inline_no_eod": (152, 53100, 2, 7)}

EDGE_CASES = [
    "",
    "   ",
    "a literal <|endoftext|> inside the text",
    "emoji 🙂🚀 and a tab\tand a form feed\f",
    "trailing newline inside the field\n",
    " ".join(flores_documents("en", 4)[:12]),  # one long document
]
BAD_LINES = [b'{"tex": "x"}', b"not json", b"\xff\xfe", b'{"text": null}', b"[1]", b""]


def write_corpus(tmp: Path) -> list[Path]:
    """Four inputs (jsonl with bad lines, CRLF txt, jsonl.gz, parquet with a null) in a fixed order."""
    docs = [d for lang in LANGS for d in flores_documents(lang, 4)[:12]]
    lines = [json.dumps({"text": d, "id": i}, ensure_ascii=i % 2 == 0).encode() for i, d in enumerate(docs)]
    lines += [json.dumps({"text": d}, ensure_ascii=False).encode() for d in EDGE_CASES]
    for i, bad in enumerate(BAD_LINES):  # spread through the file, so chunks carry errors
        lines.insert(7 + 13 * i, bad)
    jsonl = tmp / "a.jsonl"
    jsonl.write_bytes(b"\n".join(lines) + b"\n")
    txt = tmp / "b.txt"
    txt.write_bytes("\r\n".join(flores_documents("th", 2)[:9] + ["", "last"]).encode() + b"\r\n")
    gz = tmp / "c.jsonl.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as f:
        for d in flores_documents("km", 3)[:10]:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
    parquet = tmp / "d.parquet"
    pq.write_table(pa.table({"text": flores_documents("lo", 5)[:6] + [None, "end"]}), parquet)
    return [jsonl, txt, gz, parquet]


RUNS = {
    "two_workers": dict(workers=2, chunk_size=7),
    "inline_no_eod": dict(workers=1, append_eod=False),
}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("identical")
    inputs = write_corpus(tmp)
    prefixes = {}
    for name, kwargs in RUNS.items():
        prefix = tmp / f"{name}_text_document"
        summary = preprocess(inputs, prefix, skip_bad_lines=True, progress=False, **kwargs)
        counts = (summary.documents, summary.tokens, summary.empty, sum(summary.skipped.values()))
        prefixes[name] = (prefix, counts)
    return prefixes


@pytest.mark.parametrize("run", sorted(RUNS))
def test_output_bytes_are_the_golden_ones(outputs, run):
    prefix, counts = outputs[run]
    got = {suffix: digest(Path(f"{prefix}{suffix}")) for suffix in (".bin", ".idx")}
    assert got == GOLDEN[run]
    assert counts == GOLDEN_COUNTS[run]


@pytest.mark.parametrize("threads_per_process, workers, chunk_size", [(1, 2, 7), (2, 3, 50), (8, 3, 1000)])
def test_every_way_of_running_writes_the_golden_bytes(
    tmp_path, monkeypatch, threads_per_process, workers, chunk_size
):
    """Process pool (2 x 1 thread, 2 x 2 threads) and 3 threads in-process in one big chunk: same bytes."""
    monkeypatch.setattr(preprocess_module, "THREADS_PER_PROCESS", threads_per_process)
    inputs = write_corpus(tmp_path)
    prefix = tmp_path / "other_text_document"
    preprocess(inputs, prefix, skip_bad_lines=True, progress=False, workers=workers, chunk_size=chunk_size)
    got = {suffix: digest(Path(f"{prefix}{suffix}")) for suffix in (".bin", ".idx")}
    assert got == GOLDEN["two_workers"]


def test_documents_are_the_tokenizer_ids_plus_eod(outputs, tmp_path):
    """Independent of the digests: each document read back by megatron.core is encode(text) + EOD."""
    tok = load_tokenizer()
    docs = read_documents(outputs["two_workers"][0])
    first = [d for lang in LANGS for d in flores_documents(lang, 4)[:12]]
    assert [d.tolist() for d in docs[: len(first)]] == [tok.encode(t) + [tok.eod_id] for t in first]
    tail = [t for t in EDGE_CASES if t]
    got_tail = [d.tolist() for d in docs[len(first) : len(first) + len(tail)]]
    assert got_tail == [tok.encode(t) + [tok.eod_id] for t in tail]


@pytest.mark.parametrize("vocab_size", [18366, 151665])  # uint16 (toy vocabulary) and int32 (Qwen2.5)
def test_writer_matches_megatron_indexed_dataset_builder(tmp_path, vocab_size):
    """DocumentWriter.add / add_many == megatron.core's IndexedDatasetBuilder.add_document, byte for byte."""
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    assert token_dtype(vocab_size) == DType.optimal_dtype(vocab_size)
    rng = np.random.default_rng(vocab_size)
    docs = [rng.integers(0, vocab_size, size=n) for n in rng.integers(1, 300, size=57)]
    builder = IndexedDatasetBuilder(str(tmp_path / "megatron.bin"), dtype=DType.optimal_dtype(vocab_size))
    for d in docs:
        builder.add_document(d, [len(d)])
    builder.finalize(str(tmp_path / "megatron.idx"))
    with DocumentWriter(tmp_path / "one", vocab_size) as writer:
        for d in docs:
            writer.add(d)
    with DocumentWriter(tmp_path / "many", vocab_size) as writer:
        for part in (docs[:1], docs[1:30], [], docs[30:]):
            lengths = [len(d) for d in part]
            writer.add_many(np.concatenate(part) if part else np.zeros(0, np.int64), lengths)
    for suffix in (".bin", ".idx"):
        want = (tmp_path / f"megatron{suffix}").read_bytes()
        assert (tmp_path / f"one{suffix}").read_bytes() == want
        assert (tmp_path / f"many{suffix}").read_bytes() == want
