"""rl.rewards.rm_placement 'offload' on a CUDA device (rm/placement.py): the host copies are pinned,
offload() gives the module's bytes back to the device (torch.cuda.memory_allocated and the caching
allocator's reserve, which the colocated engine needs), onload() takes exactly them again, and the
outputs are bit-identical to the resident module's. Skipped without CUDA (tests/conftest.py).

The check runs in a process of its own: the caching allocator's reserve is per process, and blocks
that earlier tests of the session leave allocated would share segments with the module's weights,
which then cannot go back to the device whoever frees them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

from vepo_mcore.rm.placement import Offloader


def test_offload_releases_the_device_bytes_and_keeps_the_outputs():
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, __file__], cwd=root, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "offload checks passed" in proc.stdout, proc.stdout + proc.stderr[-3000:]


def _check() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(16)]).cuda().bfloat16().eval()
    x = torch.randn(8, 1024, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        ref = model(x)
    torch.cuda.synchronize()
    mover = Offloader(model)
    assert mover.pinned and all(t.is_pinned() for t in mover.host_params)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    assert mover.nbytes == size > 32 << 20

    before = torch.cuda.memory_allocated()
    mover.offload()
    assert size <= before - torch.cuda.memory_allocated() < size + (1 << 20)  # the allocator's rounding
    assert all(p.device.type == "cpu" for p in model.parameters())
    assert torch.cuda.memory_reserved() <= before - size + (8 << 20)  # emptied: the engine can take it

    for _ in range(2):
        with mover.on_device(), torch.no_grad():
            assert torch.cuda.memory_allocated() - (before - size) >= size
            assert all(p.device.type == "cuda" for p in model.parameters())
            assert torch.equal(model(x), ref)
        torch.cuda.synchronize()
        assert torch.cuda.memory_allocated() <= before - size + x.numel() * 2 + ref.numel() * 2
    print("offload checks passed")


if __name__ == "__main__":
    _check()
