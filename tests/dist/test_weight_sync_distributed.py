"""Weight sync to an engine on other GPUs (rl.rollout.weight_sync: distributed): 2 trainer processes
and the fake SGLang engine's scheduler, a third process that joins the update group over gloo, as
SGLang's schedulers join it over NCCL. After the sync the engine holds exactly the HF export of the
Megatron model (checkpoint.mapping, the mapping tools/convert_hf.py writes), received in several
byte buckets; every data-parallel replica's TP rank 0 of each pipeline stage broadcasts its share over
a group of its own; and the engine refuses what SGLang refuses, with its messages."""

from __future__ import annotations

import threading

import pytest
import torch

import harness.fake_sglang  # noqa: F401  (registers the 'fake_sglang' rollout engine)
from tests.dist.model_utils import tiny_cfg
from vepo_mcore.parallel.launch import run_processes

BUCKET = 16 << 10  # bytes: several buckets for the tiny model


def _engine_and_model(tp: int, pp: int, ranks_per_engine: int | None = None):
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.parallel import init_model_parallel
    from vepo_mcore.rollout.base import build_engine

    cfg = tiny_cfg(tp=tp, pp=pp, num_layers=2)
    cfg.model.init_method_std = 0.2
    cfg.rl.rollout.engine = "fake_sglang"
    cfg.rl.rollout.weight_sync = "distributed"
    cfg.rl.rollout.weight_sync_backend = "gloo"
    cfg.rl.rollout.ranks_per_engine = ranks_per_engine
    init_model_parallel(cfg.parallel, seed=1)
    model = build_model(cfg).eval()
    return cfg, model, build_engine(cfg)


def _spy_broadcasts(seen: list):
    """Wrap torch.distributed.broadcast to record (group, numel) of this rank's calls; returns the real one."""
    import torch.distributed as dist

    real = dist.broadcast

    def spy(tensor, src, group=None, *args, **kwargs):
        seen.append((group, tensor.numel()))
        return real(tensor, src, group, *args, **kwargs)

    dist.broadcast = spy
    return real


def _check_engine_holds_export(engine, model, cfg):
    """On each owner: every engine parameter equals the HF export of the model, bit for bit."""
    import torch.distributed as dist

    from vepo_mcore.rollout.weight_sync import hf_tensors

    for owner in engine.owner_ranks:  # collective: the export is gathered to each owner in turn
        exported = dict(hf_tensors(model, cfg, dst=owner, vocab_rows=engine.engine_vocab_rows))
        if dist.get_rank() == owner:
            export = exported
    if engine.engine is None:
        return
    params = dict(engine.engine.model.named_parameters())
    tied = cfg.model.tie_word_embeddings
    assert set(export) == set(params) - ({"lm_head.weight"} if tied else set())
    for name, tensor in export.items():
        assert torch.equal(params[name].detach(), tensor.float()), f"{name} differs after the sync"


def _case(rank, tp, pp, refusals=False, ranks_per_engine=None):
    import torch.distributed as dist

    from vepo_mcore.rollout.weight_sync import sync_weights

    cfg, model, engine = _engine_and_model(tp, pp, ranks_per_engine)
    assert ("weights" in engine.released) is False  # not colocated: nothing released
    seen: list = []
    real = _spy_broadcasts(seen)
    try:
        stats = sync_weights(engine, model, cfg, bucket_bytes=BUCKET)
    finally:
        dist.broadcast = real
    group = engine.update_groups.group  # this rank's update group (None unless it is a source)
    sent = [n for g, n in seen if g is not None and g is group]
    _check_engine_holds_export(engine, model, cfg)
    from megatron.core import parallel_state as ps

    dp = ps.get_data_parallel_world_size()
    source = ps.get_tensor_model_parallel_rank() == 0  # every replica sends its share
    assert (len(sent) > 0) == source, f"rank {rank} broadcast {len(sent)} buckets (source: {source})"
    counts = [None] * dist.get_world_size()
    dist.all_gather_object(counts, len(sent))
    if engine.is_owner:
        fake = engine.engine
        calls = [c for c in fake.calls if c[0] == "update_weights_from_distributed"]
        assert stats["calls"] == len(calls) == sum(counts) > 2, (stats, counts)
        assert {c[1]["load_format"] for c in calls} == {"flattened_bucket"}
        names = {f"vepo_weights_pp{s}_dp{d}" for s in range(pp) for d in range(dp)}
        assert {c[1]["group_name"] for c in calls} == names
        # The replicas' shares are disjoint and together the model: no tensor arrives twice.
        received = [n for c in calls for n in c[1]["names"]]
        assert len(received) == len(set(received))
        assert stats["bytes"] == fake.bytes_received
        for c in calls:  # buckets by bytes: one dtype, at most BUCKET unless a tensor alone is larger
            sizes = [
                torch.Size(s).numel() * getattr(torch, d).itemsize
                for d, s in zip(c[1]["dtypes"], c[1]["shapes"])
            ]
            assert len(set(c[1]["dtypes"])) == 1 and (len(sizes) == 1 or sum(sizes) <= BUCKET)
    else:
        assert stats is None
    # A second sync after an "optimizer step" reuses the groups and carries the new weights.
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    sync_weights(engine, model, cfg, bucket_bytes=BUCKET)
    _check_engine_holds_export(engine, model, cfg)
    if refusals:
        _refusals(rank, engine)
    dist.barrier()
    engine.shutdown()


def _refusals(rank, engine):
    """The fake refuses, with SGLang 0.5.23's messages, what the scheduler refuses."""
    import torch.distributed as dist

    fake = engine.engine
    group = engine.update_groups.group
    if rank != 0:
        return
    name = "model.norm.weight"
    ok, message = fake.update_weights_from_distributed(
        [name], ["float32"], [[64]], group_name="vepo_weights_pp0_dp0"
    )
    assert not ok and "must run between begin_weight_update() and end_weight_update()" in message
    fake.begin_weight_update()
    try:
        ok, message = fake.update_weights_from_distributed([name], ["float32"], [[64]], group_name="nope")
        assert not ok and message == (
            "Failed to receive weights: Group nope not in ['vepo_weights_pp0_dp0']. "
            "Please call `init_weights_update_group` first."
        )
        ok, message = fake.update_weights_from_distributed(
            [name], ["f32"], [[64]], group_name="vepo_weights_pp0_dp0"
        )
        assert not ok and "Failed to receive weights: module 'torch' has no attribute 'f32'" in message

        def send(tensor):  # the trainer's side of one bucket, while the engine call blocks
            thread = threading.Thread(target=dist.broadcast, args=(tensor.view(torch.uint8), 0, group))
            thread.start()
            return thread

        for names, shape, expected in (
            (
                [name],
                [8, 8],
                "Attempted to load weight (torch.Size([8, 8])) into parameter (torch.Size([64]))",
            ),
            (["model.no_such.weight"], [64], "unknown parameter"),
        ):
            thread = send(torch.ones(shape))
            ok, message = fake.update_weights_from_distributed(
                names, ["float32"], [shape], group_name="vepo_weights_pp0_dp0", load_format="flattened_bucket"
            )
            thread.join()
            assert (
                not ok and message.startswith("Failed to update parameter online: ") and expected in message
            )
    finally:
        fake.end_weight_update()


def _all_cases(rank, world):
    _case(rank, tp=2, pp=1, refusals=True)  # TP=2: shards gathered to the source
    _case(rank, tp=1, pp=1)  # DP=2: each replica sends its share over its own group
    _case(rank, tp=1, pp=2)  # PP=2: one group per stage, each stage's source sends its own


@pytest.mark.dist
def test_distributed_sync_into_a_separate_engine_process_equals_the_hf_export():
    run_processes(_all_cases, 2)


def _replicas_and_two_engines(rank, world):
    # TP=2 x DP=2, one engine per replica (owners 0 and 2): rank 2 is an owner receiving metadata
    # while it sends its own share's metadata to owner 0.
    _case(rank, tp=2, pp=1, ranks_per_engine=2)


@pytest.mark.dist
def test_distributed_sync_from_two_tp_replicas_into_two_engines():
    run_processes(_replicas_and_two_engines, 4)
