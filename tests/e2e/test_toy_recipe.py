"""A small, fast variant of the toy recipe (tools/run_toy.py) on a fixed seed: every stage of the
paper's chain runs through the real entry scripts, the SFT policy learns to stop on held-out prompts,
RL moves a held-out metric the right way, no devtest sentence is in any training data, and the
exported HF checkpoint decodes greedily with transformers to exactly the embedded engine's output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vepo_mcore.eval.heldout import read_records, summarize
from vepo_mcore.languages import load_flores

ROOT = Path(__file__).resolve().parents[2]
DIRECTIONS = "en-vi,vi-en"
SMALL_MODEL = ["all.model.num_layers=2", "all.model.hidden_size=128", "all.model.ffn_hidden_size=352"]
EVAL_SENTENCES = 40


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("toy")
    args = [sys.executable, "tools/run_toy.py", "--out", str(out / "run"), "--seeds", "0",
            "--directions", DIRECTIONS, "--eval-sentences", str(EVAL_SENTENCES), "--max-new-tokens", "64",
            "--iters", "base=5", "cpt=20", "sft=260", "rl=24", "--report-dir", str(out / "report"),
            "--set", *SMALL_MODEL, "sft.training.optimizer.lr=3e-3", "rl.training.optimizer.lr=1e-4"]  # fmt: skip
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_every_stage_ran_and_the_report_has_the_fixed_names(toy):
    summary = json.loads((toy / "report" / "summary.json").read_text())
    keys = {"stop_rate", "lang_pass", "length_pass", "mixing_pass", "overall_pass", "chrf"}
    assert set(summary["sft"]) == set(summary["rl"]) == set(summary["delta_ci95"]) == keys
    assert summary["seeds"] == [0] and summary["wall_s_one_seed"] > 0
    stages = summary["stage_wall_s"]
    for stage in (
        "tokenizer_expand",
        "data_and_trim",
        "base",
        "resize",
        "cpt",
        "sft",
        "rl",
        "eval_sft",
        "eval_rl",
    ):
        assert stages[stage] > 0, stage
    assert (toy / "report" / "rl_curves.png").is_file()
    assert (toy / "report" / "seed0_constraints_rl.md").read_text().count("|") > 10
    manifest = json.loads((toy / "run" / "shared" / "tokenizer" / "toy" / "trim_manifest.json").read_text())
    assert manifest["prefix_size"] < manifest["vocab_size"] < 20_000  # resize grew a trimmed base


def test_no_devtest_sentence_in_training_data(toy):
    shared = toy / "run" / "shared" / "data"
    devtest = {line for lang in ("en", "vi") for line in load_flores(lang, "devtest")}
    sft = [json.loads(line) for line in (shared / "sft" / "translation.jsonl").read_text().splitlines()]
    texts = [m["content"] for c in sft for m in c["messages"]]
    texts += [json.loads(line)["text"] for f in sorted((shared / "cpt").glob("*.jsonl"))
              for line in f.read_text().splitlines()]  # fmt: skip
    assert len(texts) > 3000
    assert not any(sentence in text for text in texts for sentence in devtest if len(sentence) > 20)


def test_sft_policy_stops_and_rl_moves_a_held_out_metric(toy):
    seed = toy / "run" / "seed0"
    before, sft, rl = (summarize(read_records(seed / f"heldout_{n}.jsonl")) for n in ("cpt", "sft", "rl"))
    assert before["stop_rate"] < 50.0  # the CPT model has never seen <|im_end|> end an answer
    assert sft["stop_rate"] >= 90.0
    assert rl["overall_pass"] > sft["overall_pass"] or rl["chrf"] > sft["chrf"]
    assert rl["stop_rate"] >= sft["stop_rate"] - 5.0


def test_exported_checkpoint_decodes_like_the_embedded_engine(toy):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vepo_mcore.eval.directions import parse_directions
    from vepo_mcore.eval.translate import clean_hypothesis, format_prompt

    seed = toy / "run" / "seed0"
    hf_dir = toy / "hf_sft"
    subprocess.run([sys.executable, "tools/convert_hf.py", "megatron-to-hf", "--ckpt", str(seed / "sft"),
                    "--out", str(hf_dir)], cwd=ROOT, check=True, capture_output=True)  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), torch_dtype=torch.float32).eval()
    records = {(r["direction"], r["index"]): r for r in read_records(seed / "heldout_sft.jsonl")}
    from vepo_mcore.tokenizer import load_tokenizer

    ours = load_tokenizer(hf_dir)
    stops = list(ours.stop_ids)
    for direction in parse_directions(DIRECTIONS):
        for index in range(3):
            record = records[(str(direction), index)]
            prompt = format_prompt(direction, record["source"], ours)
            ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)])
            with torch.no_grad():
                out = model.generate(ids, max_new_tokens=64, do_sample=False, eos_token_id=stops,
                                     pad_token_id=ours.pad_id)  # fmt: skip
            text = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
            assert clean_hypothesis(text) == record["hypothesis"], (direction, index)
