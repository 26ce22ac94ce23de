"""run_processes: gloo workers are CPU processes, also on a CUDA host (GPUs hidden from them)."""

from __future__ import annotations

import os

import torch

from vepo_mcore.parallel.launch import run_processes


def _report_devices(rank: int, world_size: int, seen: dict) -> None:
    import torch.distributed as dist

    visible = torch.tensor([float(os.environ.get("CUDA_VISIBLE_DEVICES") == ""), torch.cuda.device_count()])
    dist.all_reduce(visible)
    assert visible.tolist() == [world_size, 0], visible


def test_workers_see_no_gpu_and_the_parent_environment_is_restored(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    run_processes(_report_devices, world_size=2, args=({},))
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "0,1"
