"""RL section: loss, KL, advantages, rollout engine and the RL step loop (SPEC.md section 4)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from vepo_mcore.config.base import from_dict
from vepo_mcore.config.rewards import FilterConfig, RewardsConfig
from vepo_mcore.config.rollout_correction import RolloutCorrectionConfig
from vepo_mcore.languages import sentence_range

LOSS_OPTIONS: dict[str, type] = {}
"""The options dataclass of each loss that has options, by loss name: what a section
rl.loss.<loss name> holds. vepo_mcore.rl.losses.register_loss fills it (the losses sit in a layer
above the config, so the config learns their options from them, never imports them)."""


def register_loss_options(name: str, options: type) -> None:
    """Make `options` (a kw_only dataclass) the type of the config section rl.loss.<name>."""
    if name in LOSS_OPTIONS:
        raise ValueError(f"loss options {name!r} are already registered by {LOSS_OPTIONS[name].__module__}")
    LOSS_OPTIONS[name] = options


@dataclass(kw_only=True)
class LossConfig:
    """Policy loss: any registered algorithm (vepo, ppo, grpo, dapo, rloo, reinforce_pp). The fields
    here are what every loss shares; each loss's own options are its section rl.loss.<loss name>."""

    name: str = "vepo"
    """Registered loss name."""
    ratio_mode: Literal["tempered", "scaled", "untempered"] = "tempered"
    """'tempered' r = exp(logp_tau - old_logp_tau); 'scaled' = exp((logp - old_logp) / tau) (appendix);
    'untempered' = exp(logp - old_logp) at tau 1 although the samples come from pi^tau (what a trainer
    without temperature consistency computes; the ablation of VEPO's temperature-consistent ratio).
    The entropy (shaping and bonus) is the sampling policy's, at tau, in every mode. Shared: it decides
    how the log-probs every loss reads are taken."""
    eps_low: float = 0.20
    """Lower clip range: r >= 1 - eps_low."""
    eps_high: float = 0.28
    """Upper clip range (clip-higher): r <= 1 + eps_high. PPO, GRPO, RLOO and REINFORCE++ clip
    symmetrically at eps_low."""
    dual_clip: float | None = None
    """PPO dual-clip constant c > 1 (verl's clip_ratio_c, 3.0 there): for A < 0 the surrogate is bounded
    below by c * A, so a huge ratio on a bad token cannot dominate the batch. None = off (the paper's
    loss has no dual clip)."""
    adv_eps: float = 1e-6
    """Epsilon in the advantage denominator (group normalisation, whitening)."""
    loss_agg: Literal["tokens", "global_tokens", "seq_mean"] = "tokens"
    """'tokens' = mean over micro-batch response tokens; 'global_tokens' = sum over tokens divided by
    the global batch's token count (RLBatch.global_num_tokens; sum micro-batch losses, do not average);
    'seq_mean' = mean over responses of each response's token mean. GRPO always uses 'seq_mean'."""
    entropy_topk_frac: float | None = None
    """Approximate H by -sum p log p over the top fraction (e.g. 0.2) of tokens; None = exact."""
    logprob_chunk_size: int | None = None
    """Tokens per chunk in the fused vocab-parallel log-prob/entropy; None = as many as fit 32 MiB
    per work buffer (rl.logprobs.CHUNK_BYTES), so its memory does not grow with T."""
    chunked_output_layer: bool = False
    """True: the training loss computes log-prob and entropy from the final hidden states and the output
    weight chunk by chunk (models/output_loss.py): no [response tokens, vocab] logits or gradient, at
    the cost of recomputing each chunk's output GEMM in backward (output layer + loss took 1.2-1.3x
    the logits path's CPU time at 512 tokens x 152k vocab). False: logits, then the fused log-prob.
    The old/reference log-prob passes (no backward) always run chunked."""
    options: dict[str, Any] = field(default_factory=dict, metadata={"sections": LOSS_OPTIONS})
    """Each loss's own options by loss name, written as the sections rl.loss.<loss name>
    (--rl.loss.vepo.alpha 0.1, --rl.loss.dapo.overlong_buffer 16), each of the dataclass registered
    with that loss. Sections of losses other than rl.loss.name are type-checked and kept but not
    validated or used: as in verl's and Megatron's configs, where every algorithm's options sit side by
    side, one config can carry several losses' settings and one flag (--rl.loss.name) switches."""

    def __post_init__(self) -> None:
        # Sections of registered losses become their dataclasses (an unknown or mistyped key is a
        # ValueError naming rl.loss.<name>.<key>); the selected loss's defaults are written out, so a
        # saved config.yaml holds every value the run used. A section of a loss not registered yet
        # stays a mapping until options_of (vepo_mcore.rl.losses.check_loss_options names strays).
        options = {name: self._typed(name, section) for name, section in self.options.items()}
        if self.name in LOSS_OPTIONS and self.name not in options:
            options[self.name] = LOSS_OPTIONS[self.name]()
        self.options = options

    @staticmethod
    def _typed(name: str, section: Any) -> Any:
        cls = LOSS_OPTIONS.get(name)
        if cls is None or isinstance(section, cls):
            return section
        if not isinstance(section, dict):
            raise ValueError(f"rl.loss.{name}: expected a mapping of {cls.__name__}, got {section!r}")
        return from_dict(cls, section, f"rl.loss.{name}")

    def options_of(self, name: str | None = None) -> Any:
        """The options of loss `name` (default: rl.loss.name): its section, or its options dataclass's
        defaults where the config has none. A ValueError for a loss that registered no options."""
        name = self.name if name is None else name
        if name not in LOSS_OPTIONS:
            raise ValueError(
                f"rl.loss.{name}: no registered loss {name!r} has options; "
                f"losses with options: {sorted(LOSS_OPTIONS)}"
            )
        return self._typed(name, self.options.get(name, {}))

    def validate(self) -> None:
        """The selected loss's section, by its options' validate() (the other sections are only
        type-checked: see `options`)."""
        if self.name in LOSS_OPTIONS:
            validate = getattr(self.options_of(), "validate", None)
            if validate is not None:
                validate()


@dataclass(kw_only=True)
class KLConfig:
    """KL to a frozen reference policy."""

    estimator: Literal["none", "k1", "k2", "k3"] = "none"
    """Which estimator is optimised (all three are always logged when a reference exists)."""
    coef: float = 0.001
    """KL coefficient."""
    placement: Literal["auto", "loss", "reward"] = "auto"
    """Add the KL to the loss (GRPO style) or subtract it from the reward (REINFORCE++ style);
    'auto' = the algorithm's own choice (loss: vepo, grpo, dapo; reward: ppo, rloo, reinforce_pp)."""
    measure_interval: int = 1
    """When no estimator is optimised, run the reference forward pass (and log rl/kl_k1..k3) only
    every N RL steps: the pass costs about a third of the experience time and measures only."""


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """What to sample and when to stop: rl.rollout.sampling in the config, and the one value every
    rollout engine's generate call takes (the RL trainer adds the tokenizer's stop ids and a seed)."""

    temperature: float = 1.0
    """tau; 0 = greedy (argmax). In the RL config (rl.rollout.sampling) this one value is also the
    temperature of the old log-probs and of the loss (> 0 there): the paper's ratio and entropy are
    those of the tempered policy pi^tau that produced the samples (SPEC section 4)."""
    top_p: float = 1.0
    """Nucleus: keep the smallest set of tokens whose tempered probability reaches top_p."""
    top_k: int = -1
    """Keep the k most probable tokens (-1 = all)."""
    max_new_tokens: int = 256
    """Response length cap; reaching it gives finish_reason 'length'."""
    stop_token_ids: tuple[int, ...] = ()
    """Generating any of these ends the response (finish_reason 'stop'); the token is kept."""
    seed: int | None = None
    """Seed of the sampling generator; None = the engine's own stream."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"sampling temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"sampling top_k must be -1 (off) or positive, got {self.top_k}")
        if self.max_new_tokens < 1:
            raise ValueError(f"sampling max_new_tokens must be >= 1, got {self.max_new_tokens}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    def with_stops(self, stop_token_ids: Iterable[int] = (), seed: int | None = None) -> SamplingParams:
        """These parameters, also stopping at `stop_token_ids` (the tokenizer's stop_ids), with `seed`."""
        stops = tuple(dict.fromkeys([*stop_token_ids, *self.stop_token_ids]))
        return replace(self, stop_token_ids=stops, seed=seed)

    def to_sglang(self) -> dict[str, Any]:
        """SGLang's sampling_params dict (python/sglang/srt/sampling/sampling_params.py)."""
        params: dict[str, Any] = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "max_new_tokens": self.max_new_tokens,
            "stop_token_ids": list(self.stop_token_ids),
            "skip_special_tokens": False,
            "no_stop_trim": True,
        }
        if self.seed is not None:
            params["sampling_seed"] = self.seed
        return params


@dataclass(kw_only=True)
class RolloutConfig:
    """Which engine generates rollouts, and how weights reach it."""

    engine: str = "embedded"
    """A registered rollout engine (vepo_mcore.rollout.register_engine): 'embedded' = in-process
    Megatron sampler; 'sglang' = colocated sglang.Engine; tests register 'fake_sglang', its CPU
    stand-in (harness/fake_sglang.py). An unknown name fails when the engine is built, listing
    the known ones."""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    """Sampling parameters."""
    engine_tp: int = 1
    """SGLang tensor-parallel size (may differ from training TP)."""
    ranks_per_engine: int | None = None
    """One SGLang engine per block of this many consecutive ranks, owned by the block's first rank and
    placed on its GPUs (e.g. 8 = one per node, 4 = two per 8-GPU node); None = one for the whole job."""
    mem_fraction_static: float = 0.5
    """SGLang static memory fraction when colocated."""
    deterministic_inference: bool = True
    """Start SGLang with enable_deterministic_inference. SGLang (0.5.15.post1 through 0.5.23) honours a
    request's sampling_seed only then, so the seeded rollouts the trainer asks for (one seed per step,
    reproducible on resume) need it; off, SGLang samples from its own stream (faster batch-variant
    kernels, rollouts not reproducible). The embedded engine always honours the seed."""
    weight_bucket_mb: int = 512
    """Flattened bucket size for weight sync."""
    weight_sync: str = "colocated"
    """How trained weights reach an SGLang engine. 'colocated': update_weights_from_tensor (CUDA IPC;
    the engine shares the training GPUs and sleeps while training runs). 'distributed':
    update_weights_from_distributed, broadcast over a process group joined by the trainer and the
    engine's GPUs (an engine on other GPUs: engine_base_gpu, or another node); rollout/weight_sync.py."""
    weight_sync_backend: str = "nccl"
    """Backend of the distributed weight-sync group: 'nccl' on GPUs, 'gloo' for CPU tests."""
    engine_base_gpu: int | None = None
    """weight_sync 'distributed': the engine's first GPU on its owner's node (GPUs apart from training);
    None = the owner's own GPU (colocated placement)."""
    batch_size: int = 64
    """Prompts per generate call."""


@dataclass(kw_only=True)
class RLConfig:
    """The VEPO RL step loop."""

    loss: LossConfig = field(default_factory=LossConfig)
    """Policy loss."""
    kl: KLConfig = field(default_factory=KLConfig)
    """Reference KL."""
    rewards: RewardsConfig = field(default_factory=RewardsConfig)
    """Reward terms."""
    filtering: FilterConfig = field(default_factory=FilterConfig)
    """RLVR candidate filtering."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Rollout engine."""
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    """Importance weights pi_old / pi_rollout on the policy-gradient term (TIS / MIS); off by default."""
    prompts_per_step: int = 8
    """Prompts per RL step (the paper: 128)."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    mini_batches: int = 1
    """Optimizer steps per rollout batch per epoch."""
    directions: str = "all"
    """Translation directions used for prompts (like eval.directions)."""
    prompt_split: str = "dev"
    """FLORES split the prompts come from."""
    prompt_sentences: str = ":"
    """Which sentences of that split, as START:STOP ('800:' = from the 801st on): keeps RL prompts
    apart from sentences the SFT data already translated (the policy has memorised those)."""
    eval_sentences: str = ""
    """Validation: sentences of prompt_split (START:STOP, apart from prompt_sentences) translated
    greedily in every direction every training.eval_interval RL steps, their constraint pass rates
    and chrF++ logged as valid/* (as tools/eval_heldout.py scores devtest). "" = no validation."""

    def validate(self) -> None:
        # rl.loss.name is checked against the loss registry, a layer above the config, by
        # rl.trainer.rl_job_config (every RL launch and --dry-run).
        self.loss.validate()
        if self.kl.coef < 0:
            raise ValueError(f"rl.kl.coef must be >= 0, got {self.kl.coef}")

        try:
            sentence_range(self.prompt_sentences)
        except ValueError as err:
            raise ValueError(f"rl.prompt_sentences: {err}") from None
        if self.eval_sentences:
            try:
                held, prompts = sentence_range(self.eval_sentences), sentence_range(self.prompt_sentences)
            except ValueError as err:
                raise ValueError(f"rl.eval_sentences: {err}") from None
            if _overlap(held, prompts):
                raise ValueError(
                    f"rl.eval_sentences {self.eval_sentences!r} overlaps rl.prompt_sentences "
                    f"{self.prompt_sentences!r}: validation must use sentences RL does not train on "
                    "(e.g. rl.prompt_sentences '800:947' and rl.eval_sentences '947:')"
                )
        if self.kl.measure_interval < 1:
            raise ValueError(f"rl.kl.measure_interval must be >= 1, got {self.kl.measure_interval}")
        if self.filtering.num_candidates < self.filtering.group_size:
            raise ValueError(
                f"rl.filtering.num_candidates ({self.filtering.num_candidates}) must be >= "
                f"rl.filtering.group_size ({self.filtering.group_size})"
            )
        if self.rollout.sampling.temperature <= 0:
            raise ValueError(
                "rl.rollout.sampling.temperature must be positive: the loss and the old log-probs are "
                f"taken at it, got {self.rollout.sampling.temperature}"
            )
        if self.loss.logprob_chunk_size is not None and self.loss.logprob_chunk_size <= 0:
            raise ValueError(
                "rl.loss.logprob_chunk_size must be positive or null (sized by bytes), "
                f"got {self.loss.logprob_chunk_size}"
            )
        if self.loss.dual_clip is not None and self.loss.dual_clip <= 1:
            raise ValueError(f"rl.loss.dual_clip must be > 1 (or null for off), got {self.loss.dual_clip}")
        if not (0 <= self.loss.eps_low < 1 and self.loss.eps_high >= 0):
            raise ValueError("rl.loss.eps_low must be in [0, 1) and rl.loss.eps_high >= 0")
        if self.loss.entropy_topk_frac is not None and not 0 < self.loss.entropy_topk_frac <= 1:
            raise ValueError(
                f"rl.loss.entropy_topk_frac must be in (0, 1], got {self.loss.entropy_topk_frac}"
            )
        if self.rollout.weight_sync not in ("colocated", "distributed"):
            raise ValueError(
                f"rl.rollout.weight_sync must be 'colocated' or 'distributed', got {self.rollout.weight_sync!r}"
            )
        if self.rollout.weight_sync_backend not in ("nccl", "gloo"):
            raise ValueError(
                f"rl.rollout.weight_sync_backend must be 'nccl' or 'gloo', got {self.rollout.weight_sync_backend!r}"
            )
        if self.prompts_per_step < 1 or self.ppo_epochs < 1 or self.mini_batches < 1:
            raise ValueError("rl.prompts_per_step, rl.ppo_epochs and rl.mini_batches must be >= 1")
        self.rollout_correction.validate()
        self.rewards.validate()


def _overlap(a: slice, b: slice) -> bool:
    """Whether two sentence ranges (slices with non-negative bounds or None) share an index."""
    inf = float("inf")
    lo, hi = (
        max(a.start or 0, b.start or 0),
        min(inf if a.stop is None else a.stop, inf if b.stop is None else b.stop),
    )
    return lo < hi
