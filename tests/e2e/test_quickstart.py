"""The README's main job, end to end, as a small fast variant of the toy recipe on a fixed seed:
every stage runs through the real entry scripts (tokenizer expansion and trimming, base, resize,
CPT, SFT, RL, held-out evaluation, reward model, FLORES scores), the SFT policy learns to stop on
held-out prompts, RL moves a held-out metric the right way, no devtest sentence is in any training
data, and the exported HF checkpoint decodes greedily with transformers exactly like the embedded
engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vepo_mcore.eval.heldout import read_records, summarize
from vepo_mcore.languages import load_flores

ROOT = Path(__file__).resolve().parents[2]
DIRECTIONS = "en-vi,vi-en"
EVAL_SENTENCES = 40
SMALL = "--set all.model.num_layers=2 all.model.hidden_size=128 all.model.ffn_hidden_size=352"


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("qs") / "qs"
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PY": sys.executable, "TORCHRUN": str(bin_dir / "torchrun"), "OUT": str(out),
           "BASE_ITERS": "5", "CPT_ITERS": "20", "SFT_ITERS": "260", "RM_ITERS": "2", "RL_ITERS": "24",
           "EVAL_SENTENCES": str(EVAL_SENTENCES), "DIRECTIONS": DIRECTIONS,
           "TOY_ARGS": f"{SMALL} sft.training.optimizer.lr=3e-3 rl.training.optimizer.lr=5e-5 "
                       "rl.training.optimizer.min_lr=5e-5"}  # fmt: skip
    proc = subprocess.run(
        ["bash", "examples/quickstart_cpu.sh"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return out, proc.stdout


def test_every_stage_runs_and_the_summary_reports(quickstart):
    qs, out = quickstart
    for stage in range(1, 5):
        assert f"[{stage}/4]" in out
    for stage in ("tokenizer_expand", "data_and_trim", "base", "resize", "cpt", "sft", "rl", "eval_rl"):
        assert f"seed0/{stage}:" in out or f"shared/{stage}:" in out, stage
    assert "quickstart summary" in out and "TOK  expanded Qwen2.5 trimmed" in out
    assert "before SFT -> SFT" in out and "SFT -> RL" in out and "paired-bootstrap interval" in out
    assert "RM   pairwise accuracy" in out and "rl_curves.png" in out
    seed = qs / "toy" / "seed0"
    for path in ("cpt/latest_checkpointed_iteration.txt", "sft/latest_checkpointed_iteration.txt",
                 "rl/rl_curves.png", "heldout_rl.jsonl", "hyps_rl/en-vi.txt"):  # fmt: skip
        assert (seed / path).is_file(), path
    for path in ("rm_eval/eval.md", "eval_rl/bootstrap.md"):
        assert (qs / path).is_file(), path
    manifest = json.loads((qs / "toy" / "shared" / "tokenizer" / "toy" / "trim_manifest.json").read_text())
    assert manifest["prefix_size"] < manifest["vocab_size"] < 20_000  # the resize grew a trimmed base


def test_no_devtest_sentence_in_any_training_data(quickstart):
    qs, _ = quickstart
    data = qs / "toy" / "shared" / "data"
    devtest = {line for lang in ("en", "vi") for line in load_flores(lang, "devtest") if len(line) > 20}
    sft = [json.loads(line) for line in (data / "sft" / "translation.jsonl").read_text().splitlines()]
    texts = [m["content"] for c in sft for m in c["messages"]]
    texts += [
        json.loads(line)["text"]
        for f in sorted(data.rglob("cpt_*.jsonl"))
        for line in f.read_text().splitlines()
    ]
    assert len(texts) > 3000
    assert not any(sentence in text for text in texts for sentence in devtest)
    rl = yaml.safe_load((qs / "toy" / "seed0" / "rl" / "config.yaml").read_text())["rl"]
    assert rl["prompt_split"] == "dev"


def _rl_at_another_seed(seed_dir: Path, training_seed: int) -> Path:
    """The quickstart's RL stage again from the same SFT checkpoint (its own config.yaml) at another
    training seed (rollout sampling and data order), then the same held-out evaluation; returns the
    records file."""
    from recipes.toy.recipe import ToyPlan
    from vepo_mcore.parallel.init import free_port

    bin_dir = Path(sys.executable).parent
    save, records = seed_dir / f"rl_seed{training_seed}", seed_dir / f"heldout_rl_seed{training_seed}.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    run = lambda cmd: subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)  # noqa: E731
    proc = run([str(bin_dir / "torchrun"), "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port",
                str(free_port()), "tools/train_vepo.py", "--config", str(seed_dir / "rl" / "config.yaml"), "--training.seed",
                str(training_seed), "--training.checkpoint.save", str(save)])  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    proc = run([sys.executable, "tools/eval_heldout.py", "--checkpoint", str(save), "--directions", DIRECTIONS,
                "--max-sentences", str(EVAL_SENTENCES), "--max-new-tokens", str(ToyPlan.max_new_tokens),
                "--out", str(records)])  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return records


def test_sft_policy_stops_and_rl_moves_a_held_out_metric(quickstart):
    qs, _ = quickstart
    seed = qs / "toy" / "seed0"
    before, sft, rl = (summarize(read_records(seed / f"heldout_{n}.jsonl")) for n in ("cpt", "sft", "rl"))
    # Measured on this variant (2026-11-25): the CPT model never stops within 96 tokens and writes
    # Vietnamese/English 40% of the time; after 260 SFT steps it stops on 81% and passes language
    # 82.5%. 24 RL steps' outcome swings with the last bits of the SFT weights and the RL seed:
    # 2026-11-27, from one SFT policy (overall 37.5), overall after RL 47.5 / 66.2 / 73.8 at RL
    # training seeds 1000 / 2000 / 3000 (the CPU cross-entropy computed vocabulary-major); 63.8 at
    # 1000 with the same SFT answers rounded token-major. 2026-11-26, at RL lr 1e-4: 31.2 and 65.0
    # at two seeds (hence 5e-5 here). So RL runs at two seeds and the mean must gain.
    assert sft["stop_rate"] >= 70.0 and sft["stop_rate"] > before["stop_rate"] + 50.0
    assert sft["lang_pass"] > before["lang_pass"] + 20.0
    rl_again = summarize(read_records(_rl_at_another_seed(seed, 2000)))
    gains = [r["overall_pass"] - sft["overall_pass"] for r in (rl, rl_again)]
    assert sum(gains) / 2 > 10.0, gains


def test_exported_checkpoint_decodes_like_the_embedded_engine(quickstart, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vepo_mcore.tokenizer import load_tokenizer
    from vepo_mcore.translation.directions import parse_directions
    from vepo_mcore.translation.prompts import clean_hypothesis, format_prompt

    qs, _ = quickstart
    seed = qs / "toy" / "seed0"
    hf_dir = tmp_path / "hf_sft"
    subprocess.run([sys.executable, "tools/convert_hf.py", "megatron-to-hf", "--ckpt", str(seed / "sft"),
                    "--out", str(hf_dir)], cwd=ROOT, check=True, capture_output=True)  # fmt: skip
    hf_tokenizer = AutoTokenizer.from_pretrained(str(hf_dir))
    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    ours = load_tokenizer(hf_dir)
    records = {(r["direction"], r["index"]): r for r in read_records(seed / "heldout_sft.jsonl")}
    for direction in parse_directions(DIRECTIONS):
        for index in range(3):
            record = records[(str(direction), index)]
            prompt = format_prompt(direction, record["source"], ours)
            ids = torch.tensor([hf_tokenizer.encode(prompt, add_special_tokens=False)])
            assert ids[0].tolist() == ours.encode(prompt)
            with torch.no_grad():
                out = model.generate(ids, max_new_tokens=96, do_sample=False, eos_token_id=list(ours.stop_ids),
                                     pad_token_id=ours.pad_id)  # fmt: skip
            text = hf_tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
            assert clean_hypothesis(text) == record["hypothesis"], (direction, index)
