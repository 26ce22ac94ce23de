"""Megatron (TP shards, PP stages) -> full HF-named tensors -> the rollout engine, after each optimizer step.

    sync_weights(engine, model, cfg)      # collective: call on every rank; no-op for the embedded engine

`full_megatron_tensors` streams the model one parameter at a time to the engine's owner rank:
each pipeline stage's TP ranks gather their shards to TP rank 0 (dist.gather) which merges them
with checkpoint.mapping.tp_merge; that rank sends the full tensor to the owner (send/recv; nothing
is sent when it is the owner). Each owner takes the weights from the replicas inside its own block
of rl.rollout.ranks_per_engine ranks only (its node, or its part of one: the block holds whole
replicas), parameter i of a stage from the block's replica i mod (replicas in the block), and all
owners fill at once in one pass: no weight crosses a block's boundary, and each replica of a block
moves its share. `hf_tensors` renames and
re-lays them out with checkpoint.mapping.megatron_to_hf_tensors (fused qkv -> q, k, v; fc1 ->
gate, up; vocab rows cut or zero-padded to the engine's rows). The owner hands the stream to
`engine.update_weights`, which buckets it, so peak extra memory is about one bucket plus one
tensor, and every byte of the model reaches the engine once (benchmarks/weight_sync.py).
`sync_weights(..., version=)` moves nothing when the engine still holds that version of the
weights (the RL trainer passes its iteration, which each step's optimizer updates advance); an
engine that releases its weights when it sleeps forgets its version, so it is filled again.

An engine on other GPUs (rl.rollout.weight_sync: distributed) gets the weights as SGLang's
`update_weights_from_distributed` takes them: over process groups (NCCL; gloo in the CPU tests)
whose rank 0 is a trainer rank and whose other ranks are the engines' GPUs
(`init_weights_update_group(master_address, master_port, rank_offset, world_size, group_name,
backend)`). SGLang receives every bucket as `broadcast(src=0)` in the named group. Each data-parallel
replica sends its share: there is one group per (pipeline stage, replica),
rank 0 being that replica's TP rank 0 of the stage, and parameter i of a stage goes out through
replica i mod DP. A stage's parameters never leave their stage; the TP shards are gathered to the
source, renamed and re-laid out to HF tensors, packed into byte buckets of one dtype
(rl.rollout.weight_bucket_mb) and broadcast, while the engine's owner rank calls
update_weights_from_distributed(names, dtypes, shapes, group_name, load_format="flattened_bucket")
with the bucket's metadata (sent by the source over a gloo group). One broadcast feeds every engine.

A source hosts its group's TCP store at the address of its interface that routes to MASTER_ADDR
(what torchrun and the launch scripts set), not at its host name's /etc/hosts entry.

The engine takes one request at a time, so the replicas' broadcasts reach it one after another:
what the split buys is the gathers, conversions and sending links spread over the replicas (each
replica's node sends 1/DP of the model), at the cost of DP NCCL communicators per stage on every
engine GPU. slime sends from one replica per stage ("slime-pp_{pp_rank}", DP = TP = 0;
slime/backends/megatron_utils/update_weight_utils.py); with DP = 1 the two are the same.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import queue
import socket
import threading
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world

from vepo_mcore.checkpoint import mapping
from vepo_mcore.checkpoint.convert import layer_offset
from vepo_mcore.rollout.sglang_engine import bucketize

# Imported where used: megatron.core (heavy: seconds to import; the trainers import this module before they
# take the save folder's lock).


def _unwrap(model):
    if isinstance(model, (list, tuple)):
        if len(model) != 1:
            raise NotImplementedError("weight sync does not support virtual pipeline stages yet")
        model = model[0]
    while hasattr(model, "module"):
        model = model.module
    return model


def _full_shape(name: str, shard_shape: torch.Size, tp_size: int) -> list[int]:
    _, rule = mapping.parse_megatron_name(name)
    shape = list(shard_shape)
    if rule.tp in ("column", "gate_up"):
        shape[0] *= tp_size
    elif rule.tp == "row":
        shape[1] *= tp_size
    return shape


def _plain(t: torch.Tensor) -> torch.Tensor:
    """A plain dense tensor (Transformer Engine FP8 parameters are dequantised)."""
    t = t.detach()
    if type(t) is not torch.Tensor and hasattr(t, "dequantize"):
        t = t.dequantize()
    return t


def _stage_weights(model, cfg) -> Iterator[tuple[str, torch.nn.Parameter]]:
    """(global megatron name, local shard) of this stage's weights: no weightless entries, and no
    tied output layer (the last stage's copy of the embedding)."""
    offset = layer_offset(model)
    for name, param in model.named_parameters():
        global_name = mapping.global_layer_name(name, offset)
        if mapping.is_weightless(global_name):
            continue
        if global_name == "output_layer.weight" and cfg.model.tie_word_embeddings:
            continue
        yield global_name, param


def full_megatron_tensors(
    model, cfg, dst: int = 0, block: range | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(global megatron name, full tensor) for every weight, yielded on rank `dst` only.

    Collective over the default group: every rank must exhaust the iterator. Tied output layers
    (a copy of the embedding on the last stage) are skipped. `block` (default: every rank) is the
    range of ranks `dst` takes from: only the replicas inside it gather and send to it. Ranks of
    disjoint blocks may call this at once, each block with its own `dst`: their gathers and sends
    never meet, so every engine owner fills at once.
    """
    from megatron.core import parallel_state

    model = _unwrap(model)
    rank = dist.get_rank()
    tp_size = parallel_state.get_tensor_model_parallel_world_size()
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    # Context-parallel ranks hold the full weights too: they count as replicas here.
    dp_rank = parallel_state.get_data_parallel_rank(with_context_parallel=True)
    local = list(_stage_weights(model, cfg))
    # Sources (TP rank 0 of every stage of every replica) announce what they hold, in which shapes.
    announce = None
    if tp_rank == 0:
        announce = (pp_rank, dp_rank, [(n, _full_shape(n, p.shape, tp_size), p.dtype) for n, p in local])
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, announce)
    block = range(dist.get_world_size()) if block is None else block
    # Per stage, the sources inside the block: (rank, replica), replica by replica.
    sources: dict[int, list[tuple[int, int]]] = {}
    for r, a in enumerate(everyone):
        if a is not None and r in block:
            sources.setdefault(a[0], []).append((r, a[1]))
    entries_of = {a[0]: a[2] for a in everyone if a is not None}
    device = next(model.parameters()).device
    for stage in sorted(entries_of):
        if stage not in sources:
            raise ValueError(
                f"ranks {block.start}..{block.stop - 1} hold no replica of pipeline stage {stage}"
            )
        for i, (name, shape, dtype) in enumerate(entries_of[stage]):
            # this parameter's gather and send fall to one replica of the block
            src, replica = sources[stage][i % len(sources[stage])]
            full = None
            if pp_rank == stage and dp_rank == replica:
                full = _gather_tp(name, _plain(local[i][1]), tp_size, tp_rank)
            if rank == src and src != dst:
                dist.send(full.contiguous(), dst=dst)
            elif rank == dst and src != dst:
                full = torch.empty(shape, dtype=dtype, device=device)
                dist.recv(full, src=src)
            if rank == dst:
                yield name, full


def _gather_tp(name: str, shard: torch.Tensor, tp_size: int, tp_rank: int) -> torch.Tensor | None:
    """The full tensor on TP rank 0 (None on the others); replicated tensors are taken as they are."""
    from megatron.core import parallel_state

    _, rule = mapping.parse_megatron_name(name)
    if tp_size == 1 or rule.tp is None:
        return shard
    shard = shard.contiguous()
    parts = [torch.empty_like(shard) for _ in range(tp_size)] if tp_rank == 0 else None
    dist.gather(
        shard,
        gather_list=parts,
        dst=parallel_state.get_tensor_model_parallel_src_rank(),
        group=parallel_state.get_tensor_model_parallel_group(),
    )
    return mapping.tp_merge(name, parts) if tp_rank == 0 else None


def hf_tensors(
    model,
    cfg,
    dst: int = 0,
    vocab_rows: int | None = None,
    dtype: torch.dtype | None = None,
    block: range | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) on rank `dst`, taken from the ranks of `block` (default: all);
    vocab tensors get `vocab_rows` rows (default: the real vocab)."""
    rows = cfg.model.vocab_size if vocab_rows is None else vocab_rows
    for hf_name, tensor in mapping.megatron_to_hf_tensors(
        full_megatron_tensors(model, cfg, dst, block), cfg.model, rows
    ):
        yield hf_name, tensor if dtype is None else tensor.to(dtype)


def sync_weights(
    engine, model, cfg, bucket_bytes: int | None = None, version: int | None = None
) -> dict | None:
    """Push the current policy into `engine` (collective; call on every rank after the optimizer step).

    `version` names the weights (the caller bumps it with every optimizer step): when the engine
    still holds that version (`engine.weights_version`: set here, cleared by an engine that releases
    its weights), nothing moves and the owners get {'skipped': 1.0}. Every rank sees the same
    versions, so all ranks skip together. Returns the engine's transfer stats on its owner ranks
    ({'bytes', 'tensors', 'calls', 'seconds'}), None elsewhere and for engines that compute with
    the training weights.
    """
    if engine.shares_training_weights:
        return None
    if version is not None and getattr(engine, "weights_version", None) == version:
        return {"skipped": 1.0} if getattr(engine, "is_owner", True) else None
    if getattr(engine, "weight_sync", "colocated") == "distributed":
        result = sync_weights_distributed(engine, model, cfg, bucket_bytes)
    else:
        result = _sync_colocated(engine, model, cfg, bucket_bytes)
    engine.weights_version = version
    return result


def _sync_colocated(engine, model, cfg, bucket_bytes: int | None) -> dict | None:
    """Every owner at once fills its engine from the replicas of its own block of ranks (its node, or
    its part of one), so no weight crosses a block's boundary; each owner receives the whole model
    (its engine shards it itself)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    owner = getattr(engine, "owner_rank", 0)
    owners = list(getattr(engine, "owner_ranks", [owner]))
    end = next((o for o in owners if o > owner), world)
    stream = hf_tensors(model, cfg, dst=owner, vocab_rows=getattr(engine, "engine_vocab_rows", None),
                        block=range(owner, end))  # fmt: skip
    if rank == owner:
        engine.update_weights(stream, bucket_bytes)
        return dict(engine.last_sync) if getattr(engine, "last_sync", None) else {}
    for _ in stream:  # the others take part in their block's gathers and sends only
        pass
    return None


# ---------------------------------------------------------------- update_weights_from_distributed

GROUP_PREFIX = "vepo_weights_pp"
"""Update-group names: GROUP_PREFIX + pipeline stage + "_dp" + data-parallel replica."""


def init_update_group(
    backend: str, master_address: str, master_port: int, rank: int, world_size: int, group_name: str
) -> dist.ProcessGroup:
    """Join a process group apart from the default one (trainer ranks and engine GPUs together).

    The same rendezvous as SGLang's side (sglang.srt.utils.init_custom_process_group, which slime
    mirrors): a TCP store at master_address:master_port hosted by group rank 0, keys under
    `group_name`. torch.distributed.new_group only takes ranks of the default group, hence the
    lower-level helper; the group is registered with identity rank mapping so torch.distributed's
    collectives take it (`src=0` is the group's rank 0).
    """
    timeout = datetime.timedelta(minutes=30)
    store, rank, world_size = next(
        dist.rendezvous(f"tcp://{master_address}:{master_port}", rank, world_size, timeout=timeout)
    )
    store.set_timeout(timeout)
    group, _ = _new_process_group_helper(
        world_size, rank, [], Backend(backend), PrefixStore(group_name, store), group_name=group_name,
        timeout=timeout,
    )  # fmt: skip
    _world.pg_group_ranks[group] = {i: i for i in range(world_size)}
    return group


def _host_address(master_address: str | None = None) -> str:
    """The address other nodes reach this one at, for the TCP store of an update group it hosts.

    `master_address` (default: $MASTER_ADDR, which torchrun and the launch scripts set): the
    address of this host's interface that routes to it (a UDP connect sends nothing); a loopback
    master means one node, 127.0.0.1. The host name's own entry is not used: /etc/hosts often maps
    it to 127.0.1.1, unreachable from other nodes. Without any master address: 127.0.0.1.
    """
    master = master_address or os.environ.get("MASTER_ADDR")
    if not master:
        return "127.0.0.1"
    try:
        resolved = socket.gethostbyname(master)
    except OSError as exc:
        raise ValueError(f"MASTER_ADDR {master!r} does not resolve: {exc}") from None
    if ipaddress.ip_address(resolved).is_loopback:
        return "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect((resolved, 9))
        except OSError as exc:
            raise ValueError(f"no route from this host to MASTER_ADDR {master!r}: {exc}") from None
        return sock.getsockname()[0]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


class UpdateGroups:
    """The update groups of one job and its engines, one per (pipeline stage, data-parallel replica)
    (built once, collectively)."""

    def __init__(self, engine, cfg):
        from megatron.core import parallel_state as ps

        self.backend = cfg.rl.rollout.weight_sync_backend
        key = (ps.get_pipeline_model_parallel_rank(), ps.get_data_parallel_rank(with_context_parallel=True))
        self.is_source = ps.get_tensor_model_parallel_rank() == 0
        rank = dist.get_rank()
        self.owners = list(engine.owner_ranks)
        # Bucket metadata goes from each source to each owner over gloo (whatever the training backend),
        # one group per owner: an owner's receiving thread is the only user of its group on that rank,
        # while the rank's main thread, when it is also a source, sends over the other owners' groups
        # (new_group is collective: every rank creates every group, in the same order).
        self.control = {owner: dist.new_group(backend="gloo") for owner in self.owners}
        address = (_host_address(), _free_port()) if self.is_source else None
        everyone = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, (key, rank, address) if self.is_source else None)
        self.sources = {k: (r, addr) for k, r, addr in filter(None, everyone)}  # key -> (rank, addr)
        engine_tp = engine.engine_tp
        world = 1 + len(self.owners) * engine_tp
        self.group = None
        joined = None
        if engine.is_owner:  # the engine joins every group; each call blocks until all its ranks joined
            offset = 1 + self.owners.index(rank) * engine_tp
            calls = [(*self.sources[k][1], offset, world, self.group_name(k)) for k in sorted(self.sources)]
            joined = _in_thread(lambda: [engine.join_update_group(*call, self.backend) for call in calls])
        if self.is_source:
            host, port = self.sources[key][1]
            self.group = init_update_group(self.backend, host, port, 0, world, self.group_name(key))
        if joined is not None:
            joined.result()
        dist.barrier(group=self.control[self.owners[0]])

    @staticmethod
    def group_name(key: tuple[int, int]) -> str:
        stage, replica = key
        return f"{GROUP_PREFIX}{stage}_dp{replica}"


class _in_thread:
    """Run fn in a thread (the engine's calls block until the other side acts); result() re-raises."""

    def __init__(self, fn):
        self._out: queue.Queue = queue.Queue(1)
        self._thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self._thread.start()

    def _run(self, fn) -> None:
        try:
            self._out.put((True, fn()))
        except BaseException as exc:  # re-raised in the caller's thread
            self._out.put((False, exc))

    def result(self):
        self._thread.join()
        ok, value = self._out.get()
        if not ok:
            raise value
        return value


def stage_tensors(model, cfg) -> Iterator[tuple[str, torch.Tensor | None]]:
    """(global megatron name, full tensor) of this data-parallel replica's share of its pipeline
    stage's weights (parameter i when i mod DP is the replica), on the replica's TP rank 0; its TP
    peers take part in the gathers and get None. Tied output layers are skipped, as in
    full_megatron_tensors."""
    from megatron.core import parallel_state as ps

    model = _unwrap(model)
    replica = ps.get_data_parallel_rank(with_context_parallel=True)
    replicas = ps.get_data_parallel_world_size(with_context_parallel=True)
    tp_size = ps.get_tensor_model_parallel_world_size()
    tp_rank = ps.get_tensor_model_parallel_rank()
    for i, (global_name, param) in enumerate(_stage_weights(model, cfg)):
        if i % replicas == replica:
            yield global_name, _gather_tp(global_name, _plain(param), tp_size, tp_rank)


def flatten_bucket(named: list[tuple[str, torch.Tensor]]) -> torch.Tensor:
    """Tensors of one dtype -> their bytes end to end (uint8), the layout SGLang's receiving
    FlattenedTensorBucket allocates from (names, dtypes, shapes) for load_format='flattened_bucket'."""
    return torch.cat([t.detach().contiguous().reshape(-1).view(torch.uint8) for _, t in named])


def bucket_metadata(named: list[tuple[str, torch.Tensor]]) -> tuple[list[str], list[str], list[list[int]]]:
    """(names, dtypes as SGLang reads them with getattr(torch, dtype), shapes)."""
    return (
        [n for n, _ in named],
        [str(t.dtype).removeprefix("torch.") for _, t in named],
        [list(t.shape) for _, t in named],
    )


def sync_weights_distributed(engine, model, cfg, bucket_bytes: int | None = None) -> dict | None:
    """Collective: broadcast the policy to the engines over the update groups.

    Each replica's source of each stage gathers, converts and broadcasts its share bucket by bucket;
    engine owners call the engine once per bucket with its metadata, taking the sources one after
    another; every other rank takes part in its replica's TP gathers only.
    Returns the engine's stats on owners ({'bytes', 'tensors', 'calls', 'seconds'}), None elsewhere.
    """
    groups = getattr(engine, "update_groups", None)
    if groups is None:
        groups = engine.update_groups = UpdateGroups(engine, cfg)
    bucket_bytes = engine.bucket_bytes if bucket_bytes is None else bucket_bytes
    if bucket_bytes <= 0:
        raise ValueError("rl.rollout.weight_bucket_mb must be > 0 with weight_sync 'distributed'")
    rank = dist.get_rank()
    local = queue.Queue()  # metadata from this rank's own source role to its own owner role
    receiving = None
    if engine.is_owner:

        def buckets():
            for key in sorted(groups.sources):
                src = groups.sources[key][0]
                while True:
                    if src == rank:
                        meta = local.get()
                    else:
                        box = [None]
                        dist.recv_object_list(box, src=src, group=groups.control[rank])
                        meta = box[0]
                    if meta is None:
                        break
                    yield (groups.group_name(key), *meta)

        receiving = _in_thread(lambda: engine.update_weights_from_distributed(buckets()))

    def tell_owners(meta) -> None:
        for owner in groups.owners:
            if owner == rank:
                local.put(meta)
            else:
                dist.send_object_list([meta], dst=owner, group=groups.control[owner])

    try:
        rows = getattr(engine, "engine_vocab_rows", None) or cfg.model.vocab_size
        stream = stage_tensors(model, cfg)
        if groups.is_source:
            try:
                hf = mapping.megatron_to_hf_tensors(stream, cfg.model, rows)
                for bucket in bucketize(hf, bucket_bytes):
                    tell_owners(bucket_metadata(bucket))
                    dist.broadcast(flatten_bucket(bucket), src=0, group=groups.group)
            finally:  # the end of this share (also on an error: the owners stop waiting for it)
                tell_owners(None)
        else:
            for _ in stream:  # TP peers of a source: the gathers only
                pass
    finally:
        result = receiving.result() if receiving is not None else None
    return result
