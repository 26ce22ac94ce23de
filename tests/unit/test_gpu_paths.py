"""CUDA/NCCL code paths checked on CPU: helpers must build their tensors on the device of their inputs.

No GPU runs these paths in CI, and the CPU shim (parallel/device.py) maps device="cuda" to CPU, so a
tensor left on CPU next to a device tensor goes unnoticed there. The "meta" device has CUDA's rules
(a CPU tensor beside a meta tensor is an error, a CPU 0-dim scalar is allowed), so passing meta
inputs catches exactly the mixes that would fail on a GPU.
"""

from __future__ import annotations

import json
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
    save_checkpoint(ckpt, 1, model, config=cfg, tokenizer_dir=str(default_tokenizer_dir()))
    common = dict(directions="en-th", max_sentences=2, max_new_tokens=4, batch_size=2)
    translate_checkpoint(ckpt, f"{out}/embedded", **common)
    translate_checkpoint(ckpt, f"{out}/fake", overrides=["--rl.rollout.engine", "fake_sglang"], **common)


def test_translate_checkpoint_pushes_the_checkpoint_into_an_sglang_engine(tmp_path):
    """The SGLang engine starts from dummy weights; translating a checkpoint must sync them first."""
    from vepo_mcore.parallel.launch import run_processes

    run_processes(_translate_both_engines, 1, args=(str(tmp_path / "ckpt"), str(tmp_path)))
    embedded = (tmp_path / "embedded" / "en-th.txt").read_text()
    fake = (tmp_path / "fake" / "en-th.txt").read_text()
    assert embedded.count("\n") == 2
    assert fake == embedded, json.dumps({"embedded": embedded, "fake_sglang": fake}, ensure_ascii=False)


def test_rl_forward_step_default_positions_follow_the_tokens():
    """rl_forward_step builds default positions on the tokens' device (meta here)."""
    from vepo_mcore.rl.losses.loss_func import rl_forward_step

    seen = {}

    def model(tokens, positions, mask):
        seen["positions"] = positions
        return torch.empty(*tokens.shape, 8, device=tokens.device)

    micro = {"tokens": torch.zeros(2, 3, dtype=torch.long, device=META)}
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
