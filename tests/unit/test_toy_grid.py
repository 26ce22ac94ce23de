"""The toy grid (recipes/toy/grid.py) and the claim verdicts (claims.py): the plan, the flags each
run gets (checked by the real config loader), the first/last windows, and every verdict rule on
histories built to satisfy or break it."""

import json
import math

import pytest

from vepo_mcore.config import JobConfig
from vepo_mcore.config.job import job_from_cli
from vepo_mcore.rl.trainer import check_batch_shape, rl_job_config
from recipes.toy import claims
from recipes.toy.grid import (
    GridRun,
    GridSetup,
    grid_records,
    is_complete,
    plan_grid,
    read_histories,
)
from vepo_mcore.training.logging import read_metrics


def test_plan_grid_seeds_the_compared_cells_and_adds_the_overlong_arm():
    runs = plan_grid(seeds=(0, 1, 2))
    names = [r.name for r in runs]
    assert len(names) == len(set(names))
    first = [r for r in runs if r.seed == 0 and not r.overlong]
    assert len(first) == 18  # 6 algorithms x 3 KL regimes
    for seed in (1, 2):
        assert {(r.algorithm, r.kl) for r in runs if r.seed == seed} == {
            (a, kl) for a in ("vepo", "grpo") for kl in ("none", "k2", "k3")
        }
    assert [r for r in runs if r.overlong] == [GridRun("dapo", "none", 0, overlong=True)]
    assert len(runs) == 18 + 12 + 1
    assert runs.index(GridRun("dapo", "none", 0, overlong=True)) < runs.index(GridRun("vepo", "none", 1))
    assert plan_grid(("vepo",), ("k2",), (0,)) == [GridRun("vepo", "k2", 0)]  # no DAPO, no overlong arm


@pytest.mark.parametrize(
    "run",
    [GridRun("vepo", "none", 0), GridRun("dapo", "k3", 1), GridRun("dapo", "none", 0, overlong=True),
     GridRun("ppo", "k2", 2)],
)  # fmt: skip
def test_every_run_is_a_valid_rl_config(run, tmp_path):
    setup = GridSetup(sft=tmp_path / "sft", tokenizer=tmp_path / "tok", vocab_size=18358, prompt_sentences="800:",
                      extra=("--training.micro_batch_size", "8"))  # fmt: skip
    flags = setup.overrides(run, steps=7, out=tmp_path)
    _, cfg = job_from_cli(flags, "")
    assert isinstance(cfg, JobConfig)
    assert (cfg.rl.loss.name, cfg.rl.kl.estimator, cfg.rl.kl.measure_interval) == (run.algorithm, run.kl, 1)
    assert cfg.rl.rollout.sampling.temperature == 1.0
    assert cfg.training.train_iters == 7 and cfg.training.seed == 1000 + run.seed
    assert cfg.training.optimizer.lr == cfg.training.optimizer.min_lr == 2e-4
    assert cfg.rl.prompt_sentences == "800:" and cfg.training.micro_batch_size == 8
    assert cfg.rl.mini_batches == 2  # two updates per rollout batch: the clips act
    assert cfg.rl.filtering.dynamic_sampling == (run.algorithm == "dapo")
    assert cfg.rl.loss.overlong_buffer == (16 if run.overlong else 0)
    assert cfg.training.logging.metrics_jsonl == str(tmp_path / run.name / "metrics.jsonl")
    assert (cfg.training.checkpoint.save is not None) == run.keeps_checkpoint
    check_batch_shape(rl_job_config(cfg), 1)


def _write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _rows(entropy, length=None, reward=None):
    n = len(entropy)
    length = length or [30.0] * n
    reward = reward or [0.5] * n
    return [{"step": i + 1, "rollout/entropy": e, "rollout/len_mean": ln, "reward/total": r}
            for i, (e, ln, r) in enumerate(zip(entropy, length, reward))]  # fmt: skip


def test_records_average_the_first_and_last_tenth_and_skip_restarted_steps(tmp_path):
    run = GridRun("grpo", "none", 0)
    rows = _rows([4.0] * 3 + [3.0] * 24 + [1.0] * 3, length=[20.0] * 3 + [25.0] * 24 + [40.0] * 3)
    # a relaunch appended steps 1-2 again: the later record of a step wins, no step counts twice
    _write(tmp_path / run.name / "metrics.jsonl", rows + _rows([4.0, 4.0], length=[20.0, 20.0]))
    assert len(read_metrics(tmp_path / run.name / "metrics.jsonl")) == 30
    assert is_complete(tmp_path, run, 30) and not is_complete(tmp_path, run, 31)
    (record,) = grid_records(read_histories([run, GridRun("vepo", "none", 0)], tmp_path))  # vepo never ran
    assert record["steps"] == 30 and record["algorithm"] == "grpo"
    assert (record["entropy_first"], record["entropy_last"], record["entropy_min"]) == (4.0, 1.0, 1.0)
    assert (record["length_first"], record["length_last"]) == (20.0, 40.0)


def _record(algorithm, kl, seed, entropy=(3.0, 3.0), length=(30.0, 30.0)):
    return {"algorithm": algorithm, "kl": kl, "seed": seed, "entropy_first": entropy[0], "entropy_last": entropy[1],
            "length_first": length[0], "length_last": length[1]}  # fmt: skip


def _grid(grpo_last=1.5, vepo_last=3.0, ppo_last=1.0, grpo_len=40.0, rloo_len=40.0, vepo_len=31.0):
    records = []
    for seed in (0, 1, 2):
        for kl in ("none", "k2", "k3"):
            records.append(_record("grpo", kl, seed, (3.0, grpo_last + 0.05 * seed), (30.0, grpo_len)))
            records.append(_record("vepo", kl, seed, (3.0, vepo_last - 0.05 * seed), (30.0, vepo_len)))
    records += [
        _record("ppo", "none", 0, (3.0, ppo_last)),
        _record("rloo", "none", 0, length=(30.0, rloo_len)),
    ]
    return records


def test_c2_c3_c4_verdicts_follow_their_rules():
    assert claims.claim_c2(_grid())["verdict"] == claims.REPRODUCED
    assert claims.claim_c2(_grid(grpo_last=2.9))["verdict"] == claims.NOT_REPRODUCED  # no collapse
    assert claims.claim_c2(_grid(vepo_last=5.0))["verdict"] == claims.INCONCLUSIVE  # VEPO leaves its band
    assert claims.claim_c3(_grid())["verdict"] == claims.REPRODUCED
    assert claims.claim_c3(_grid(ppo_last=3.5))["verdict"] == claims.NOT_REPRODUCED
    assert claims.claim_c3(_grid(ppo_last=2.95))["verdict"] == claims.INCONCLUSIVE  # inside VEPO's seeds
    assert claims.claim_c4(_grid())["verdict"] == claims.REPRODUCED
    assert claims.claim_c4(_grid(vepo_len=45.0))["verdict"] == claims.NOT_REPRODUCED
    assert claims.claim_c4(_grid(rloo_len=31.0))["verdict"] == claims.INCONCLUSIVE
    assert claims.claim_c2([])["verdict"] == claims.INCONCLUSIVE


def test_c5_c6_read_oscillation_from_the_histories():
    smooth = _rows([3.0 + 0.01 * i for i in range(20)])
    jumpy = _rows([3.0 + (0.5 if i % 2 else -0.5) for i in range(20)])
    records = _grid()
    assert claims.claim_c5(smooth, jumpy, records)["verdict"] == claims.REPRODUCED
    assert claims.claim_c5(jumpy, smooth, records)["verdict"] == claims.NOT_REPRODUCED
    assert claims.claim_c5(None, jumpy, records)["verdict"] == claims.INCONCLUSIVE
    assert claims.roughness([1.0, 1.0, 1.0]) == 0.0 and claims.roughness([1.0, 3.0, 1.0]) == pytest.approx(
        1.2
    )

    def kl_rows(k1, k2, k3):
        return [
            {"step": i, "rl/kl_k1": a, "rl/kl_k2": b, "rl/kl_k3": c}
            for i, (a, b, c) in enumerate(zip(k1, k2, k3))
        ]

    calm = [0.01 * (1 + i) for i in range(10)]
    noisy = [0.01 * (1 + i) * (3 if i % 2 else -1) for i in range(10)]
    assert claims.claim_c6({"a": kl_rows(noisy, calm, calm)})["verdict"] == claims.REPRODUCED
    assert claims.claim_c6({"a": kl_rows(calm, noisy, calm)})["verdict"] == claims.NOT_REPRODUCED


def test_c1_c7_read_the_toy_summary_and_the_decision_study():
    summary = {"sft": {"overall_pass": 70.0}, "rl": {"overall_pass": 80.0},
               "per_seed": [{"delta_ci95": {"overall_pass": [2.0, 9.0]}}, {"delta_ci95": {"overall_pass": [-1.0, 9.0]}}]}  # fmt: skip
    assert claims.claim_c1(summary)["verdict"] == claims.INCONCLUSIVE  # one seed's interval reaches 0
    summary["per_seed"][1]["delta_ci95"]["overall_pass"] = [0.5, 9.0]
    assert claims.claim_c1(summary)["verdict"] == claims.REPRODUCED
    study = {
        "entropy_delta_ci95": [0.1, 0.3],
        "entropy_sft": 1.0,
        "entropy_rl": 1.2,
        "top1_sft": 0.6,
        "top1_rl": 0.5,
    }
    assert claims.claim_c7(study)["verdict"] == claims.REPRODUCED
    study["entropy_delta_ci95"] = [-0.3, -0.1]
    verdict = claims.claim_c7(study)
    assert verdict["verdict"] == claims.NOT_REPRODUCED and not math.isnan(verdict["evidence"]["entropy_sft"])
    json.dumps(claims.all_claims(_grid(), {}, None, None, None))  # every verdict serialises


def test_the_grid_takes_the_rl_prompts_the_toy_planned(tmp_path):
    from recipes.toy.grid import toy_rl_prompts

    assert toy_rl_prompts(tmp_path) == {}
    planned = {"directions": "en-th,th-en", "prompt_sentences": "800:"}  # what run_seed writes
    (tmp_path / "rl_prompts.json").write_text(json.dumps(planned))
    setup = GridSetup(
        sft=tmp_path / "sft", tokenizer=tmp_path / "tok", vocab_size=10, **toy_rl_prompts(tmp_path)
    )
    assert (setup.directions, setup.prompt_sentences) == ("en-th,th-en", "800:")


def test_a_missing_sft_checkpoint_names_the_command_that_makes_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"tools/run_toy.py --out .* --seeds 3 --no-report"):
        GridSetup.from_toy(tmp_path / "seed3")
