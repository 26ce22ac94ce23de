"""Megatron (TP shards, PP stages) -> full HF-named tensors -> the rollout engine, after each optimizer step.

    sync_weights(engine, model, cfg)      # collective: call on every rank; no-op for the embedded engine

`full_megatron_tensors` streams the model one parameter at a time to the engine's owner rank:
each pipeline stage's TP ranks gather their shards to TP rank 0 (dist.gather) which merges them
with checkpoint.mapping.tp_merge; that rank sends the full tensor to the owner (send/recv; nothing
is sent when it is the owner). The work is spread over the data-parallel replicas (issue 20.7):
parameter i of a stage is gathered and sent by replica i mod DP, so each replica moves its share
and no single replica's links carry the whole model. `hf_tensors` renames and
re-lays them out with checkpoint.mapping.megatron_to_hf_tensors (fused qkv -> q, k, v; fc1 ->
gate, up; vocab rows cut or zero-padded to the engine's rows). The owner hands the stream to
`engine.update_weights`, which buckets it, so peak extra memory is about one bucket plus one
tensor, and every byte of the model reaches the engine once (benchmarks/weight_sync.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist

from vepo_mcore.checkpoint import mapping


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


def full_megatron_tensors(model, cfg, dst: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """(global megatron name, full tensor) for every weight, yielded on rank `dst` only.

    Collective over the default group: every rank must exhaust the iterator. Tied output layers
    (a copy of the embedding on the last stage) are skipped.
    """
    from megatron.core import parallel_state

    from vepo_mcore.checkpoint.convert import layer_offset

    model = _unwrap(model)
    rank = dist.get_rank()
    tp_size = parallel_state.get_tensor_model_parallel_world_size()
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    # Context-parallel ranks hold the full weights too: they count as replicas here.
    dp_rank = parallel_state.get_data_parallel_rank(with_context_parallel=True)
    dp_size = parallel_state.get_data_parallel_world_size(with_context_parallel=True)
    offset = layer_offset(model)
    local = []
    for name, param in model.named_parameters():
        global_name = mapping.global_layer_name(name, offset)
        if mapping.is_weightless(global_name):
            continue
        if global_name == "output_layer.weight" and cfg.model.tie_word_embeddings:
            continue
        local.append((global_name, param))
    # Sources (TP rank 0 of every stage of every replica) announce what they hold, in which shapes.
    announce = None
    if tp_rank == 0:
        announce = (pp_rank, dp_rank, [(n, _full_shape(n, p.shape, tp_size), p.dtype) for n, p in local])
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, announce)
    sources = {(a[0], a[1]): r for r, a in enumerate(everyone) if a is not None}
    entries_of = {a[0]: a[2] for a in everyone if a is not None}
    device = next(model.parameters()).device
    for stage in sorted(entries_of):
        for i, (name, shape, dtype) in enumerate(entries_of[stage]):
            replica = i % dp_size  # this parameter's gather and send fall to one replica
            src = sources[(stage, replica)]
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
    model, cfg, dst: int = 0, vocab_rows: int | None = None, dtype: torch.dtype | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) on rank `dst`; vocab tensors get `vocab_rows` rows (default: the real vocab)."""
    rows = cfg.model.vocab_size if vocab_rows is None else vocab_rows
    for hf_name, tensor in mapping.megatron_to_hf_tensors(
        full_megatron_tensors(model, cfg, dst), cfg.model, rows
    ):
        yield hf_name, tensor if dtype is None else tensor.to(dtype)


def sync_weights(engine, model, cfg, bucket_bytes: int | None = None) -> dict | None:
    """Push the current policy into `engine` (collective; call on every rank after the optimizer step).

    Returns the engine's transfer stats on its owner ranks ({'bytes', 'tensors', 'calls', 'seconds'}),
    None elsewhere and for engines that compute with the training weights.
    """
    if engine.shares_training_weights:
        return None
    result = None
    for owner in getattr(engine, "owner_ranks", [getattr(engine, "owner_rank", 0)]):
        # One pass per engine: each owner receives the whole model (its engine shards it itself).
        stream = hf_tensors(model, cfg, dst=owner, vocab_rows=getattr(engine, "engine_vocab_rows", None))
        if dist.get_rank() == owner:
            engine.update_weights(stream, bucket_bytes)
            result = dict(engine.last_sync) if getattr(engine, "last_sync", None) else {}
        else:
            for _ in stream:  # the others take part in the gathers and sends only
                pass
    return result
