"""Build, initialise, load and run the reward model (a GPTModel with an 11-wide ScalarHead).

model = build_reward_model(cfg)                           # this rank's stage, any TP/PP
load_policy_weights(model, "ckpt/policy")                 # every weight but the head
model, cfg, tokenizer = load_reward_model("ckpt/rm")      # a trained RM in the current TP layout
scores, probs = score_texts(model, tokenizer, prompts, responses)   # [N], [N, 10]
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core import dist_checkpointing
from megatron.core import parallel_state as ps

from vepo_mcore.config.base import load_config
from vepo_mcore.config.job import JobConfig
from vepo_mcore.models.heads import LM_HEAD, build_value_model
from vepo_mcore.parallel import init_model_parallel
from vepo_mcore.parallel.device import device
from vepo_mcore.rm import NUM_OUTPUTS
from vepo_mcore.rm.data import encode, pad
from vepo_mcore.rm.loss import gather_last, positions
from vepo_mcore.tokenizer import load_tokenizer
from vepo_mcore.training.checkpointing import load_checkpoint, resolve_checkpoint
from vepo_mcore.training.optimizer import unwrap
from vepo_mcore.training.pipeline import broadcast_from_last_stage, forward_backward
from vepo_mcore.training.state_dict import load_model_state


def build_reward_model(cfg: JobConfig, pre_process=None, post_process=None):
    """This rank's stage of the RM: GPTModel whose output layer is ScalarHead(hidden, 11)."""

    return build_value_model(cfg, NUM_OUTPUTS, pre_process, post_process)


def load_policy_weights(model, checkpoint: str | Path) -> list[str]:
    """Collective: initialise `model` from a policy checkpoint (weights only, any saved TP/PP).

    training.checkpointing.load_checkpoint loads the model's whole sharded state dict, and the
    policy has no 11-wide head (its output_layer is the vocab projection, or absent when tied), so
    it would fail on that key. Here every key except output_layer.* is loaded and the head keeps
    its fresh initialisation. Returns the names of the parameters left at initialisation.
    """

    path = resolve_checkpoint(checkpoint)
    if path is None:
        raise FileNotFoundError(f"policy checkpoint {checkpoint} holds no checkpoint (no 'latest' or iter_*)")
    inner = unwrap(model)
    wanted = {k: v for k, v in inner.sharded_state_dict().items() if not k.startswith(LM_HEAD)}
    loaded = dist_checkpointing.load({"model": wanted}, str(path))["model"]
    try:
        return load_model_state(inner, loaded, missing_ok=(LM_HEAD,))
    except ValueError as e:
        raise ValueError(f"{path}: policy weights do not fit the reward model: {e}") from None


def load_reward_model(checkpoint: str | Path, cfg: JobConfig | None = None):
    """Collective over the current model-parallel groups: (model, cfg, tokenizer) of a trained RM.

    The model shape comes from the checkpoint's config.yaml and the parallel layout from the
    running process (dist_checkpointing reshards to the current TP/PP). Starts a 1-process group
    with TP=PP=1 when none is initialised.
    """

    path = resolve_checkpoint(checkpoint)
    if path is None:
        raise FileNotFoundError(
            f"rewards.rm_checkpoint {checkpoint} holds no checkpoint (no 'latest' or iter_*)"
        )
    if cfg is None:
        config_file = path / "config.yaml"
        if not config_file.is_file():
            raise FileNotFoundError(f"{config_file} missing: the RM checkpoint must carry its config.yaml")
        cfg = load_config(JobConfig, config_file)
    running = dist.is_initialized() and ps.model_parallel_is_initialized()
    p = cfg.parallel
    p.tensor_model_parallel_size = ps.get_tensor_model_parallel_world_size() if running else 1
    p.pipeline_model_parallel_size = ps.get_pipeline_model_parallel_world_size() if running else 1
    # Sequence parallelism splits activations over TP ranks: only meaningful in the TP it runs in.
    p.sequence_parallel = p.sequence_parallel and p.tensor_model_parallel_size > 1
    if not running:
        init_model_parallel(p, seed=cfg.training.seed)
    model = build_reward_model(cfg)
    load_checkpoint(path, model, finetune=True)
    model.eval()
    tokenizer_dir = path / "tokenizer"
    tokenizer = load_tokenizer(tokenizer_dir if tokenizer_dir.is_dir() else cfg.tokenizer.path)
    return model, cfg, tokenizer


def _micro_batches(
    rows: list[list[int]], pad_id: int, batch_size: int, same_shape: bool, multiple: int
) -> list[dict[str, torch.Tensor]]:
    """Token rows -> micro-batches {"tokens" [b, s], "last" [b]} of `batch_size` rows.

    With `same_shape` (pipeline parallel: the stages exchange [s, b, hidden] activations of one
    fixed shape) every micro-batch has `batch_size` rows, the last one filled with copies of a
    padding row, and every row is right-padded to the longest row overall; otherwise each
    micro-batch is padded to its own longest row, as a single forward call would be. Widths are
    rounded up to `multiple` (sequence parallelism splits the sequence over the TP ranks). Right
    padding does not change the outputs at the real tokens (causal attention).
    """
    width = max(len(r) for r in rows) if same_shape else None
    out = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start : start + batch_size]
        if same_shape:
            chunk = chunk + [[pad_id]] * (batch_size - len(chunk))
        length = width or max(len(r) for r in chunk)
        tokens, last = pad(chunk, pad_id, -(-length // multiple) * multiple)
        out.append({"tokens": tokens, "last": last})
    return out


@torch.no_grad()
def score_texts(
    model,
    tokenizer,
    prompts: Sequence[str],
    responses: Sequence[str],
    seq_length: int = 1024,
    batch_size: int = 16,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores [N], category probabilities [N, 10]) of prompt + response + <|im_end|>, on CPU.

    Collective over the model-parallel group: every rank of the model's TP and PP groups must
    call this with the same texts. The texts run through megatron's forward-only schedule in
    micro-batches of `batch_size` rows (any TP/PP); the outputs, read at each row's last real
    token on the last pipeline stage, come back identical on every rank of those groups.
    """

    if len(prompts) != len(responses):
        raise ValueError(f"score_texts: {len(prompts)} prompts but {len(responses)} responses")
    if batch_size < 1:
        raise ValueError(f"score_texts: batch_size must be >= 1, got {batch_size}")
    if not prompts:
        return torch.zeros(0), torch.zeros(0, NUM_OUTPUTS - 1)
    rows = [encode(tokenizer, p, r, seq_length) for p, r in zip(prompts, responses)]
    pipelined = ps.get_pipeline_model_parallel_world_size() > 1
    sequence_parallel = getattr(model.config, "sequence_parallel", False)
    multiple = ps.get_tensor_model_parallel_world_size() if sequence_parallel else 1
    micro = _micro_batches(rows, tokenizer.eod_id, batch_size, pipelined, multiple)
    outputs: list[torch.Tensor] = []

    def forward_step(data_iterator, module):
        mb = {k: v.to(device()) for k, v in next(data_iterator).items()}
        out = module(mb["tokens"], positions(mb["tokens"]), None)

        def stash(output):
            outputs.append(gather_last(output, mb["last"]).float())
            return output.new_zeros(()), torch.ones((), dtype=torch.int), {}

        return out, stash

    was_training = model.training
    model.eval()
    forward_backward(model, micro, forward_step, forward_only=True, shape=tuple(micro[0]["tokens"].shape))
    model.train(was_training)
    n_rows = sum(mb["tokens"].shape[0] for mb in micro)
    if ps.is_pipeline_last_stage(ignore_virtual=True):
        at = torch.cat(outputs)
    else:
        at = torch.empty(n_rows, NUM_OUTPUTS, device=device())
    broadcast_from_last_stage([at])  # on the compute device: NCCL broadcasts device tensors only
    at = at[: len(rows)].cpu()  # drops the padding rows of the last micro-batch
    return at[:, 0].contiguous(), torch.sigmoid(at[:, 1:])
