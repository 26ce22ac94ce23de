"""The RL step loop: VEPO (or any registered loss) on Megatron-Core with a colocated rollout engine.

    torchrun --nproc-per-node 2 tools/train_vepo.py --config examples/configs/vepo_tiny.yaml

One step: translation prompts -> K samples each at temperature tau -> RLVR rewards -> filter to G
per prompt -> old (and reference) log-probs recomputed by the training model at the same tau
(the engine's log-probs are kept and their mismatch logged) -> advantages on the rank's whole
rollout batch -> PPO epochs over mini-batches with the chosen loss -> weight sync to the engine.

Each data-parallel rank rolls out its own share of the step's prompts; reward normalisation and
the 'microbatch' std scope are rank-local (no all-reduce), 'global' all-reduces over DP.
`training.train_iters` counts RL steps; `training.checkpoint.load` initialises the policy (and the
frozen reference) from a CPT/SFT checkpoint, `training.checkpoint.save` is where RL checkpoints
go and where a restarted run resumes from.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import time
from functools import partial
from pathlib import Path

import torch
import torch.distributed as dist

from vepo_mcore.config.job import JobConfig
from vepo_mcore.config.rollout_correction import RolloutCorrectionConfig
from vepo_mcore.eval.diversity import distinct_n, group_chrf
from vepo_mcore.eval.heldout import by_direction, heldout_records, summarize
from vepo_mcore.models.builder import build_model
from vepo_mcore.models.fp8 import token_multiple
from vepo_mcore.models.heads import build_value_model
from vepo_mcore.parallel import init_model_parallel
from vepo_mcore.parallel.device import device
from vepo_mcore.rewards.rlvr import check_weights, rlvr_reward
from vepo_mcore.rl import experience as xp
from vepo_mcore.rl.filtering import dynamic_sampling, filter_candidates
from vepo_mcore.rl.losses import check_loss_options, get_loss
from vepo_mcore.rl.losses.loss_func import rl_forward_step
from vepo_mcore.rl.losses.ppo import ppo_gae
from vepo_mcore.rl.losses.registry import compute_advantages, compute_keep
from vepo_mcore.rl.prompts import TranslationPrompts
from vepo_mcore.rl.rollout_correction import rollout_correction
from vepo_mcore.rm import reward as _rm_term  # noqa: F401  (registers the reward term `rm`)
from vepo_mcore.rollout.base import build_engine
from vepo_mcore.rollout.weight_sync import sync_weights
from vepo_mcore.tokenizer import load_tokenizer
from vepo_mcore.training.checkpointing import load_checkpoint, save_checkpoint
from vepo_mcore.training.curves import PANELS, VALIDATION_PANELS, plot_curves
from vepo_mcore.training.logging import rl_flops_per_token
from vepo_mcore.training.optimizer import build_optimizer, build_scheduler, half_precision, unwrap, wrap_model
from vepo_mcore.training.runner import check_vocab, run_training
from vepo_mcore.training.trainer import train_step
from vepo_mcore.translation.sample import Sample

# Imported where used: megatron.core (lock order: training/runner.py takes the save folder's lock before
# RLTrainer builds anything, so a second launch is refused in seconds, before megatron loads).


class RLTrainer:
    """Owns the policy (+ reference, + critic for PPO), the optimizer, the engine and the prompt stream."""

    def __init__(self, cfg: JobConfig):
        from megatron.core import parallel_state as ps

        self.cfg = cfg = rl_job_config(cfg)
        init_model_parallel(cfg.parallel, seed=cfg.training.seed)
        self.dp_rank, self.dp_size = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
        check_batch_shape(cfg, self.dp_size)
        cfg.validate(dist.get_world_size())
        self.tokenizer = load_tokenizer(cfg.tokenizer.path)
        check_vocab(cfg.model.vocab_size, len(self.tokenizer), str(self.tokenizer.path))
        self.log_interval = (
            1  # every RL step is a whole rollout batch: its row is what curves and the grid read
        )
        ckpt = cfg.training.checkpoint
        self.model = wrap_model(build_model(cfg, init_weights=not ckpt.load), cfg)  # a load overwrites all
        self.optimizer = build_optimizer(self.model, cfg)
        self.scheduler = build_scheduler(self.optimizer, cfg)
        if ckpt.load:
            if load_checkpoint(ckpt.load, self.model, finetune=True) is None:
                raise FileNotFoundError(f"training.checkpoint.load={ckpt.load} holds no checkpoint")
            self.optimizer.reload_model_params()
        # The frozen reference is the initial policy (KL k1/k2/k3 are measured every kl.measure_interval steps).
        reference = build_model(cfg, init_weights=False)
        reference.load_state_dict(unwrap(self.model).state_dict())
        self.reference = half_precision(reference).eval().requires_grad_(False)  # the policy's precision
        self.critic = self.critic_optimizer = self.critic_scheduler = None
        if get_loss(cfg.rl.loss.name).needs_critic:
            self.critic = wrap_model(build_value_model(cfg), cfg)
            xp.init_critic(unwrap(self.critic), unwrap(self.model))  # before the optimizer copies it
            self.critic_optimizer = build_optimizer(self.critic, cfg)
            self.critic_scheduler = build_scheduler(self.critic_optimizer, cfg)

        self.prompts = TranslationPrompts(
            self.tokenizer,
            cfg.rl.directions,
            cfg.rl.prompt_split,
            seed=cfg.training.seed,
            sentences=cfg.rl.prompt_sentences,
        )
        self.iteration, self.resumed_from = 0, None
        if ckpt.save:
            state = load_checkpoint(
                ckpt.save, self.model, self.optimizer, self.scheduler, verify_hashes=ckpt.verify_hashes
            )
            if state is not None:
                self.iteration, self.resumed_from = state.iteration, state.path
                self.prompts.load_state_dict(state.data_state["prompts"])
                if self.critic is not None:  # the critic of the same step as the policy
                    load_checkpoint(Path(ckpt.save) / "critic", self.critic, self.critic_optimizer,
                                    self.critic_scheduler, iteration=state.iteration,
                                    verify_hashes=ckpt.verify_hashes)  # fmt: skip
        self.engine = build_engine(cfg, model=unwrap(self.model), tokenizer=self.tokenizer)
        self.weights_stale = not self.engine.shares_training_weights
        self.sync_s = 0.0  # weight-sync seconds of the current step (the console's time split)
        self.flops_per_token = rl_flops_per_token(cfg, critic=self.critic is not None)

    @property
    def consumed_samples(self) -> int:
        """Responses trained on so far."""
        return self.iteration * self.cfg.rl.prompts_per_step * self.cfg.rl.filtering.group_size

    # -- the step, in training/runner.py's loop -----------------------------------------------
    def describe(self) -> str:
        return f"RL steps {self.iteration} -> {self.cfg.training.train_iters}"

    def step(self) -> tuple[dict[str, float], int]:
        """One RL step: its metrics (the same on every rank) and the tokens it rolled out."""
        start, self.sync_s = time.perf_counter(), 0.0
        samples, metrics = self.rollout()
        rolled = time.perf_counter()
        exp = self.experience(samples, metrics)
        scored = time.perf_counter()
        metrics.update(self.train(exp))
        # Where the step's time goes (slime/verl log the same split): generation + rewards, the
        # old/reference log-prob passes, the optimizer steps.
        metrics["perf/rollout_s"] = rolled - start
        metrics["perf/sync_s"] = self.sync_s  # part of perf/rollout_s
        metrics["perf/experience_s"] = scored - rolled
        metrics["perf/train_s"] = time.perf_counter() - scored
        self.weights_stale = not self.engine.shares_training_weights
        self.iteration += 1
        return metrics, int(metrics.pop("rollout/tokens", 0.0))

    def evaluate(self) -> dict[str, float] | None:
        """Greedy answers to the rl.eval_sentences prompts of every direction, each data-parallel
        rank its share: their stop rate, constraint pass rates and chrF++ (eval.heldout.summarize,
        the numbers tools/eval_heldout.py gives for devtest), overall pass and chrF++ per direction
        ('en-th/overall_pass') and how many prompts were scored; None without rl.eval_sentences."""
        rl = self.cfg.rl
        if not rl.eval_sentences:
            return None
        with self.awake_engine():
            records = heldout_records(self.engine, self.tokenizer, rl.directions, 0, rl.rollout.sampling.max_new_tokens,
                                      split=rl.prompt_split, batch_size=rl.rollout.batch_size,
                                      sentences=rl.eval_sentences, shard=(self.dp_rank, self.dp_size))  # fmt: skip
        shares = [None] * self.dp_size
        dist.all_gather_object(shares, records, group=_dp_group())
        records = [r for share in shares for r in share]
        if not records:
            raise ValueError(f"rl.eval_sentences {rl.eval_sentences!r} selects no {rl.prompt_split} sentence")
        return {**summarize(records), **by_direction(records), "prompts": float(len(records))}

    def finish(self, history: list[dict[str, float]]) -> None:
        save = self.cfg.training.checkpoint.save
        if dist.get_rank() == 0 and save and history:
            panels = PANELS + VALIDATION_PANELS if self.cfg.rl.eval_sentences else PANELS
            plot_curves(history, Path(save) / "rl_curves.png", panels=panels, smooth=0.8)

    def close(self) -> None:
        self.engine.shutdown()

    def rollout(self) -> tuple[list[Sample], dict[str, float]]:
        """Generate K candidates per prompt, score them, keep G per prompt."""
        rl = self.cfg.rl
        per_rank = rl.prompts_per_step // self.dp_size
        kept, metrics, rounds = [], {}, 0
        while len(kept) < per_rank * rl.filtering.group_size:
            prompts = self.prompts.next_batch(
                rl.prompts_per_step, first_group_id=rounds * rl.prompts_per_step
            )
            mine = prompts[self.dp_rank :: self.dp_size][: per_rank - len(kept) // rl.filtering.group_size]
            candidates = [copy.deepcopy(p) for p in mine for _ in range(rl.filtering.num_candidates)]
            samples = self.generate(
                candidates, seed=_step_seed(self.cfg, self.iteration, rounds, self.dp_rank)
            )
            rlvr_reward(samples, rl.rewards)
            chosen, filter_metrics = filter_candidates(samples, rl.filtering.group_size, rl.filtering.enabled)
            if rounds == 0:
                metrics.update(filter_metrics)
                metrics.update(_reward_metrics(samples))
            last_round = chosen
            if rl.filtering.dynamic_sampling:
                chosen, ds_metrics = dynamic_sampling(chosen)
                metrics.update(ds_metrics) if rounds == 0 else None
            kept += chosen
            rounds += 1
            if rounds == MAX_SAMPLING_ROUNDS and len(kept) < per_rank * rl.filtering.group_size:
                metrics["rollout/ds_exhausted"] = float(not kept)
                kept = _fill_by_repeating(kept, per_rank * rl.filtering.group_size, last_round)
        metrics["rollout/sampling_rounds"] = float(rounds)
        return kept, metrics

    @contextlib.contextmanager
    def awake_engine(self):
        """Wake the engine and push the newest weights if it keeps its own copy; release its memory after."""
        self.engine.wake()
        if self.weights_stale or not self.engine.weights_survive_sleep:
            start = time.perf_counter()
            sync_weights(self.engine, self.model, self.cfg, version=self.iteration)
            self.sync_s += time.perf_counter() - start
            self.weights_stale = False
        yield self.engine
        self.engine.sleep()

    def generate(self, prompts: list[Sample], seed: int) -> list[Sample]:
        """The rollout's samples of `prompts` at the rollout's sampling settings."""
        sampling = self.cfg.rl.rollout.sampling.with_stops(self.tokenizer.stop_ids, seed=seed)
        with self.awake_engine():
            return self.engine.generate(prompts, sampling)

    def experience(self, samples: list[Sample], metrics: dict[str, float]) -> xp.Experience:
        """The rollout as tensors for the loss: old/reference log-probs at tau, critic values, advantages."""
        cfg, loss = self.cfg, self.cfg.rl.loss
        # On the compute device from here on: the forward passes, NCCL's all-reduce of the
        # advantage statistics and the pipeline broadcasts all need device tensors. FP8 GEMMs need
        # whole multiples of 16 tokens (token_multiple is 1 without FP8).
        sampling = cfg.rl.rollout.sampling
        exp = xp.make_experience(samples, self.tokenizer.pad_id, token_multiple(cfg),
                                 max_response_length=sampling.max_new_tokens,
                                 temperature=sampling.temperature).to(device())  # fmt: skip
        mbs = cfg.training.micro_batch_size
        args = (mbs, loss, cfg.model.vocab_size)  # log-probs and entropy as the loss reads them
        exp.old_logp, exp.rollout_entropy = xp.policy_logprobs(self.model, exp, *args)
        exp.rollout_is_weights = rollout_is_weights(exp, cfg.rl.rollout_correction, metrics)
        if self.needs_reference():
            exp.ref_logp, _ = xp.policy_logprobs(self.reference, exp, *args)
        if self.critic is not None:
            exp.old_values = xp.critic_values(self.critic, exp, mbs)
        batch = exp.loss_batch(std_group=_dp_group())
        exp.advantages = compute_advantages(batch, loss, cfg.rl.kl)
        exp.keep = compute_keep(batch, loss, cfg.rl.kl)  # on the whole batch: micro-batches split groups
        if self.critic is not None:
            exp.returns = ppo_gae(batch, loss, cfg.rl.kl)[1]
        metrics.update(_experience_metrics(samples, exp))
        return exp

    def needs_reference(self) -> bool:
        """The reference pass runs every step when a KL is optimised, else every kl.measure_interval steps."""
        kl = self.cfg.rl.kl
        return kl.estimator != "none" or self.iteration % kl.measure_interval == 0

    def train(self, exp: xp.Experience) -> dict[str, float]:
        """ppo_epochs x mini_batches optimizer steps of the policy (and the critic for PPO)."""
        cfg = self.cfg
        rows = exp.num_rows // cfg.rl.mini_batches
        policy_step = partial(rl_forward_step, cfg=cfg.rl.loss, kl=cfg.rl.kl, vocab_size=cfg.model.vocab_size)
        metrics: dict[str, list[float]] = {}
        for _epoch in range(cfg.rl.ppo_epochs):
            for k in range(cfg.rl.mini_batches):
                micro = exp.rows(k * rows, (k + 1) * rows).split(cfg.training.micro_batch_size)
                shape = (len(micro), micro[0].tokens.shape[1], micro[0].tokens.shape[0])
                out = train_step(policy_step, iter(micro), self.model, self.optimizer, self.scheduler, *shape)
                if self.critic is not None:
                    critic_step = partial(xp.critic_forward_step, loss_cfg=cfg.rl.loss)
                    critic = train_step(critic_step, iter(micro), self.critic, self.critic_optimizer,
                                        self.critic_scheduler, *shape)  # fmt: skip
                    out.update({f"critic/{k}": v for k, v in critic.items() if not k.startswith("critic/")})
                    out.update({k: v for k, v in critic.items() if k.startswith("critic/")})
                for key, value in out.items():
                    metrics.setdefault(key if "/" in key else f"train/{key}", []).append(value)
        return {key: sum(v) / len(v) for key, v in metrics.items()}

    def save(self) -> None:
        ckpt = self.cfg.training.checkpoint
        common = dict(data_state={"prompts": self.prompts.state_dict()}, config=self.cfg,
                      tokenizer_dir=str(self.tokenizer.path), keep_last=ckpt.keep_last,
                      async_save=ckpt.async_save)  # fmt: skip
        save_checkpoint(ckpt.save, self.iteration, self.model, self.optimizer, self.scheduler, **common)
        if self.critic is not None:
            save_checkpoint(Path(ckpt.save) / "critic", self.iteration, self.critic, self.critic_optimizer,
                            self.critic_scheduler, **common)  # fmt: skip


def train_rl(cfg: JobConfig) -> list[dict[str, float]]:
    """Run RL to training.train_iters steps, logging and checkpointing; returns this call's metrics."""
    return run_training(cfg.training.checkpoint, lambda: RLTrainer(cfg), cfg.training.logging)


# -- helpers ------------------------------------------------------------------------------------
MAX_SAMPLING_ROUNDS = 4
"""Dynamic sampling: rounds of extra prompts before the batch is filled by repeating kept groups."""


def _step_seed(cfg: JobConfig, iteration: int, round_: int, dp_rank: int) -> int:
    """Sampling seed of one generate call: a function of the step, so a resumed run samples the same."""
    return (cfg.training.seed * 1_000_003 + iteration * 101 + round_) * 64 + dp_rank


def rl_job_config(cfg: JobConfig) -> JobConfig:
    """The config as the RL loop runs it: training.global_batch_size = responses per optimizer step
    (prompts_per_step * group_size / mini_batches), LR decay over all optimizer steps of the run
    (RL steps x epochs x mini-batches) unless set. An unregistered rl.loss.name or reward term of
    rl.rewards.weights, or a section rl.loss.<name> of no registered loss, is a ValueError. Each loss's
    section is typed, the selected one's defaults written out (all losses are registered here)."""
    get_loss(cfg.rl.loss.name)
    check_loss_options(cfg.rl.loss)
    check_weights(cfg.rl.rewards)
    cfg = copy.deepcopy(cfg)
    rl = cfg.rl
    rl.loss = dataclasses.replace(rl.loss)  # sections read before the losses registered become typed
    cfg.training.global_batch_size = max(rl.prompts_per_step * rl.filtering.group_size // rl.mini_batches, 1)
    if cfg.training.scheduler.decay_iters is None:
        steps = cfg.training.train_iters * cfg.rl.ppo_epochs * cfg.rl.mini_batches
        cfg.training.scheduler = dataclasses.replace(cfg.training.scheduler, decay_iters=max(steps, 1))
    return cfg


def check_batch_shape(cfg: JobConfig, dp: int) -> None:
    """Each DP rank's responses must split into whole mini- and micro-batches (fixed PP shapes)."""
    rl = cfg.rl
    if rl.prompts_per_step % dp:
        raise ValueError(
            f"rl.prompts_per_step ({rl.prompts_per_step}) must be divisible by the DP size ({dp})"
        )
    rows = rl.prompts_per_step // dp * rl.filtering.group_size
    if rows % rl.mini_batches or (rows // rl.mini_batches) % cfg.training.micro_batch_size:
        raise ValueError(
            f"each DP rank trains on rl.prompts_per_step/DP * rl.filtering.group_size = {rows} responses per "
            f"step; it must split into rl.mini_batches ({rl.mini_batches}) mini-batches of whole "
            f"training.micro_batch_size ({cfg.training.micro_batch_size}) micro-batches"
        )


def _dp_group():
    from megatron.core import parallel_state as ps

    return ps.get_data_parallel_group()


def _fill_by_repeating(samples: list[Sample], rows: int, last_round: list[Sample]) -> list[Sample]:
    """Dynamic sampling ran out of rounds: repeat whole kept groups. With none kept (every group of every
    round had one reward, as a policy whose sampling entropy has collapsed gives), train on the last
    round's groups: their advantages are zero, so the step changes nothing but the run goes on, as it
    would without dynamic sampling (the step logs rollout/ds_exhausted = 1)."""
    if not samples:
        return last_round[:rows]
    out, i = list(samples), 0
    while len(out) < rows:
        out.append(samples[i % len(samples)])
        i += 1
    return out


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _reward_metrics(samples: list[Sample]) -> dict[str, float]:
    """Means of every reward term and constraint pass rate over all K candidates, and of the raw
    total per direction (rollout/<direction>/reward).

    reward/total is the raw weighted total; rollout/reward_normalised_mean the mean of the reward the
    loss sees (z-normalised over the batch by default, so about 0 at every step)."""
    metrics = {"rollout/reward_normalised_mean": _mean([s.reward for s in samples])}
    for name in samples[0].reward_terms:
        metrics[f"reward/{name}"] = _mean([s.reward_terms.get(name, 0.0) for s in samples])
    for name in samples[0].passed:
        metrics[f"constraint/{name}"] = _mean([float(s.passed.get(name, False)) for s in samples])
    metrics["constraint/overall"] = _mean([float(s.compliant) for s in samples])
    for direction in sorted({s.direction for s in samples}):
        metrics[f"rollout/{direction}/reward"] = _mean(
            [s.reward_terms.get("total", 0.0) for s in samples if s.direction == direction]
        )
    return metrics | group_diversity(samples)


def group_diversity(samples: list[Sample]) -> dict[str, float]:
    """rollout/group_chrf and rollout/distinct2: eval/diversity.py's measures averaged over the
    prompt groups (all K candidates of each prompt)."""
    groups: dict[int, list[str]] = {}
    for s in samples:
        groups.setdefault(s.group_id, []).append(s.response)
    chrf = [v for v in (group_chrf(g) for g in groups.values()) if v == v]
    distinct = [v for v in (distinct_n(g, 2) for g in groups.values()) if v == v]
    return {"rollout/group_chrf": _mean(chrf), "rollout/distinct2": _mean(distinct)}


def _experience_metrics(samples: list[Sample], exp: xp.Experience) -> dict[str, float]:
    """Response lengths, training-vs-engine log-prob mismatch, advantage stats (kept samples; their
    mean per direction too)."""
    mask = exp.loss_mask.bool()
    lengths = exp.response_lengths.float()
    metrics = {
        "rollout/len_mean": lengths.mean().item(),
        "rollout/len_max": lengths.max().item(),
        "rollout/truncated_frac": _mean([float(s.finish_reason == "length") for s in samples]),
        "rollout/kept_reward_normalised_mean": exp.rewards.mean().item(),
        "rollout/groups_with_spread": groups_with_spread(samples),
        "rollout/entropy": exp.rollout_entropy[mask].mean().item() if mask.any() else 0.0,
        "rollout/entropy_len_corr": entropy_length_correlation(exp.rollout_entropy, mask),
        "rl/adv_mean": exp.advantages[mask].mean().item() if mask.any() else 0.0,
        "rl/adv_std": exp.advantages[mask].std().item() if mask.sum() > 1 else 0.0,
        "rollout/tokens": float(mask.sum().item() + sum(len(s.prompt_ids) for s in samples)),
    }
    metrics |= {f"rl/{d}/adv_mean": v for d, v in direction_means(samples, exp.advantages, mask).items()}
    engine_logp = [s.rollout_logprobs for s in samples if s.rollout_logprobs is not None]
    if len(engine_logp) == len(samples):
        metrics["rollout/logprob_mismatch"] = logprob_mismatch(exp.old_logp, mask, engine_logp).item()
    return metrics


def direction_means(samples: list[Sample], values: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """direction -> the mean of `values` [B, T] over the `mask`ed tokens of its samples' rows (row i is
    samples[i]): rl/<direction>/adv_mean shows a direction whose every answer is pushed down."""
    out = {}
    for direction in sorted({s.direction for s in samples}):
        rows = torch.tensor([s.direction == direction for s in samples], device=mask.device)
        mine = mask.bool() & rows[:, None]
        if mine.any():
            out[direction] = values[mine].float().mean().item()
    return out


def rollout_is_weights(
    exp: xp.Experience, cfg: RolloutCorrectionConfig, metrics: dict[str, float]
) -> torch.Tensor | None:
    """rl.rollout_correction's weights for the loss (None when off); the engine-trainer mismatch is
    logged as rollout_corr/* whenever the engine returned log-probs (rl/rollout_correction.py)."""
    if exp.rollout_logp is None:
        if cfg.mode != "off":
            raise ValueError(
                f"rl.rollout_correction.mode {cfg.mode!r} needs the rollout engine's log-probs "
                "(Sample.rollout_logprobs), and this engine returned none"
            )
        return None
    weights, corr = rollout_correction(exp.old_logp, exp.rollout_logp, exp.loss_mask, cfg)
    metrics.update({key: value.item() for key, value in corr.items()})
    return weights if cfg.mode != "off" else None


def groups_with_spread(samples: list[Sample]) -> float:
    """Share of prompt groups whose kept rewards are not all equal (a group with one reward has none):
    only those carry a group-relative advantage."""
    groups: dict[int, list[float]] = {}
    for s in samples:
        groups.setdefault(s.group_id, []).append(s.reward)
    return _mean([float(max(r) - min(r) > 1e-9) for r in groups.values()])


def entropy_length_correlation(entropy: torch.Tensor, mask: torch.Tensor) -> float:
    """Pearson correlation over the batch's responses of length and mean token entropy (the
    appendix's entropy-length observation); entropy, mask [B, S]. 0 when either does not vary."""
    m = mask.to(torch.float64)
    lengths = m.sum(1)
    keep = lengths > 0
    lengths = lengths[keep]
    values = torch.where(mask.bool(), entropy.detach().to(torch.float64), torch.zeros_like(m))
    mean_entropy = values.sum(1)[keep] / lengths
    if lengths.numel() < 2:
        return 0.0
    x, y = lengths - lengths.mean(), mean_entropy - mean_entropy.mean()
    scale = (x.square().sum() * y.square().sum()).sqrt()
    return float((x * y).sum() / scale) if scale > 0 else 0.0


def logprob_mismatch(
    old_logp: torch.Tensor, mask: torch.Tensor, engine_logp: list[list[float]]
) -> torch.Tensor:
    """Mean |training - engine| log-prob over response tokens, a scalar on old_logp's device (0 when none).

    old_logp, mask: [B, S] (on the compute device); engine_logp: B lists of the engine's per-token log-probs.
    """
    ours = [old_logp[i][mask[i]] for i in range(len(engine_logp))]
    # The engine's values arrive as Python floats: build them where the training values live.
    theirs = [torch.tensor(lp, device=old_logp.device) for lp in engine_logp]
    diffs = torch.cat([(a - b.float()).abs() for a, b in zip(ours, theirs)])
    return diffs.mean() if diffs.numel() else old_logp.new_zeros(())
