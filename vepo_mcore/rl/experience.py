"""From rollout samples to training tensors (`Experience`), and the forward-only passes over them.

Layout: each sample is `prompt_ids + response_ids`, right-padded to the batch's longest sequence.
The model reads `tokens = seq[:-1]` and predicts `labels = seq[1:]`; `loss_mask` marks the label
positions that are response tokens, so every [B, S] tensor below is aligned with the logits and
the response-token position t (for gamma**t) is the running count of `loss_mask`.

    exp = make_experience(samples, pad_id, max_response_length=L, temperature=tau).to(device())
    exp.old_logp, exp.rollout_entropy = policy_logprobs(model, exp, mbs, loss_cfg, vocab)  # no grad
    exp.advantages = compute_advantages(exp.loss_batch(), loss_cfg, kl)
    train_step(partial(rl_forward_step, ...), iter(exp.split(mbs)), ...)

The token fields follow megatron's GPTDataset (tokens, labels, loss_mask, position_ids); the rest
are the RLBatch fields a loss reads, under the same names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from vepo_mcore.config.rl import LossConfig
from vepo_mcore.models.heads import LM_HEAD, ScalarHead
from vepo_mcore.rl.batch import RLBatch
from vepo_mcore.rl.logprobs import masked_policy_logprobs_and_entropy
from vepo_mcore.rl.losses.ppo import value_loss
from vepo_mcore.training.pipeline import broadcast_from_last_stage, forward_backward
from vepo_mcore.training.state_dict import load_model_state
from vepo_mcore.translation.sample import Sample

# Imported where used: megatron.core (heavy: seconds to import; the trainers import this module before they
# take the save folder's lock).


@dataclass(kw_only=True)
class Experience:
    """One RL step's rollout batch as tensors. Rows are responses; [B, S] fields are aligned with
    the model's output positions. make_experience fills the rollout fields; the trainer then fills
    the model-derived ones in order (old_logp and rollout_entropy, ref_logp, old_values, then
    advantages, keep and returns). `rows` and `split` cut mini- and micro-batches."""

    tokens: torch.Tensor
    """[B, S] long: prompt + response ids (without the last), right-padded with the pad id."""
    labels: torch.Tensor
    """[B, S] long: the next token at each position (the ids shifted left by one)."""
    position_ids: torch.Tensor
    """[B, S] long: 0..S-1 on every row."""
    loss_mask: torch.Tensor
    """[B, S] float: 1 where the label is a response token, 0 on prompt and padding."""
    rewards: torch.Tensor
    """[B] float: each response's final reward (weighted terms, clipped and normalised)."""
    group_ids: torch.Tensor
    """[B] long: the prompt each response answers (a GRPO group)."""
    response_lengths: torch.Tensor
    """[B] long: response tokens, the stop token included."""
    max_response_length: int | None = None
    """The generation cap L_max (DAPO's overlong shaping)."""
    temperature: float = 1.0
    """The sampling temperature tau of the rollout: the log-probs and entropies below, and the
    loss's, are taken at it."""
    old_logp: torch.Tensor | None = None
    """[B, S]: log-prob of each label under the policy that sampled it, at the sampling temperature,
    recomputed by the training model (0 off the mask; no gradient)."""
    rollout_entropy: torch.Tensor | None = None
    """[B, S]: entropy of that tempered policy at each response position (logged; the loss
    recomputes the current policy's own)."""
    ref_logp: torch.Tensor | None = None
    """[B, S]: log-prob of each label under the frozen reference policy (KL), when it ran."""
    old_values: torch.Tensor | None = None
    """[B, S]: the critic's values at rollout time (PPO)."""
    advantages: torch.Tensor | None = None
    """[B, S]: advantages over the rank's whole rollout batch (before VEPO's entropy shaping)."""
    keep: torch.Tensor | None = None
    """[B] bool: responses the loss trains on (DAPO's dynamic sampling); None = all."""
    returns: torch.Tensor | None = None
    """[B, S]: value targets (PPO: GAE advantages + old values)."""
    rollout_logp: torch.Tensor | None = None
    """[B, S]: the rollout engine's log-prob of each response token (Sample.rollout_logprobs, 0 off the
    mask); None when a sample came without them."""
    rollout_is_weights: torch.Tensor | None = None
    """[B, S]: rollout-correction weights of the policy-gradient term (rl.rollout_correction), when on."""

    @property
    def num_rows(self) -> int:
        return self.tokens.shape[0]

    def _map(self, fn) -> Experience:
        return dataclasses.replace(
            self,
            **{
                f.name: fn(v)
                for f in dataclasses.fields(self)
                if isinstance(v := getattr(self, f.name), torch.Tensor)
            },
        )

    def to(self, device: torch.device | str) -> Experience:
        return self._map(lambda t: t.to(device))

    def rows(self, start: int, stop: int) -> Experience:
        """Responses start..stop-1 of every row-indexed field."""
        return self._map(lambda t: t[start:stop])

    def split(self, rows_per_part: int) -> list[Experience]:
        """Consecutive row slices of `rows_per_part` responses (micro-batches)."""
        return [self.rows(i, i + rows_per_part) for i in range(0, self.num_rows, rows_per_part)]

    def loss_fields(self) -> dict[str, Any]:
        """The RLBatch fields this record holds, by name (the rollout data a loss reads)."""
        names = ("old_logp", "ref_logp", "rewards", "group_ids", "advantages", "old_values", "returns",
                 "response_lengths", "max_response_length", "keep", "rollout_is_weights", "temperature")  # fmt: skip
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}

    def loss_batch(self, **extra: Any) -> RLBatch:
        """The whole batch as a loss sees it at rollout time (current = old policy): for advantages."""
        return RLBatch(logp=self.old_logp, entropy=self.rollout_entropy, mask=self.loss_mask,
                       **self.loss_fields(), **extra)  # fmt: skip


def make_experience(
    samples: list[Sample],
    pad_id: int,
    multiple: int = 1,
    max_response_length: int | None = None,
    temperature: float = 1.0,
) -> Experience:
    """Samples -> the rollout fields of an Experience: [B, S] token tensors and [B] rewards, groups
    and lengths; `temperature` is the tau they were sampled at. S is the longest prompt + response minus one, rounded up to `multiple` (FP8 needs
    16: vepo_mcore.models.fp8.token_multiple); the padding is masked out of the loss."""
    if not samples:
        raise ValueError("make_experience needs at least one sample")
    seqs = [list(s.prompt_ids) + list(s.response_ids) for s in samples]
    width = max(len(seq) for seq in seqs) - 1
    if width < 1:
        raise ValueError("every sample needs a prompt and a response of at least one token in total")
    width = -(-width // multiple) * multiple
    tokens = torch.full((len(seqs), width + 1), pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), width)
    engine_logp = None  # the engine's log-probs of the response tokens, when every sample has them
    if all(s.rollout_logprobs is not None for s in samples):
        engine_logp = torch.zeros(len(seqs), width)
    for i, (seq, s) in enumerate(zip(seqs, samples)):
        tokens[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        start = len(s.prompt_ids) - 1  # target position of the first response token
        mask[i, start : start + len(s.response_ids)] = 1.0
        if engine_logp is not None:
            if len(s.rollout_logprobs) != len(s.response_ids):
                raise ValueError(
                    f"sample {i}: {len(s.response_ids)} response tokens but {len(s.rollout_logprobs)} rollout log-probs"
                )
            engine_logp[i, start : start + len(s.response_ids)] = torch.tensor(s.rollout_logprobs)
    return Experience(
        tokens=tokens[:, :-1].contiguous(),
        labels=tokens[:, 1:].contiguous(),
        position_ids=torch.arange(width).unsqueeze(0).expand(len(seqs), -1).contiguous(),
        loss_mask=mask,
        rewards=torch.tensor([s.reward for s in samples], dtype=torch.float32),
        group_ids=torch.tensor([s.group_id for s in samples], dtype=torch.long),
        response_lengths=torch.tensor([len(s.response_ids) for s in samples], dtype=torch.long),
        rollout_logp=engine_logp,
        max_response_length=max_response_length,
        temperature=temperature,
    )


@torch.no_grad()
def policy_logprobs(
    model, exp: Experience, micro_batch_size: int, loss_cfg: LossConfig, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward-only log-probs and entropies of `exp.labels`, [B, S] each, as the loss reads them
    (rl.logprobs.policy_logprobs_and_entropy at exp.temperature), on every pipeline rank (computed on the last stage
    and broadcast)."""
    from megatron.core import parallel_state as ps

    micro = exp.split(micro_batch_size)
    outputs: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward_step(data_iterator, module):
        mb = next(data_iterator)
        mask = mb.loss_mask.bool()  # the response positions only; the output layer runs in the loss
        output = module(mb.tokens, mb.position_ids, None, output_mask=mask, defer_output_layer=True)

        def stash(output):
            outputs.append(
                masked_policy_logprobs_and_entropy(
                    output, mb.labels, mask, loss_cfg, vocab_size, exp.temperature
                )
            )
            return outputs[-1][0].new_zeros(()), torch.ones((), dtype=torch.int), {}

        return output, stash

    was_training = model.training
    model.eval()
    forward_backward(model, micro, forward_step, forward_only=True, shape=tuple(micro[0].tokens.shape))
    model.train(was_training)
    shape = exp.labels.shape
    if ps.is_pipeline_last_stage(ignore_virtual=True):
        logp = torch.cat([o[0] for o in outputs]).float()
        entropy = torch.cat([o[1] for o in outputs]).float()
    else:
        # Allocated where the batch lives: NCCL broadcasts device tensors only.
        logp, entropy = (torch.empty(shape, device=exp.loss_mask.device) for _ in range(2))
    broadcast_from_last_stage([logp, entropy])
    return logp * exp.loss_mask, entropy * exp.loss_mask


@torch.no_grad()
def init_critic(critic: torch.nn.Module, policy: torch.nn.Module) -> None:
    """Start the PPO critic from the policy (both unwrapped, this rank's stages of one layout): every
    weight but the LM head copied, the scalar head zeroed so that V = 0 on every token at the first
    step. As PPO trainers initialise their critic from the actor (or a reward model): a randomly
    initialised trunk gives values of the reward's own scale that are noise, and GAE turns that
    noise into the advantages."""
    trunk = {k: v for k, v in policy.state_dict().items() if not k.startswith(LM_HEAD)}
    try:
        load_model_state(critic, trunk, missing_ok=(LM_HEAD,))
    except ValueError as e:
        raise ValueError(f"the policy does not fit its critic: {e}") from None
    head = getattr(critic, "output_layer", None)
    if isinstance(head, ScalarHead):  # only the last pipeline stage holds the head
        head.weight.zero_()
        head.bias.zero_()


@torch.no_grad()
def critic_values(critic, exp: Experience, micro_batch_size: int) -> torch.Tensor:
    """Forward-only critic values V(s_t) at every target position, [B, S] on every pipeline rank."""
    from megatron.core import parallel_state as ps

    micro = exp.split(micro_batch_size)
    outputs: list[torch.Tensor] = []

    def forward_step(data_iterator, module):
        mb = next(data_iterator)
        values = module(mb.tokens, mb.position_ids, None)

        def stash(output):
            outputs.append(output[..., 0].float())
            return output.new_zeros(()), torch.ones((), dtype=torch.int), {}

        return values, stash

    critic.eval()
    forward_backward(critic, micro, forward_step, forward_only=True, shape=tuple(micro[0].tokens.shape))
    critic.train()
    values = (
        torch.cat(outputs)
        if ps.is_pipeline_last_stage(ignore_virtual=True)
        else torch.empty(exp.loss_mask.shape, device=exp.loss_mask.device)
    )
    broadcast_from_last_stage([values])
    return values * exp.loss_mask


def critic_forward_step(data_iterator: Iterator[Experience], model, *, loss_cfg: LossConfig):
    """megatron forward_step for the PPO critic: clipped value loss against the GAE returns."""
    mb = next(data_iterator)
    values = model(mb.tokens, mb.position_ids, None)
    agg = "tokens" if loss_cfg.loss_agg == "global_tokens" else loss_cfg.loss_agg
    value_clip = loss_cfg.options_of("ppo").value_clip

    def loss_func(output):
        v = output[..., 0].float()
        loss, clip_frac = value_loss(v, mb.old_values, mb.returns, mb.loss_mask, value_clip, agg)
        if loss_cfg.loss_agg == "global_tokens":  # same per-token contract as rl_loss_func
            n = mb.loss_mask.sum()
            return loss * n, n.to(torch.int), {"loss": torch.stack([(loss * n).detach(), n.float()])}
        one = torch.ones((), dtype=torch.int, device=loss.device)  # stacked with the loss below
        return loss, one, {"loss": torch.stack([loss.detach(), one.float()]), "clip_frac": clip_frac}

    return values, loss_func
