"""build_optimizer switches megatron's torch AdamW fallback (no TE / Apex) to torch's fused kernel:
the same training, checked against the for-loop AdamW megatron builds, and resumable."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from vepo_mcore.parallel.launch import run_processes


def _train(cfg, init: dict, fused: bool, steps: int):
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.training.optimizer import build_optimizer, torch_adams, wrap_model

    model = wrap_model(build_model(cfg), cfg)
    model.module.load_state_dict(init)
    optimizer = build_optimizer(model, cfg)
    for opt in torch_adams(optimizer):
        assert all(g["fused"] for g in opt.param_groups)
        if not fused:  # megatron's own choice: torch's for-loop AdamW
            for g in opt.param_groups:
                g["fused"], g["foreach"] = False, False
    g = torch.Generator().manual_seed(11)
    for _ in range(steps):
        optimizer.zero_grad()
        model.zero_grad_buffer()
        tokens = torch.randint(0, cfg.model.vocab_size, (2, 16), generator=g)
        positions = torch.arange(16).expand(2, 16)
        loss = model(tokens, positions, None, labels=tokens.roll(-1, 1)).float().mean()
        loss.backward()
        model.finish_grad_sync()
        optimizer.step()
    return {k: v.detach().clone() for k, v in model.module.state_dict().items() if torch.is_tensor(v)}


def _fused_vs_loop(rank, world, out: str) -> None:
    from tests.dist.model_utils import tiny_cfg
    from vepo_mcore.parallel import init_model_parallel

    cfg = tiny_cfg(num_layers=2)
    cfg.training.optimizer.weight_decay = 0.1
    init_model_parallel(cfg.parallel, seed=3)
    from vepo_mcore.models.builder import build_model

    init = build_model(cfg).state_dict()
    fused, loop = _train(cfg, init, True, 4), _train(cfg, init, False, 4)
    moved = max((fused[k] - init[k]).abs().max().item() for k in fused if torch.is_floating_point(fused[k]))
    diff = max((fused[k] - loop[k]).abs().max().item() for k in fused if torch.is_floating_point(fused[k]))
    Path(out).write_text(json.dumps({"moved": moved, "diff": diff}))


@pytest.mark.dist
def test_fused_adam_trains_as_megatrons_loop_adam(tmp_path):
    run_processes(_fused_vs_loop, 1, args=(str(tmp_path / "out.json"),))
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["moved"] > 1e-3  # four steps of Adam at the tiny config's lr moved the weights
    assert result["diff"] < 1e-5, result  # the same update up to fp32 rounding
