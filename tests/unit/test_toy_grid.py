"""The toy grid (recipes/toy/grid.py) and the claim verdicts (claims.py): the plan, the flags each
run gets (checked by the real config loader; an ablation differs from full VEPO in one field), the
run loop (validation-chosen checkpoint, held-out records, resume) with the training stubbed, the
records, every verdict rule on histories built to satisfy or break it, the held-out table and the
ablation figure."""

import dataclasses
import json
import math
from pathlib import Path

import pytest

from recipes.toy import claims
from recipes.toy.grid import (
    ABLATIONS,
    GridRun,
    GridSetup,
    grid_records,
    is_complete,
    plan_grid,
    read_heldout,
    read_histories,
    report_plan,
)
from vepo_mcore.config import JobConfig, to_dict
from vepo_mcore.config.job import job_from_cli
from vepo_mcore.rl.trainer import check_batch_shape, rl_job_config
from vepo_mcore.training.logging import read_metrics


def test_plan_grid_seeds_the_compared_cells_and_adds_the_twins_and_the_ablations():
    runs = plan_grid(seeds=(0, 1, 2))
    names = [r.name for r in runs]
    assert len(names) == len(set(names))
    first = [r for r in runs if r.seed == 0 and not r.twin and r.variant == "full"]
    assert len(first) == 12  # 6 algorithms x KL {none, k3}
    for seed in (1, 2):
        assert {(r.algorithm, r.kl) for r in runs if r.seed == seed and r.variant == "full"} == {
            (a, kl) for a in ("vepo", "grpo") for kl in ("none", "k3")
        }
    for seed in (0, 1, 2):
        ablations = [r for r in runs if r.seed == seed and r.variant != "full" and r.kl == "none"]
        assert {r.variant for r in ablations} == set(ABLATIONS)
        assert {r.algorithm for r in ablations} == {"vepo"}
        assert [r for r in runs if r.seed == seed and r.kl == "k3" and r.variant != "full"] == [
            GridRun("vepo", "k3", seed, variant="group_std")
        ]  # the KL arm
    assert [r for r in runs if r.twin] == [GridRun("dapo", "none", 0, twin="overlong"),
                                           GridRun("reinforce_pp", "none", 0, twin="baseline")]  # fmt: skip
    assert len(runs) == 12 + 2 + 6 + 2 * (4 + 6) + 3
    assert GridRun("vepo", "k3", 0, variant="group_std") not in plan_grid(kls=("none",))
    assert GridRun("vepo", "k3", 0, variant="group_std") not in plan_grid(ablations=("seq_mean",))
    assert runs.index(GridRun("dapo", "none", 0, twin="overlong")) < runs.index(GridRun("vepo", "none", 1))
    assert max(runs.index(r) for r in runs if r.seed == 0) < min(runs.index(r) for r in runs if r.seed == 1)
    assert plan_grid(("vepo",), ("k3",), (0,), ablations=()) == [GridRun("vepo", "k3", 0)]
    assert GridRun("vepo", "none", 0, variant="seq_mean").name == "vepo-seq_mean_kl-none_s0"
    with pytest.raises(ValueError, match="variants are ablations of VEPO"):
        GridRun("grpo", "none", 0, variant="seq_mean")
    assert GridRun("reinforce_pp", "none", 0, twin="baseline").name == "reinforce_pp-baseline_kl-none_s0"
    assert (
        GridRun("dapo", "none", 0, twin="overlong").name == "dapo-overlong_kl-none_s0"
    )  # committed runs' names
    with pytest.raises(ValueError, match="twin 'baseline' of 'grpo'"):
        GridRun("grpo", "none", 0, twin="baseline")
    with pytest.raises(ValueError, match="no_entropy_bonus"):
        GridRun("vepo", "none", 0, variant="no_clip")


def test_a_grid_run_on_a_subset_reports_on_every_run_of_the_default_plan_and_its_own():
    subset = plan_grid(("ppo",), ("none", "k2"), (0,), ablations=())
    covered = report_plan(subset)
    assert covered[: len(plan_grid())] == plan_grid()  # the default plan first, in its order
    assert covered[len(plan_grid()) :] == [GridRun("ppo", "k2", 0)]  # then what the subset adds
    assert len(set(covered)) == len(covered)


def _checkpoint(save: Path, weights: bytes, integrity: bool = True) -> Path:
    """A save folder holding one checkpoint whose only weight file holds `weights`."""
    from vepo_mcore.training.checkpointing import write_integrity

    path = save / "iter_0000010"
    path.mkdir(parents=True, exist_ok=True)
    (path / "metadata.json").write_text("{}")
    (path / "__0_0.distcp").write_bytes(weights)
    (path / "config.yaml").write_text(f"saved at {save}")  # differs wherever the checkpoint lives
    if integrity:
        write_integrity(path, {})
    (save / "latest_checkpointed_iteration.txt").write_text("10")
    return save


def _setup(tmp_path, **settings):
    _checkpoint(tmp_path / "sft", b"the SFT weights")
    return GridSetup(sft=tmp_path / "sft", tokenizer=tmp_path / "tok", vocab_size=18358, prompt_sentences="800:947",
                     eval_sentences="947:", **settings)  # fmt: skip


@pytest.mark.parametrize(
    "run",
    [GridRun("vepo", "none", 0), GridRun("dapo", "k3", 1), GridRun("dapo", "none", 0, twin="overlong"),
     GridRun("ppo", "k2", 2), GridRun("vepo", "none", 1, variant="tau1_ratio"),
     GridRun("reinforce_pp", "none", 0, twin="baseline")],
)  # fmt: skip
def test_every_run_is_a_valid_rl_config(run, tmp_path):
    setup = _setup(tmp_path)
    flags = setup.overrides(run, steps=7, out=tmp_path)
    _, cfg = job_from_cli(flags, "")
    assert isinstance(cfg, JobConfig)
    assert (cfg.rl.loss.name, cfg.rl.kl.estimator, cfg.rl.kl.measure_interval) == (run.algorithm, run.kl, 1)
    assert cfg.rl.rollout.sampling.temperature == 0.4  # the recipe's (configs/rl.yaml)
    assert cfg.training.train_iters == 7 and cfg.training.seed == 1000 + run.seed
    per_update = 1e-4 / 4  # the recipe's lr spread over the 4 updates of a batch
    assert cfg.training.optimizer.lr == cfg.training.optimizer.min_lr == per_update
    assert cfg.rl.prompt_sentences == "800:947" and cfg.rl.eval_sentences == "947:"
    # four updates per rollout batch (the ratios leave 1, the clips act); K = 8 -> G = 4 (filtering removes half)
    assert (cfg.rl.mini_batches, cfg.rl.ppo_epochs, cfg.training.micro_batch_size) == (4, 1, 8)
    assert (cfg.rl.filtering.num_candidates, cfg.rl.filtering.group_size) == (8, 4)
    assert cfg.rl.filtering.enabled  # the toy recipe's RL stage trains unfiltered; the grid filters
    assert cfg.rl.filtering.dynamic_sampling == (run.algorithm == "dapo")
    assert cfg.rl.loss.options_of("dapo").overlong_buffer == (16 if run.twin == "overlong" else 0)
    assert cfg.rl.loss.options_of("reinforce_pp").baseline == ("group" if run.twin == "baseline" else "none")
    assert cfg.rl.loss.ratio_mode == ("untempered" if run.variant == "tau1_ratio" else "tempered")
    assert cfg.training.logging.metrics_jsonl == str(tmp_path / run.name / "metrics.jsonl")
    assert cfg.training.checkpoint.save == str(tmp_path / run.name / "checkpoint")
    assert cfg.training.eval_interval == cfg.training.checkpoint.save_interval == 40
    assert cfg.training.checkpoint.keep_last == 0
    assert cfg.training.bf16  # the recipe's; a grid from an fp32 SFT checkpoint trains in fp32:
    assert not job_from_cli(_setup(tmp_path, bf16=False).overrides(run, 7, tmp_path), "")[1].training.bf16
    check_batch_shape(rl_job_config(cfg), 1)
    cfg.rl.validate()
    no_validation = GridSetup(sft=tmp_path / "sft", tokenizer=tmp_path / "tok", vocab_size=18358)
    _, cfg = job_from_cli(no_validation.overrides(run, steps=7, out=tmp_path), "")
    assert cfg.rl.eval_sentences == "" and (cfg.training.checkpoint.save is not None) == run.keeps_checkpoint


def _leaves(tree, prefix=""):
    if dataclasses.is_dataclass(tree):
        tree = to_dict(tree)  # as YAML and dotted flags write it: rl.loss.vepo.alpha
    if isinstance(tree, dict):
        return {k: v for key, value in tree.items() for k, v in _leaves(value, f"{prefix}{key}.").items()}
    return {prefix[:-1]: tree}


@pytest.mark.parametrize("variant", list(ABLATIONS))
def test_an_ablation_differs_from_full_vepo_in_its_one_field(variant, tmp_path):
    setup = _setup(tmp_path)
    full = _leaves(job_from_cli(setup.overrides(GridRun("vepo", "none", 0), 7, tmp_path), "")[1])
    run = GridRun("vepo", "none", 0, variant=variant)
    ablated = _leaves(job_from_cli(setup.overrides(run, 7, tmp_path), "")[1])
    paths = ("training.logging.metrics_jsonl", "training.checkpoint.save")  # the run's own folder
    changed = {k for k in full if full[k] != ablated[k] and k not in paths}
    assert changed == {ABLATIONS[variant][0]}
    assert full[ABLATIONS[variant][0]] != ablated[ABLATIONS[variant][0]]


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
    for i, row in enumerate(rows):
        row.update({"rl/clip_frac": 0.01 * (i % 5), "filter/filtered_share": 0.5, "rl/ratio_max": 1.0 + 0.01 * i,
                    "rollout/group_chrf": 60.0 - i, "rollout/entropy_len_corr": 0.2})  # fmt: skip
    # a relaunch appended steps 1-2 again: the later record of a step wins, no step counts twice
    _write(tmp_path / run.name / "metrics.jsonl", rows + _rows([4.0, 4.0], length=[20.0, 20.0]))
    assert len(read_metrics(tmp_path / run.name / "metrics.jsonl")) == 30
    assert is_complete(tmp_path, run, 30) and not is_complete(tmp_path, run, 31)
    assert not is_complete(tmp_path, run, 30, heldout=True)  # no held-out records yet
    (record,) = grid_records(read_histories([run, GridRun("vepo", "none", 0)], tmp_path))  # vepo never ran
    assert record["steps"] == 30 and record["algorithm"] == "grpo" and record["variant"] == "full"
    assert (record["entropy_first"], record["entropy_last"], record["entropy_min"]) == (4.0, 1.0, 1.0)
    assert record["entropy_half_step"] == 30  # the 5-step mean reaches (3 * 3 + 2 * 1) / 5 < 2 at step 30
    assert (record["length_first"], record["length_last"]) == (20.0, 40.0)
    assert record["clip_fraction_max"] == 0.04 and record["ratio_max"] == pytest.approx(1.29)
    assert record["filtered_share_mean"] == 0.5 and record["entropy_len_corr_mean"] == pytest.approx(0.2)
    assert record["group_chrf_first"] == pytest.approx(59.0) and record["group_chrf_last"] == pytest.approx(
        32.0
    )
    assert record["heldout_chrf"] is None and record["heldout_same_opening"] is None


def _heldout_records(n=4, chrf=20.0):
    """Half en-th (every other sentence passing), half th-en (all passing)."""
    return [{"direction": "en-th" if i < n // 2 else "th-en", "index": i, "source": f"Word {i} here.",
             "reference": "ref text", "hypothesis": "Abc def" if i % 2 else f"Xyz {i}", "stop": True, "lang": True,
             "length": True, "format": True, "mixing": True, "overall": bool(i % 2) or i >= n // 2,
             "chrf": chrf + i, "response_tokens": 5}
            for i in range(n)]  # fmt: skip


def test_run_grid_trains_chooses_the_validated_checkpoint_evaluates_it_and_resumes(tmp_path, monkeypatch):
    """tools/train_vepo.py and eval_heldout.py stubbed: what the loop does around them."""
    from recipes.toy import grid

    calls = []

    def fake_run_logged(args, log_file, threads):
        run_dir = log_file.parent
        calls.append((run_dir.name, log_file.name))
        if log_file.name == "train.log":
            for step in (2, 4):  # validation and checkpoint every 2 steps
                (run_dir / "checkpoint" / f"iter_{step:07d}").mkdir(parents=True)
            rows = _rows([3.0] * 4)
            rows[1].update({"valid/overall_pass": 80.0, "valid/chrf": 20.0})
            rows[3].update({"valid/overall_pass": 85.0, "valid/chrf": 10.0})  # worse sum: step 2 wins
            _write(run_dir / "metrics.jsonl", rows)
        elif log_file.name == "sft_heldout.log":  # the starting point, on the runs' sentences
            assert args[args.index("--checkpoint") + 1] == str(setup.sft)
            _write(Path(args[args.index("--out") + 1]), _heldout_records(chrf=10.0))
        else:
            assert args[args.index("--checkpoint") + 1].endswith("iter_0000002")
            _write(Path(args[args.index("--out") + 1]), _heldout_records())

    monkeypatch.setattr(grid, "run_logged", fake_run_logged)
    setup = _setup(tmp_path, eval_interval=2)
    runs = [GridRun("vepo", "none", 0), GridRun("grpo", "none", 0)]
    grid.run_grid(runs, setup, tmp_path / "out", steps=4, workers=1, log=lambda *_: None)
    assert calls == [("out", "sft_heldout.log")] + [
        (r.name, log) for r in runs for log in ("train.log", "heldout.log")
    ]
    out = tmp_path / "out"
    assert json.loads((out / runs[1].name / "selected.json").read_text())["step"] == 2
    assert (out / runs[0].name / "checkpoint").is_dir()  # the decision-point study reads VEPO's
    assert not (out / runs[1].name / "checkpoint").exists()
    assert all(is_complete(out, r, 4, heldout=True) for r in runs)
    calls.clear()
    grid.run_grid(runs, setup, out, steps=4, workers=1, log=lambda *_: None)
    assert calls == []  # finished runs are skipped
    (out / runs[1].name / "heldout.jsonl").unlink()  # its checkpoints are gone: it trains again
    grid.run_grid(runs, setup, out, steps=4, workers=1, log=lambda *_: None)
    assert calls == [(runs[1].name, "train.log"), (runs[1].name, "heldout.log")]
    records = grid_records(read_histories(runs, out), read_heldout(runs, out))
    assert records[1]["heldout_chrf"] == pytest.approx(21.5) and records[1]["heldout_step"] == 2
    assert records[1]["heldout_overall"] == 75.0 and records[1]["heldout_same_opening"] is not None
    assert records[1]["heldout_overall_worst"] == 50.0 and records[1]["heldout_worst_direction"] == "en-th"
    assert "heldout_chrf_source" in records[1]
    lo, hi = records[1]["heldout_chrf_delta_ci95"]  # every sentence 10 chrF++ above the SFT's
    assert lo == pytest.approx(10.0) and hi == pytest.approx(10.0)
    assert records[1]["heldout_chrf_source_delta_ci95"] is not None


def test_an_interrupted_run_resumes_from_its_checkpoint(tmp_path, monkeypatch):
    """A run stopped after its step-2 checkpoint: relaunched with its checkpoint and rows in place."""
    from recipes.toy import grid
    from vepo_mcore.training.logging import read_metrics

    run, setup, out = GridRun("grpo", "none", 0), _setup(tmp_path, eval_interval=2), tmp_path / "out"
    grid.check_start(out, setup.sft, setup.settings(4))
    run_dir = out / run.name
    (run_dir / "checkpoint" / "iter_0000002").mkdir(parents=True)
    rows = _rows([3.0] * 4)
    rows[1].update({"valid/overall_pass": 80.0, "valid/chrf": 20.0})
    _write(run_dir / "metrics.jsonl", rows[:3])  # killed at step 3: the trainer drops row 3 on resume
    launched = []

    def fake_run_logged(args, log_file, threads):
        if log_file.name == "train.log":
            launched.append(
                (
                    (run_dir / "checkpoint" / "iter_0000002").is_dir(),
                    len(read_metrics(run_dir / "metrics.jsonl")),
                )
            )
            (run_dir / "checkpoint" / "iter_0000004").mkdir()
            _write(run_dir / "metrics.jsonl", rows)
        else:
            _write(Path(args[args.index("--out") + 1]), _heldout_records())

    monkeypatch.setattr(grid, "run_logged", fake_run_logged)
    grid.run_grid([run], setup, out, steps=4, workers=1, log=lambda *_: None)
    assert launched == [(True, 3)]
    assert is_complete(out, run, 4, heldout=True)


def test_a_grid_folder_takes_runs_from_one_starting_checkpoint(tmp_path):
    from recipes.toy.grid import START, check_start, weights_fingerprint

    same = weights_fingerprint(_checkpoint(tmp_path / "a", b"w1"))
    assert weights_fingerprint(_checkpoint(tmp_path / "b", b"w1")) == same  # the weights, not the folder
    assert weights_fingerprint(_checkpoint(tmp_path / "c", b"w1", integrity=False)) == same
    assert weights_fingerprint(_checkpoint(tmp_path / "d", b"w2")) != same
    out = tmp_path / "grid"
    check_start(out, tmp_path / "a")
    assert json.loads((out / START).read_text())["fingerprint"] == same
    check_start(out, tmp_path / "b")  # the same weights elsewhere: runs may be added
    record = json.loads((out / START).read_text())
    record["machine"] = "Some Other CPU, no AMX, torch 2.13.0"
    (out / START).write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"grid: its runs started from .*/a .*on Some Other CPU, no AMX.*"
                       r"here on .*torch .*other kind of CPU.*Move .* aside or pass --out"):  # fmt: skip
        check_start(out, tmp_path / "d")
    (out / START).unlink()
    (out / "vepo_kl-none_s0").mkdir()
    with pytest.raises(ValueError, match="holds runs but no start.json"):
        check_start(out, tmp_path / "a")
    with pytest.raises(FileNotFoundError, match="holds no checkpoint"):
        check_start(tmp_path / "new", tmp_path / "nothing")


def test_a_grid_folder_takes_runs_with_one_set_of_settings(tmp_path):
    """Runs of other settings (here the learning rate) are not added to a grid folder, whose
    start.json records the settings; the same settings are."""
    from recipes.toy.grid import START, check_start

    setup, out = _setup(tmp_path), tmp_path / "grid"
    check_start(out, setup.sft, setup.settings(200))
    assert json.loads((out / START).read_text())["settings"]["lr"] == setup.update_lr
    check_start(out, setup.sft, setup.settings(200))
    with pytest.raises(ValueError, match=r"other settings \(lr 2\.5e-05 -> 0\.0001\).*--out"):
        check_start(out, setup.sft, dataclasses.replace(setup, lr=1e-4).settings(200))
    with pytest.raises(ValueError, match=r"other settings \(steps 200 -> 100\)"):
        check_start(out, setup.sft, setup.settings(100))
    record = json.loads((out / START).read_text())
    (out / START).write_text(json.dumps({k: v for k, v in record.items() if k != "settings"}))
    with pytest.raises(ValueError, match="records no settings"):
        check_start(out, setup.sft, setup.settings(200))


def test_the_learning_rate_spreads_the_recipes_step_over_the_updates_of_a_batch(tmp_path):
    from recipes.toy.grid import recipe_batch_lr

    per_batch = recipe_batch_lr()
    setup = _setup(tmp_path)
    assert setup.mini_batches == 4 and setup.update_lr == pytest.approx(per_batch / 4)
    assert dataclasses.replace(setup, mini_batches=2, ppo_epochs=2).update_lr == pytest.approx(per_batch / 4)
    assert dataclasses.replace(setup, lr=3e-4).update_lr == 3e-4
    flags = dataclasses.replace(setup, mini_batches=1).overrides(
        GridRun("vepo", "none", 0), 4, tmp_path / "out"
    )
    assert flags[flags.index("--training.optimizer.lr") + 1] == str(per_batch)


def _record(algorithm, kl, seed, entropy=(3.0, 3.0), length=(30.0, 30.0), variant="full", **extra):
    return {"algorithm": algorithm, "kl": kl, "seed": seed, "entropy_first": entropy[0], "entropy_last": entropy[1],
            "length_first": length[0], "length_last": length[1], "variant": variant, **extra}  # fmt: skip


def _grid(grpo_last=1.2, vepo_last=3.0, ppo_last=1.0, grpo_len=40.0, rloo_len=40.0, vepo_len=31.0):
    records = []
    for seed in (0, 1, 2):
        for kl in ("none", "k3"):
            records.append(_record("grpo", kl, seed, (3.0, grpo_last + 0.05 * seed), (30.0, grpo_len)))
            records.append(_record("vepo", kl, seed, (3.0, vepo_last - 0.05 * seed), (30.0, vepo_len)))
    records += [
        _record("ppo", "none", 0, (3.0, ppo_last)),
        _record("rloo", "none", 0, length=(30.0, rloo_len)),
    ]
    return records


def test_c2_is_untested_where_grpo_does_not_collapse():
    assert claims.claim_c2(_grid())["verdict"] == claims.REPRODUCED  # GRPO 3 -> 1.2: below half
    untested = claims.claim_c2(_grid(grpo_last=2.9))
    assert untested["verdict"] == claims.UNTESTED and untested["evidence"]["grpo_mean_ratio"] > 0.9
    assert claims.claim_c2(_grid(vepo_last=5.0))["verdict"] == claims.INCONCLUSIVE  # VEPO leaves its band
    assert claims.claim_c2(_grid(vepo_last=1.0))["verdict"] == claims.NOT_REPRODUCED  # VEPO collapses too
    assert claims.claim_c2([])["verdict"] == claims.INCONCLUSIVE


def test_c2_reports_the_diversity_beside_its_entropy_rule():
    records = _grid(grpo_last=2.9)
    for r in records:
        r.update(group_chrf_first=40.0, group_chrf_last=40.0 + (10.0 if r["algorithm"] == "grpo" else 1.0),
                 heldout_same_opening=60.0 if r["algorithm"] == "grpo" else 30.0)  # fmt: skip
    evidence = claims.claim_c2(records)["evidence"]
    assert evidence["grpo_group_chrf_change"]["grpo kl-k3 s2"] == 10.0
    assert list(evidence["vepo_group_chrf_change"].values()) == [1.0] * 6
    assert evidence["grpo_heldout_same_opening"]["grpo kl-none s0"] == 60.0
    assert claims.claim_c2(records)["verdict"] == claims.UNTESTED  # diversity is evidence, not the rule


def test_c3_is_untested_where_ppo_does_not_collapse():
    assert claims.claim_c3(_grid())["verdict"] == claims.REPRODUCED
    assert claims.claim_c3(_grid(ppo_last=3.5))["verdict"] == claims.UNTESTED
    assert claims.claim_c3(_grid(ppo_last=1.4, vepo_last=1.0))["verdict"] == claims.NOT_REPRODUCED
    assert claims.claim_c3(_grid(ppo_last=1.15, vepo_last=1.2))["verdict"] == claims.INCONCLUSIVE


def test_c4_compares_absolute_drift_with_absolute_drift():
    assert claims.claim_c4(_grid())["verdict"] == claims.REPRODUCED
    assert claims.claim_c4(_grid(vepo_len=45.0))["verdict"] == claims.NOT_REPRODUCED
    assert claims.claim_c4(_grid(rloo_len=31.0))["verdict"] == claims.INCONCLUSIVE
    # RLOO shortens by a third: a drift as large as GRPO's lengthening, in the other direction
    shortened = claims.claim_c4(_grid(rloo_len=20.0))
    assert shortened["verdict"] == claims.REPRODUCED and shortened["evidence"]["rloo_abs_drift"] > 0.3
    assert claims.claim_c4(_grid(grpo_len=31.0, rloo_len=32.0, vepo_len=30.5))["verdict"] == claims.UNTESTED
    assert claims.claim_c4(_grid())["evidence"]["kl"] == ["none"]  # RLOO ran without KL only
    ablation = _grid() + [_record("vepo", "none", 0, length=(30.0, 60.0), variant="seq_mean")]
    assert claims.claim_c4(ablation)["verdict"] == claims.REPRODUCED  # ablations are not VEPO


def _kl_rows(k1, k2, k3):
    return [
        {"step": i, "rl/kl_k1": a, "rl/kl_k2": b, "rl/kl_k3": c}
        for i, (a, b, c) in enumerate(zip(k1, k2, k3))
    ]


def test_c5_c6_read_oscillation_from_the_histories_and_judge_k2_and_k3_apart():
    smooth = _rows([3.0 + 0.01 * i for i in range(20)])
    jumpy = _rows([3.0 + (0.5 if i % 2 else -0.5) for i in range(20)])
    records = _grid()
    assert claims.claim_c5(smooth, jumpy, records)["verdict"] == claims.REPRODUCED
    assert claims.claim_c5(jumpy, smooth, records)["verdict"] == claims.NOT_REPRODUCED
    assert claims.claim_c5(None, jumpy, records)["verdict"] == claims.INCONCLUSIVE
    assert claims.roughness([1.0, 1.0, 1.0]) == 0.0 and claims.roughness([1.0, 3.0, 1.0]) == pytest.approx(
        1.2
    )
    calm = [0.01 * (1 + i) for i in range(10)]
    noisy = [0.01 * (1 + i) * (3 if i % 2 else -1) for i in range(10)]
    noisier = [0.01 * (1 + i) * (9 if i % 2 else -5) for i in range(10)]
    assert claims.claim_c6({"a": _kl_rows(noisy, calm, calm)})["verdict"] == claims.REPRODUCED
    assert claims.claim_c6({"a": _kl_rows(calm, noisy, calm)})["verdict"] == claims.NOT_REPRODUCED
    partly = claims.claim_c6({"a": _kl_rows(noisy, noisier, calm), "b": _kl_rows(noisy, noisier, calm)})
    assert partly["verdict"] == claims.PARTLY
    assert (partly["evidence"]["k2"], partly["evidence"]["k3"]) == (claims.NOT_REPRODUCED, claims.REPRODUCED)
    assert (partly["evidence"]["share_k2_smoother"], partly["evidence"]["share_k3_smoother"]) == (0.0, 1.0)
    mixed = claims.claim_c6({"a": _kl_rows(noisy, calm, calm), "b": _kl_rows(noisy, noisier, calm)})
    assert mixed["evidence"]["share_k2_smoother"] == 0.5 and mixed["evidence"]["k2"] == claims.NOT_REPRODUCED
    assert mixed["verdict"] == claims.PARTLY  # k2 in half the runs, k3 in all


def test_c1_c7_read_the_toy_summary_and_the_decision_study_with_its_premise():
    summary = {"sft": {"overall_pass": 70.0}, "rl": {"overall_pass": 80.0},
               "per_seed": [{"delta_ci95": {"overall_pass": [2.0, 9.0]}}, {"delta_ci95": {"overall_pass": [-1.0, 9.0]}}]}  # fmt: skip
    assert claims.claim_c1(summary)["verdict"] == claims.INCONCLUSIVE  # one seed's interval reaches 0
    summary["per_seed"][1]["delta_ci95"]["overall_pass"] = [0.5, 9.0]
    assert claims.claim_c1(summary)["verdict"] == claims.REPRODUCED
    study = {"entropy_delta_ci95": [0.1, 0.3], "entropy_sft": 1.0, "entropy_rl": 1.2, "top1_sft": 0.6,
             "top1_rl": 0.5}  # fmt: skip
    assert claims.claim_c7(study)["verdict"] == claims.REPRODUCED
    study["entropy_delta_ci95"] = [-0.3, -0.1]
    verdict = claims.claim_c7(study)
    assert verdict["verdict"] == claims.NOT_REPRODUCED and not math.isnan(verdict["evidence"]["entropy_sft"])
    study["top1_sft"] = 0.22  # the SFT policy spreads its mass already: nothing to spread
    untested = claims.claim_c7(study)
    assert untested["verdict"] == claims.UNTESTED and untested["evidence"]["top1_sft"] == 0.22
    json.dumps(claims.all_claims(_grid(), {}, None, None, None))  # every verdict serialises


def test_c8_reads_the_within_step_entropy_length_correlation():
    def records(values):
        return [_record("vepo", "none", s, entropy_len_corr_mean=v) for s, v in enumerate(values)]

    assert claims.claim_c8(records([0.45, 0.5, 0.55, 0.4]))["verdict"] == claims.REPRODUCED
    assert claims.claim_c8(records([-0.1, 0.0, 0.05, -0.05]))["verdict"] == claims.NOT_REPRODUCED
    assert claims.claim_c8(records([0.1, 0.3, -0.1, 0.4]))["verdict"] == claims.INCONCLUSIVE
    assert claims.claim_c8(_grid())["verdict"] == claims.INCONCLUSIVE  # not logged
    ablated = records([0.45, 0.5, 0.55]) + [
        _record("vepo", "none", 0, variant="seq_mean", entropy_len_corr_mean=-0.9)
    ]
    assert claims.claim_c8(ablated)["evidence"]["runs"] == 3
    histories = {"a": _rows([3.0, 2.0, 1.0, 0.5], length=[40.0, 30.0, 20.0, 10.0])}
    assert claims.claim_c8(ablated, histories)["evidence"]["across_steps_mean_r"] == pytest.approx(
        0.98985, abs=1e-4
    )


def _ablation_grid(grpo_last=1.2, full_last=3.0, ablated_last=1.0, full_len=31.0, ablated_len=31.0, variant="no_entropy_bonus"):  # fmt: skip
    records = [r for r in _grid(grpo_last=grpo_last, vepo_last=full_last, vepo_len=full_len)]
    for seed in (0, 1, 2):
        records.append(_record("vepo", "none", seed, (3.0, ablated_last + 0.05 * seed), (30.0, ablated_len + seed),
                               variant=variant, heldout_chrf=20.0 - seed, group_chrf_last=70.0))  # fmt: skip
    for r in records:
        if r["algorithm"] == "vepo" and r["variant"] == "full":
            r.update(heldout_chrf=22.0 - r["seed"], group_chrf_last=60.0)
    return records


def test_each_ablation_is_judged_on_the_claim_its_part_is_tied_to():
    from recipes.toy.grid import ABLATION_KL

    assert set(claims.ABLATION_CLAIMS) == set(ABLATIONS) and claims.ABLATION_KL == ABLATION_KL
    collapse = claims.claim_ablation(_ablation_grid(), "no_entropy_bonus")
    assert collapse["verdict"] == claims.REPRODUCED and collapse["evidence"]["claim"] == "C2"
    assert collapse["evidence"]["moves"] == ["C2"] and collapse["evidence"]["seeds"] == 3
    assert collapse["evidence"]["heldout_chrf_diff_ci95"] == [-2.0, -2.0]  # quality reported beside
    assert (
        claims.claim_ablation(_ablation_grid(ablated_last=2.9), "no_entropy_bonus")["verdict"]
        == claims.NOT_REPRODUCED
    )
    assert (
        claims.claim_ablation(_ablation_grid(grpo_last=2.9), "no_entropy_bonus")["verdict"] == claims.UNTESTED
    )
    assert (
        claims.claim_ablation(_ablation_grid(full_last=1.3), "no_entropy_bonus")["verdict"] == claims.UNTESTED
    )
    length = _ablation_grid(ablated_last=3.0, ablated_len=45.0, variant="seq_mean")
    verdict = claims.claim_ablation(length, "seq_mean")
    assert verdict["verdict"] == claims.REPRODUCED and verdict["evidence"]["moves"] == ["C4"]
    stable = _ablation_grid(ablated_last=3.0, ablated_len=31.0, variant="seq_mean")
    assert claims.claim_ablation(stable, "seq_mean")["verdict"] == claims.NOT_REPRODUCED
    assert claims.claim_ablation(_grid(), "seq_mean")["verdict"] == claims.INCONCLUSIVE  # never ran
    assert collapse["evidence"]["band"] == "leaves the band downward"
    assert verdict["evidence"].get("band") is None  # a length claim has no entropy band
    every = claims.all_claims(_ablation_grid(), {}, None, None, None)
    assert list(every) == [f"C{i}" for i in range(1, 9)] + ["ablation/no_entropy_bonus"]
    assert all(set(v) >= {"verdict", "rule", "evidence"} for v in every.values())
    json.dumps(every)


def test_heldout_table_and_ablation_figure_on_synthetic_runs(tmp_path):
    from recipes.toy.figures import plot_ablations
    from recipes.toy.grid_report import heldout_table

    records = _ablation_grid()
    for r in records:
        r.update(heldout_chrf_source=r.get("heldout_chrf", 0.0) - 5, heldout_same_opening=30.0,
                 heldout_overall=90.0, heldout_overall_worst=60.0 + r["seed"], heldout_worst_direction="en-th",
                 heldout_step=40 * (1 + r["seed"]))  # fmt: skip
    records[-1]["heldout_chrf"] = None  # one run not evaluated
    table = heldout_table(records)
    assert table[0].startswith("| algorithm | removed part | KL | seeds | chrF++ |")
    row = next(line for line in table if "no_entropy_bonus" in line)
    assert row.startswith("| vepo | no_entropy_bonus | none | 3 | 19.5 (19.0-20.0) | 14.0 (13.0-15.0)")
    assert "40, 80, 120" in row and "60.0 (en-th), 61.0 (en-th), 62.0 (en-th)" in row
    full = next(line for line in table if line.startswith("| vepo |  | none |"))
    assert "21.0 (20.0-22.0)" in full
    histories = {"full": [_rows([3.0 - 0.01 * i for i in range(30)]) for _ in range(3)],
                 "no_entropy_bonus": [_rows([3.0 - 0.05 * i for i in range(30)]) for _ in range(2)]}  # fmt: skip
    for seeds in histories.values():
        for rows in seeds:
            for i, row in enumerate(rows):
                row["rollout/group_chrf"] = 50.0 + i
    path = plot_ablations(
        histories, {"full": {0: 21.0, 1: 22.0}, "no_entropy_bonus": {0: 19.0}}, tmp_path / "a.png"
    )
    assert path.stat().st_size > 10_000


def test_the_grid_takes_the_rl_prompts_and_validation_the_toy_planned(tmp_path):
    from recipes.toy.grid import toy_rl_prompts

    assert toy_rl_prompts(tmp_path) == {}
    planned = {"directions": "en-th,th-en", "prompt_sentences": "800:947"}  # what run_seed writes
    (tmp_path / "rl_prompts.json").write_text(json.dumps(planned))
    setup = GridSetup(
        sft=tmp_path / "sft", tokenizer=tmp_path / "tok", vocab_size=10, **toy_rl_prompts(tmp_path)
    )
    assert (setup.directions, setup.prompt_sentences, setup.eval_sentences) == (
        "en-th,th-en",
        "800:947",
        "947:",
    )
    (tmp_path / "rl_prompts.json").write_text(json.dumps({**planned, "prompt_sentences": "800:"}))
    assert toy_rl_prompts(tmp_path)["eval_sentences"] == ""  # no validation planned: none in the grid


def test_a_missing_sft_checkpoint_names_the_command_that_makes_it(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"tools/run_toy.py --out .* --seeds 3 --until sft"):
        GridSetup.from_toy(tmp_path / "seed3")


def test_the_report_reads_the_decision_study_kept_in_a_vepo_runs_folder_when_its_checkpoint_is_gone(tmp_path):
    from recipes.toy.grid_report import DECISION, write_grid_report

    runs = [GridRun("vepo", "none", s) for s in (0, 1)]
    out = tmp_path / "runs"
    for run in runs:
        _write(out / run.name / "metrics.jsonl", _rows([3.0] * 20))
    setup = _setup(tmp_path)
    missing = write_grid_report(
        runs, out, tmp_path / "none", setup
    )  # no study, no checkpoint: nothing to read
    assert missing["C7"]["evidence"] == {"missing": "the decision-point study"}
    point = {"direction": "en-th", "context": "Abc", "position": 1, "ids": [5, 7], "tokens": ["x", "y"],
             "p_sft": [0.3, 0.2], "p_rl": [0.25, 0.22], "entropy_sft": 2.0, "entropy_rl": 2.1}  # fmt: skip
    study = {"run": runs[1].name, "answers": 40, "entropy_sft": 1.0, "entropy_rl": 1.2,
             "entropy_delta_ci95": [0.1, 0.3], "top1_sft": 0.6, "top1_rl": 0.5, "point": point}  # fmt: skip
    (out / runs[1].name / DECISION).write_text(json.dumps(study))  # seed 0's folder holds neither
    claims_out = write_grid_report(runs, out, tmp_path / "report", setup)
    assert claims_out["C7"]["verdict"] == claims.REPRODUCED
    assert claims_out["C7"]["evidence"]["diff_ci95"] == [0.1, 0.3]
    assert (tmp_path / "report" / "grid_decision_point.png").stat().st_size > 10_000
    assert (
        "Decision point (vepo_kl-none_s1 against the SFT policy; en-th"
        in (tmp_path / "report" / "grid.md").read_text()
    )


def test_the_report_writes_the_new_fields_every_claim_and_the_heldout_table(tmp_path):
    from recipes.toy.grid_report import write_grid_report

    runs = [GridRun("vepo", "none", s) for s in (0, 1)] + [GridRun("grpo", "none", 0)]
    runs += [GridRun("vepo", "none", s, variant="symmetric_clip") for s in (0, 1)]
    out = tmp_path / "runs"
    for i, run in enumerate(runs):
        rows = _rows([3.0 - 0.02 * i * k for k in range(20)])
        for row in rows:
            row.update({"rl/clip_frac": 0.02, "filter/filtered_share": 0.5, "rollout/group_chrf": 55.0,
                        "rollout/entropy_len_corr": 0.3, "rl/kl_k1": 0.1, "rl/kl_k2": 0.01, "rl/kl_k3": 0.01})  # fmt: skip
        _write(out / run.name / "metrics.jsonl", rows)
        _write(out / run.name / "heldout.jsonl", _heldout_records(chrf=20.0 + i))
        (out / run.name / "selected.json").write_text(json.dumps({"step": 20}))
    _write(out / "sft_heldout.jsonl", _heldout_records(chrf=10.0))  # the grid's own SFT evaluation
    setup = _setup(tmp_path)
    claims_out = write_grid_report(runs, out, tmp_path / "report", setup, study=False)
    records = json.loads((tmp_path / "report" / "grid.json").read_text())
    new = ("variant", "clip_fraction_max", "filtered_share_mean", "group_chrf_first", "group_chrf_last",
           "heldout_chrf", "heldout_chrf_source", "heldout_same_opening")  # fmt: skip
    assert all(record[key] is not None for record in records for key in new)
    assert json.loads((tmp_path / "report" / "claims.json").read_text()) == claims_out
    assert [k for k in claims_out if k.startswith("C")] == [f"C{i}" for i in range(1, 9)]
    assert "ablation/symmetric_clip" in claims_out
    assert (tmp_path / "report" / "grid_ablations.png").is_file()
    markdown = (tmp_path / "report" / "grid.md").read_text()
    assert "Figures: grid_entropy.png, grid_length.png, grid_ablations.png." in markdown
    assert "| SFT (the start) |  |  | 1 | 11.5 |" in markdown
    assert "| vepo | symmetric_clip | none | 2 | 25.0 (24.5-25.5) |" in markdown
    assert "| 20, 20 | [+13.0, +13.0]; [+14.0, +14.0] |" in markdown  # each seed's chrF++ - SFT interval
    assert "- a clip acts on more than 1% of tokens at some step: 5 of 5 runs" in markdown
    assert "- importance ratios leave 1: 0 of 0 runs" in markdown  # the rows hold no rl/ratio_max

    # with `steps`, a run still training (fewer rows) is left out of every output
    _write(out / runs[2].name / "metrics.jsonl", _rows([3.0] * 12))
    write_grid_report(runs, out, tmp_path / "partial", setup, study=False, steps=20)
    names = [r["name"] for r in json.loads((tmp_path / "partial" / "grid.json").read_text())]
    assert names == [r.name for r in runs if r != runs[2]]


def test_an_entropy_ablation_that_blows_the_entropy_up_leaves_the_band_even_where_collapse_is_untested():
    def band(**grid):
        verdict = claims.claim_ablation(_ablation_grid(variant="tau1_ratio", **grid), "tau1_ratio")
        return verdict["verdict"], verdict["evidence"]["band"]

    upward = "leaves the band upward"
    assert band(ablated_last=6.0) == (claims.NOT_REPRODUCED, upward)  # ratios ~2.0 vs full 1.0
    assert band(grpo_last=2.9, ablated_last=6.0) == (claims.UNTESTED, upward)  # GRPO does not collapse
    assert band(ablated_last=4.0)[1] == "stays in the band"  # ratio ~1.35
    assert band(full_last=5.0, ablated_last=6.0)[1] == claims.INCONCLUSIVE  # full VEPO is outside the band


def test_an_ablation_over_fewer_than_three_seeds_is_not_read():
    two = [r for r in _ablation_grid(ablated_last=6.0, variant="tau1_ratio") if r["seed"] < 2]
    verdict = claims.claim_ablation(two, "tau1_ratio")
    assert verdict["evidence"]["seeds"] == 2 and verdict["evidence"]["entropy_ratio_diff_ci95"][0] > 0
    assert verdict["verdict"] == claims.INCONCLUSIVE and verdict["evidence"]["band"] == claims.INCONCLUSIVE
    assert verdict["evidence"]["moves"] == []
    untested = [r for r in _ablation_grid(grpo_last=2.9, variant="tau1_ratio") if r["seed"] < 2]
    verdict = claims.claim_ablation(untested, "tau1_ratio")["verdict"]
    assert verdict == claims.UNTESTED  # GRPO does not collapse


def _kl_arm_grid(arm_chrf=(16.0, 16.2, 16.4), grpo_chrf=(16.1, 16.3, 16.5), vepo_chrf=(15.1, 15.2, 15.2)):
    records = []
    for seed in (0, 1, 2):
        for algorithm, variant, chrf in (("vepo", "full", vepo_chrf), ("grpo", "full", grpo_chrf),
                                         ("vepo", "group_std", arm_chrf)):  # fmt: skip
            records.append(_record(algorithm, "k3", seed, variant=variant, heldout_chrf=chrf[seed],
                                   kl_k3_last=0.2, adv_std_mean=0.3))  # fmt: skip
        records.append(_record("vepo", "none", seed, heldout_chrf=16.0))  # other KL regimes are not read
    return records


def test_the_kl_arm_says_whether_the_group_std_closes_vepo_k3s_gap_to_grpo_k3():
    from recipes.toy.grid import KL_ARM

    assert claims.KL_ARM == KL_ARM
    explained = claims.claim_kl_arm(_kl_arm_grid(), *KL_ARM)
    assert explained["verdict"] == "explained" and explained["evidence"]["seeds"] == 3
    assert explained["evidence"]["gap_ci95"][0] > 0 and explained["evidence"]["gap_closed_share"] > 0.9
    assert explained["evidence"]["heldout_chrf_vepo"] == pytest.approx(15.1667, abs=1e-3)
    partly = claims.claim_kl_arm(_kl_arm_grid(arm_chrf=(15.3, 15.4, 15.4)), *KL_ARM)
    assert partly["verdict"] == "partly explained"
    assert (
        claims.claim_kl_arm(_kl_arm_grid(arm_chrf=(15.0, 15.4, 15.1)), *KL_ARM)["verdict"] == "not explained"
    )
    no_gap = _kl_arm_grid(grpo_chrf=(15.0, 15.4, 15.1))
    assert claims.claim_kl_arm(no_gap, *KL_ARM)["verdict"] == claims.UNTESTED
    two = [r for r in _kl_arm_grid() if r["seed"] < 2]
    assert claims.claim_kl_arm(two, *KL_ARM)["verdict"] == claims.INCONCLUSIVE
    assert claims.claim_kl_arm([], *KL_ARM)["verdict"] == claims.INCONCLUSIVE
    assert "kl_arm" in claims.all_claims(_kl_arm_grid(), {}, None, None, None)
    assert "kl_arm" not in claims.all_claims(_grid(), {}, None, None, None)
