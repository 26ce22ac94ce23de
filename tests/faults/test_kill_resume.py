"""Fault injection at CI size (benchmarks/fault_inject.py runs the same at N >= 20 kills): the real
tools are killed with SIGKILL at random points, some while a checkpoint is being written, and
relaunched; every relaunch resumes from the newest complete checkpoint and the final curves and
checkpoint (weights, optimizer, python/numpy/torch/tracker RNG states) equal an uninterrupted run's
bit for bit (CPU). A damaged file of the newest checkpoint is named and the run falls back to the
one before; a second run on a folder being written is refused."""

from __future__ import annotations

import random

import pytest

from harness.faults import (
    FaultReport,
    build_data,
    compare_runs,
    cpt_spec,
    damage_and_resume,
    kill_and_resume,
    rl_spec,
    run_to_end,
    second_writer,
    sft_spec,
)

pytestmark = pytest.mark.faults


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    path = tmp_path_factory.mktemp("faults")
    build_data(path)
    return path


def _assert_clean(report: FaultReport) -> None:
    events = "\n".join(report.events)
    assert report.checkpoints_lost == 0, events  # every relaunch resumed from the newest complete one
    assert report.curves_identical and report.checkpoint_identical, events


def test_cpt_second_writer_kills_and_a_damaged_checkpoint(workdir):
    spec = cpt_spec(workdir, train_iters=6, save_interval=2)
    # The reference run is raced by a second launch on its folder: one trains, the other is refused.
    straight = workdir / "cpt_straight"
    report = FaultReport("cpt")
    error = second_writer(spec, straight, report)
    assert report.second_writer_refused == 1, "\n".join(report.events)
    assert "is being written by another run: pid" in error and "training.checkpoint.save" in error

    faulty = workdir / "cpt_faulty"
    rng = random.Random(0)
    killed = kill_and_resume(spec, faulty, kills=2, rng=rng, save_share=0.5)
    assert killed.kills == 2, "\n".join(killed.events)
    compare_runs(straight, faulty, killed, spec.train_iters)
    _assert_clean(killed)

    warning = damage_and_resume(spec, faulty, rng, killed)
    assert killed.damaged_caught == 1, "\n".join(killed.events)
    assert "Loading the newest intact checkpoint instead" in warning
    compare_runs(straight, faulty, killed, spec.train_iters)  # trained back to the same end
    _assert_clean(killed)


@pytest.mark.parametrize("make_spec", [sft_spec, rl_spec], ids=["sft", "rl"])
def test_kill_during_save_resumes_identically(workdir, make_spec):
    spec = make_spec(workdir, train_iters=4, save_interval=2)
    straight = run_to_end(spec, workdir / f"{spec.name}_straight")
    faulty = workdir / f"{spec.name}_faulty"
    # Killed while writing the checkpoint of step 4: the relaunch resumes from step 2's.
    report = kill_and_resume(spec, faulty, kills=1, rng=random.Random(1), save_share=1.0, save_after=2)
    assert report.kills == 1 and report.saves_interrupted == 1 and report.resumes == 1, "\n".join(
        report.events
    )
    compare_runs(straight, faulty, report, spec.train_iters)
    _assert_clean(report)
