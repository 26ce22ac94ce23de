"""The per-GPU memory of a run for its parallel layout, worked out from the config before any GPU
is touched (tools/pretrain_cpt.py and tools/train_vepo.py print it with --dry-run).

    plan = memory_plan(cfg, world_size=64)                        # CPT / SFT
    plan = memory_plan(rl_cfg, world_size=32, rl=True)            # RL: + engine, reference, RM
    print(plan.format())
    plan.check()       # ValueError naming the setting to change when the peak exceeds the GPU

Every number is bytes on the most loaded GPU (the first pipeline stage, or the last when its
output layer weighs more), printed in GiB (2**30). The accounting:

- weights, gradients, optimizer: Megatron-LM's theoretical_memory_usage.py rule: parameters of the
  most loaded shard = (transformer block / PP + embedding) / TP, plus the untied output layer at
  PP=1; bf16 weights (2 bytes), fp32 gradients (4: grad_reduce_in_fp32, training/optimizer.py),
  fp32 master weights (4) and Adam m, v (4 + 4) divided over the data-parallel ranks with the
  distributed optimizer: 18 bytes a parameter, or 6 + 12 / DP. Qwen2.5's q/k/v biases are counted
  (Megatron-LM's formula omits biases).
- activations: Korthikanti et al. 2022 (arXiv 2205.05198), Table 2, per layer, generalised to
  grouped-query attention, SwiGLU (the fc1 output is 2 x ffn wide) and dropout that Qwen2.5 turns
  off (p = 0 stores no mask); flash attention (Transformer Engine, the GPU spec) stores no [s, s]
  scores. Sequence parallelism splits every term over TP; without it the norms' inputs, the
  linear layers' inputs and the dropout masks stay whole. The first stage holds min(PP, micro-
  batches) micro-batches in flight under 1F1B; CP splits the tokens. Full recompute keeps each
  layer's input plus one layer rebuilt in backward.
- weight gradients of the linear layers: none beyond the fp32 gradients above where gradient-
  accumulation fusion adds each GEMM's result straight into main_grad (Transformer Engine's layers,
  training.fusions.gradient_accumulation; models/fusions.py); without it (the switch false, or the
  local spec, whose megatron linears fuse only with apex) one layer's largest weight gradient, in the
  weight dtype, lives until DDP's hook adds it. Overlapped gradient reduction reuses DDP's buffer and
  the fused RoPE stores what the unfused one does: neither changes the plan.
- output layer: the final norm's input and output, then for CPT/SFT (and RL with
  rl.loss.chunked_output_layer) the chunked output layer + loss of models/output_loss.py: a few
  chunk buffers and the output weight's gradient (fp32 sum + bf16 GEMM output, built in forward),
  never [tokens, V]; for RL otherwise the logits of the positions a loss reads, [positions,
  V_pad / TP] bf16 plus their gradient beside rl.logprobs' two 32 MiB chunk buffers (only the
  response positions unless sequence parallelism computes all).
- RL: the colocated SGLang engine takes mem_fraction_static of the memory free when it starts
  (sglang's profile_max_num_token: KV pool = free after its weights - (1 - f) x free at start),
  i.e. after the policy's weights, gradients and master weights and the reference are allocated,
  but before Adam's moments (allocated at the first optimizer step) and the reward model (loaded
  at the first reward): both count on top of its share when it wakes again. It releases all of it
  while the policy trains, so the peak is the larger of the rollout and the training phase.
- RL with rl.rewards.mt = 'rm': the reward model scores after the engine sleeps and before the
  policy's passes (rl/trainer.py), a phase of its own: one forward micro-batch of
  rl.rewards.rm_batch_size rows live at a time (no grad). rl.rewards.rm_placement 'resident' holds
  its bf16 weights all run long (every phase); 'offload' only while scoring (pinned host memory
  the rest of the step, one H2D copy of the weights a step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from vepo_mcore.config.job import JobConfig
from vepo_mcore.config.model import ModelConfig
from vepo_mcore.models.output_loss import chunk_tokens
from vepo_mcore.models.vocab import padded_vocab_size

GIB = float(1 << 30)
LOGPROB_WORK_BYTES = 2 * (32 << 20)
"""rl.logprobs holds two CHUNK_BYTES (32 MiB) work buffers beside the logits and their gradient."""
RM_HEAD_OUTPUTS = 11
"""The reward model's head: a score + 10 error categories (rm/model.py)."""
H2D_BYTES_PER_S = 25e9
"""Host-to-device copy from pinned memory, per GPU (PCIe Gen5 x16 measures ~25 GB/s of its 64)."""

Phase = Literal["resident", "training", "rollout", "scoring"]


@dataclass(frozen=True)
class ParameterCounts:
    """Parameters of a Qwen2.5-architecture model (counts, not bytes)."""

    per_layer: int
    """One transformer layer: q/k/v/o projections (+ q/k/v biases), SwiGLU MLP (3 h f), two RMSNorms."""
    qkv_bias_per_layer: int
    """The q/k/v biases inside per_layer (Megatron-LM's estimator leaves them out)."""
    embedding: int
    """V_pad x h: the input embedding, and the output layer again when untied."""
    final_norm: int
    """h: the final RMSNorm."""

    def total(self, num_layers: int, tied: bool) -> int:
        return num_layers * self.per_layer + self.final_norm + self.embedding * (1 if tied else 2)


def parameter_counts(model: ModelConfig, padded_vocab: int) -> ParameterCounts:
    """Counts for `model` with an embedding of `padded_vocab` rows (Qwen2.5-7B at V_pad 152,064:
    7.62e9 in total)."""
    h, f = model.hidden_size, model.ffn_hidden_size
    q = model.num_attention_heads * model.head_dim
    kv = model.num_query_groups * model.head_dim
    bias = (q + 2 * kv) if model.add_qkv_bias else 0
    attention = h * q + 2 * h * kv + q * h + bias
    return ParameterCounts(
        per_layer=attention + 3 * h * f + 2 * h,
        qkv_bias_per_layer=bias,
        embedding=padded_vocab * h,
        final_norm=h,
    )


def stage_parameters(
    counts: ParameterCounts, num_layers: int, tp: int, pp: int, tied: bool, stage: Literal["first", "last"]
) -> float:
    """Parameters on one GPU of a pipeline stage: its L / PP layers and its share of the embedding
    (first stage) or of the final norm and output layer (last stage; a tied model keeps a copy of
    the embedding there), all divided by TP as in Megatron-LM's estimator (the norms, replicated in
    fact, are 0.01% of a layer)."""
    layers = num_layers / pp * counts.per_layer
    if pp == 1:
        return (layers + counts.final_norm + counts.embedding * (1 if tied else 2)) / tp
    if stage == "first":
        return (layers + counts.embedding) / tp
    return (layers + counts.final_norm + counts.embedding) / tp


def layer_activation_bytes(
    *,
    tokens: float,
    seq_length: int,
    hidden: int,
    ffn_hidden: int,
    num_heads: int,
    num_query_groups: int,
    head_dim: int,
    tp: int = 1,
    sequence_parallel: bool = False,
    gated: bool = True,
    hidden_dropout: bool = False,
    attention_dropout: bool = False,
    flash_attention: bool = True,
    recompute: Literal["none", "selective", "full"] = "none",
) -> float:
    """Bytes one transformer layer keeps for backward, per GPU, for `tokens` = micro-batch x
    sequence tokens on this rank (bf16, 2 bytes a value; `seq_length` = keys per query for the
    [s, s] attention scores).

    Korthikanti et al. (2022) Table 2 with MHA, GeLU and dropout (gated=False, num_query_groups =
    num_heads, both dropouts on, ffn 4h): s b h (34 + 5 a s / h) without parallelism,
    s b h (10 + 24 / t + 5 a s / (h t)) under TP, s b h 34 / t under TP + sequence parallelism
    with selective recompute, Megatron-LM's `18 + 4 ffn / h`."""
    h, f = hidden, ffn_hidden
    if recompute == "full":
        return 2 * h * tokens / (tp if sequence_parallel else 1)
    q, kv = num_heads * head_dim, num_query_groups * head_dim
    # Whole on every TP rank unless sequence parallel: the two norms' inputs (2h each), their
    # outputs = the QKV and fc1 inputs (2h each), the dropout masks after attention and MLP (h each).
    replicated = 8 * h + (2 * h if hidden_dropout else 0)
    # Split over TP: Q (2q), K and V (4kv), the attention output = out-projection input (2q),
    # fc1's output (2f, or 4f for SwiGLU's gate and up halves) and fc2's input (2f).
    split = 4 * q + 4 * kv + (6 * f if gated else 4 * f)
    per_token = replicated / (tp if sequence_parallel else 1) + split / tp
    if flash_attention:
        per_token += 4 * num_heads / tp  # flash attention keeps the fp32 log-sum-exp per head
    elif recompute != "selective":
        # softmax output (2 a s), and with attention dropout its mask (a s) and output (2 a s).
        per_token += num_heads * seq_length * (5 if attention_dropout else 2) / tp
    return per_token * tokens


def in_flight_layers(num_layers: int, pp: int, microbatches: int) -> float:
    """Layers' worth of activations the first pipeline stage holds at its peak: its L / PP layers x
    min(PP, micro-batches) under 1F1B (Megatron-LM; virtual stages are refused by ParallelConfig)."""
    if pp == 1:
        return float(num_layers)
    return num_layers / pp * min(pp, microbatches)


@dataclass(frozen=True)
class MemoryItem:
    """One line of the plan."""

    name: str
    bytes: float
    """Per GPU."""
    detail: str
    """How the number comes about."""
    phase: Phase
    """'resident' all run long; 'training' only while the policy trains (activations, logits);
    'rollout' only while the colocated engine is awake; 'scoring' only while the reward model
    scores (the engine asleep, no training activations)."""
    setting: str
    """What to change to shrink it."""
    before_engine: bool = True
    """Allocated before the engine starts, so outside the share it takes (resident items only)."""


@dataclass(frozen=True)
class MemoryPlan:
    """The per-GPU memory of a run; `peak` against `gpu_bytes`."""

    layout: str
    items: tuple[MemoryItem, ...]
    gpu_bytes: float
    reserve_bytes: float
    notes: tuple[str, ...] = ()

    def phase_bytes(self, phase: Phase) -> float:
        return sum(item.bytes for item in self.items if item.phase == phase)

    @property
    def training_peak(self) -> float:
        return self.phase_bytes("resident") + self.phase_bytes("training") + self.reserve_bytes

    @property
    def rollout_peak(self) -> float:
        if not any(item.phase == "rollout" for item in self.items):
            return 0.0
        return self.phase_bytes("resident") + self.phase_bytes("rollout") + self.reserve_bytes

    @property
    def scoring_peak(self) -> float:
        if not any(item.phase == "scoring" for item in self.items):
            return 0.0
        return self.phase_bytes("resident") + self.phase_bytes("scoring") + self.reserve_bytes

    def _peaks(self) -> dict[Phase, float]:
        return {"training": self.training_peak, "rollout": self.rollout_peak, "scoring": self.scoring_peak}

    @property
    def peak(self) -> float:
        return max(self._peaks().values())

    @property
    def fits(self) -> bool:
        return self.peak <= self.gpu_bytes and all(item.bytes >= 0 for item in self.items)

    def item(self, name: str) -> MemoryItem | None:
        return next((item for item in self.items if item.name == name), None)

    def format(self) -> str:
        lines = [f"memory plan per GPU: {self.layout}"]
        phases = (
            ("resident", None),
            ("training", "training"),
            ("rollout", "rollout"),
            ("scoring", "scoring"),
        )
        for phase, title in phases:
            items = [item for item in self.items if item.phase == phase]
            if title and items:
                lines.append(f"  while {title}:")
            for item in items:
                indent = "    " if title else "  "
                lines.append(
                    f"{indent}{item.name:<{32 - len(indent)}}{item.bytes / GIB:7.2f} GiB  {item.detail}"
                )
        lines.append(f"  {'reserve':<30}{self.reserve_bytes / GIB:7.2f} GiB  memory.reserve_gib")
        lines.append(f"  {'peak, training':<30}{self.training_peak / GIB:7.2f} GiB")
        if self.rollout_peak:
            lines.append(f"  {'peak, rollout':<30}{self.rollout_peak / GIB:7.2f} GiB")
        if self.scoring_peak:
            lines.append(f"  {'peak, scoring':<30}{self.scoring_peak / GIB:7.2f} GiB")
        verdict = "fits" if self.fits else "DOES NOT FIT"
        lines.append(f"  {verdict} in {self.gpu_bytes / GIB:.1f} GiB (memory.gpu_memory_gib)")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)

    def check(self) -> None:
        """ValueError naming the settings of the largest items when the plan does not fit."""
        if self.peak > self.gpu_bytes:
            peaks = self._peaks()
            phase: Phase = max(peaks, key=lambda name: peaks[name])
            candidates = [item for item in self.items if item.phase in ("resident", phase)]
            largest = sorted(candidates, key=lambda item: -item.bytes)[:3]
            advice = "; ".join(
                f"{item.name} {item.bytes / GIB:.1f} GiB -> {item.setting}" for item in largest
            )
            raise ValueError(
                f"memory plan: the {phase} phase needs {self.peak / GIB:.1f} GiB per GPU, more than "
                f"memory.gpu_memory_gib = {self.gpu_bytes / GIB:.1f} ({self.layout}). Largest: {advice}"
            )
        for item in self.items:
            if item.bytes < 0:
                raise ValueError(
                    f"memory plan: {item.name} comes out at {item.bytes / GIB:.2f} GiB ({item.detail}); "
                    f"change {item.setting}"
                )


def _state_items(name: str, params: float, cfg: JobConfig, shards: int, setting: str) -> list[MemoryItem]:
    """bf16 weights, fp32 gradients, fp32 master weights and Adam m, v of `params` parameters per GPU,
    the optimizer's part divided over `shards` ranks with the distributed optimizer."""
    bf16 = cfg.training.bf16
    distributed = cfg.training.optimizer.use_distributed_optimizer
    divide = shards if distributed else 1
    how = f"/ {divide} (distributed optimizer)" if distributed else "whole (use_distributed_optimizer false)"
    optimizer_setting = (
        "more data-parallel ranks, or " + setting
        if distributed
        else "training.optimizer.use_distributed_optimizer"
    )
    items = [
        MemoryItem(
            f"{name} weights",
            params * (2 if bf16 else 4),
            f"{params / 1e9:.3f}e9 params x {'2 (bf16)' if bf16 else '4 (fp32)'}",
            "resident",
            setting,
        ),
        MemoryItem(f"{name} gradients", params * 4, "x 4 (fp32 main_grad)", "resident", setting),
    ]
    if bf16:
        items.append(
            MemoryItem(
                f"{name} master weights",
                params * 4 / divide,
                f"x 4 (fp32) {how}",
                "resident",
                optimizer_setting,
            )
        )
    items.append(
        MemoryItem(
            f"{name} Adam moments",
            params * 8 / divide,
            f"x 8 (fp32 m, v) {how}",
            "resident",
            optimizer_setting,
            before_engine=False,
        )
    )
    return items


def _fp8_item(cfg: JobConfig, layers_params: float) -> list[MemoryItem]:
    if cfg.model.fp8.format is None:
        return []
    return [
        MemoryItem(
            "fp8 weight copies",
            layers_params * 2,
            "fp8 weight + transpose of each layer GEMM (TE)",
            "resident",
            "model.fp8.format",
        )
    ]


def _weight_gradient_item(cfg: JobConfig) -> list[MemoryItem]:
    """Without gradient-accumulation fusion, the largest weight gradient of a layer (fc1's [2f / TP, h]
    under SwiGLU, or QKV's) as a tensor of its own in the weight dtype until DDP's hook adds it into
    main_grad; none with it (Transformer Engine's linears on a GPU: models/fusions.py)."""
    m = cfg.model
    if cfg.training.fusions.gradient_accumulation and m.transformer_impl != "local":
        return []
    q, kv = m.num_attention_heads * m.head_dim, m.num_query_groups * m.head_dim
    rows = max(2 * m.ffn_hidden_size, q + 2 * kv) // cfg.parallel.tensor_model_parallel_size
    size = rows * m.hidden_size * (2 if cfg.training.bf16 else 4)
    why = "local spec" if m.transformer_impl == "local" else "training.fusions.gradient_accumulation false"
    return [
        MemoryItem(
            "unfused weight gradient",
            size,
            f"[{rows:,}, {m.hidden_size:,}] before DDP adds it to main_grad ({why})",
            "training",
            "training.fusions.gradient_accumulation with Transformer Engine (model.transformer_impl)",
        )
    ]


def sequence_length(cfg: JobConfig, rl: bool) -> int:
    """Tokens per training sequence: training.seq_length, or for RL the longest prompt
    (memory.rl_prompt_tokens) + rl.rollout.sampling.max_new_tokens, rounded up to FP8's multiple as
    rl/experience.py pads it (16, x TP under sequence parallelism)."""
    if not rl:
        return cfg.training.seq_length
    p = cfg.parallel
    multiple = (
        16 * (p.tensor_model_parallel_size if p.sequence_parallel else 1) if cfg.model.fp8.format else 1
    )
    length = cfg.memory.rl_prompt_tokens + cfg.rl.rollout.sampling.max_new_tokens
    return -(-length // multiple) * multiple


def _output_item(cfg: JobConfig, tokens: float, vocab: int, rl: bool) -> MemoryItem:
    """The last stage's output layer for one micro-batch of `tokens` on this rank: the final norm's
    input and output (2 + 2 bytes x h a token, split over TP under sequence parallelism), then either
    the chunked output layer + loss (CPT/SFT always, RL with rl.loss.chunked_output_layer) or the
    logits [positions, V_pad / TP] of the positions a loss reads (QwenGPTModel's output_mask; all of
    them under sequence parallelism)."""
    m, p, t = cfg.model, cfg.parallel, cfg.training
    tp, cp, sp = p.tensor_model_parallel_size, p.context_parallel_size, p.sequence_parallel
    positions = tokens if (sp or not rl) else t.micro_batch_size * cfg.rl.rollout.sampling.max_new_tokens / cp
    norm = 4 * m.hidden_size * tokens / (tp if sp else 1)
    shard = vocab // tp
    setting = "training.micro_batch_size, parallel.tensor_model_parallel_size"
    if not rl or cfg.rl.loss.chunked_output_layer:
        # models/output_loss.py: per chunk of CUDA_CHUNK_BYTES / (4 V_shard) tokens (at most the
        # micro-batch's positions: the chunks are the fewest of equal size), the logits in the weight
        # dtype and their fp32 shifted copy (one buffer in fp32), exp in place for the CE, a third
        # buffer for the RL entropy; and the gradients: dhidden [positions, h] and dweight, for CPT/SFT
        # built in forward, summed in fp32 beside one GEMM output in the weight dtype (4 + 2 bytes, 4
        # in fp32), then added into DDP's main_grad; for RL added into main_grad chunk by chunk in
        # backward (only the bf16 GEMM output: 2 bytes, none in fp32).
        low = t.bf16
        wbytes = 2 if low else 4
        most = chunk_tokens(shard, torch.bfloat16 if low else torch.float32, device_type="cuda")
        rows = int(min(most, positions))
        buffers = rows * shard * (wbytes + (4 if low else 0) + (4 if rl else 0))
        dweight = ((2 if low else 0) if rl else (6 if low else 4)) * shard * m.hidden_size
        dhidden = wbytes * positions * m.hidden_size
        detail = (
            f"chunked: {rows:,} x {shard:,} work buffers {buffers / GIB * 1024:.0f} MiB, "
            f"dweight {'fp32 + bf16' if low else 'fp32'} {dweight / GIB:.2f} GiB"
        )
        return MemoryItem("output layer", norm + buffers + dweight + dhidden, detail, "training", setting)
    # rl.logprobs: the bf16 logits, their gradient in backward, two work buffers
    shape = f"logits [{positions:,.0f}, {shard:,}]"
    size = norm + 4 * positions * shard + LOGPROB_WORK_BYTES
    return MemoryItem("output layer", size, f"{shape} bf16 + grad, 2 x 32 MiB", "training", setting)


def memory_plan(cfg: JobConfig, world_size: int, *, rl: bool = False, critic: bool = False) -> MemoryPlan:
    """The plan of `cfg` on `world_size` GPUs. `rl`: cfg is rl.trainer.rl_job_config's (global batch
    derived from the RL section) and the plan adds the colocated engine (rl.rollout.engine 'sglang'),
    the frozen reference, the reward model (rl.rewards.mt = 'rm') and, with `critic` (a loss that
    needs one: PPO), the value model with its optimizer."""
    m, p, t = cfg.model, cfg.parallel, cfg.training
    tp, pp, cp = p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.context_parallel_size
    dp = p.data_parallel_size(world_size)
    if dp < 1:
        raise ValueError(f"memory plan: world size {world_size} is smaller than TP*PP*CP = {tp * pp * cp}")
    vocab = padded_vocab_size(m.vocab_size, m.make_vocab_size_divisible_by, tp)
    counts = parameter_counts(m, vocab)
    tied = m.tie_word_embeddings
    flash = m.transformer_impl != "local"
    seq = sequence_length(cfg, rl)
    microbatches = max(1, t.global_batch_size // (t.micro_batch_size * dp))
    tokens = t.micro_batch_size * seq / cp
    sp = p.sequence_parallel
    shape = dict(
        seq_length=seq,
        hidden=m.hidden_size,
        ffn_hidden=m.ffn_hidden_size,
        num_heads=m.num_attention_heads,
        num_query_groups=m.num_query_groups,
        head_dim=m.head_dim,
        tp=tp,
        sequence_parallel=sp,
        hidden_dropout=m.hidden_dropout > 0,
        attention_dropout=m.attention_dropout > 0,
        flash_attention=flash,
    )
    per_layer = layer_activation_bytes(tokens=tokens, recompute=t.recompute, **shape)
    rebuilt = (
        layer_activation_bytes(tokens=tokens, recompute="none", **shape) if t.recompute == "full" else 0.0
    )
    act_setting = "training.micro_batch_size, training.recompute, parallel.tensor_model_parallel_size" + (
        "" if sp else " with parallel.sequence_parallel true"
    )
    act_setting += ", rl.rollout.sampling.max_new_tokens" if rl else ", training.seq_length"

    output = _output_item(cfg, tokens, vocab, rl)
    stages = ("first",) if pp == 1 else ("first", "last")
    plans = []
    for stage in stages:
        params = stage_parameters(counts, m.num_layers, tp, pp, tied, stage)
        layers_params = m.num_layers / pp * (counts.per_layer - 2 * m.hidden_size) / tp
        weight_setting = "parallel.tensor_model_parallel_size, parallel.pipeline_model_parallel_size"
        items = _state_items("policy" if rl else "model", params, cfg, dp * cp, weight_setting) + _fp8_item(
            cfg, layers_params
        )
        if stage == "first":
            layers = in_flight_layers(m.num_layers, pp, microbatches)
            in_flight = layers / (m.num_layers / pp)
        else:
            layers, in_flight = m.num_layers / pp, 1.0
        act = per_layer * layers + rebuilt + 8 * tokens * in_flight  # + the token ids
        items.append(
            MemoryItem(
                "activations",
                act,
                f"{layers:g} layer-passes x {per_layer / GIB * 1024:.0f} MiB, "
                f"recompute {t.recompute}" + (" + 1 rebuilt" if rebuilt else ""),
                "training",
                act_setting,
            )
        )
        items += _weight_gradient_item(cfg)
        if stage == "last" or pp == 1:
            items.append(output)
        notes: list[str] = []
        if rl:
            items += _rl_items(cfg, params, counts, dp, critic, notes)
        layout = (
            f"TP={tp}{' SP' if sp else ''} PP={pp}{f' (stage {stage})' if pp > 1 else ''} CP={cp} DP={dp}, "
            f"micro-batch {t.micro_batch_size} x {seq} tokens, {microbatches} micro-batches/step, "
            f"recompute {t.recompute}, {'flash attention (TE)' if flash else 'local attention'}"
        )
        gpu = cfg.memory.gpu_memory_gib * GIB
        reserve = cfg.memory.reserve_gib * GIB
        if rl and cfg.rl.rollout.engine == "sglang":
            items = _with_engine(cfg, items, counts, gpu - reserve, notes)
        plans.append(MemoryPlan(layout, tuple(items), gpu, reserve, tuple(notes)))
    return max(plans, key=lambda plan: plan.peak)


def _rl_items(
    cfg: JobConfig, params: float, counts: ParameterCounts, dp: int, critic: bool, notes: list[str]
) -> list[MemoryItem]:
    """The reference (always built by the RL trainer), the critic (PPO) and the reward model."""
    kl = cfg.rl.kl
    why = (
        f"KL {kl.estimator} optimised"
        if kl.estimator != "none"
        else (
            f"KL measured every {kl.measure_interval} steps (rl.kl.measure_interval); the trainer holds it either way"
        )
    )
    items = [
        MemoryItem(
            "reference weights",
            params * 2,
            f"frozen bf16 policy copy, {why}",
            "resident",
            "parallel.tensor_model_parallel_size",
        )
    ]
    tp, pp = cfg.parallel.tensor_model_parallel_size, cfg.parallel.pipeline_model_parallel_size
    h = cfg.model.hidden_size
    if critic:
        # The value model: the trunk with a 1-wide head instead of the output layer, trained too.
        trunk = (
            params - (counts.embedding / tp if pp == 1 and not cfg.model.tie_word_embeddings else 0) + h / tp
        )
        items += _state_items(
            "critic",
            trunk,
            cfg,
            dp * cfg.parallel.context_parallel_size,
            "rl.loss.name (a loss without a critic)",
        )
    if cfg.rl.rewards.mt == "rm":
        items += _rm_items(cfg, params, counts, notes)
    return items


def _rm_items(cfg: JobConfig, params: float, counts: ParameterCounts, notes: list[str]) -> list[MemoryItem]:
    """The reward model (rl.rewards.mt = 'rm'): its bf16 weights where rl.rewards.rm_placement keeps
    them, and its forward working set while it scores."""
    m, p, rewards = cfg.model, cfg.parallel, cfg.rl.rewards
    tp, pp = p.tensor_model_parallel_size, p.pipeline_model_parallel_size
    trunk = params - (counts.embedding / tp if pp == 1 and not m.tie_word_embeddings else 0)
    weights = (trunk + RM_HEAD_OUTPUTS * m.hidden_size / tp) * 2
    placement = rewards.rm_placement
    if placement == "offload":
        item = MemoryItem(
            "reward model weights",
            weights,
            f"bf16, the policy's trunk + 11-wide head, on the GPU only while scoring (rm_placement "
            f"offload): {weights / 1e9:.2f} GB H2D a step = {weights / H2D_BYTES_PER_S:.2f} s at "
            f"{H2D_BYTES_PER_S / 1e9:.0f} GB/s",
            "scoring",
            "rl.rewards.mt (the RM scores on every training GPU)",
        )
        notes.append(
            f"reward model placement offload (rl.rewards.rm_placement): {weights / GIB:.2f} GiB of pinned "
            "host memory per GPU between scoring calls"
        )
    else:
        item = MemoryItem(
            "reward model weights",
            weights,
            "bf16, the policy's trunk + 11-wide head, resident (rm_placement resident) from the first reward on",
            "resident",
            "rl.rewards.rm_placement offload (on the GPU only while scoring)",
            before_engine=False,
        )
        notes.append("reward model placement resident (rl.rewards.rm_placement): on the GPU all run long")
    # Forward only, one layer live at a time on each TP rank: the residual stream and the MLP's
    # output (2h each, whole without sequence parallelism), fc1's gate and up halves (2 x 2f / TP)
    # and the SwiGLU product (2f / TP), bf16, for one micro-batch of the longest RL texts.
    tokens = rewards.rm_batch_size * sequence_length(cfg, rl=True)
    split = tp if p.sequence_parallel else 1
    working = tokens * (4 * m.hidden_size / split + 6 * m.ffn_hidden_size / tp)
    scoring = MemoryItem(
        "reward model forward",
        working,
        f"{rewards.rm_batch_size} rows x {sequence_length(cfg, rl=True)} tokens, one layer live, no grad",
        "scoring",
        "rl.rewards.rm_batch_size",
    )
    notes.append("the RM's shape is assumed to be the policy's (its checkpoint's config.yaml decides)")
    return [item, scoring]


def _with_engine(
    cfg: JobConfig, items: list[MemoryItem], counts: ParameterCounts, usable: float, notes: list[str]
) -> list[MemoryItem]:
    """+ the colocated SGLang engine's static pool (its weights and KV cache) for the rollout phase."""
    m, rollout = cfg.model, cfg.rl.rollout
    fraction = rollout.mem_fraction_static
    at_start = sum(item.bytes for item in items if item.phase == "resident" and item.before_engine)
    share = fraction * (usable - at_start)
    total = counts.total(m.num_layers, m.tie_word_embeddings)
    engine_weights = total * 2 / rollout.engine_tp
    kv_heads = max(1, m.num_query_groups // rollout.engine_tp)
    kv_per_token = 2 * m.num_layers * kv_heads * m.head_dim * 2  # K and V, bf16, per engine GPU
    kv_cache = share - engine_weights
    sequence = cfg.memory.rl_prompt_tokens + rollout.sampling.max_new_tokens
    engine_setting = "rl.rollout.mem_fraction_static (or rl.rollout.engine_tp)"
    items = items + [
        MemoryItem(
            "engine weights",
            engine_weights,
            f"bf16 / engine TP {rollout.engine_tp}",
            "rollout",
            engine_setting,
        ),
        MemoryItem(
            "engine KV cache",
            kv_cache,
            f"{max(kv_cache, 0) / kv_per_token:,.0f} tokens x "
            f"{kv_per_token // 1024} KiB; mem_fraction_static {fraction} of the "
            f"{(usable - at_start) / GIB:.1f} GiB free at its start",
            "rollout",
            engine_setting,
        ),
    ]
    if 0 <= kv_cache < sequence * kv_per_token:
        items[-1] = MemoryItem(
            "engine KV cache",
            kv_cache - sequence * kv_per_token,
            items[-1].detail + (f", less than one {sequence}-token sequence"),
            "rollout",
            engine_setting,
        )
    notes.append(
        f"the engine queues what its KV cache cannot hold: {max(kv_cache, 0) / kv_per_token / sequence:,.0f} "
        f"sequences of {sequence} tokens at once"
    )
    return items


__all__ = [
    "GIB",
    "MemoryItem",
    "MemoryPlan",
    "ParameterCounts",
    "in_flight_layers",
    "layer_activation_bytes",
    "memory_plan",
    "parameter_counts",
    "sequence_length",
    "stage_parameters",
]
