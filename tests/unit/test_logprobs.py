"""rl.logprobs against the naive float64 full-vocab computation (TP=1; TP=2 is in tests/dist)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.reference_logprobs import reference_logprobs_and_entropy
from vepo_mcore.rl import logprobs
from vepo_mcore.rl.logprobs import chunk_rows, logprobs_and_entropy

VOCAB, PADDED = 13, 16


def _inputs(n=10, padded=PADDED, vocab=VOCAB, scale=3.0, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, padded, generator=g, dtype=torch.float64) * scale).to(dtype)
    # padding columns hold large values: they must not leak into the softmax
    logits[:, vocab:] = 50.0
    targets = torch.randint(0, vocab, (n,), generator=g)
    return logits, targets


def _value_and_grad(fn, logits, targets, w_lp, w_h):
    x = logits.clone().requires_grad_(True)
    lp, h = fn(x, targets)
    ((lp * w_lp).sum() + (h * w_h).sum()).backward()
    return lp.detach(), h.detach(), x.grad


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.6])
@pytest.mark.parametrize("topk_frac", [None, 0.2])
def test_fp32_matches_float64_reference_values_and_grads(temperature, topk_frac):
    logits, targets = _inputs()
    w_lp, w_h = torch.randn(10, dtype=torch.float64), torch.randn(10, dtype=torch.float64)
    got = _value_and_grad(
        lambda x, t: logprobs_and_entropy(
            x, t, temperature, chunk_size=3, vocab_size=VOCAB, topk_frac=topk_frac
        ),
        logits,
        targets,
        w_lp.float(),
        w_h.float(),
    )
    ref = _value_and_grad(
        lambda x, t: reference_logprobs_and_entropy(x, t, temperature, VOCAB, topk_frac),
        logits.double(),
        targets,
        w_lp,
        w_h,
    )
    for a, b in zip(got, ref):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a.double(), b, atol=1e-5, rtol=0)
    assert torch.all(got[2][:, VOCAB:] == 0), "padding columns must get no gradient"


def _wide_spread_logits(vocab: int) -> torch.Tensor:
    """Rows whose max - min is ~50: Gaussian, uniform, and near one-hot (one logit 40 above the rest)."""
    g = torch.Generator().manual_seed(5)
    gaussian = torch.randn(2, vocab, generator=g) * 5.5
    uniform = torch.rand(2, vocab, generator=g) * 50
    peaked = torch.randn(2, vocab, generator=g)
    peaked[:, :2] += 40.0
    return torch.cat([gaussian, uniform, peaked])


@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize("topk_frac", [None, 0.2])
def test_fp32_within_1e5_of_float64_at_full_vocab_and_wide_spread(temperature, topk_frac):
    """At Qwen's 152,064-token vocabulary, fp32 log-prob, entropy and gradient stay within 1e-5 of
    float64: no sum over the vocabulary may accumulate its roundings sequentially (a BLAS dot for
    sum p z put the entropy 4e-5 off here), and no rounded constant may scale every logit alike."""
    vocab = 152_064
    logits = _wide_spread_logits(vocab)
    targets = torch.tensor([0, 7, 100_000, vocab - 1, 0, 5])  # the peak's own token and others
    w_lp, w_h = torch.randn(6, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
    ref = _value_and_grad(
        lambda x, t: reference_logprobs_and_entropy(x, t, temperature, topk_frac=topk_frac),
        logits.double(),
        targets,
        w_lp,
        w_h,
    )
    for chunk in (None, 4):
        got = _value_and_grad(
            lambda x, t, c=chunk: logprobs_and_entropy(x, t, temperature, c, topk_frac=topk_frac),
            logits,
            targets,
            w_lp.float(),
            w_h.float(),
        )
        for a, b, what in zip(got, ref, ("logp", "entropy", "grad")):
            assert a.dtype == torch.float32
            err = (a.double() - b).abs().max().item()
            assert err <= 1e-5, f"{what} off by {err:.2e} (chunk {chunk})"


def test_default_chunk_is_sized_by_bytes(monkeypatch):
    # the compute dtype decides the bytes: fp32 for bf16 logits too, float64 for float64
    assert chunk_rows(152_064, torch.float32) == logprobs.CHUNK_BYTES // (152_064 * 4)
    assert chunk_rows(152_064, torch.bfloat16) == chunk_rows(152_064, torch.float32)
    assert chunk_rows(1000, torch.float64, chunk_bytes=80_000) == 10
    assert chunk_rows(10**9, torch.float32) == 1  # never zero tokens
    # a budget of 3 rows: the default then runs 4 chunks, with the results of one
    logits, targets = _inputs(n=10)
    w = torch.randn(10)
    one_chunk = _value_and_grad(
        lambda x, t: logprobs_and_entropy(x, t, 0.8, 64, VOCAB), logits, targets, w, w
    )
    monkeypatch.setattr(logprobs, "CHUNK_BYTES", 3 * VOCAB * 4)
    assert chunk_rows(VOCAB, torch.float32) == 3
    by_bytes = _value_and_grad(
        lambda x, t: logprobs_and_entropy(x, t, 0.8, None, VOCAB), logits, targets, w, w
    )
    for a, b in zip(one_chunk, by_bytes):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


@pytest.mark.parametrize("topk_frac", [None, 0.3])
def test_gradcheck_float64(topk_frac):
    logits, targets = _inputs(n=5, padded=8, vocab=7, dtype=torch.float64)
    x = logits.requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda y: logprobs_and_entropy(y, targets, 0.8, chunk_size=2, vocab_size=7, topk_frac=topk_frac), (x,)
    )


def test_chunk_size_does_not_change_results():
    logits, targets = _inputs(n=23)
    w = torch.randn(23)
    outs = [
        _value_and_grad(lambda x, t, c=c: logprobs_and_entropy(x, t, 0.9, c, VOCAB), logits, targets, w, w)
        for c in (1, 4, 7, 1024)
    ]
    for other in outs[1:]:
        for a, b in zip(outs[0], other):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_batched_3d_input_and_grad_of_one_output_only():
    logits, targets = _inputs(n=12)
    lp3, h3 = logprobs_and_entropy(logits.view(3, 4, PADDED), targets.view(3, 4), 1.0, 5, VOCAB)
    lp, h = logprobs_and_entropy(logits, targets, 1.0, 5, VOCAB)
    assert lp3.shape == (3, 4)
    torch.testing.assert_close(lp3.reshape(-1), lp)
    torch.testing.assert_close(h3.reshape(-1), h)
    # gradient through the entropy alone (the VEPO bonus), none through logp
    x = logits.double().requires_grad_(True)
    _, h = logprobs_and_entropy(x, targets, 1.3, 5, VOCAB)
    h.sum().backward()
    y = logits.double().requires_grad_(True)
    reference_logprobs_and_entropy(y, targets, 1.3, VOCAB)[1].sum().backward()
    torch.testing.assert_close(x.grad, y.grad, atol=1e-10, rtol=0)


def test_bf16_inputs_within_stated_tolerance():
    """bf16 logits are upcast per chunk: exact (1e-5) against float64 on the same bf16 values, and within
    the bf16 rounding of the logits (0.05 absolute at logit scale 3) against the fp32 originals."""
    logits, targets = _inputs(n=16, scale=3.0)
    bf = logits.to(torch.bfloat16)
    x = bf.clone().requires_grad_(True)
    lp, h = logprobs_and_entropy(x, targets, 0.7, 4, VOCAB)
    (lp.sum() + h.sum()).backward()
    assert lp.dtype == torch.float32 and x.grad.dtype == torch.bfloat16
    y = bf.double().requires_grad_(True)
    ref_lp, ref_h = reference_logprobs_and_entropy(y, targets, 0.7, VOCAB)
    (ref_lp.sum() + ref_h.sum()).backward()
    torch.testing.assert_close(lp.double(), ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(h.double(), ref_h, atol=1e-5, rtol=0)
    # the gradient itself is rounded to bf16 (8 bits of mantissa)
    torch.testing.assert_close(x.grad.double(), y.grad, atol=2e-2, rtol=1e-2)
    fp_lp, fp_h = reference_logprobs_and_entropy(logits.double(), targets, 0.7, VOCAB)
    assert (lp.double() - fp_lp).abs().max() < 0.05
    assert (h.double() - fp_h).abs().max() < 0.05


def test_large_logits_are_stable():
    logits, targets = _inputs(n=6, scale=1e4)
    lp, h = logprobs_and_entropy(logits, targets, 1.0, 4, VOCAB)
    ref_lp, ref_h = reference_logprobs_and_entropy(logits.double(), targets, 1.0, VOCAB)
    assert torch.isfinite(lp).all() and torch.isfinite(h).all()
    torch.testing.assert_close(lp.double(), ref_lp, atol=1e-2, rtol=1e-6)
    torch.testing.assert_close(h.double(), ref_h, atol=1e-3, rtol=0)


def test_topk_frac_one_equals_exact_entropy():
    logits, targets = _inputs()
    _, h_exact = logprobs_and_entropy(logits, targets, 1.0, 4, VOCAB)
    _, h_top = logprobs_and_entropy(logits, targets, 1.0, 4, VOCAB, topk_frac=1.0)
    torch.testing.assert_close(h_top, h_exact, atol=1e-6, rtol=0)
    _, h_small = logprobs_and_entropy(logits, targets, 1.0, 4, VOCAB, topk_frac=0.2)
    assert torch.all(h_small <= h_exact + 1e-6)


def test_bad_arguments_raise_value_errors():
    logits, targets = _inputs()
    with pytest.raises(ValueError, match="temperature"):
        logprobs_and_entropy(logits, targets, 0.0)
    with pytest.raises(ValueError, match="vocab_size"):
        logprobs_and_entropy(logits, targets, vocab_size=PADDED + 1)
    with pytest.raises(ValueError, match="topk_frac"):
        logprobs_and_entropy(logits, targets, topk_frac=1.5)
    with pytest.raises(ValueError, match="disagree"):
        logprobs_and_entropy(logits, targets[:-1])
    with pytest.raises(ValueError, match="chunk_size"):
        logprobs_and_entropy(logits, targets, chunk_size=0)


def test_backward_keeps_nothing_vocab_sized_but_the_logits():
    """Forward saves only per-token vectors besides the caller's own logits (backward recomputes)."""
    logits, targets = _inputs(n=40, padded=64, vocab=60)
    x = logits.requires_grad_(True)
    saved = []

    def pack(t):
        saved.append((t.data_ptr(), t.numel()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp, h = logprobs_and_entropy(x, targets, 0.7, 8, 60)
    big = [numel for ptr, numel in saved if numel > 40 and ptr != x.data_ptr()]
    assert saved and not big, big


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 20),
    padded=st.integers(2, 24),
    data=st.data(),
    chunk=st.integers(1, 25),
    temperature=st.floats(0.3, 3.0),
    topk=st.sampled_from([None, 0.1, 0.5]),
)
def test_random_shapes_match_reference(n, padded, data, chunk, temperature, topk):
    vocab = data.draw(st.integers(1, padded))
    logits, targets = _inputs(n=n, padded=padded, vocab=vocab, seed=n * 31 + padded)
    x = logits.double().requires_grad_(True)
    lp, h = logprobs_and_entropy(x, targets, temperature, chunk, vocab, topk_frac=topk)
    (lp.sum() + 0.5 * h.sum()).backward()
    y = logits.double().requires_grad_(True)
    ref_lp, ref_h = reference_logprobs_and_entropy(y, targets, temperature, vocab, topk)
    (ref_lp.sum() + 0.5 * ref_h.sum()).backward()
    torch.testing.assert_close(lp, ref_lp, atol=1e-10, rtol=0)
    torch.testing.assert_close(h, ref_h, atol=1e-10, rtol=0)
    torch.testing.assert_close(x.grad, y.grad, atol=1e-10, rtol=0)
