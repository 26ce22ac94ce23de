"""tools/preprocess_data.py: raw text -> Megatron indexed dataset, read back with megatron.core's IndexedDataset."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vepo_mcore.data.indexed import dataset_prefix, read_documents, token_dtype
from vepo_mcore.data.preprocess import BadInputError, preprocess
from vepo_mcore.languages import load_flores
from vepo_mcore.tokenizer import load_tokenizer

ROOT = Path(__file__).resolve().parents[2]
DOCS = [
    "Hello world.",
    "สวัสดีครับ ยินดีที่ได้รู้จัก",
    "Xin chào, tôi là một mô hình.",
    "你好，世界",
    "មួយ ពីរ បី",
    "  leading and trailing spaces  ",
]


def expected(docs: list[str]) -> list[list[int]]:
    tok = load_tokenizer()
    return [tok.encode(d) + [tok.eod_id] for d in docs]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text(
        "".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in rows)
    )
    return path


def assert_docs(prefix: str, docs: list[str]) -> None:
    got = read_documents(prefix)
    want = expected(docs)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.tolist() == w


def test_round_trip_jsonl_txt_parquet_in_one_dataset(tmp_path):
    jsonl = write_jsonl(tmp_path / "a.jsonl", [{"text": d, "id": i} for i, d in enumerate(DOCS[:3])])
    txt = tmp_path / "b.txt"
    txt.write_text("\n".join(DOCS[3:5]) + "\n", encoding="utf-8")
    parquet = tmp_path / "c.parquet"
    pq.write_table(pa.table({"text": DOCS[5:], "other": [1]}), parquet)
    prefix = str(tmp_path / "out_text_document")
    summary = preprocess([jsonl, txt, parquet], prefix, progress=False)
    assert_docs(prefix, DOCS)
    assert summary.documents == len(DOCS)
    assert summary.tokens == sum(len(x) for x in expected(DOCS))
    # Qwen2.5's 151,665 ids do not fit uint16: Megatron-LM's rule picks int32.
    assert token_dtype(load_tokenizer().vocab_size) == np.int32
    assert token_dtype(32000) == np.uint16
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ds = IndexedDataset(prefix)
    assert ds.index.dtype == np.int32 and len(ds.document_indices) == len(DOCS) + 1


def test_worker_pool_keeps_order_across_many_chunks(tmp_path):
    docs = load_flores("th", "dev")[:60] + load_flores("en", "dev")[:40]
    jsonl = write_jsonl(tmp_path / "x.jsonl", [{"content": d} for d in docs])
    prefix = str(tmp_path / "pool_text_document")
    preprocess([jsonl], prefix, text_key="content", workers=2, chunk_size=7, progress=False)
    assert_docs(prefix, docs)


def test_no_eod_and_empty_documents_counted(tmp_path):
    jsonl = write_jsonl(tmp_path / "e.jsonl", [{"text": "a b"}, {"text": ""}, {"text": "c"}])
    prefix = str(tmp_path / "e_text_document")
    summary = preprocess([jsonl], prefix, append_eod=False, progress=False)
    tok = load_tokenizer()
    assert [d.tolist() for d in read_documents(prefix)] == [tok.encode("a b"), tok.encode("c")]
    assert summary.empty == 1 and summary.documents == 2


@pytest.mark.parametrize(
    "line, reason",
    [
        ('{"txt": "x"}', "missing field 'text'"),
        ('{"text": 3}', "is int, expected a string"),
        ('{"text": "unterminated', "bad JSON"),
        ("[1, 2]", "expected a JSON object"),
        (b'{"text": "bad \xff byte"}', "invalid UTF-8"),
    ],
)
def test_bad_line_error_names_file_and_line(tmp_path, line, reason):
    path = tmp_path / "bad.jsonl"
    raw = line if isinstance(line, bytes) else line.encode()
    path.write_bytes(b'{"text": "ok"}\n{"text": "ok too"}\n' + raw + b'\n{"text": "after"}\n')
    prefix = str(tmp_path / "bad_text_document")
    with pytest.raises(BadInputError) as err:
        preprocess([path], prefix, progress=False)
    assert f"{path}:3" in str(err.value) and reason in str(err.value)
    # A failed run leaves no half-written dataset behind.
    assert not Path(prefix + ".bin").exists() and not Path(prefix + ".idx").exists()


def test_skip_bad_lines_counts_every_skip(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(
        b'{"text": "one"}\n{"tex": "x"}\nnot json\n{"text": "two"}\n\xff\xfe\n{"text": null}\n{"text": "three"}\n'
    )
    prefix = str(tmp_path / "mixed_text_document")
    summary = preprocess([path], prefix, skip_bad_lines=True, progress=False)
    assert_docs(prefix, ["one", "two", "three"])
    assert summary.skipped == {"missing field": 1, "bad JSON": 1, "invalid UTF-8": 1, "wrong type": 1}
    assert summary.skipped_examples[0].startswith(f"{path}:2: missing field")
    assert "bad lines skipped: 4" in summary.report()


def test_parquet_errors_name_file_and_column(tmp_path):
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"body": ["a", None, "b"]}), path)
    with pytest.raises(BadInputError, match=r"p\.parquet: no column 'text'; columns: \['body'\]"):
        preprocess([path], str(tmp_path / "p1"), progress=False)
    with pytest.raises(BadInputError, match=r"p\.parquet:2: null"):
        preprocess([path], str(tmp_path / "p2"), text_key="body", progress=False)


def test_missing_input_and_unknown_extension(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        preprocess([tmp_path / "nope.jsonl"], str(tmp_path / "x"), progress=False)
    odd = tmp_path / "data.csv"
    odd.write_text("a\n")
    with pytest.raises(ValueError, match="cannot tell the format of .*data.csv"):
        preprocess([odd], str(tmp_path / "x"), progress=False)


def test_cli_uses_megatron_naming_per_language(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "tools"))
    import preprocess_data

    jsonl = write_jsonl(tmp_path / "th.jsonl", [{"text": d} for d in DOCS[:2]])
    out = tmp_path / "out" / "cpt"
    assert (
        preprocess_data.main(
            ["--input", str(jsonl), "--output-prefix", str(out), "--lang", "th", "--no-progress"]
        )
        == 0
    )
    prefix = dataset_prefix(out, "th")
    assert prefix.endswith("out/cpt_th_text_document")
    assert_docs(prefix, DOCS[:2])
    assert "2 documents" in capsys.readouterr().out
    bad = write_jsonl(tmp_path / "bad.jsonl", ["{oops"])
    assert preprocess_data.main(["--input", str(bad), "--output-prefix", str(out), "--no-progress"]) == 1
    assert f"{bad}:1: bad JSON" in capsys.readouterr().err


def test_add_many_writes_the_same_files_as_add(tmp_path):
    from vepo_mcore.data.indexed import DocumentWriter

    docs = expected(DOCS)
    with DocumentWriter(tmp_path / "one", vocab_size=151665) as w:
        for d in docs:
            w.add(d)
    with DocumentWriter(tmp_path / "many", vocab_size=151665) as w:
        w.add_many(np.concatenate(docs[:4]), [len(d) for d in docs[:4]])
        w.add_many(np.concatenate(docs[4:]), [len(d) for d in docs[4:]])
    for suffix in (".bin", ".idx"):
        assert (tmp_path / f"one{suffix}").read_bytes() == (tmp_path / f"many{suffix}").read_bytes()


def test_gzipped_jsonl_and_txt(tmp_path):
    import gzip

    with gzip.open(tmp_path / "a.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(json.dumps({"text": DOCS[1]}, ensure_ascii=False) + "\n")
    with gzip.open(tmp_path / "b.txt.gz", "wt", encoding="utf-8") as f:
        f.write(DOCS[2] + "\n")
    prefix = str(tmp_path / "gz_text_document")
    preprocess([tmp_path / "a.jsonl.gz", tmp_path / "b.txt.gz"], prefix, progress=False)
    assert_docs(prefix, DOCS[1:3])


def test_corrupt_gzip_and_directory_inputs_name_the_file(tmp_path):
    import gzip

    data = gzip.compress(b'{"text": "a"}\n' * 1000)
    bad = tmp_path / "cut.jsonl.gz"
    bad.write_bytes(data[: len(data) // 2])  # truncated archive
    with pytest.raises(BadInputError, match=r"cut\.jsonl\.gz:\d+: cannot read the file"):
        preprocess([bad], str(tmp_path / "x"), workers=2, progress=False)
    with pytest.raises(BadInputError, match="is a directory"):
        preprocess([tmp_path], str(tmp_path / "y"), progress=False)


def test_empty_input_is_an_error_that_writes_nothing(tmp_path, capsys):
    sys.path.insert(0, str(ROOT / "tools"))
    import preprocess_data

    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    blank = write_jsonl(tmp_path / "blank.jsonl", [{"text": ""}, {"text": ""}])
    out = tmp_path / "out"
    assert preprocess_data.main(["--input", str(empty), "--output-prefix", str(out), "--no-progress"]) == 1
    assert f"no documents in {empty} (0 empty, 0 bad lines skipped)" in capsys.readouterr().err
    with pytest.raises(BadInputError, match=r"no documents in .*blank.jsonl \(2 empty.*under --json-key"):
        preprocess([blank], str(out), progress=False)
    assert not list(tmp_path.glob("out*.bin")) and not list(tmp_path.glob("out*.idx"))
