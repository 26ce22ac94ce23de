"""models.output_loss: log-prob, entropy and cross-entropy from hidden states and the output weight,
chunk by chunk, against the naive full-vocab computation in float64 (values and the gradients of
hidden and weight), one process; TP=2 and the model itself are in tests/dist/test_chunked_output.py."""

from __future__ import annotations

import pytest
import torch

from tests.support.reference_logprobs import reference_logprobs_and_entropy
from vepo_mcore.models.output_loss import (
    DeferredOutputLayer,
    output_layer_cross_entropy,
    output_layer_logprobs,
)


def _inputs(n=24, h=16, rows=40, dtype=torch.float32, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(n, h, generator=g, dtype=torch.float64) * scale).to(dtype)
    weight = (torch.randn(rows, h, generator=g, dtype=torch.float64) * scale).to(dtype)
    targets = torch.randint(0, rows, (n,), generator=g)
    return hidden.requires_grad_(), weight.requires_grad_(), targets


def _reference(hidden, weight, targets, tau, vocab, topk):
    """Naive float64: full logits, log_softmax, gather, entropy; grads by autograd."""
    h = hidden.detach().double().requires_grad_()
    w = weight.detach().double().requires_grad_()
    logp, ent = reference_logprobs_and_entropy(h @ w.t(), targets, tau, vocab, topk)
    return h, w, logp, ent


@pytest.mark.parametrize("tau,vocab,topk", [(1.0, None, None), (0.7, 37, None), (1.3, 37, 0.25)])
@pytest.mark.parametrize("chunk", [None, 1, 5, 24])
def test_values_and_grads_equal_float64_reference(tau, vocab, topk, chunk):
    hidden, weight, targets = _inputs()
    targets = targets % (vocab or 40)
    logp, ent = output_layer_logprobs(hidden, weight, targets, tau, vocab, topk_frac=topk, chunk_size=chunk)
    w_lp, w_h = torch.randn(24, dtype=torch.float64), torch.randn(24, dtype=torch.float64)
    ((logp.double() * w_lp).sum() + (ent.double() * w_h).sum()).backward()
    h, w, ref_lp, ref_h = _reference(hidden, weight, targets, tau, vocab, topk)
    ((ref_lp * w_lp).sum() + (ref_h * w_h).sum()).backward()
    assert logp.dtype == torch.float32 and ent.dtype == torch.float32
    torch.testing.assert_close(logp.double(), ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent.double(), ref_h, atol=1e-5, rtol=0)
    torch.testing.assert_close(hidden.grad.double(), h.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(weight.grad.double(), w.grad, atol=1e-4, rtol=1e-4)
    if vocab is not None:  # padding rows take no part: zero gradient
        assert (weight.grad[vocab:] == 0).all()


def test_fp32_within_1e5_of_float64_at_full_vocab_and_wide_spread():
    """152k rows, logits spread over ~50: the sums over the vocabulary must not accumulate sequentially."""
    hidden, weight, targets = _inputs(n=6, h=32, rows=152_064, scale=1.2)
    logp, ent = output_layer_logprobs(hidden, weight, targets, 0.7)
    _, _, ref_lp, ref_h = _reference(hidden, weight, targets, 0.7, None, None)
    assert (hidden.detach() @ weight.detach().t()).std() > 5
    assert (logp.double() - ref_lp).abs().max() < 1e-5
    assert (ent.double() - ref_h).abs().max() < 1e-5


def test_loss_weighted_cross_entropy_as_precise_as_torch_fp32_at_full_vocab_and_offset_logits():
    """The loss-weighted CE (gradients built in forward, logits computed in exp2's units) at 152k rows,
    logits spread over ~50 around a common offset of ~40, against float64: no further from it than
    torch's own fp32 cross-entropy on fp32 logits (whose error here is the GEMM's rounding)."""
    hidden, weight, targets = _inputs(n=16, h=32, rows=152_064, scale=1.2)
    with torch.no_grad():
        hidden[:, 0], weight[:, 0] = 8.0, 5.0  # every logit + 40
    w = (torch.arange(16) % 5 != 0).float() * 1.5  # a loss mask times a scale
    loss = output_layer_cross_entropy(hidden, weight, targets, loss_weights=w)
    (loss * w).sum().backward()

    def errors(dtype):
        h, wt = hidden.detach().to(dtype).requires_grad_(), weight.detach().to(dtype).requires_grad_()
        ce = torch.nn.functional.cross_entropy(h @ wt.t(), targets, reduction="none")
        (ce * w.to(dtype)).sum().backward()
        return ce.detach().double(), h.grad.double(), wt.grad.double()

    ref, naive = errors(torch.float64), errors(torch.float32)
    assert (hidden.detach().double() @ weight.detach().double().t()).mean() > 35
    ours = (loss.detach().double(), hidden.grad.double(), weight.grad.double())
    for mine, theirs, exact in zip(ours, naive, ref):
        assert (mine - exact).abs().max() <= 1.5 * (theirs - exact).abs().max() + 2e-6


def test_default_chunks_are_the_fewest_the_budget_allows_and_of_equal_size():
    from vepo_mcore.models.output_loss import even_chunk

    assert even_chunk(512, 441) == 256  # not 441 + 71
    assert even_chunk(460, 441) == 230
    assert even_chunk(441, 441) == 441 and even_chunk(100, 441) == 100
    assert even_chunk(1000, 7) == 7 and even_chunk(0, 441) == 1
    for n, most in ((512, 441), (1023, 100), (7, 3)):
        size = even_chunk(n, most)
        assert size <= most and -(-n // size) == -(-n // most)


def test_cross_entropy_equals_torch_cross_entropy_and_its_grads():
    hidden, weight, targets = _inputs(n=30, rows=50)
    loss = output_layer_cross_entropy(hidden, weight, targets, chunk_size=7)
    (loss * torch.arange(30.0)).sum().backward()
    h, w = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    ref = torch.nn.functional.cross_entropy(h @ w.t(), targets, reduction="none")
    (ref * torch.arange(30.0)).sum().backward()
    torch.testing.assert_close(loss, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(hidden.grad, h.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(weight.grad, w.grad, atol=1e-5, rtol=1e-4)


def test_gradcheck_float64():
    hidden, weight, targets = _inputs(n=5, h=4, rows=9, dtype=torch.float64)

    def fn(h, w):
        logp, ent = output_layer_logprobs(h, w, targets % 7, 0.8, 7, chunk_size=2)
        return logp, ent

    assert torch.autograd.gradcheck(fn, (hidden, weight))


def test_bf16_weights_match_the_bf16_logits_path():
    """bf16 hidden/weight: the chunk GEMM runs in bf16 like the output layer's, the softmax in fp32;
    the weight gradient is summed over chunks in fp32."""
    hidden, weight, targets = _inputs(n=20, h=32, rows=64, dtype=torch.bfloat16)
    logp, ent = output_layer_logprobs(hidden, weight, targets, 0.9, chunk_size=3)
    (logp.sum() + ent.sum()).backward()
    h, w = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    ref_lp, ref_h = reference_logprobs_and_entropy((h @ w.t()).float(), targets, 0.9)
    (ref_lp.sum() + ref_h.sum()).backward()
    assert logp.dtype == torch.float32 and hidden.grad.dtype == torch.bfloat16
    torch.testing.assert_close(logp, ref_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_h, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(hidden.grad.float(), h.grad.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(weight.grad.float(), w.grad.float(), atol=2e-2, rtol=2e-2)


def test_nothing_vocab_sized_is_saved_for_backward():
    """The [N, V] logits never outlive a chunk: autograd keeps hidden, weight and per-token scalars."""
    hidden, weight, targets = _inputs(n=64, h=8, rows=500)
    saved = []

    def pack(t):
        saved.append(t.numel() if t.data_ptr() not in (hidden.data_ptr(), weight.data_ptr()) else 0)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logp, ent = output_layer_logprobs(hidden, weight, targets, 0.7, chunk_size=8)
    assert saved and max(saved) <= 64
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):  # the naive path does save [N, V]
        reference_logprobs_and_entropy(hidden @ weight.t(), targets, 0.7)
    assert max(saved) >= 64 * 500


def test_deferred_output_layer_logits_and_logprobs():
    hidden, weight, targets = _inputs(n=10, rows=30)
    out = DeferredOutputLayer(hidden, weight)
    assert out.logits().shape == (1, 10, 30)
    logp, ent = out.logprobs_and_entropy(targets, 0.5, 29)
    ref_lp, ref_h = reference_logprobs_and_entropy(out.logits()[0].double(), targets, 0.5, 29)
    torch.testing.assert_close(logp.double(), ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent.double(), ref_h, atol=1e-5, rtol=0)


def test_bad_arguments_raise_value_errors():
    hidden, weight, targets = _inputs(n=4, h=8, rows=10)
    with pytest.raises(ValueError, match="temperature"):
        output_layer_logprobs(hidden, weight, targets, 0.0)
    with pytest.raises(ValueError, match="hidden"):
        output_layer_logprobs(hidden[:, :4], weight, targets)
    with pytest.raises(ValueError, match="targets"):
        output_layer_logprobs(hidden, weight, targets[:2])
    with pytest.raises(ValueError, match="vocab_size"):
        output_layer_logprobs(hidden, weight, targets, vocab_size=11)


@pytest.mark.parametrize("vocab_major", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gradients_built_in_forward_for_the_expected_loss_weights(monkeypatch, dtype, vocab_major):
    """loss_weights: forward builds the gradients of sum(w * loss), backward rescales them without
    recomputing a chunk; any other upstream gradient still gets the exact (recomputed) gradients.
    Both layouts of the fp32 path: vocabulary-major (CPU, small chunks) and token-major (GPU, bf16)."""
    from vepo_mcore.models import output_loss

    monkeypatch.setattr(output_loss, "VOCAB_MAJOR_BYTES", 1 << 30 if vocab_major else 0)
    calls = []
    real = output_loss._chunk_logits
    monkeypatch.setattr(output_loss, "_chunk_logits", lambda *a: calls.append(1) or real(*a))
    hidden, weight, targets = _inputs(n=30, h=16, rows=50, dtype=dtype)
    w = torch.rand(30) * (torch.arange(30) % 4 != 0)  # some zero weights, as a loss mask has
    tol = dict(atol=1e-5, rtol=1e-4) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    for upstream, early in ((w * 2.5, True), (w + 1.0, False)):
        hidden.grad = weight.grad = None
        loss = output_layer_cross_entropy(hidden, weight, targets, chunk_size=7, loss_weights=w)
        calls.clear()
        (loss * upstream).sum().backward()
        assert (len(calls) == 0) is early
        h, wt = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
        ref = torch.nn.functional.cross_entropy((h @ wt.t()).float(), targets, reduction="none")
        (ref * upstream).sum().backward()
        torch.testing.assert_close(loss, ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(hidden.grad.float(), h.grad.float(), **tol)
        torch.testing.assert_close(weight.grad.float(), wt.grad.float(), **tol)
    with torch.no_grad():  # nothing runs backward: no gradients built
        calls.clear()
        output_layer_cross_entropy(hidden, weight, targets, chunk_size=7, loss_weights=w)
        assert len(calls) == 5


@pytest.mark.parametrize("rows_per_block", [1, 3, 64])
def test_vocab_major_blocks_equal_float64_and_the_token_major_layout(monkeypatch, rows_per_block):
    """The CPU cross-entropy with an expected gradient runs vocabulary-major, block by block (no
    token-major logits are computed in forward); at tau 0.7 over a padded vocabulary, in chunks of 7
    tokens (the last one of 2) and blocks of 1, 3 or 64 rows (the last one short), the log-prob and the
    gradients (upstream = 2.5 x the expected one) equal a naive float64 computation and the
    token-major layout's, which a chunk of one byte more hidden states than VOCAB_MAJOR_BYTES takes."""
    from vepo_mcore.models import output_loss

    calls = []
    real = output_loss._chunk_logits
    monkeypatch.setattr(output_loss, "_chunk_logits", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(output_loss, "BLOCK_BYTES", rows_per_block * 7 * 4)
    hidden, weight, targets = _inputs(n=30, h=16, rows=50, scale=1.5)
    targets = targets % 37
    w = torch.rand(30, generator=torch.Generator().manual_seed(1)) * (torch.arange(30) % 4 != 0)

    def run(vocab_major):
        # the layout is chosen by the bytes of a chunk's hidden states: 7 tokens x 16 x fp32
        monkeypatch.setattr(output_loss, "VOCAB_MAJOR_BYTES", 7 * 16 * 4 - (0 if vocab_major else 1))
        h, wt = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
        logp, _ = output_layer_logprobs(
            h, wt, targets, 0.7, 37, need_entropy=False, chunk_size=7, expected_grad=-w
        )
        (-(logp * w).sum() * 2.5).backward()
        return logp.detach(), h.grad, wt.grad

    logp, grad_h, grad_w = run(True)
    assert not calls  # neither forward nor backward computed token-major logits
    h64, w64, ref_lp, _ = _reference(hidden, weight, targets, 0.7, 37, None)
    (-(ref_lp * w.double()).sum() * 2.5).backward()
    torch.testing.assert_close(logp.double(), ref_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(grad_h.double(), h64.grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(grad_w.double(), w64.grad, atol=1e-5, rtol=1e-4)
    assert (grad_w[37:] == 0).all()  # padding rows
    for mine, token_major in zip((logp, grad_h, grad_w), run(False)):  # the two fp32 roundings
        torch.testing.assert_close(mine, token_major, atol=1e-5, rtol=1e-4)
    assert calls  # the token-major layout did


def test_megatron_builds_the_output_layer_as_column_parallel_linear_whatever_the_layer_spec():
    """Contract with megatron.core (pinned 0.16.1) for the GPU path: GPTModel builds its output layer
    from tensor_parallel.ColumnParallelLinear itself, never from the transformer layer spec, so with
    Transformer Engine's spec the chunked output layer + loss runs exactly as with the local one."""
    import inspect

    from megatron.core.models.gpt import gpt_model

    src = inspect.getsource(gpt_model.GPTModel.__init__)
    assert src.count("self.output_layer =") == 1
    assert "self.output_layer = tensor_parallel.ColumnParallelLinear(" in src


def test_chunked_path_only_for_megatrons_own_output_layer():
    """QwenGPTModel takes the chunked path for a bias-free ColumnParallelLinear; the critic's and the
    reward model's ScalarHead, MTP, inference and an opt-out keep megatron's logits."""
    from types import SimpleNamespace

    from megatron.core.tensor_parallel import ColumnParallelLinear

    from vepo_mcore.models.gpt import QwenGPTModel
    from vepo_mcore.models.heads import ScalarHead

    column = ColumnParallelLinear.__new__(ColumnParallelLinear)
    torch.nn.Module.__init__(column)
    column.bias = None
    config = SimpleNamespace(defer_embedding_wgrad_compute=False)

    labels_given = torch.zeros(1)

    def applies(layer, labels=labels_given, kwargs=None, defer=False, opt_in=True, mtp=False):
        model = SimpleNamespace(chunked_output_loss=opt_in, _defer_output_layer=defer, mtp_process=mtp,
                                output_layer=layer, config=config)  # fmt: skip
        return QwenGPTModel._chunked_output_applies(model, labels, kwargs or {})

    assert applies(column)
    assert applies(column, labels=None, defer=True)
    assert not applies(column, labels=None)  # logits wanted
    assert not applies(column, opt_in=False)
    assert not applies(column, mtp=True)
    assert not applies(ScalarHead(8, 1))
    assert not applies(column, kwargs={"inference_context": object()})
    assert not applies(column, kwargs={"runtime_gather_output": True})


def test_no_tokens():
    """A micro-batch whose loss mask is all zero selects no position: zero loss, zero gradients."""
    hidden, weight, _ = _inputs(n=0, rows=12)
    loss = output_layer_cross_entropy(
        hidden, weight, torch.zeros(0, dtype=torch.long), loss_weights=torch.ones(0)
    )
    loss.sum().backward()
    assert loss.shape == (0,) and (weight.grad == 0).all()


def test_host_buffers_are_reused_best_fit_and_never_shared():
    """HostBuffers: a buffer given back is handed out again (no fresh allocation: no page faults),
    the smallest that fits, and one that is taken is never handed out twice."""
    from vepo_mcore.models.output_loss import HostBuffers

    pool, cpu = HostBuffers(keep=2), torch.device("cpu")
    a = pool.take((4, 8), torch.float32, cpu)
    b = pool.take((100,), torch.float64, cpu)
    assert a.shape == (4, 8) and a.dtype == torch.float32 and b.dtype == torch.float64
    assert a.data_ptr() != b.data_ptr()
    pool.give(a, b, None)
    c = pool.take((2, 8), torch.bfloat16, cpu)  # fits both: the smaller one (a's) comes back
    assert c.data_ptr() == a.data_ptr() and c.shape == (2, 8)
    d = pool.take((2, 8), torch.bfloat16, cpu)  # a's is taken: b's
    assert d.data_ptr() == b.data_ptr()
    e = pool.take((2, 8), torch.bfloat16, cpu)  # none free: a new one
    assert e.data_ptr() not in (a.data_ptr(), b.data_ptr())
    pool.give(c, d, e)
    assert len(pool.free) == 2  # keep=2: the largest kept
    assert max(r.numel() for r in pool.free) == 800
