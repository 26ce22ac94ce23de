"""Tokenising throughput: our tools/preprocess_data.py vs Megatron-LM's own, same corpus, tokenizer, workers.

    python benchmarks/preprocess_throughput.py --megatron-lm /path/to/Megatron-LM --workers 2

Megatron-LM's script runs from its checkout (PYTHONPATH=<checkout>[:--megatron-pythonpath], for
packages it imports that vepo_mcore does not need, e.g. six and triton) with its
HuggingFaceTokenizer type pointed at our tokenizer directory. Both tools run as subprocesses
on the same jsonl corpus (FLORES-200 sentences of the ten languages, 4 per document, repeated
to --docs documents), alternating, --repeats times each; the best wall time counts. Startup
(interpreter + imports + tokenizer load) is measured on a 10-document corpus and reported, and
the ratio is given both end to end and with startup subtracted. Tokens are counted from each
output .idx; the token ids of the two outputs are compared (they differ only in the EOD id when
the tokenizer's eos is not <|endoftext|>: Megatron's HuggingFaceTokenizer uses eos, Qwen2.5's
tokenizer_config names <|im_end|>).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vepo_mcore.data.corpus import flores_documents  # noqa: E402
from vepo_mcore.data.indexed import count_tokens, read_documents  # noqa: E402
from vepo_mcore.languages import LANGS, default_tokenizer_dir  # noqa: E402


def write_corpus(path: Path, num_docs: int) -> None:
    docs = [d for lang in LANGS for d in flores_documents(lang, 4)]
    with path.open("w", encoding="utf-8") as f:
        for i in range(num_docs):
            f.write(json.dumps({"text": docs[i % len(docs)]}, ensure_ascii=False) + "\n")


def run(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return seconds


def commands(args, corpus: Path, out: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    tok_dir = str(args.tokenizer_dir)
    base_env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "PYTHONWARNINGS": "ignore"}
    mlm = Path(args.megatron_lm).resolve()
    mlm_path = os.pathsep.join([str(mlm)] + ([args.megatron_pythonpath] if args.megatron_pythonpath else []))
    megatron = [
        sys.executable,
        str(mlm / "tools" / "preprocess_data.py"),
        "--input", str(corpus),
        "--output-prefix", str(out / "megatron"),
        "--tokenizer-type", "HuggingFaceTokenizer",
        "--tokenizer-model", tok_dir,
        "--workers", str(args.workers),
        "--append-eod",
        "--log-interval", "100000000",
    ]  # fmt: skip
    ours = [
        sys.executable,
        str(ROOT / "tools" / "preprocess_data.py"),
        "--input", str(corpus),
        "--output-prefix", str(out / "ours"),
        "--tokenizer-dir", tok_dir,
        "--workers", str(args.workers),
        "--no-progress",
    ]  # fmt: skip
    return {"megatron": (megatron, {**base_env, "PYTHONPATH": mlm_path}), "ours": (ours, base_env)}


def best_times(args, corpus: Path, out: Path, repeats: int) -> dict[str, float]:
    cmds = commands(args, corpus, out)
    times: dict[str, list[float]] = {name: [] for name in cmds}
    for _ in range(repeats):
        for name, (cmd, env) in cmds.items():
            times[name].append(run(cmd, env))
    return {name: min(ts) for name, ts in times.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--megatron-lm", required=True, help="a Megatron-LM checkout (tools/preprocess_data.py)")
    p.add_argument("--megatron-pythonpath", default=None, help="extra PYTHONPATH for Megatron-LM's imports")
    p.add_argument("--workers", type=int, default=2, help="tokenising processes for both tools")
    p.add_argument("--docs", type=int, default=20000, help="documents in the benchmark corpus")
    p.add_argument("--repeats", type=int, default=2, help="runs per tool (best counts)")
    p.add_argument("--tokenizer-dir", default=str(default_tokenizer_dir()), help="tokenizer for both tools")
    args = p.parse_args()
    if not (Path(args.megatron_lm) / "tools" / "preprocess_data.py").is_file():
        print(f"error: {args.megatron_lm} has no tools/preprocess_data.py", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        small, big = tmp / "small.jsonl", tmp / "corpus.jsonl"
        write_corpus(small, 10)
        write_corpus(big, args.docs)
        startup = best_times(args, small, tmp, args.repeats)
        wall = best_times(args, big, tmp, args.repeats)
        prefixes = {"megatron": str(tmp / "megatron_text_document"), "ours": str(tmp / "ours_text_document")}
        tokens = {name: count_tokens(prefix) for name, prefix in prefixes.items()}
        docs = {name: read_documents(prefix) for name, prefix in prefixes.items()}
    same_docs = len(docs["ours"]) == len(docs["megatron"])
    same_ids = same_docs and all((a[:-1] == b[:-1]).all() for a, b in zip(docs["ours"], docs["megatron"]))
    eod = {name: int(d[0][-1]) for name, d in docs.items()}

    print(
        f"corpus: {args.docs:,} documents (FLORES-200, 10 languages), workers={args.workers}, tokenizer {args.tokenizer_dir}"
    )
    print(
        f"token ids identical apart from the final EOD: {same_ids}  (EOD id: ours {eod['ours']}, megatron {eod['megatron']})"
    )
    print(f"{'tool':<10}{'tokens':>12}{'wall s':>9}{'startup s':>11}{'tok/s e2e':>12}{'tok/s net':>12}")
    rate, net = {}, {}
    for name in ("megatron", "ours"):
        rate[name] = tokens[name] / wall[name]
        net[name] = tokens[name] / max(wall[name] - startup[name], 1e-9)
        row = f"{name:<10}{tokens[name]:>12,}{wall[name]:>9.2f}{startup[name]:>11.2f}"
        print(f"{row}{rate[name]:>12,.0f}{net[name]:>12,.0f}")
    print(f"ratio ours/megatron: end to end {rate['ours'] / rate['megatron']:.2f}x, "
          f"startup subtracted {net['ours'] / net['megatron']:.2f}x (goal >= 1.0)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
