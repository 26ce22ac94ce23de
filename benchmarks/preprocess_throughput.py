"""Tokenising throughput: tools/preprocess_data.py end to end vs the `tokenizers` encode_batch ceiling.

    python benchmarks/preprocess_throughput.py        # 20,000 documents, 2 workers; about 1 min idle

Corpus: FLORES-200 dev sentences of the ten languages, 4 per document, repeated to --docs jsonl
lines (about 6.9M tokens). Reference (the ceiling): the Hugging Face `tokenizers` Tokenizer loaded
from the same tokenizer.json in this process, `encode_batch(texts, add_special_tokens=False)` on
the same texts already in memory, with its own thread pool of --workers threads
(RAYON_NUM_THREADS), as a user would call it: no reading, parsing or writing. Ours:
`python tools/preprocess_data.py --input corpus.jsonl --workers N` as a subprocess, timed end to
end (interpreter start, imports, tokenizer load, reading and parsing the jsonl, tokenising,
writing the .bin/.idx). The two alternate, --repeats times each, and the best wall time of each
counts: ratio = reference seconds / our seconds on the same texts (goal >= 0.7). Also printed:
the same ratio in CPU seconds, our start-up (the tool on a 10-document corpus), the tool's own
timer, and the load average (the ratio is only meaningful on an otherwise idle machine). The
output is checked: every document must be the reference's ids plus the EOD id.

--megatron-lm DIR also times Megatron-LM's tools/preprocess_data.py on the same corpus
(PYTHONPATH=<checkout>[:--megatron-pythonpath]; its HuggingFaceTokenizer appends eos, which for
Qwen2.5 is <|im_end|>, where we append <|endoftext|>).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vepo_mcore.data.corpus import flores_documents  # noqa: E402
from vepo_mcore.data.indexed import read_documents  # noqa: E402
from vepo_mcore.languages import LANGS, default_tokenizer_dir  # noqa: E402


def corpus_texts(num_docs: int) -> list[str]:
    docs = [d for lang in LANGS for d in flores_documents(lang, 4)]
    return [docs[i % len(docs)] for i in range(num_docs)]


def write_corpus(path: Path, texts: list[str]) -> None:
    with path.open("w", encoding="utf-8") as f:
        for text in texts:
            f.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")


def timed_subprocess(cmd: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of the process and its children, stdout) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout


def ours_command(corpus: Path, prefix: Path, tokenizer_dir: str, workers: int) -> list[str]:
    return [
        sys.executable, str(ROOT / "tools" / "preprocess_data.py"),
        "--input", str(corpus), "--output-prefix", str(prefix),
        "--tokenizer-dir", tokenizer_dir, "--workers", str(workers), "--no-progress",
    ]  # fmt: skip


def megatron_command(args, corpus: Path, prefix: Path) -> tuple[list[str], dict[str, str]]:
    mlm = Path(args.megatron_lm).resolve()
    path = os.pathsep.join([str(mlm)] + ([args.megatron_pythonpath] if args.megatron_pythonpath else []))
    cmd = [
        sys.executable, str(mlm / "tools" / "preprocess_data.py"),
        "--input", str(corpus), "--output-prefix", str(prefix),
        "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", args.tokenizer_dir,
        "--workers", str(args.workers), "--append-eod", "--log-interval", "100000000",
    ]  # fmt: skip
    return cmd, {**os.environ, "PYTHONPATH": path, "PYTHONWARNINGS": "ignore"}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--workers", type=int, default=2, help="our tokenising processes = the reference's threads"
    )
    p.add_argument("--docs", type=int, default=20000, help="documents in the benchmark corpus")
    p.add_argument("--repeats", type=int, default=3, help="alternating runs of each (best counts)")
    p.add_argument("--tokenizer-dir", default=str(default_tokenizer_dir()), help="tokenizer for both")
    p.add_argument("--megatron-lm", default=None, help="also time this Megatron-LM checkout's tool")
    p.add_argument("--megatron-pythonpath", default=None, help="extra PYTHONPATH for Megatron-LM's imports")
    args = p.parse_args()
    if args.megatron_lm and not (Path(args.megatron_lm) / "tools" / "preprocess_data.py").is_file():
        print(f"error: {args.megatron_lm} has no tools/preprocess_data.py", file=sys.stderr)
        return 1
    # The reference's thread pool is sized before `tokenizers` starts it; the tool's own
    # environment gets no such variable (it runs one tokenizer thread per worker process).
    os.environ.setdefault("RAYON_NUM_THREADS", str(args.workers))
    from tokenizers import Tokenizer

    reference = Tokenizer.from_file(str(Path(args.tokenizer_dir) / "tokenizer.json"))
    tool_env = {
        k: v for k, v in os.environ.items() if k not in ("RAYON_NUM_THREADS", "TOKENIZERS_PARALLELISM")
    }
    load_start = os.getloadavg()[0]
    texts = corpus_texts(args.docs)
    wall: dict[str, list[float]] = {"reference": [], "ours": [], "ours_startup": [], "megatron": []}
    cpu: dict[str, list[float]] = {"reference": [], "ours": []}
    tool_timer: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        corpus, small = tmp / "corpus.jsonl", tmp / "small.jsonl"
        write_corpus(corpus, texts)
        write_corpus(small, texts[:10])
        ours = ours_command(corpus, tmp / "ours", args.tokenizer_dir, args.workers)
        for _ in range(args.repeats):
            start, cpu_start = time.perf_counter(), time.process_time()
            encodings = reference.encode_batch(texts, add_special_tokens=False)
            wall["reference"].append(time.perf_counter() - start)
            cpu["reference"].append(time.process_time() - cpu_start)
            seconds, cpu_seconds, out = timed_subprocess(ours, tool_env)
            wall["ours"].append(seconds)
            cpu["ours"].append(cpu_seconds)
            tool_timer.append(float(re.search(r"in ([0-9.]+)s", out).group(1)))
            small_cmd = ours_command(small, tmp / "small", args.tokenizer_dir, args.workers)
            wall["ours_startup"].append(timed_subprocess(small_cmd, tool_env)[0])
            if args.megatron_lm:
                cmd, env = megatron_command(args, corpus, tmp / "megatron")
                wall["megatron"].append(timed_subprocess(cmd, env)[0])
        ref_ids = [e.ids for e in encodings]
        # Read back through megatron.core's reader (its import warns about GPU-only kernels).
        warnings.filterwarnings("ignore", message=".*(Apex|Transformer Engine).*")
        docs = read_documents(tmp / "ours_text_document")
    eod = reference.token_to_id("<|endoftext|>")
    same = len(docs) == len(ref_ids) and all(d.tolist() == ids + [eod] for d, ids in zip(docs, ref_ids))
    if not same:
        print("error: the tool's documents differ from encode_batch's ids + EOD", file=sys.stderr)
        return 1
    tokens = sum(len(ids) for ids in ref_ids)
    best = {name: min(times) for name, times in wall.items() if times}
    ratio = best["reference"] / best["ours"]
    cpu_ratio = min(cpu["reference"]) / min(cpu["ours"])
    load = (load_start + os.getloadavg()[0]) / 2

    print(f"corpus: {args.docs:,} jsonl documents, {tokens:,} tokens (FLORES-200 dev, 10 languages)")
    print(f"workers / reference threads: {args.workers}; load average {load:.1f} on {os.cpu_count()} CPUs")
    print("output == encode_batch ids + EOD: True")
    print(f"{'':<34}{'best s':>8}{'all runs s':>26}{'tok/s':>12}")
    rows = [
        ("tokenizers encode_batch (ceiling)", "reference"),
        ("tools/preprocess_data.py e2e", "ours"),
        ("  its start-up (10 documents)", "ours_startup"),
        ("Megatron-LM preprocess_data.py", "megatron"),
    ]
    for label, name in rows:
        if wall[name]:
            runs = " ".join(f"{t:.2f}" for t in wall[name])
            print(f"{label:<34}{best[name]:>8.2f}{runs:>26}{tokens / best[name]:>12,.0f}")
    print(f"tool's own timer (tokenising + writing): best {min(tool_timer):.2f}s")
    print(
        f"ratio (ours / ceiling, end to end): {ratio:.2f}x wall, {cpu_ratio:.2f}x CPU seconds (goal >= 0.7)"
    )
    record = {
        "bench": "preprocess",
        "ratio": round(ratio, 3),
        "goal": 0.7,
        "higher_is_better": True,
        "cpu_ratio": round(cpu_ratio, 3),
        "tokens": tokens,
        "docs": args.docs,
        "workers": args.workers,
        "reference_s": round(best["reference"], 3),
        "ours_s": round(best["ours"], 3),
        "ours_startup_s": round(best["ours_startup"], 3),
        "tool_timer_s": round(min(tool_timer), 3),
        "load": round(load, 2),
    }
    if wall["megatron"]:
        record["megatron_lm_s"] = round(best["megatron"], 3)
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
