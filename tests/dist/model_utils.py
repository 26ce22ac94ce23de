"""Shared helpers for the multi-process model tests: a tiny config, a megatron training step
through the real schedules, and weight exchange through dist_checkpointing."""

from __future__ import annotations

import torch

from vepo_mcore.config import JobConfig

VOCAB = 500


def tiny_cfg(tp: int = 1, pp: int = 1, **model) -> JobConfig:
    cfg = JobConfig()
    cfg.model.num_layers = model.get("num_layers", 4)
    cfg.model.hidden_size = 64
    cfg.model.ffn_hidden_size = 128
    cfg.model.num_attention_heads = 4
    cfg.model.num_query_groups = 2
    cfg.model.vocab_size = VOCAB
    cfg.model.make_vocab_size_divisible_by = 64
    cfg.model.tie_word_embeddings = model.get("tie_word_embeddings", False)
    cfg.parallel.tensor_model_parallel_size = tp
    cfg.parallel.pipeline_model_parallel_size = pp
    return cfg


def batch(seed: int, batch_size: int = 2, seq: int = 16) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (batch_size, seq + 1), generator=g)
    return {"tokens": tokens[:, :-1].contiguous(), "labels": tokens[:, 1:].contiguous()}


def positions(tokens: torch.Tensor) -> torch.Tensor:
    return torch.arange(tokens.shape[1]).unsqueeze(0).expand_as(tokens)


def param_grads(model) -> dict[str, torch.Tensor]:
    """name -> a copy of each parameter's .grad (those that have one)."""
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def tiny_model(tp: int, tied: bool, seed: int, batch_seed: int, batch_size: int, seq: int):
    """(model, tokens, labels, positions): model parallel set up at TP = tp (one process per rank),
    a 2-layer tiny QwenGPTModel, and a random batch [batch_size, seq]."""
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.parallel import init_model_parallel

    cfg = tiny_cfg(tp=tp, num_layers=2, tie_word_embeddings=tied)
    init_model_parallel(cfg.parallel, seed=seed)
    data = batch(batch_seed, batch_size=batch_size, seq=seq)
    return build_model(cfg), data["tokens"], data["labels"], positions(data["tokens"])


def save_model(model, directory: str) -> None:
    import os

    from megatron.core import dist_checkpointing

    os.makedirs(directory, exist_ok=True)
    dist_checkpointing.save(model.sharded_state_dict(), directory)


def load_model(model, directory: str) -> None:
    from megatron.core import dist_checkpointing

    state = dist_checkpointing.load(model.sharded_state_dict(), directory)
    model.load_state_dict(state)


def gather_logits(logits: torch.Tensor) -> torch.Tensor:
    """[b, s, V/TP] vocab-parallel shard -> full [b, s, V] on every TP rank."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    if parallel_state.get_tensor_model_parallel_world_size() == 1:
        return logits
    return gather_from_tensor_model_parallel_region(logits)


def megatron_step(
    model, batches: list[dict], cfg: JobConfig, lr: float = 1e-2, optimizer: str = "adam"
) -> float | None:
    """One optimizer step over `batches` (one micro-batch each) with megatron's schedule,
    DDP and optimizer; returns the mean loss on the last pipeline stage, else None."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func

    opt = get_megatron_optimizer(
        OptimizerConfig(optimizer=optimizer, lr=lr, weight_decay=0.1, clip_grad=1.0, bf16=False),
        [model],
    )
    it = iter(batches)

    def forward_step(data_iterator, module):
        b = next(data_iterator)
        out = module(b["tokens"], positions(b["tokens"]), None, labels=b["labels"])

        def loss_func(per_token):
            loss = per_token.float().mean()
            return loss, {"loss": loss.detach()}

        return out, loss_func

    model.zero_grad_buffer()
    opt.zero_grad()
    losses = get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=it,
        model=[model],
        num_microbatches=len(batches),
        seq_length=batches[0]["tokens"].shape[1],
        micro_batch_size=batches[0]["tokens"].shape[0],
        forward_only=False,
    )
    model.finish_grad_sync()
    ok, _, _ = opt.step()
    assert ok
    if losses:
        return float(torch.stack([x["loss"] for x in losses]).mean())
    return None


def wrap_ddp(model):
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    return DistributedDataParallel(
        config=model.config,
        ddp_config=DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False),
        module=model,
    )
