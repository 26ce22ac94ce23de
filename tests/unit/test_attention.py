"""models.attention.SDPAttention against megatron.core's own DotProductAttention (the local spec's
core attention it replaces on CPU): the same outputs and input gradients for causal, block-diagonal
(packed SFT) and grouped-query attention, and megatron's own forward wherever SDPA would differ."""

from __future__ import annotations

import pytest
import torch
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType

from vepo_mcore.config import JobConfig
from vepo_mcore.data.sft import block_causal_mask
from vepo_mcore.models.attention import SDPAttention
from vepo_mcore.models.builder import build_model, layer_spec, transformer_config
from vepo_mcore.parallel import init_model_parallel


@pytest.fixture(scope="module")
def cfg():
    c = JobConfig()
    m = c.model
    m.num_layers, m.hidden_size, m.ffn_hidden_size, m.vocab_size = 2, 32, 64, 128
    m.num_attention_heads, m.num_query_groups = 4, 2
    init_model_parallel(c.parallel)
    return c


def _pair(cfg, dropout=0.0):
    config = transformer_config(cfg)
    config.attention_dropout = dropout
    args = dict(config=config, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self")
    return SDPAttention(**args), DotProductAttention(**args)


def _qkv(s, b, heads=4, groups=2, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(s, b, heads, d, generator=g).requires_grad_()
    k = torch.randn(s, b, groups, d, generator=g).requires_grad_()
    v = torch.randn(s, b, groups, d, generator=g).requires_grad_()
    return q, k, v


def _run(module, q, k, v, mask):
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    out = module(q, k, v, mask)
    out.backward(torch.linspace(-1, 1, out.numel()).view_as(out))
    return out.detach(), q.grad, k.grad, v.grad


def _segments():
    # Two packed rows: conversations of 5, 4 and 3 tokens, then padding (segment -1, its own block).
    return torch.tensor([[0] * 5 + [1] * 4 + [2] * 3 + [-1] * 4, [0] * 9 + [1] * 7])


@pytest.mark.parametrize("mask", ["causal", "packed"])
def test_sdpa_equals_megatrons_dot_product_attention(cfg, mask):
    ours, megatron = _pair(cfg)
    assert isinstance(ours, DotProductAttention)
    q, k, v = _qkv(16, 2)
    attention_mask = None if mask == "causal" else block_causal_mask(_segments())  # [b, 1, s, s]
    got, want = _run(ours, q, k, v, attention_mask), _run(megatron, q, k, v, attention_mask)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert got[0].shape == (16, 2, 32)


def test_what_sdpa_cannot_express_runs_megatrons_forward(cfg, monkeypatch):
    calls = []
    original = DotProductAttention.forward

    def recorded(self, *args, **kwargs):
        calls.append(type(self))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(DotProductAttention, "forward", recorded)
    q, k, v = _qkv(8, 1)
    ours, _ = _pair(cfg, dropout=0.5)
    ours.train()(q, k, v, None)  # attention dropout while training: megatron's RNG tracker draws it
    assert calls == [SDPAttention]
    ours.eval()(q, k, v, None)  # no dropout at evaluation: the fused kernel
    assert calls == [SDPAttention]
    ours(q[-1:], k, v, None)  # one query against a longer key/value cache
    assert len(calls) == 2


def test_the_local_spec_builds_sdpa_and_the_model_matches_megatrons_stock_spec(cfg, monkeypatch):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from vepo_mcore.models import builder

    assert layer_spec(cfg).submodules.self_attention.submodules.core_attention is SDPAttention
    model = build_model(cfg).eval()
    assert all(
        isinstance(layer.self_attention.core_attention, SDPAttention) for layer in model.decoder.layers
    )
    monkeypatch.setattr(builder, "layer_spec", lambda _: get_gpt_layer_local_spec(normalization="RMSNorm"))
    stock = build_model(cfg).eval()
    assert type(stock.decoder.layers[0].self_attention.core_attention) is DotProductAttention
    stock.load_state_dict(model.state_dict())
    tokens = torch.randint(0, cfg.model.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(12).expand(2, 12)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens, positions, None), stock(tokens, positions, None))
