"""CUDA/NCCL code paths checked on CPU in gloo process groups (tests/unit/test_gpu_paths.py has the
single-process ones): decoding a sequence-parallel checkpoint with both engines, the empty Adam state,
and the scalar head under sequence parallelism."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import harness.fake_sglang  # noqa: F401  (registers the 'fake_sglang' rollout engine)
from vepo_mcore.parallel.launch import run_processes


def _translate_both_engines(rank, world, ckpt: str, out: str) -> None:
    import copy

    from vepo_mcore.config import JobConfig, load_config
    from vepo_mcore.eval.translate_checkpoint import translate_checkpoint
    from vepo_mcore.languages import default_tokenizer_dir
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.parallel import init_model_parallel
    from vepo_mcore.training.checkpointing import save_checkpoint

    root = Path(__file__).resolve().parents[2]
    cfg = load_config(JobConfig, root / "examples" / "configs" / "vepo_tiny.yaml")
    init_model_parallel(cfg.parallel, seed=7)
    model = build_model(cfg)
    with torch.no_grad():  # larger logits than the init's: greedy choices far from ties
        for p in model.parameters():
            p.mul_(8.0)
    # The run that wrote it trained at TP=2 with sequence parallelism (as the 7B recipes do).
    saved = copy.deepcopy(cfg)
    saved.parallel.tensor_model_parallel_size, saved.parallel.sequence_parallel = 2, True
    save_checkpoint(ckpt, 1, model, config=saved, tokenizer_dir=str(default_tokenizer_dir()))
    common = dict(directions="en-th", max_sentences=2, max_new_tokens=4, batch_size=1)
    # Both ranks translate into one directory (the TP group is one engine); rank 0 writes the cache.
    translate_checkpoint(ckpt, f"{out}/embedded", **common)
    translate_checkpoint(ckpt, f"{out}/fake", overrides=["--rl.rollout.engine", "fake_sglang"], **common)
    # A run interrupted after the first sentence resumes from rank 0's partial cache.
    import torch.distributed as dist

    if rank == 0:
        first = (Path(out) / "embedded" / "en-th.txt").read_text().splitlines()[0]
        resumed = Path(out) / "resumed"
        resumed.mkdir()
        (resumed / "en-th.partial.jsonl").write_text(json.dumps({"index": 0, "hypothesis": first}) + "\n")
    dist.barrier()
    translate_checkpoint(ckpt, f"{out}/resumed", **common)


@pytest.mark.dist
def test_translate_checkpoint_of_a_sequence_parallel_run_with_both_engines(tmp_path):
    """Decoding runs without sequence parallelism (megatron cannot decode with it; on CPU it cannot
    even start), and the SGLang engine, which starts from dummy weights, gets the checkpoint's."""
    run_processes(_translate_both_engines, 2, args=(str(tmp_path / "ckpt"), str(tmp_path)))
    outputs = {name: (tmp_path / name / "en-th.txt").read_text() for name in ("embedded", "fake", "resumed")}
    assert outputs["embedded"].count("\n") == 2  # one line per sentence: ranks did not both append
    assert len(set(outputs.values())) == 1, json.dumps(outputs, ensure_ascii=False)
    assert not list(tmp_path.glob("*/*.partial.jsonl"))


def _adam_state_helpers(rank, world, out: str) -> None:
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    from tests.dist.model_utils import tiny_cfg
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.parallel import init_model_parallel
    from vepo_mcore.training.checkpointing import _init_empty_adam_state
    from vepo_mcore.training.optimizer import build_optimizer, torch_adams, wrap_model

    cfg = tiny_cfg(num_layers=1)
    init_model_parallel(cfg.parallel, seed=3)
    adam = build_optimizer(wrap_model(build_model(cfg), cfg), cfg)
    sgd = get_megatron_optimizer(
        OptimizerConfig(optimizer="sgd", lr=0.1, bf16=False), [wrap_model(build_model(cfg), cfg)]
    )
    _init_empty_adam_state(adam)
    _init_empty_adam_state(sgd)
    (inner_adam,) = torch_adams(adam)
    states = list(inner_adam.state.values())
    result = {
        "adam_found": len(torch_adams(adam)),
        "adam_steps": sorted({float(s["step"]) for s in states}),
        "adam_fused": [g["fused"] for g in inner_adam.param_groups],
        "adam_params_with_state": len(states),
        "adam_params": sum(len(g["params"]) for g in inner_adam.param_groups),
        "sgd_found": len(torch_adams(sgd)),
        "sgd_states": sum(
            len(s) for o in getattr(sgd, "chained_optimizers", [sgd]) for s in o.optimizer.state.values()
        ),
    }
    Path(out).write_text(json.dumps(result))


@pytest.mark.dist
def test_empty_adam_state_touches_only_torch_adam(tmp_path):
    """Only torch Adam keeps a per-parameter 'step'; TE/apex FusedAdam (GPU) would fail on one in
    state_dict(), so any other optimizer class (SGD here) must be left as megatron built it."""
    run_processes(_adam_state_helpers, 1, args=(str(tmp_path / "out.json"),))
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["adam_found"] == 1 and result["adam_steps"] == [0.0]
    assert result["adam_fused"] and all(result["adam_fused"])  # build_optimizer's fuse_torch_adam
    assert result["adam_params_with_state"] == result["adam_params"] > 0
    assert result["sgd_found"] == 0 and result["sgd_states"] == 0


def _sequence_parallel_head(rank, world, out_dir: str) -> None:
    from megatron.core import parallel_state as ps

    from vepo_mcore.models.heads import ScalarHead

    ps.initialize_model_parallel(tensor_model_parallel_size=world)
    g = torch.Generator().manual_seed(0)
    full = torch.randn(6, 2, 8, generator=g, dtype=torch.float64)  # [s, b, h], the same on every rank
    upstream = torch.randn(6, 2, 3, generator=g, dtype=torch.float64)  # dL/d(output), replicated loss
    torch.manual_seed(1)
    head = ScalarHead(8, 3, std=0.5, sequence_parallel=True).double()
    local = full.chunk(world)[rank].clone().requires_grad_(True)  # this rank's sequence slice
    out, _ = head(local)
    (out * upstream).sum().backward()
    ref_in = full.clone().requires_grad_(True)
    ref_out = ref_in @ head.weight.detach().T + head.bias.detach()
    (ref_out * upstream).sum().backward()
    result = {
        "shape": list(out.shape),
        "out_err": (out - ref_out).abs().max().item(),
        "grad_err": (local.grad - ref_in.grad.chunk(world)[rank]).abs().max().item(),
        "weight_grad_err": (head.weight.grad - upstream.reshape(-1, 3).T @ full.reshape(-1, 8))
        .abs()
        .max()
        .item(),
    }
    Path(f"{out_dir}/{rank}.json").write_text(json.dumps(result))
    ps.destroy_model_parallel()


@pytest.mark.dist
def test_scalar_head_gathers_the_sequence_under_sequence_parallelism(tmp_path):
    """With sequence parallelism each TP rank holds s/TP positions; the replicated head must see all of
    them (outputs [s, b, k]) and hand back exactly this rank's slice of the input gradient."""
    run_processes(_sequence_parallel_head, 2, args=(str(tmp_path),))
    for rank in range(2):
        result = json.loads((tmp_path / f"{rank}.json").read_text())
        assert result["shape"] == [6, 2, 3]
        assert result["out_err"] < 1e-12 and result["grad_err"] < 1e-12 and result["weight_grad_err"] < 1e-12
