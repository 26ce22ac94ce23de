"""Raw text (jsonl / txt / parquet) -> Megatron indexed dataset, tokenised by a process pool.

    summary = preprocess(["th.jsonl"], "out/cpt_th_text_document", workers=4)
    print(summary.report())

Reading stays in the main thread (files are read as bytes, line by line, so a bad line is
reported with its file and line number); decoding, JSON parsing and tokenisation run on chunks
of lines, results in input order. Up to THREADS_PER_PROCESS workers are threads of `tokenizers`'
own pool in this process: two Python threads take turns on the chunks, so one converts ids while
the other's encode_batch runs (it releases the GIL), and there is no pickling and no second copy
of the tokenizer. More workers than that start processes (`Pool.imap`), each with a share of
the threads, so the Python work per chunk is spread too. Each document gets the EOD token
appended (Megatron-LM's --append-eod). A bad line (invalid UTF-8, bad JSON, missing or
non-string text field, null parquet cell) stops the run with a ValueError naming file and
line, or with `skip_bad_lines` is skipped and counted in the summary; empty documents are
never written (as in Megatron-LM) and are counted too. Nothing is dropped silently.
"""

from __future__ import annotations

import gzip
import json
import multiprocessing
import os
import time
from collections import Counter, deque
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from vepo_mcore.data.indexed import DocumentWriter
from vepo_mcore.tokenizer import load_tokenizer

# Imported where used: pyarrow.parquet (~0.3 s; only parquet inputs need it).

FORMATS = ("jsonl", "txt", "parquet")
_EXTENSIONS = {".jsonl": "jsonl", ".json": "jsonl", ".txt": "txt", ".text": "txt", ".parquet": "parquet"}


def detect_format(path: str | Path) -> str:
    """'jsonl' / 'txt' / 'parquet' from the file name (a trailing .gz is allowed for jsonl and txt)."""
    name = Path(path).name
    if name.endswith(".gz"):
        name = name[:-3]
    fmt = _EXTENSIONS.get(Path(name).suffix.lower())
    if fmt is None:
        raise ValueError(
            f"cannot tell the format of {path} from its extension; known: "
            f"{', '.join(sorted(_EXTENSIONS))} (optionally .gz), or pass the format explicitly ({', '.join(FORMATS)})"
        )
    return fmt


class BadInputError(ValueError):
    """A line of the input that cannot become a document (the message names file and line)."""


@dataclass
class PreprocessSummary:
    """What one preprocess run read and wrote."""

    prefix: str
    files: list[str]
    documents: int = 0
    tokens: int = 0
    empty: int = 0
    skipped: Counter = field(default_factory=Counter)
    """Reason -> count of bad lines skipped with skip_bad_lines."""
    skipped_examples: list[str] = field(default_factory=list)
    """The first few skipped lines as 'file:line: reason'."""
    seconds: float = 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def report(self) -> str:
        lines = [
            f"wrote {self.prefix}.bin/.idx: {self.documents:,} documents, {self.tokens:,} tokens "
            f"from {len(self.files)} file(s) in {self.seconds:.1f}s "
            f"({self.documents / max(self.seconds, 1e-9):,.0f} docs/s, {self.tokens_per_second:,.0f} tokens/s)",
            f"empty documents not written: {self.empty:,}",
            f"bad lines skipped: {sum(self.skipped.values()):,}"
            + (
                f" ({', '.join(f'{k}: {v}' for k, v in sorted(self.skipped.items()))})"
                if self.skipped
                else ""
            ),
        ]
        lines += [f"  e.g. {example}" for example in self.skipped_examples]
        return "\n".join(lines)


# ---------------------------------------------------------------- reading (main process)


def _open_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as f:
        yield from enumerate(f, start=1)


def _parquet_rows(path: Path, text_key: str, batch_size: int) -> Iterator[tuple[int, str | None]]:
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises its own error types for a corrupt file
        raise BadInputError(f"{path}: not a readable parquet file ({exc})") from exc
    columns = parquet.schema_arrow.names
    if text_key not in columns:
        raise BadInputError(f"{path}: no column {text_key!r}; columns: {columns}")
    row = 0
    for batch in parquet.iter_batches(columns=[text_key], batch_size=batch_size):
        for value in batch.column(0).to_pylist():
            row += 1
            yield row, value


def _records(path: Path, fmt: str, text_key: str, chunk_size: int) -> Iterator[tuple[int, object]]:
    """(line number, raw payload) of one input file; payloads are decoded by the workers."""
    if fmt == "parquet":
        yield from _parquet_rows(path, text_key, chunk_size)
        return
    line_no = 0
    try:
        for line_no, raw in _open_lines(path):
            yield line_no, raw
    except (OSError, EOFError) as exc:  # e.g. a truncated or corrupt .gz, a disk error
        raise BadInputError(f"{path}:{line_no + 1}: cannot read the file ({exc})") from exc


def _chunks(
    paths: list[Path], formats: list[str], text_key: str, chunk_size: int
) -> Iterator[tuple[int, str, list[tuple[int, object]]]]:
    """(file index, format, [(line, payload), ...]) chunks of at most chunk_size records, in order."""
    for file_index, (path, fmt) in enumerate(zip(paths, formats)):
        chunk: list[tuple[int, object]] = []
        for record in _records(path, fmt, text_key, chunk_size):
            chunk.append(record)
            if len(chunk) == chunk_size:
                yield file_index, fmt, chunk
                chunk = []
        if chunk:
            yield file_index, fmt, chunk


# ---------------------------------------------------------------- tokenising (workers)

_WORKER: dict = {}


THREADS_PER_PROCESS = 8
"""Most tokenizer threads one process drives: beyond it, its Python work (JSON, ids) is the limit."""


def _init_worker(
    tokenizer_dir: str | None, text_key: str, append_eod: bool, dtype: type, threads: int
) -> None:
    # `threads` is this process's share of --workers. tokenizers sizes its pool from RAYON_NUM_THREADS
    # when it first encodes in parallel (a pool already started in this process keeps its size). A
    # TOKENIZERS_PARALLELISM=false already set is kept (one thread): the user's choice, or tokenizers'
    # own in a process forked after its pool started, where that pool would deadlock.
    if os.environ.get("TOKENIZERS_PARALLELISM", "").lower() not in ("false", "0", "off", "no"):
        os.environ["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"
        os.environ["RAYON_NUM_THREADS"] = str(threads)
    tok = load_tokenizer(tokenizer_dir)
    _WORKER.update(tok=tok, text_key=text_key, append_eod=append_eod, dtype=dtype)


def _decode(payload: object, fmt: str, text_key: str) -> str:
    """Raw payload -> document text, or ValueError with a short reason (no file/line: the caller adds them)."""
    if fmt == "parquet":
        if not isinstance(payload, str):
            raise ValueError(f"null or non-string value in column {text_key!r}: {type(payload).__name__}")
        return payload
    try:
        line = payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"invalid UTF-8 at byte {exc.start}") from None
    line = line.rstrip("\r\n") if fmt == "txt" else line
    if fmt == "txt":
        return line
    if not line.strip():
        raise ValueError("blank line, expected a JSON object")
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"bad JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(record, dict):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    if text_key not in record:
        raise ValueError(f"missing field {text_key!r} (fields: {sorted(record)[:10]})")
    text = record[text_key]
    if not isinstance(text, str):
        raise ValueError(f"field {text_key!r} is {type(text).__name__}, expected a string")
    return text


def _reason_kind(reason: str) -> str:
    """Short category of a bad-line reason for the summary counts."""
    for kind in (
        "invalid UTF-8",
        "bad JSON",
        "missing field",
        "expected a JSON object",
        "blank line",
        "null",
    ):
        if reason.startswith(kind):
            return kind
    return "wrong type"


def _encode_chunk(job: tuple[int, str, list[tuple[int, object]]]) -> tuple:
    """A chunk of raw records -> (file index, lengths [n], tokens [sum], errors [(line, reason)], empty count).

    Token ids travel back as one numpy array per chunk: pickling it is far cheaper than lists of ints.
    """
    file_index, fmt, records = job
    tok, text_key = _WORKER["tok"], _WORKER["text_key"]
    texts, lines, errors, empty = [], [], [], []
    for line_no, payload in records:
        try:
            text = _decode(payload, fmt, text_key)
        except ValueError as exc:
            errors.append((line_no, str(exc)))
            continue
        if text:
            texts.append(text)
            lines.append(line_no)
        else:
            empty.append(line_no)
    encoded = tok.encode_batch(texts) if texts else []
    eod = [tok.eod_id] if _WORKER["append_eod"] else []
    lengths, flat = [], []
    for line_no, ids in zip(lines, encoded):
        if not ids:  # text that tokenises to nothing (cannot happen with byte-level BPE, but be safe)
            empty.append(line_no)
            continue
        flat += ids  # one list of ints, then one C-level conversion: no per-token Python generator
        flat += eod
        lengths.append(len(ids) + len(eod))
    flat = np.array(flat, dtype=_WORKER["dtype"])
    return file_index, np.asarray(lengths, dtype=np.int64), flat, errors, len(empty)


# ---------------------------------------------------------------- driver


def _check_inputs(inputs: list[str | Path], fmt: str | None) -> tuple[list[Path], list[str]]:
    paths, formats = [], []
    if not inputs:
        raise ValueError("no input files given")
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            raise BadInputError(f"input {path} is a directory, expected a .jsonl/.txt/.parquet file")
        if not path.is_file():
            raise FileNotFoundError(f"input file {path} does not exist")
        if not os.access(path, os.R_OK):
            raise BadInputError(f"input file {path} is not readable")
        if fmt is not None and fmt not in FORMATS:
            raise ValueError(f"unknown input format {fmt!r}; known: {', '.join(FORMATS)}")
        paths.append(path)
        formats.append(fmt or detect_format(path))
    return paths, formats


def preprocess(
    inputs: list[str | Path],
    prefix: str | Path,
    *,
    tokenizer_dir: str | Path | None = None,
    text_key: str = "text",
    input_format: str | None = None,
    workers: int = 1,
    append_eod: bool = True,
    skip_bad_lines: bool = False,
    chunk_size: int = 256,
    progress: bool = True,
    max_skipped_examples: int = 5,
) -> PreprocessSummary:
    """Tokenise `inputs` (in order) into `<prefix>.bin/.idx`; returns counts of what was written and skipped.

    workers = tokenizer threads; up to THREADS_PER_PROCESS they run in this process, more are
    spread over a multiprocessing Pool of ceil(workers / THREADS_PER_PROCESS) processes.
    Raises BadInputError (a ValueError) naming file and line on the first bad line unless
    skip_bad_lines; FileNotFoundError for a missing input.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    paths, formats = _check_inputs(inputs, input_format)
    tokenizer_dir = str(tokenizer_dir) if tokenizer_dir is not None else None
    vocab_size = load_tokenizer(tokenizer_dir).vocab_size
    summary = PreprocessSummary(prefix=str(prefix), files=[str(p) for p in paths])
    # vocab_size sets the token dtype; the tokenizer stays cached for the in-process workers.
    writer = DocumentWriter(prefix, vocab_size)
    processes = -(-workers // THREADS_PER_PROCESS)
    init_args = (tokenizer_dir, text_key, append_eod, writer.dtype, -(-workers // processes))
    jobs = _chunks(paths, formats, text_key, chunk_size)
    saved_env = {name: os.environ.get(name) for name in ("TOKENIZERS_PARALLELISM", "RAYON_NUM_THREADS")}
    pool = threads = None
    bar = _progress_bar(progress)
    start = time.perf_counter()
    try:
        with writer:
            if processes == 1:
                _init_worker(*init_args)
                threads = ThreadPoolExecutor(2 if workers > 1 else 1)
                results = _in_order(threads, _encode_chunk, jobs, in_flight=4)
            else:
                # Forked after this process used tokenizers' thread pool, a child finds
                # TOKENIZERS_PARALLELISM=false (set by tokenizers) and _init_worker keeps it.
                pool = multiprocessing.Pool(processes, initializer=_init_worker, initargs=init_args)
                results = pool.imap(_encode_chunk, jobs, chunksize=1)
            for file_index, lengths, flat, errors, empty in results:
                for line_no, reason in errors:
                    where = f"{paths[file_index]}:{line_no}"
                    if not skip_bad_lines:
                        raise BadInputError(
                            f"{where}: {reason} (pass --skip-bad-lines to skip and count such lines)"
                        )
                    summary.skipped[_reason_kind(reason)] += 1
                    if len(summary.skipped_examples) < max_skipped_examples:
                        summary.skipped_examples.append(f"{where}: {reason}")
                summary.empty += empty
                writer.add_many(flat, lengths)
                if bar is not None:
                    bar.update(len(lengths))
                    elapsed = max(time.perf_counter() - start, 1e-9)
                    bar.set_postfix_str(f"{writer.num_tokens / elapsed:,.0f} tok/s", refresh=False)
            summary.documents, summary.tokens = writer.num_documents, writer.num_tokens
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
        if threads is not None:
            threads.shutdown(cancel_futures=True)
        if bar is not None:
            bar.close()
        if processes == 1:  # _init_worker ran in this process: give the caller its environment back
            for name, value in saved_env.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
    summary.seconds = time.perf_counter() - start
    if summary.documents == 0:  # an empty dataset would only fail later, inside megatron's sampler
        for suffix in (".bin", ".idx"):
            Path(f"{prefix}{suffix}").unlink(missing_ok=True)
        skipped = sum(summary.skipped.values())
        raise BadInputError(
            f"no documents in {', '.join(summary.files)} ({summary.empty:,} empty, {skipped:,} bad lines "
            f"skipped); nothing written to {prefix}.bin/.idx. Give a file with text, one document per line "
            f"(jsonl: the text under --json-key, here {text_key!r})"
        )
    return summary


def _in_order(executor: ThreadPoolExecutor, fn, jobs: Iterator, in_flight: int) -> Iterator:
    """fn(job) for each job, run on the executor with at most in_flight jobs read ahead; results in order."""
    pending: deque[Future] = deque()
    for job in jobs:
        pending.append(executor.submit(fn, job))
        if len(pending) >= in_flight:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def _progress_bar(enabled: bool):
    if not enabled:
        return None

    return tqdm(unit=" docs", desc="tokenising", dynamic_ncols=True, mininterval=0.5)
