"""Sampling parameters, top-k/top-p filtering and sampling, weight bucketing, the engine registry."""

from __future__ import annotations

import pytest
import torch

from harness.fake_sglang import FlattenedTensorBucket, MultiprocessingSerializer
from vepo_mcore.config import JobConfig
from vepo_mcore.config.rl import SamplingParams as ConfigSampling
from vepo_mcore.rollout.base import SamplingParams, build_engine, filter_logits, known_engines, sample_next
from vepo_mcore.rollout.sglang_engine import bucketize


def test_config_sampling_is_the_engines_type_and_merges_stop_ids():
    assert ConfigSampling is SamplingParams and isinstance(JobConfig().rl.rollout.sampling, SamplingParams)
    scfg = SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=33, stop_token_ids=[7, 3])
    sp = scfg.with_stops(stop_token_ids=(3, 151645), seed=5)
    assert sp.stop_token_ids == (3, 151645, 7)
    assert (sp.temperature, sp.top_p, sp.top_k, sp.max_new_tokens, sp.seed) == (0.7, 0.9, 20, 33, 5)
    sg = sp.to_sglang()
    assert sg["stop_token_ids"] == [3, 151645, 7] and sg["sampling_seed"] == 5 and sg["max_new_tokens"] == 33


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_k": 0}, "top_k"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
    ],
)
def test_sampling_params_reject_bad_values(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


def _naive_filter(row: torch.Tensor, top_k: int, top_p: float) -> set[int]:
    """Kept token ids, by a plain loop in float64."""
    order = sorted(range(len(row)), key=lambda i: -float(row[i]))
    if top_k > 0:
        order = order[:top_k]
    probs = torch.softmax(row.double()[order], 0) if top_k > 0 else torch.softmax(row.double(), 0)[order]
    kept, mass = [], 0.0
    for i, p in zip(order, probs.tolist()):
        if mass >= top_p:
            break
        kept.append(i)
        mass += p
    return set(kept)


@pytest.mark.parametrize("top_k, top_p", [(-1, 1.0), (5, 1.0), (-1, 0.6), (8, 0.5), (1, 0.3)])
def test_filter_logits_matches_a_naive_loop(top_k, top_p):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 30, generator=g) * 2
    out = filter_logits(logits, top_k, top_p)
    for row, filtered in zip(logits, out):
        kept = {i for i in range(30) if torch.isfinite(filtered[i])}
        assert kept == _naive_filter(row, top_k, top_p)
        assert torch.equal(filtered[list(kept)], row[list(kept)])


def test_sample_next_greedy_and_tempered_logprobs():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 50, generator=g)
    tokens, logp = sample_next(logits, SamplingParams(temperature=0), None)
    assert torch.equal(tokens, logits.argmax(-1))
    assert torch.allclose(logp, torch.log_softmax(logits.double(), -1).max(-1).values.float(), atol=1e-6)
    tokens, logp = sample_next(
        logits, SamplingParams(temperature=0.5, top_k=3), torch.Generator().manual_seed(2)
    )
    top3 = logits.topk(3, -1).indices
    assert all(int(t) in top3[i].tolist() for i, t in enumerate(tokens))
    ref = torch.log_softmax(logits.double() / 0.5, -1).gather(-1, tokens[:, None])[:, 0]
    assert torch.allclose(logp.double(), ref, atol=1e-6)  # before top-k: the training model's quantity


def test_sampling_frequencies_follow_the_nucleus_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0, -3.0]]).repeat(4000, 1)
    sp = SamplingParams(temperature=0.9, top_p=0.8)
    tokens, _ = sample_next(logits, sp, torch.Generator().manual_seed(3))
    kept = sorted(_naive_filter(logits[0] / 0.9, -1, 0.8))
    expected = torch.softmax(logits[0, kept].double() / 0.9, 0)
    counts = torch.bincount(tokens, minlength=5).double() / len(tokens)
    assert set(torch.nonzero(counts).flatten().tolist()) == set(kept)
    assert torch.allclose(counts[kept], expected, atol=0.03)


def test_bucketize_keeps_order_dtype_and_size():
    tensors = [
        ("a", torch.zeros(100)),
        ("b", torch.zeros(300)),
        ("c", torch.zeros(10, dtype=torch.bfloat16)),
        ("d", torch.zeros(50)),
        ("huge", torch.zeros(2000)),
        ("e", torch.zeros(20, dtype=torch.bfloat16)),
    ]
    buckets = list(bucketize(iter(tensors), bucket_bytes=1600))
    names = [[n for n, _ in b] for b in buckets]
    assert sorted(n for b in names for n in b) == sorted(n for n, _ in tensors)
    for b in buckets:
        assert len({t.dtype for _, t in b}) == 1
        assert len(b) == 1 or sum(t.numel() * t.element_size() for _, t in b) <= 1600
    assert ["a", "b"] in names and ["huge"] in names and ["c", "e"] in names


def test_flattened_bucket_round_trip_through_the_serializer():
    named = [("x", torch.randn(3, 4)), ("y", torch.randn(5)), ("z", torch.randn(2, 2, 2))]
    bucket = FlattenedTensorBucket(named_tensors=named)
    assert bucket.get_flattened_tensor().numel() == (12 + 5 + 8) * 4  # bytes (sglang 0.5.23)
    payload = {"flattened_tensor": bucket.get_flattened_tensor(), "metadata": bucket.get_metadata()}
    restored = MultiprocessingSerializer.deserialize(
        MultiprocessingSerializer.serialize(payload, output_str=True)
    )
    out = FlattenedTensorBucket(flattened_tensor=restored["flattened_tensor"], metadata=restored["metadata"])
    for (n1, t1), (n2, t2) in zip(named, out.reconstruct_tensors()):
        assert n1 == n2 and torch.equal(t1, t2)
    with pytest.raises(ValueError, match="empty"):
        FlattenedTensorBucket(named_tensors=[])


def test_unknown_engine_lists_the_known_ones():
    cfg = JobConfig()
    cfg.rl.rollout.engine = "vllm"
    with pytest.raises(ValueError, match="embedded.*fake_sglang.*sglang"):
        build_engine(cfg)
    assert known_engines() == ["embedded", "fake_sglang", "sglang"]
    cfg.rl.rollout.engine = "embedded"
    with pytest.raises(ValueError, match="needs the training model"):
        build_engine(cfg)
