"""CUDA/NCCL code paths checked on CPU: helpers must build their tensors on the device of their inputs.

No GPU runs these paths in CI, and the CPU shim (parallel/device.py) maps device="cuda" to CPU, so a
tensor left on CPU next to a device tensor goes unnoticed there. The "meta" device has CUDA's rules
(a CPU tensor beside a meta tensor is an error, a CPU 0-dim scalar is allowed), so passing meta
inputs catches exactly the mixes that would fail on a GPU.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest
import torch
import torch.fx.experimental._config as fx_config

from vepo_mcore.config.rl import LossConfig

META = torch.device("meta")


def _critic_micro(device, b: int = 2, s: int = 5) -> dict:
    g = torch.Generator().manual_seed(0)
    mask = torch.ones(b, s)
    mask[0, :2] = 0
    return {
        "tokens": torch.zeros(b, s, dtype=torch.long).to(device),
        "position_ids": torch.arange(s).expand(b, s).to(device),
        "loss_mask": mask.to(device),
        "old_values": torch.randn(b, s, generator=g).to(device),
        "returns": torch.randn(b, s, generator=g).to(device),
        "response_lengths": torch.tensor([3, 5]).to(device),
    }


@pytest.mark.parametrize("agg", ["tokens", "seq_mean", "global_tokens"])
def test_critic_loss_func_reports_on_the_values_device(agg):
    from vepo_mcore.rl.experience import critic_forward_step

    micro = _critic_micro(META)
    values = torch.empty(2, 5, 1, device=META)
    output, loss_func = critic_forward_step(
        iter([micro]), lambda tokens, pos, mask: values, loss_cfg=LossConfig(loss_agg=agg)
    )
    loss, num_tokens, report = loss_func(output)
    assert loss.device == META and num_tokens.device == META
    assert report["loss"].device == META and report["loss"].shape == (2,)


def test_critic_loss_func_values_on_cpu_match_a_float64_reference():
    from vepo_mcore.rl.experience import critic_forward_step

    micro = _critic_micro("cpu")
    values = torch.randn(2, 5, 1, generator=torch.Generator().manual_seed(1))
    clip = LossConfig().value_clip
    _, loss_func = critic_forward_step(
        iter([micro]), lambda *a: values, loss_cfg=LossConfig(loss_agg="tokens")
    )
    loss, num_tokens, report = loss_func(values)
    v, old, ret = values[..., 0].double(), micro["old_values"].double(), micro["returns"].double()
    m = micro["loss_mask"].double()
    clipped = old + (v - old).clamp(-clip, clip)
    ref = (0.5 * torch.maximum((v - ret) ** 2, (clipped - ret) ** 2) * m).sum() / m.sum()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    assert int(num_tokens) == 1 and report["loss"].tolist() == pytest.approx([ref.item(), 1.0], rel=1e-6)


def test_logprob_mismatch_is_computed_on_the_training_device():
    from vepo_mcore.rl.trainer import logprob_mismatch

    old = torch.empty(2, 4, device=META)
    mask = torch.ones(2, 4, dtype=torch.bool, device=META)
    # Boolean indexing on meta needs a guess at the number of selected entries: all (mask is all ones).
    with fx_config.patch(meta_nonzero_assume_all_nonzero=True):
        out = logprob_mismatch(old, mask, [[-0.5] * 4, [-1.0] * 4])
    assert out.device == META and out.shape == ()


def test_logprob_mismatch_value_on_cpu():
    from vepo_mcore.rl.trainer import logprob_mismatch

    old = torch.tensor([[0.0, -1.0, -2.0], [-0.5, -0.25, 0.0]])
    mask = torch.tensor([[False, True, True], [True, False, False]])
    out = logprob_mismatch(old, mask, [[-1.5, -2.0], [0.5]])
    assert out.item() == pytest.approx((0.5 + 0.0 + 1.0) / 3)


def _translate_both_engines(rank, world, ckpt: str, out: str) -> None:
    import copy

    from vepo_mcore.config import JobConfig, load_config
    from vepo_mcore.eval.generate import translate_checkpoint
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
    from vepo_mcore.parallel.launch import run_processes

    run_processes(_translate_both_engines, 2, args=(str(tmp_path / "ckpt"), str(tmp_path)))
    outputs = {name: (tmp_path / name / "en-th.txt").read_text() for name in ("embedded", "fake", "resumed")}
    assert outputs["embedded"].count("\n") == 2  # one line per sentence: ranks did not both append
    assert len(set(outputs.values())) == 1, json.dumps(outputs, ensure_ascii=False)
    assert not list(tmp_path.glob("*/*.partial.jsonl"))


def test_rl_forward_step_default_positions_follow_the_tokens():
    """rl_forward_step builds default positions on the tokens' device (meta here)."""
    from vepo_mcore.rl.losses.loss_func import rl_forward_step

    seen = {}

    def model(tokens, positions, mask, output_mask):
        seen["positions"] = positions
        return torch.empty(1, 6, 8, device=tokens.device)

    micro = {
        "tokens": torch.zeros(2, 3, dtype=torch.long, device=META),
        "loss_mask": torch.ones(2, 3, dtype=torch.bool, device=META),
    }
    rl_forward_step(iter([micro]), model, cfg=LossConfig(), kl=None, vocab_size=8)
    assert seen["positions"].device == META


def _adam_state_helpers(rank, world, out: str) -> None:
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    from tests.dist.model_utils import tiny_cfg
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.parallel import init_model_parallel
    from vepo_mcore.training.checkpointing import _init_empty_adam_state, _torch_adams
    from vepo_mcore.training.optimizer import build_optimizer, wrap_model

    cfg = tiny_cfg(num_layers=1)
    init_model_parallel(cfg.parallel, seed=3)
    adam = build_optimizer(wrap_model(build_model(cfg), cfg), cfg)
    sgd = get_megatron_optimizer(
        OptimizerConfig(optimizer="sgd", lr=0.1, bf16=False), [wrap_model(build_model(cfg), cfg)]
    )
    _init_empty_adam_state(adam)
    _init_empty_adam_state(sgd)
    (inner_adam,) = _torch_adams(adam)
    states = list(inner_adam.state.values())
    result = {
        "adam_found": len(_torch_adams(adam)),
        "adam_steps": sorted({float(s["step"]) for s in states}),
        "adam_params_with_state": len(states),
        "adam_params": sum(len(g["params"]) for g in inner_adam.param_groups),
        "sgd_found": len(_torch_adams(sgd)),
        "sgd_states": sum(
            len(s) for o in getattr(sgd, "chained_optimizers", [sgd]) for s in o.optimizer.state.values()
        ),
    }
    Path(out).write_text(json.dumps(result))


def test_empty_adam_state_touches_only_torch_adam(tmp_path):
    """Only torch Adam keeps a per-parameter 'step'; TE/apex FusedAdam (GPU) would fail on one in
    state_dict(), so any other optimizer class (SGD here) must be left as megatron built it."""
    from vepo_mcore.parallel.launch import run_processes

    run_processes(_adam_state_helpers, 1, args=(str(tmp_path / "out.json"),))
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["adam_found"] == 1 and result["adam_steps"] == [0.0]
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
    from vepo_mcore.parallel.launch import run_processes

    run_processes(_sequence_parallel_head, 2, args=(str(tmp_path),))
    for rank in range(2):
        result = json.loads((tmp_path / f"{rank}.json").read_text())
        assert result["shape"] == [6, 2, 3]
        assert result["out_err"] < 1e-12 and result["grad_err"] < 1e-12 and result["weight_grad_err"] < 1e-12


def _rl_micro(device, b: int = 2, s: int = 5) -> dict:
    zeros = partial(torch.zeros, device=device)
    return {
        "tokens": zeros(b, s, dtype=torch.long),
        "labels": zeros(b, s, dtype=torch.long),
        "loss_mask": torch.ones(b, s, device=device),
        **{k: zeros(b, s) for k in ("old_logp", "ref_logp", "advantages", "old_values", "returns")},
        "rewards": zeros(b),
        "response_lengths": torch.ones(b, dtype=torch.long, device=device),
        "max_response_length": 8,
    }


@pytest.mark.parametrize("name", ["vepo", "grpo", "dapo", "rloo", "reinforce_pp", "ppo"])
@pytest.mark.parametrize("agg", ["tokens", "global_tokens", "seq_mean"])
def test_rl_loss_func_forward_and_backward_stay_on_the_logits_device(name, agg):
    """The whole loss path (fused log-probs, ratio, KL, metrics, megatron's count) on device tensors."""
    from vepo_mcore.config.rl import KLConfig
    from vepo_mcore.rl.losses.loss_func import rl_loss_func

    logits = torch.empty(1, 10, 16, device=META, requires_grad=True)  # output_mask: all 2 x 5 positions
    cfg = LossConfig(name=name, loss_agg=agg, entropy_topk_frac=0.25 if name == "vepo" else None)
    with fx_config.patch(meta_nonzero_assume_all_nonzero=True):  # metrics select masked tokens
        loss, num_tokens, metrics = rl_loss_func(_rl_micro(META), cfg, KLConfig(), 16, logits)
        loss.backward()
    assert loss.device == META and num_tokens.device == META and logits.grad.device == META
    assert [k for k, v in metrics.items() if v.device != META] == []


def test_embedded_engine_refuses_sequence_parallelism_with_a_clear_error():
    from vepo_mcore.config import JobConfig
    from vepo_mcore.rollout.base import build_engine

    cfg = JobConfig()
    cfg.parallel.tensor_model_parallel_size, cfg.parallel.sequence_parallel = 2, True
    with pytest.raises(ValueError, match="sequence_parallel.*sglang"):
        build_engine(cfg, model=torch.nn.Linear(2, 2))
