"""The RL trainer end to end on the tiny model with the embedded engine: it runs, logs what SPEC
lists, checkpoints, resumes exactly, and the 7B recipe validates on CPU."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vepo_mcore.config import JobConfig, load_config
from vepo_mcore.eval.heldout import by_direction
from vepo_mcore.parallel.launch import run_processes

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "configs" / "vepo_tiny.yaml"
SMALL = [
    "--rl.prompts_per_step", "2", "--rl.filtering.num_candidates", "3", "--rl.filtering.group_size", "2",
    "--training.micro_batch_size", "2", "--rl.rollout.sampling.max_new_tokens", "6",
    "--rl.directions", "en-th,zh-en", "--training.logging.progress_bar", "false",
]  # fmt: skip


def _cfg(save: Path, iters: int, *extra: str) -> JobConfig:
    return load_config(
        JobConfig,
        TINY,
        [*SMALL, "--training.train_iters", str(iters), "--training.checkpoint.save", str(save), *extra],
    )


def _train(rank, world, cfgs, out):
    from vepo_mcore.rl.trainer import train_rl

    results = [train_rl(cfg) for cfg in cfgs]
    Path(out).write_text(json.dumps(results))


def _run(cfgs, tmp_path) -> list[list[dict]]:
    out = tmp_path / "histories.json"
    run_processes(_train, 1, args=(cfgs, str(out)))
    return json.loads(out.read_text())


SPEC_METRICS = (
    "train/loss", "rl/clip_frac_low", "rl/clip_frac_high", "rl/ratio_mean", "rl/ratio_min", "rl/ratio_max",
    "rollout/entropy", "rollout/len_mean", "reward/mt", "reward/length", "reward/format", "reward/lid",
    "reward/mixing", "rl/adv_mean", "rl/adv_std", "rl/kl_k1", "rl/kl_k2", "rl/kl_k3",
    "constraint/overall", "filter/compliance_rate", "rollout/logprob_mismatch", "rollout_corr/k3",
)  # fmt: skip


def test_rl_runs_logs_checkpoints_and_resumes_exactly(tmp_path):
    straight, first, resumed, sparse_kl = _run(
        [_cfg(tmp_path / "a", 2), _cfg(tmp_path / "b", 1), _cfg(tmp_path / "b", 2),
         _cfg(tmp_path / "c", 2, "--rl.kl.measure_interval", "2")],
        tmp_path,
    )  # fmt: skip
    assert [r["step"] for r in straight] == [1, 2]
    for key in SPEC_METRICS:
        assert key in straight[0], f"missing metric {key}"
        assert all(math.isfinite(r[key]) for r in straight), key
    # The engine samples with the policy being trained: its log-probs match the recomputation.
    assert straight[0]["rollout/logprob_mismatch"] < 1e-4
    for row in straight:  # a mean per direction the step's batch holds
        sampled = {key.split("/")[1] for key in row if key.startswith("rollout/") and key.endswith("/reward")}
        assert sampled and sampled <= {"en-th", "zh-en"}
        assert all(
            math.isfinite(row[f"rollout/{d}/reward"]) and math.isfinite(row[f"rl/{d}/adv_mean"])
            for d in sampled
        )
    assert (tmp_path / "a" / "rl_curves.png").stat().st_size > 10_000
    assert (tmp_path / "a" / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    # 1 step, stop, resume for 1 more == 2 straight steps: same samples, same losses.
    assert [r["step"] for r in first] == [1] and [r["step"] for r in resumed] == [2]
    for key in (
        "train/loss",
        "rollout/reward_normalised_mean",
        "reward/mt",
        "rl/kl_k3",
        "rollout/len_mean",
        "train/grad_norm",
    ):
        assert resumed[0][key] == straight[1][key], key
    # KL not optimised and measured every 2nd step: the reference pass is skipped in between,
    # and the training itself is unchanged.
    assert "rl/kl_k3" in sparse_kl[0] and "rl/kl_k3" not in sparse_kl[1]
    assert sparse_kl[0]["rl/kl_k3"] == straight[0]["rl/kl_k3"]
    assert sparse_kl[1]["train/loss"] == straight[1]["train/loss"]


def _reference_precision(rank, world, cfg, out):
    from vepo_mcore.rl.trainer import RLTrainer

    trainer = RLTrainer(cfg)
    dtypes = {str(p.dtype) for p in trainer.reference.parameters()}
    metrics, _ = trainer.step()
    Path(out).write_text(
        json.dumps({"dtypes": sorted(dtypes), "k1": metrics["rl/kl_k1"], "k3": metrics["rl/kl_k3"]})
    )


def test_the_reference_runs_in_the_policys_precision_and_starts_at_kl_zero(tmp_path):
    """Under bf16 every reference parameter is bf16 (as the policy's, norms included), and before
    the first update the reference and the policy give the same log-probs: KL exactly 0."""
    out = tmp_path / "ref.json"
    run_processes(
        _reference_precision, 1, args=(_cfg(tmp_path / "bf16", 1, "--training.bf16", "true"), str(out))
    )
    ref = json.loads(out.read_text())
    assert ref["dtypes"] == ["torch.bfloat16"]
    assert ref["k1"] == 0.0 and ref["k3"] == 0.0


def _loaded_policy(rank, world, saved, loaded, out):
    import torch

    from vepo_mcore.rl.trainer import RLTrainer
    from vepo_mcore.training.optimizer import unwrap

    first = RLTrainer(saved)
    first.step()
    first.save()
    trained = {k: v.detach().clone() for k, v in unwrap(first.model).state_dict().items() if v is not None}
    second = RLTrainer(loaded)  # policy and reference allocated uninitialised, then loaded
    state = {k: v for k, v in unwrap(second.model).state_dict().items() if v is not None}
    ref = {k: v for k, v in unwrap(second.reference).state_dict().items() if v is not None}
    differ = [k for k, v in trained.items() if hasattr(v, "shape") and not torch.equal(state[k], v)]
    differ_ref = [k for k, v in trained.items() if hasattr(v, "shape") and not torch.equal(ref[k], v)]
    Path(out).write_text(json.dumps({"keys": len(trained), "policy": differ, "reference": differ_ref}))


def test_rl_from_a_checkpoint_starts_at_its_weights(tmp_path):
    """A policy built for training.checkpoint.load is not initialised (the load overwrites it), nor is
    the reference (a copy of the policy): every weight must come from the checkpoint."""
    saved = _cfg(tmp_path / "first", 1)
    loaded = _cfg(tmp_path / "second", 1, "--training.checkpoint.load", str(tmp_path / "first"))
    out = tmp_path / "loaded.json"
    run_processes(_loaded_policy, 1, args=(saved, loaded, str(out)))
    result = json.loads(out.read_text())
    assert result["keys"] > 10 and result["policy"] == [] and result["reference"] == []


@pytest.mark.parametrize("loss", ["grpo", "ppo", "dapo"])
def test_other_losses_run_through_the_trainer(tmp_path, loss):
    (hist,) = _run([_cfg(tmp_path / loss, 1, "--rl.loss.name", loss, "--rl.kl.estimator", "k3")], tmp_path)
    assert math.isfinite(hist[0]["train/loss"])
    if loss == "ppo":
        assert "critic/loss" in hist[0]
    if loss == "dapo":  # decided on the whole rollout batch, so groups split over micro-batches train
        assert 0.0 < hist[0]["rl/dynamic_sampling_kept"] <= 1.0


def test_the_toy_grids_settings_act_and_the_tau1_ratio_keeps_the_tempered_entropy(tmp_path):
    """K > G: RLVR filtering removes candidates; two updates per rollout batch: the second one's ratio
    leaves 1. The tau-1 ratio ablation samples the same rollout and reads the same tempered entropy."""
    grid = ["--rl.mini_batches", "2", "--rl.rollout.sampling.temperature", "0.4"]
    full, tau1 = _run([_cfg(tmp_path / "full", 1, *grid),
                       _cfg(tmp_path / "tau1", 1, *grid, "--rl.loss.ratio_mode", "untempered")], tmp_path)  # fmt: skip
    for hist in (full, tau1):
        assert hist[0]["filter/filtered_share"] == pytest.approx(1 / 3)  # K = 3 -> G = 2
        assert -1.0 <= hist[0]["rollout/entropy_len_corr"] <= 1.0
        assert hist[0]["rl/ratio_max"] > 1.0 or hist[0]["rl/ratio_min"] < 1.0
    assert full[0]["rollout/len_mean"] == tau1[0]["rollout/len_mean"]
    assert full[0]["rollout/entropy"] == pytest.approx(tau1[0]["rollout/entropy"], abs=1e-6)
    assert full[0]["rl/ratio_max"] != tau1[0]["rl/ratio_max"]


def test_dynamic_sampling_with_only_constant_groups_trains_on(tmp_path):
    # No reward term active: every group of every round has one reward. The step must run on (zero
    # advantages) instead of ending the run, as it would without dynamic sampling.
    off = ["--rl.rewards.mt", "none"]
    for term in ("length", "format", "lid", "mixing"):
        off += [f"--rl.rewards.weights.{term}", "0"]
    (hist,) = _run([_cfg(tmp_path / "ds", 1, "--rl.filtering.dynamic_sampling", "true", *off)], tmp_path)
    assert hist[0]["rollout/ds_exhausted"] == 1.0 and hist[0]["rollout/sampling_rounds"] == 4.0
    assert hist[0]["filter/groups_kept"] == 0.0 and math.isfinite(hist[0]["train/loss"])
    assert abs(hist[0]["rl/adv_mean"]) < 1e-6 and hist[0]["rl/adv_std"] < 1e-6


def test_validation_every_eval_interval_scores_held_out_dev_prompts_like_eval_heldout(tmp_path):
    """rl.eval_sentences on 2 data-parallel ranks: valid/* rows at each eval_interval step, equal to
    tools/eval_heldout.py's summary of the saved policy on the same sentences."""
    cfg = _cfg(tmp_path / "v", 2, "--rl.prompt_sentences", ":990", "--rl.eval_sentences", "990:993",
               "--training.eval_interval", "1")  # fmt: skip
    out = tmp_path / "hist.json"
    run_processes(_train, 2, args=([cfg], str(out)))
    (hist,) = json.loads(out.read_text())
    assert [r["step"] for r in hist] == [1, 2]
    ref = tmp_path / "ref.jsonl"
    tool = [sys.executable, str(ROOT / "tools" / "eval_heldout.py"), "--checkpoint", str(tmp_path / "v"),
            "--directions", "en-th,zh-en", "--split", "dev", "--sentences", "990:993", "--max-new-tokens", "6",
            "--out", str(ref)]  # fmt: skip
    done = subprocess.run(tool, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    expected = json.loads(done.stdout.strip().splitlines()[-1])
    records = [json.loads(line) for line in ref.read_text().splitlines()]
    assert sorted({r["index"] for r in records}) == [990, 991, 992]
    assert {"en-th/overall_pass", "zh-en/chrf"} <= set(by_direction(records))
    for key, value in by_direction(records).items():
        assert hist[1][f"valid/{key}"] == pytest.approx(value, abs=1e-9), key
    assert set(expected) >= {"stop_rate", "overall_pass", "chrf", "lang_pass"}
    for key, value in expected.items():
        assert hist[1][f"valid/{key}"] == pytest.approx(value, abs=1e-9, nan_ok=True), key
    assert hist[0]["valid/prompts"] == hist[1]["valid/prompts"] == 6  # 3 sentences x 2 directions, once each
    assert (tmp_path / "v" / "rl_curves.png").stat().st_size > 10_000  # with the validation panels


RL_LINE = re.compile(
    r"^\[[\d: -]+\] iteration (\d)/2 \| consumed samples (\d+) \| consumed tokens [\d,]+ \| elapsed time per "
    r"iteration \(ms\) [\d.]+ \| tokens/s [\d,]+ \| TFLOP/s per device [\d.e+-]+ \| lr [\d.E+-]+ \| loss [\d.e+-]+ \| "
    r"grad norm [\d.]+ \| skipped 0 \| nan 0 \| peak memory [\d.]+ GiB \((RSS|GPU)\) \| "
    r"reward [\d.-]+ \(mt [\d.-]+ length [\d.-]+ format [\d.-]+ lid [\d.-]+ mixing [\d.-]+\) \| "
    r"response length [\d.]+ \| entropy [\d.]+ \| kl [\d.e+-]+ \| clip frac [\d.]+ \| "
    r"time rollout/sync/logprobs/train \(s\) [\d.]+/[\d.]+/[\d.]+/[\d.]+ \| eta [\d:]+$"
)


def test_the_console_prints_one_line_per_rl_step_with_its_rewards_and_time_split(tmp_path):
    """tools/train_vepo.py with stdout redirected to a file, as a user's `> log`: one line per step."""
    log = tmp_path / "stdout.log"
    tool = [sys.executable, str(ROOT / "tools/train_vepo.py"), "--config", str(TINY), *SMALL,
            "--training.train_iters", "2", "--training.checkpoint.save", str(tmp_path / "rl")]  # fmt: skip
    with log.open("w") as stdout:
        done = subprocess.run(tool, stdout=stdout, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in log.read_text().splitlines() if " iteration " in line]
    assert [RL_LINE.match(line).groups()[:2] for line in lines] == [("1", "4"), ("2", "8")], lines
    assert re.search(
        r"^saved checkpoint iter_0000002 to .* \([\d.]+ MiB\) in [\d.]+ s$", log.read_text(), re.M
    )


def test_validation_sentences_are_refused_when_they_overlap_training_or_never_run():
    with pytest.raises(ValueError, match="overlaps rl.prompt_sentences"):
        _cfg(Path("unused"), 1, "--rl.eval_sentences", "990:", "--training.eval_interval", "1")
    with pytest.raises(ValueError, match="overlaps rl.prompt_sentences '800:'"):
        _cfg(Path("unused"), 1, "--rl.prompt_sentences", "800:", "--rl.eval_sentences", "700:801",
             "--training.eval_interval", "1")  # fmt: skip
    with pytest.raises(ValueError, match="set training.eval_interval"):
        _cfg(Path("unused"), 1, "--rl.prompt_sentences", "800:", "--rl.eval_sentences", "700:800")
    ok = _cfg(Path("unused"), 1, "--rl.prompt_sentences", "800:", "--rl.eval_sentences", "700:800",
              "--training.eval_interval", "1")  # fmt: skip
    assert ok.rl.eval_sentences == "700:800"


def test_7b_recipe_validates_on_cpu():
    env = {**os.environ, "PYTHON": sys.executable}
    ok = subprocess.run(
        ["bash", "examples/vepo_rl_7b.sh", "--dry-run", "--world-size", "32"],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert "config OK" in ok.stderr and "num_layers: 28" in ok.stdout
    bad = subprocess.run(
        ["bash", "examples/vepo_rl_7b.sh", "--dry-run", "--world-size", "24"],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert bad.returncode != 0 and "rl.prompts_per_step" in bad.stderr


def _save_tiny_rm(rank, world, path):
    from vepo_mcore.config import JobConfig
    from vepo_mcore.languages import default_tokenizer_dir
    from vepo_mcore.parallel import init_model_parallel
    from vepo_mcore.rm.model import build_reward_model
    from vepo_mcore.training.checkpointing import save_checkpoint

    cfg = load_config(
        JobConfig, ROOT / "examples" / "configs" / "rm_tiny.yaml", ["--training.seq_length", "64"]
    )
    init_model_parallel(cfg.parallel, seed=5)
    save_checkpoint(path, 1, build_reward_model(cfg), config=cfg, tokenizer_dir=default_tokenizer_dir())


def test_reward_model_serves_as_r_mt_in_the_trainer(tmp_path):
    """rl.rewards.mt = rm: the same rollouts (same seeds) get the RM's scores as R_mt instead of
    chrF++, and every other term is unchanged."""
    from vepo_mcore.rm import reward as rm_term

    run_processes(_save_tiny_rm, 1, args=(str(tmp_path / "rm"),))
    rm_term.clear_cache()
    chrf, rm = _run(
        [
            _cfg(tmp_path / "chrf", 1),
            _cfg(
                tmp_path / "with_rm",
                1,
                "--rl.rewards.mt",
                "rm",
                "--rl.rewards.rm_checkpoint",
                str(tmp_path / "rm"),
            ),
        ],
        tmp_path,
    )
    for term in ("reward/lid", "reward/length", "reward/mixing", "reward/format"):
        assert rm[0][term] == chrf[0][term], term
    assert rm[0]["reward/mt"] != chrf[0]["reward/mt"] and math.isfinite(rm[0]["reward/mt"])
    assert math.isfinite(rm[0]["train/loss"])


def test_rollout_correction_runs_on_the_embedded_engines_logprobs(tmp_path):
    """The embedded engine returns its log-probs, so rl.rollout_correction runs on CPU. It samples
    with the policy being trained: the mismatch is about 0 and no response is masked."""
    cfg = _cfg(tmp_path / "mis", 1, "--rl.rollout_correction.mode", "mask", "--rl.rollout_correction.level",
               "geometric")  # fmt: skip
    ((step,),) = _run([cfg], tmp_path)
    assert 0.0 <= step["rollout_corr/k3"] < 1e-6 and math.isfinite(step["train/loss"])
    assert step["rollout_corr/masked_token_frac"] == step["rollout_corr/masked_seq_frac"] == 0.0
    assert step["rollout_corr/ratio_max"] == pytest.approx(1.0, abs=1e-3)
    assert step["rollout_corr/weight_mean"] == pytest.approx(1.0, abs=1e-3)
