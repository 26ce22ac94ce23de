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

from vepo_mcore.config.job import JobConfig
from vepo_mcore.rm import NUM_OUTPUTS
from vepo_mcore.rm.data import encode, pad
from vepo_mcore.rm.loss import gather_last, positions


def build_reward_model(cfg: JobConfig, pre_process=None, post_process=None):
    """This rank's stage of the RM: GPTModel whose output layer is ScalarHead(hidden, 11)."""
    from vepo_mcore.models.heads import build_value_model

    return build_value_model(cfg, NUM_OUTPUTS, pre_process, post_process)


def load_policy_weights(model, checkpoint: str | Path) -> list[str]:
    """Collective: initialise `model` from a policy checkpoint (weights only, any saved TP/PP).

    training.checkpointing.load_checkpoint loads the model's whole sharded state dict, and the
    policy has no 11-wide head (its output_layer is the vocab projection, or absent when tied), so
    it would fail on that key. Here every key except output_layer.* is loaded and the head keeps
    its fresh initialisation. Returns the names of the parameters left at initialisation.
    """
    from megatron.core import dist_checkpointing

    from vepo_mcore.training.checkpointing import resolve_checkpoint
    from vepo_mcore.training.optimizer import unwrap

    path = resolve_checkpoint(checkpoint)
    if path is None:
        raise FileNotFoundError(f"policy checkpoint {checkpoint} holds no checkpoint (no 'latest' or iter_*)")
    inner = unwrap(model)
    wanted = {k: v for k, v in inner.sharded_state_dict().items() if not k.startswith("output_layer.")}
    loaded = dist_checkpointing.load({"model": wanted}, str(path))["model"]
    missing, unexpected = inner.load_state_dict(loaded, strict=False)
    if unexpected or any(
        not k.startswith("output_layer.") for k in missing if not k.endswith("_extra_state")
    ):
        raise ValueError(
            f"{path}: policy weights do not fit the reward model (missing {missing}, unexpected {unexpected})"
        )
    return [k for k in missing if not k.endswith("_extra_state")]


def load_reward_model(checkpoint: str | Path, cfg: JobConfig | None = None):
    """Collective over the current model-parallel groups: (model, cfg, tokenizer) of a trained RM.

    The model shape comes from the checkpoint's config.yaml and the parallel layout from the
    running process (dist_checkpointing reshards to the current TP/PP). Starts a 1-process group
    with TP=PP=1 when none is initialised.
    """
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from vepo_mcore.config.base import load_config
    from vepo_mcore.parallel import init_model_parallel
    from vepo_mcore.tokenizer import load_tokenizer
    from vepo_mcore.training.checkpointing import load_checkpoint, resolve_checkpoint

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
    if not (dist.is_initialized() and ps.model_parallel_is_initialized()):
        cfg.parallel.tensor_model_parallel_size = cfg.parallel.pipeline_model_parallel_size = 1
        init_model_parallel(cfg.parallel, seed=cfg.training.seed)
    else:
        cfg.parallel.tensor_model_parallel_size = ps.get_tensor_model_parallel_world_size()
        cfg.parallel.pipeline_model_parallel_size = ps.get_pipeline_model_parallel_world_size()
    model = build_reward_model(cfg)
    load_checkpoint(path, model, finetune=True)
    model.eval()
    tokenizer_dir = path / "tokenizer"
    tokenizer = load_tokenizer(tokenizer_dir if tokenizer_dir.is_dir() else cfg.tokenizer.path)
    return model, cfg, tokenizer


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

    Every rank of the model's TP group must call this with the same texts (the TP layers
    communicate); the outputs are replicated across the group. Needs PP=1.
    """
    from megatron.core import parallel_state as ps

    from vepo_mcore.parallel.device import device

    if ps.model_parallel_is_initialized() and ps.get_pipeline_model_parallel_world_size() > 1:
        raise ValueError("score_texts runs the RM in one forward call: use pipeline_model_parallel_size=1")
    if len(prompts) != len(responses):
        raise ValueError(f"score_texts: {len(prompts)} prompts but {len(responses)} responses")
    scores, probs = [], []
    for start in range(0, len(prompts), batch_size):
        rows = [
            encode(tokenizer, p, r, seq_length)
            for p, r in zip(prompts[start : start + batch_size], responses[start : start + batch_size])
        ]
        tokens, last = pad(rows, tokenizer.eod_id)
        tokens = tokens.to(device())
        at = gather_last(model(tokens, positions(tokens), None), last).float().cpu()
        scores.append(at[:, 0])
        probs.append(torch.sigmoid(at[:, 1:]))
    if not scores:
        return torch.zeros(0), torch.zeros(0, NUM_OUTPUTS - 1)
    return torch.cat(scores), torch.cat(probs)
