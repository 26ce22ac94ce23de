"""Weight sync from a TP/PP Megatron model into the fake SGLang engine (through the real SGLang backend
code): the engine's log-probs equal Megatron's on the same tokens, before and after a weight update."""

from __future__ import annotations

import zlib

import torch

import harness.fake_sglang  # noqa: F401  (registers the 'fake_sglang' rollout engine)
from tests.dist.model_utils import VOCAB, tiny_cfg
from vepo_mcore.parallel.launch import run_processes

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12]]
TAU = 0.8


def _megatron_logprobs(model, prompt_ids, response_ids):
    """log softmax(z / tau) of the response tokens on the last pipeline stage (None elsewhere)."""
    from tests.support.checkpoints import megatron_forward

    tokens = torch.tensor([list(prompt_ids) + list(response_ids)])
    logits = megatron_forward(model, tokens)
    if logits is None:
        return None
    z = logits[0, len(prompt_ids) - 1 : -1, :VOCAB].double() / TAU
    return torch.log_softmax(z, -1).gather(-1, torch.tensor(response_ids)[:, None])[:, 0]


def _check_engine_matches_megatron(engine, model, seed):
    from vepo_mcore.rollout.base import SamplingParams

    samples = engine.generate(PROMPTS, SamplingParams(temperature=TAU, max_new_tokens=5, seed=seed))
    for s in samples:  # every rank got the owner's samples
        ref = _megatron_logprobs(model, s.prompt_ids, s.response_ids)
        if ref is not None:
            got = torch.tensor(s.rollout_logprobs).double()
            assert torch.allclose(got, ref, rtol=1e-5, atol=1e-5), f"engine {got} != Megatron {ref}"
    return samples


def _sync_one(rank, tp, pp, tied):
    import torch.distributed as dist

    from vepo_mcore.models.builder import build_model
    from vepo_mcore.parallel import init_model_parallel
    from vepo_mcore.rollout.base import build_engine
    from vepo_mcore.rollout.weight_sync import sync_weights

    cfg = tiny_cfg(tp=tp, pp=pp, num_layers=2, tie_word_embeddings=tied)
    cfg.model.init_method_std = 0.2
    cfg.rl.rollout.engine = "fake_sglang"
    cfg.rl.rollout.engine_tp = 1  # engine TP differs from training TP: it gets full tensors
    init_model_parallel(cfg.parallel, seed=1)
    model = build_model(cfg).eval()
    engine = build_engine(cfg)  # config-only HF dir, load_format="dummy": weights come from the sync
    engine.wake()  # colocated: released when built; the weights come back before the sync writes them
    flushes = engine.engine.flush_calls if rank == 0 else 0  # the release at start flushed once
    stats = sync_weights(engine, model, cfg, bucket_bytes=64 << 10, version=0)
    if rank == 0:
        fake = engine.engine
        model_bytes = sum(
            p.numel() * p.element_size()
            for n, p in fake.model.named_parameters()
            if not (tied and n == "lm_head.weight")
        )
        assert stats["bytes"] == fake.bytes_received == model_bytes, (stats, model_bytes)
        assert stats["calls"] > 1 and fake.flush_calls == flushes + 1
    else:
        assert stats is None
    before = _check_engine_matches_megatron(engine, model, seed=5)
    # The same weights again (no optimizer step since): nothing moves, on every rank alike.
    received = engine.engine.bytes_received if rank == 0 else 0
    again = sync_weights(engine, model, cfg, version=0)
    assert again == ({"skipped": 1.0} if rank == 0 else None)
    assert rank != 0 or engine.engine.bytes_received == received

    # an "optimizer step": every parameter moves, consistently: TP replicas alike, and with tied
    # embeddings the last stage's output layer like the first stage's embedding (megatron all-reduces
    # their gradients), so the noise is seeded by the parameter's global name.
    from vepo_mcore.checkpoint.convert import layer_offset
    from vepo_mcore.checkpoint.mapping import global_layer_name

    with torch.no_grad():
        for name, p in model.named_parameters():
            name = global_layer_name(name, layer_offset(model))
            if tied and name == "output_layer.weight":
                name = "embedding.word_embeddings.weight"
            g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    engine.sleep()  # releases the weights: the next sync moves them whatever the version
    assert engine.weights_version is None
    engine.wake()
    sync_weights(engine, model, cfg, version=1)
    after = _check_engine_matches_megatron(engine, model, seed=5)
    assert [s.rollout_logprobs for s in after] != [s.rollout_logprobs for s in before]
    dist.barrier()
    engine.shutdown()


RANKS_PER_NODE = 2
"""The dist tests' stand-in for a node: ranks 0-1 and 2-3."""


def _spy_traffic(log: list):
    """Record (kind, peer ranks, bytes) of this rank's sends, receives and gathers; returns an undo."""
    import torch.distributed as dist

    real = {name: getattr(dist, name) for name in ("send", "recv", "gather")}

    def send(tensor, dst, *a, **k):
        log.append(("send", [dst], tensor.numel() * tensor.element_size()))
        return real["send"](tensor, dst, *a, **k)

    def recv(tensor, src=None, *a, **k):
        log.append(("recv", [src], tensor.numel() * tensor.element_size()))
        return real["recv"](tensor, src, *a, **k)

    def gather(tensor, gather_list=None, dst=0, group=None, *a, **k):
        log.append(("gather", dist.get_process_group_ranks(group), tensor.numel() * tensor.element_size()))
        return real["gather"](tensor, gather_list, dst, group, *a, **k)

    dist.send, dist.recv, dist.gather = send, recv, gather
    return lambda: [setattr(dist, name, fn) for name, fn in real.items()]


def _two_engines(rank, tp=1):
    """One engine per 2 ranks (a node here): each owner fills its engine from its own node only, all
    owners in one pass; each rank gets its own prompts' samples."""

    from vepo_mcore.models.builder import build_model
    from vepo_mcore.parallel import init_model_parallel
    from vepo_mcore.rollout import weight_sync
    from vepo_mcore.rollout.base import SamplingParams, build_engine

    cfg = tiny_cfg(tp=tp, num_layers=2)
    cfg.model.init_method_std = 0.2
    cfg.rl.rollout.engine = "fake_sglang"
    init_model_parallel(cfg.parallel, seed=1)  # same seed everywhere: the replicas are equal
    model = build_model(cfg).eval()
    engine = build_engine(cfg, ranks_per_engine=RANKS_PER_NODE)
    assert engine.owner_ranks == [0, 2] and engine.owner_rank == rank // 2 * 2
    assert (engine.engine is not None) == (rank in (0, 2))
    engine.wake()

    traffic, passes = [], []
    undo = _spy_traffic(traffic)
    real_pass = weight_sync.full_megatron_tensors
    weight_sync.full_megatron_tensors = lambda *a, **k: (passes.append(1), real_pass(*a, **k))[1]
    try:
        stats = weight_sync.sync_weights(engine, model, cfg)
    finally:
        undo()
        weight_sync.full_megatron_tensors = real_pass
    assert len(passes) == 1  # one pass for every owner at once
    node = rank // RANKS_PER_NODE
    crossing = sum(b for _, peers, b in traffic if any(p // RANKS_PER_NODE != node for p in peers))
    assert crossing == 0, f"rank {rank}: {crossing} bytes crossed a node boundary: {traffic}"
    sent = [b for kind, _, b in traffic if kind == "send"]
    n_weights = len(list(weight_sync._stage_weights(weight_sync._unwrap(model), cfg)))
    if tp == 1:  # two replicas per node: the non-owner sends every other parameter to its owner
        assert len(sent) == (0 if engine.is_owner else n_weights // 2), (rank, len(sent), n_weights)
    else:  # the owner's replica holds every weight: its TP peer only joins the gathers
        assert not sent
    assert (stats is not None) == (rank in (0, 2))
    replica = rank // tp  # a replica's TP ranks pass the same prompts
    prompts = [[replica + 1] * (replica + 2), [7, replica + 3]]  # different prompts on every replica
    samples = engine.generate(prompts, SamplingParams(temperature=TAU, max_new_tokens=4, seed=replica))
    assert [s.prompt_ids for s in samples] == prompts
    for s in samples:
        ref = _megatron_logprobs(model, s.prompt_ids, s.response_ids)
        assert torch.allclose(torch.tensor(s.rollout_logprobs).double(), ref, rtol=1e-5, atol=1e-5)
    engine.shutdown()


def _sync(rank, world):
    # One set of processes for all cases: spawning and importing dominate these tests' time.
    _sync_one(rank, tp=2, pp=2, tied=False)
    _sync_one(rank, tp=2, pp=2, tied=True)  # the last stage's output layer is the embedding's copy
    _two_engines(rank)
    _two_engines(rank, tp=2)


def test_sync_tp2_pp2_into_fake_sglang_matches_megatron_logprobs():
    run_processes(_sync, 4)
