"""GPU path: the builder with the Transformer Engine spec, bf16 and FP8 on CUDA + NCCL.
Skipped without CUDA (see tests/conftest.py); run on a GPU machine with the gpu extra."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from tests.dist.model_utils import VOCAB, batch, positions, tiny_cfg


def _init(cfg):
    from vepo_mcore.parallel import init_distributed, init_model_parallel

    init_distributed("nccl", rank=0, world_size=1)
    init_model_parallel(cfg.parallel, seed=1)


@pytest.fixture
def cleanup():
    yield
    from vepo_mcore.parallel import destroy

    destroy()


def test_local_spec_bf16_on_cuda(cleanup):
    from vepo_mcore.models.builder import build_model

    cfg = tiny_cfg()
    cfg.model.transformer_impl = "local"
    cfg.training.bf16 = True
    cfg.training.fusions.gradient_accumulation = False  # backward without DDP: no main_grad to fuse into
    _init(cfg)
    model = build_model(cfg)
    b = {k: v.cuda() for k, v in batch(0).items()}
    loss = model(b["tokens"], positions(b["tokens"]), None, labels=b["labels"]).float().mean()
    loss.backward()
    assert torch.isfinite(loss) and abs(loss.item() - torch.log(torch.tensor(float(VOCAB)))) < 1.0


@pytest.mark.skipif(
    importlib.util.find_spec("transformer_engine") is None, reason="transformer_engine missing"
)
@pytest.mark.parametrize("recipe", ["delayed", "tensorwise"])
def test_te_spec_fp8(cleanup, recipe):
    from vepo_mcore.models.builder import build_model, use_transformer_engine

    cfg = tiny_cfg()
    cfg.model.hidden_size, cfg.model.ffn_hidden_size = 128, 256  # FP8 GEMMs need dims % 16 == 0
    cfg.model.transformer_impl = "transformer_engine"
    cfg.model.fp8.format, cfg.model.fp8.recipe = "hybrid", recipe
    cfg.training.bf16 = True
    cfg.training.fusions.gradient_accumulation = False  # backward without DDP: no main_grad to fuse into
    _init(cfg)
    assert use_transformer_engine(cfg)
    model = build_model(cfg)
    b = {k: v.cuda() for k, v in batch(0, batch_size=16, seq=32).items()}
    # megatron's TransformerBlock enters the FP8 autocast itself when config.fp8 is set.
    loss = model(b["tokens"], positions(b["tokens"]), None, labels=b["labels"]).float().mean()
    loss.backward()
    assert torch.isfinite(loss)
    assert any(p.grad is not None or getattr(p, "main_grad", None) is not None for p in model.parameters())


@pytest.mark.skipif(
    importlib.util.find_spec("transformer_engine") is None, reason="transformer_engine missing"
)
def test_gradient_accumulation_fusion_inside_ddp_equals_unfused(cleanup):
    """training.fusions.gradient_accumulation on the TE spec: the layers' weight gradients go straight
    into DDP's main_grad (the output layer, megatron's own linear, stays unfused without apex), and
    every main_grad equals the unfused model's after one backward."""
    import copy

    from vepo_mcore.models.builder import build_model
    from vepo_mcore.training.optimizer import wrap_model

    cfg = tiny_cfg()
    cfg.model.transformer_impl = "transformer_engine"
    unfused_cfg = copy.deepcopy(cfg)
    unfused_cfg.training.fusions.gradient_accumulation = False
    _init(cfg)
    fused, unfused = build_model(cfg), build_model(unfused_cfg)
    assert fused.config.gradient_accumulation_fusion and not unfused.config.gradient_accumulation_fusion
    unfused.load_state_dict(fused.state_dict())
    b = {k: v.cuda() for k, v in batch(0).items()}
    main_grads = []
    for model, c in ((fused, cfg), (unfused, unfused_cfg)):
        ddp = wrap_model(model, c)
        ddp.zero_grad_buffer()
        ddp(b["tokens"], positions(b["tokens"]), None, labels=b["labels"]).float().mean().backward()
        main_grads.append({n: p.main_grad.clone() for n, p in model.named_parameters()})
    assert main_grads[0].keys() == main_grads[1].keys()
    for name, grad in main_grads[1].items():
        rel = (main_grads[0][name] - grad).norm() / grad.norm().clamp_min(1e-12)
        assert rel.item() < 1e-3, (name, rel.item())
