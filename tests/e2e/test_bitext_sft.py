"""The parallel text end to end: tools/build_parallel_corpus.py on the real Firefox language packs
(fetched with apt-get, ~0.8 MB, cached in ~/.cache/vepo_mcore/debs), then a tiny SFT from scratch on
a slice of the English -> Thai pairs; its greedy answers on the in-domain held-out pairs depend on
their source (chrf_source, eval/heldout.py) where the same model one step into training does not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vepo_mcore.data.sft_flores import translation_chat
from vepo_mcore.eval.heldout import paired_deltas, read_records, summarize, write_records
from vepo_mcore.tokenizer import load_tokenizer
from vepo_mcore.tokenizer.trim import trim_tokenizer

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path.home() / ".cache" / "vepo_mcore" / "debs"
PAIRS = 4000
HELD_OUT = 60
MODEL = ["--model.num_layers", "2", "--model.hidden_size", "128", "--model.ffn_hidden_size", "352",
         "--model.num_attention_heads", "4", "--model.num_query_groups", "2", "--model.tie_word_embeddings", "true",
         "--training.micro_batch_size", "8", "--training.global_batch_size", "8", "--training.seq_length", "256",
         "--training.optimizer.lr", "3e-3", "--training.optimizer.min_lr", "3e-4", "--training.scheduler.warmup_iters",
         "20", "--training.logging.log_interval", "50", "--training.seed", "1234"]  # fmt: skip


def _run(args: list[str], cwd: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{' '.join(args[:3])} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"


@pytest.mark.e2e
def test_sft_on_a_slice_of_the_parallel_text_makes_answers_depend_on_their_source(tmp_path):
    py = sys.executable
    _run([py, str(ROOT / "tools/build_parallel_corpus.py"), "--langs", "th", "--sources", "firefox",
          "--heldout", str(HELD_OUT), "--out", "bitext", "--cache", str(CACHE)], tmp_path)  # fmt: skip
    manifest = json.loads((tmp_path / "bitext/data.json").read_text())
    assert manifest["pairs_total"]["th"] > PAIRS and manifest["heldout"]["th"] == HELD_OUT
    assert {s["license"] for s in manifest["sources"]} == {"MPL-2.0"}

    pairs = read_records(tmp_path / "bitext/th/train.jsonl")[:PAIRS]
    held = read_records(tmp_path / "bitext/th/heldout.jsonl")
    train_en = {r["en"] for r in pairs}
    assert not train_en & {r["en"] for r in held}, "held-out pairs never train"
    chats = [translation_chat("en", "th", r["en"], r["text"]) for r in pairs]
    write_records(chats, tmp_path / "sft.jsonl")
    stock = load_tokenizer()
    prompts = [translation_chat("en", "th", r["en"], "")["messages"][:1] for r in held]
    texts = [stock.apply_chat(c["messages"]) for c in chats]
    texts += [stock.apply_chat(p, add_generation_prompt=True) for p in prompts]
    tokenizer = trim_tokenizer(stock.path, texts, tmp_path / "tok", min_count=2)
    vocab = len(load_tokenizer(tokenizer.path))

    phases = json.dumps([{"name": "bitext", "paths": {"bitext": "sft.jsonl"}, "weights": {"bitext": 1.0}}])
    for name, iters in (("before", 1), ("after", 400)):
        _run([py, str(ROOT / "tools/pretrain_cpt.py"), "--config", str(ROOT / "examples/configs/sft_tiny.yaml"),
              *MODEL, "--model.vocab_size", str(vocab), "--tokenizer.path", str(tokenizer.path),
              "--data.sft_phases", phases, "--training.train_iters", str(iters),
              "--training.checkpoint.save", name], tmp_path)  # fmt: skip
        _run([py, str(ROOT / "tools/eval_heldout.py"), "--checkpoint", name, "--directions", "en-th",
              "--bitext", "bitext", "--max-sentences", str(HELD_OUT), "--max-new-tokens", "48",
              "--out", f"{name}.jsonl"], tmp_path)  # fmt: skip
    before, after = read_records(tmp_path / "before.jsonl"), read_records(tmp_path / "after.jsonl")
    assert len(after) == HELD_OUT and after[0]["source"] == held[0]["en"]
    low, high = paired_deltas(before, after)["chrf_source"]
    summary = summarize(after)
    assert low > 0, (summarize(before)["chrf_source"], summary["chrf_source"], low, high)
    assert summary["stop_rate"] > 50
