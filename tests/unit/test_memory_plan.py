"""The per-GPU memory plan (training/memory_plan.py): its arithmetic against a hand computation of
Megatron-LM's theoretical memory estimator (megatron/training/theoretical_memory_usage.py) for the
7B CPT layout, Korthikanti et al.'s per-layer formulas, the failure naming the setting to change,
and the RL lines appearing only when their setting asks for them."""

from __future__ import annotations

import pytest

from vepo_mcore.config import JobConfig, load_config
from vepo_mcore.models.output_loss import CUDA_CHUNK_BYTES
from vepo_mcore.training.memory_plan import GIB, layer_activation_bytes, memory_plan, parameter_counts

CONFIGS = "examples/configs"
# Qwen2.5-7B: hidden, ffn, heads, KV groups, head dim, layers, V_pad at TP=4.
H, F, A, G, D, L, V = 3584, 18944, 28, 4, 128, 28, 152064


def _cpt(*overrides: str) -> JobConfig:
    """The CPT recipe's layout (examples/cpt_7b.sh): TP=4 + SP, micro-batch 1 x 4096, distributed optimizer."""
    return load_config(JobConfig, f"{CONFIGS}/qwen2.5-7b.yaml", ["--training.seq_length", "4096", *overrides])


def _rl(*overrides: str) -> JobConfig:
    from vepo_mcore.rl.trainer import rl_job_config

    return rl_job_config(load_config(JobConfig, f"{CONFIGS}/vepo_7b.yaml", list(overrides)))


def _megatron_weight_and_optimizer(tp: int, pp: int, dp: int, distributed: bool) -> float:
    """compute_weight_and_optimizer_memory of Megatron-LM, written out by hand for Qwen2.5-7B
    (SwiGLU, GQA, RMSNorm, untied embeddings; the formula has no biases)."""
    layer = 2 * H * (F * 3 / 2 + 1) + 2 * H * H * ((1 + G / A) * (A * D / H))
    block = layer * L + H  # + the final norm
    embedding = H * V
    most_loaded = (block / pp + embedding) / tp + (embedding / tp if pp == 1 else 0)
    return most_loaded * (6 + 12 / dp if distributed else 18)


def test_parameter_count_is_qwen25_7b():
    counts = parameter_counts(_cpt().model, V)
    assert counts.total(L, tied=False) == 7_615_616_512  # Qwen2.5-7B's safetensors hold 7.62e9
    assert counts.per_layer - counts.qkv_bias_per_layer == 233_053_184  # Megatron-LM's layer term


def test_weights_and_optimizer_equal_megatron_lm_estimator_for_the_7b_cpt_layout():
    plan = memory_plan(_cpt("--model.add_qkv_bias", "false", "--model.fp8.format", "null"), world_size=64)
    ours = sum(plan.item(n).bytes for n in ("model weights", "model gradients", "model master weights",
                                             "model Adam moments"))  # fmt: skip
    megatron = _megatron_weight_and_optimizer(tp=4, pp=1, dp=16, distributed=True)
    assert ours == pytest.approx(megatron, rel=1e-12)
    assert megatron / GIB == pytest.approx(11.97, abs=0.01)  # 1.904e9 params x 6.75 bytes
    # With Qwen2.5's q/k/v biases: exactly their (q + 2 kv) per layer more, at 6 + 12 / DP bytes.
    with_bias = memory_plan(_cpt("--model.fp8.format", "null"), world_size=64)
    extra = sum(with_bias.item(n).bytes for n in ("model weights", "model gradients", "model master weights",
                                                   "model Adam moments")) - ours  # fmt: skip
    assert extra == pytest.approx(L * (A * D + 2 * G * D) / 4 * (6 + 12 / 16))


def test_without_the_distributed_optimizer_megatron_lm_counts_18_bytes_a_parameter():
    cfg = _cpt("--model.add_qkv_bias", "false", "--training.optimizer.use_distributed_optimizer", "false",
               "--parallel.pipeline_model_parallel_size", "2", "--model.fp8.format", "null")  # fmt: skip
    plan = memory_plan(cfg, world_size=64)
    assert "stage first" in plan.layout  # two micro-batches in flight outweigh the last stage's logits
    ours = sum(item.bytes for item in plan.items if item.name.startswith("model "))
    # Megatron-LM spreads the final norm over the stages; it sits on the last one (H / TP there).
    megatron = _megatron_weight_and_optimizer(tp=4, pp=2, dp=8, distributed=False)
    assert ours == pytest.approx(megatron - 18 * H / 2 / 4, rel=1e-12)


def test_layer_activations_are_korthikanti_table_2_under_megatron_lm_assumptions():
    """MHA, GeLU, dropout on: 34 sbh / t with SP + selective (Megatron-LM's 18 + 4 ffn / h at
    ffn = 4h), sbh (10 + 24 / t) without SP, + 5 a s^2 b / t when the scores are stored."""
    s, b, h, a, t = 2048, 2, 1024, 16, 4
    gpt = dict(tokens=s * b, seq_length=s, hidden=h, ffn_hidden=4 * h, num_heads=a, num_query_groups=a,
               head_dim=h // a, tp=t, gated=False, hidden_dropout=True, attention_dropout=True,
               flash_attention=False)  # fmt: skip
    assert layer_activation_bytes(**gpt, sequence_parallel=True, recompute="selective") == s * b * h * 34 / t
    assert layer_activation_bytes(**gpt, recompute="selective") == s * b * h * (10 + 24 / t)
    assert (
        layer_activation_bytes(**gpt, recompute="none") == s * b * h * (10 + 24 / t) + 5 * a * s * s * b / t
    )
    assert layer_activation_bytes(**gpt, sequence_parallel=True, recompute="full") == 2 * s * b * h / t


def test_7b_cpt_activations_equal_megatron_lm_plus_the_itemised_differences():
    """compute_activation_memory (SP + selective, PP=1) by hand, then what Qwen2.5 and our loss path
    change: SwiGLU (+2 ffn), GQA K/V (4 kv instead of 4h), no dropout masks (-2h a layer, -h at the
    embedding), TE flash attention's fp32 log-sum-exp (4 a / t), token ids whole on each TP rank,
    and the chunked output layer + loss (models/output_loss.py) in place of megatron's fp32 logits
    (-4 s b V / t): chunk buffers of min(s b, CUDA_CHUNK_BYTES / (4 V / t)) tokens x V / t x (2 + 4) bytes, the
    output weight's gradient built in forward (fp32 sum + bf16 GEMM output: 6 V H / t) and dL/dhidden
    of the gathered positions (2 s b H)."""
    s, b, t = 4096, 1, 4
    megatron = (s * b * H * (18 + 4 * F / H) * L + 8 * s * b + s * b * H + s * b * H * 4 * (1 + V / H)) / t
    plan = memory_plan(_cpt("--training.recompute", "selective"), world_size=64)
    ours = plan.item("activations").bytes + plan.item("output layer").bytes
    per_layer_delta = s * b * (2 * F - (4 * H - 4 * G * D) - 2 * H + 4 * A) / t
    most = CUDA_CHUNK_BYTES // (4 * V // t)  # 7,060 tokens: the whole micro-batch here
    rows = min(most, s * b)
    output = rows * V / t * (2 + 4) + 6 * V / t * H + 2 * s * b * H - 4 * s * b * V / t
    delta = L * per_layer_delta + 8 * s * b * (1 - 1 / t) - s * b * H / t + output
    assert ours == pytest.approx(megatron + delta, rel=1e-12)
    assert megatron / GIB == pytest.approx(4.34, abs=0.01) and ours / GIB == pytest.approx(5.91, abs=0.01)
    # No [tokens, V] term left: past one chunk's budget, doubling the sequence grows only dL/dhidden and
    # the norm, not the output layer's buffers and weight gradient (up to it, the chunk grows too).
    sizes = [
        memory_plan(_cpt("--training.recompute", "selective", "--training.seq_length", str(n)), world_size=64)
        .item("output layer")
        .bytes
        for n in (s, 2 * s, 4 * s)
    ]
    assert sizes[1] - sizes[0] == pytest.approx(
        s * b * (2 * H + 4 * H / t) + (most - s) * V / t * 6, rel=1e-12
    )
    assert sizes[2] - sizes[1] == pytest.approx(2 * s * b * (2 * H + 4 * H / t), rel=1e-12)


def test_pipeline_in_flight_micro_batches_and_recompute_shrink_activations():
    base = memory_plan(_cpt(), world_size=64).item("activations").bytes
    pp2 = memory_plan(_cpt("--parallel.pipeline_model_parallel_size", "2"), world_size=64)
    # 1F1B: the first stage holds L/2 layers x min(2, 128 micro-batches) = L layer-passes, like PP=1.
    assert pp2.item("activations").bytes == pytest.approx(base + 8 * 4096, rel=1e-9)
    # PP=4 on 64 ranks: DP=4, global batch 12 -> 3 micro-batches, so only 3 in flight: 7 x 3 layer-passes.
    few = memory_plan(
        _cpt("--parallel.pipeline_model_parallel_size", "4", "--training.global_batch_size", "12"),
        world_size=64,
    )
    assert "3 micro-batches/step" in few.layout and "stage first" in few.layout
    assert few.item("activations").detail.startswith("21 layer-passes")
    full = memory_plan(_cpt("--training.recompute", "full"), world_size=64).item("activations").bytes
    assert full < base / 5
    cp2 = memory_plan(_cpt("--parallel.context_parallel_size", "2"), world_size=64).item("activations").bytes
    assert cp2 == pytest.approx(base / 2, rel=1e-9)


def test_the_7b_recipes_fit_an_80_gb_h100():
    cpt = memory_plan(_cpt(), world_size=64)
    rl = memory_plan(_rl(), world_size=32, rl=True)
    assert cpt.fits and rl.fits
    cpt.check()
    rl.check()
    assert 20 < cpt.peak / GIB < 30 and 45 < rl.peak / GIB < 60
    # With the reward model as R_mt at the recipe's placement (offload), the same peaks: it is on
    # the GPU only while it scores, when the engine sleeps and training holds no activations.
    rm = memory_plan(_rl("--rl.rewards.mt", "rm"), world_size=32, rl=True)
    rm.check()
    assert rm.fits and (rm.training_peak, rm.rollout_peak) == (rl.training_peak, rl.rollout_peak)
    assert rm.peak == rl.peak and rm.scoring_peak < rl.training_peak
    # RL sequences: the longest FLORES prompt budget (640) + max_new_tokens (512); only the response
    # positions reach the output layer without sequence parallelism.
    assert "micro-batch 4 x 1152 tokens" in rl.layout and "logits [2,048, 38,016]" in rl.format()


def test_a_plan_over_the_gpu_fails_naming_the_setting():
    cfg = _cpt("--training.micro_batch_size", "16", "--training.optimizer.use_distributed_optimizer", "false",
               "--parallel.tensor_model_parallel_size", "1", "--parallel.sequence_parallel", "false")  # fmt: skip
    plan = memory_plan(cfg, world_size=64)
    assert not plan.fits and "DOES NOT FIT" in plan.format()
    with pytest.raises(ValueError, match="memory.gpu_memory_gib = 79.6") as err:
        plan.check()
    assert "activations" in str(err.value) and "training.micro_batch_size" in str(err.value)
    assert "training.recompute" in str(err.value)
    assert "training.optimizer.use_distributed_optimizer" in str(err.value)
    # The same recipe fits a larger GPU when memory.gpu_memory_gib says so.
    small = _cpt("--memory.gpu_memory_gib", "20")
    with pytest.raises(ValueError, match="training phase needs 24.9 GiB"):
        memory_plan(small, world_size=64).check()


def test_the_engine_share_fails_naming_mem_fraction_static():
    # Too little for its weights: the KV cache would be negative.
    with pytest.raises(ValueError, match=r"engine KV cache .*rl.rollout.mem_fraction_static"):
        memory_plan(_rl("--rl.rollout.mem_fraction_static", "0.05"), world_size=32, rl=True).check()
    # Too much: Adam's moments, allocated after the engine sized its pool, no longer fit beside it.
    plan = memory_plan(_rl("--rl.rollout.mem_fraction_static", "0.99"), world_size=32, rl=True)
    assert plan.rollout_peak > plan.gpu_bytes > plan.training_peak
    with pytest.raises(ValueError, match="rollout phase") as err:
        plan.check()
    assert "rl.rollout.mem_fraction_static" in str(err.value)


def _names(plan) -> set[str]:
    return {item.name for item in plan.items}


def test_rl_lines_appear_only_when_configured():
    assert not {"reference weights", "engine weights", "engine KV cache"} & _names(memory_plan(_cpt(), 64))
    rl = memory_plan(_rl(), world_size=32, rl=True)
    assert {"reference weights", "engine weights", "engine KV cache"} <= _names(rl)
    assert not any(name.startswith(("critic", "reward model")) for name in _names(rl))
    # The reference is a bf16 copy of the policy shard.
    assert rl.item("reference weights").bytes == rl.item("policy weights").bytes
    assert "KL k3 optimised" in memory_plan(_rl("--rl.kl.estimator", "k3"), 32, rl=True).format()

    rm = memory_plan(_rl("--rl.rewards.mt", "rm", "--rl.rewards.rm_placement", "resident"), 32, rl=True)
    assert rm.item("reward model weights").bytes / GIB == pytest.approx(
        3.55 - 152064 * H / 4 * 2 / GIB, abs=0.01
    )
    assert rm.training_peak - rl.training_peak == pytest.approx(rm.item("reward model weights").bytes)

    ppo = memory_plan(_rl("--rl.loss.name", "ppo"), world_size=32, rl=True, critic=True)
    assert {"critic weights", "critic gradients", "critic master weights", "critic Adam moments"} <= _names(
        ppo
    )

    embedded = memory_plan(_rl("--rl.rollout.engine", "embedded"), world_size=32, rl=True)
    assert "engine KV cache" not in _names(embedded) and embedded.rollout_peak == 0


def test_reward_model_placement_decides_which_peaks_hold_its_weights():
    """rl.rewards.rm_placement: 'resident' adds the RM's weights to every phase, 'offload' only to
    the scoring phase (the engine asleep, no training activations), which holds its forward too."""
    none = memory_plan(_rl(), world_size=32, rl=True)
    resident = memory_plan(_rl("--rl.rewards.mt", "rm", "--rl.rewards.rm_placement", "resident"), 32, rl=True)
    offload = memory_plan(_rl("--rl.rewards.mt", "rm", "--rl.rewards.rm_placement", "offload"), 32, rl=True)
    weights = resident.item("reward model weights")
    assert weights.bytes == offload.item("reward model weights").bytes
    assert (weights.phase, offload.item("reward model weights").phase) == ("resident", "scoring")
    # The 7B RM at TP=4: the policy's shard less its 1/4 output layer, + the 11-wide head, bf16.
    trunk = (sum(none.item(n).bytes for n in ("policy weights",)) / 2 - V * H / 4 + 11 * H / 4) * 2
    assert weights.bytes == pytest.approx(trunk) and weights.bytes / GIB == pytest.approx(3.29, abs=0.01)
    for phase in ("training_peak", "rollout_peak"):
        assert getattr(resident, phase) == pytest.approx(getattr(none, phase) + weights.bytes)
        assert getattr(offload, phase) == pytest.approx(getattr(none, phase))
    # One forward micro-batch live at a time: 16 rows x 1152 tokens x (4 h + 6 ffn / TP) bytes.
    forward = offload.item("reward model forward")
    assert forward.bytes == 16 * 1152 * (4 * H + 6 * F / 4) and forward.phase == "scoring"
    resident_state = sum(i.bytes for i in none.items if i.phase == "resident")
    assert offload.scoring_peak == pytest.approx(resident_state + weights.bytes + forward.bytes + 4 * GIB)
    assert resident.scoring_peak == pytest.approx(offload.scoring_peak)
    # The transfer it costs, and the placement, in the printed plan.
    assert "3.54 GB H2D a step = 0.14 s at 25 GB/s" in offload.format()
    assert "reward model placement offload" in offload.format() and "peak, scoring" in offload.format()
    assert "reward model placement resident" in resident.format()
    # The setting to change when the resident RM is among the largest items.
    assert weights.setting.startswith("rl.rewards.rm_placement offload")


def test_a_scoring_phase_over_the_gpu_fails_naming_the_rm_setting():
    cfg = _rl("--rl.rewards.mt", "rm", "--rl.rewards.rm_batch_size", "1024", "--memory.gpu_memory_gib", "60")
    plan = memory_plan(cfg, world_size=32, rl=True)
    assert plan.scoring_peak > plan.gpu_bytes > max(plan.training_peak, plan.rollout_peak)
    with pytest.raises(ValueError, match="the scoring phase needs") as err:
        plan.check()
    assert "reward model forward" in str(err.value) and "rl.rewards.rm_batch_size" in str(err.value)


def test_kv_cache_is_the_engine_share_less_its_weights():
    plan = memory_plan(_rl(), world_size=32, rl=True)
    at_start = sum(i.bytes for i in plan.items if i.phase == "resident" and i.before_engine)
    share = 0.5 * (plan.gpu_bytes - plan.reserve_bytes - at_start)
    assert plan.item("engine weights").bytes + plan.item("engine KV cache").bytes == pytest.approx(share)
    # 2 (K, V) x 28 layers x 1 KV head per engine-TP-4 GPU x 128 x 2 bytes = 14 KiB a token.
    assert "x 14 KiB" in plan.item("engine KV cache").detail


def test_dry_runs_print_the_plan(capsys):
    from tools.pretrain_cpt import main as pretrain
    from tools.train_vepo import main as train_vepo

    pretrain(["--config", f"{CONFIGS}/qwen2.5-7b.yaml", "--dry-run", "--world-size", "64"])
    out = capsys.readouterr().out
    assert "memory plan per GPU: TP=4 SP PP=1 CP=1 DP=16" in out and "fits in 79.6 GiB" in out
    train_vepo(["--config", f"{CONFIGS}/vepo_7b.yaml", "--dry-run", "--world-size", "32"])
    out = capsys.readouterr().out
    assert "engine KV cache" in out and "peak, rollout" in out and "fits in 79.6 GiB" in out
    train_vepo(["--config", f"{CONFIGS}/vepo_7b.yaml", "--dry-run", "--world-size", "32",
                "--rl.rewards.mt", "rm", "--rl.rewards.rm_checkpoint", "/ckpt/rm"])  # fmt: skip
    out = capsys.readouterr().out
    assert "reward model placement offload (rl.rewards.rm_placement)" in out and "fits in 79.6 GiB" in out
    with pytest.raises(ValueError, match="memory.gpu_memory_gib = 25.0"):
        train_vepo(["--config", f"{CONFIGS}/vepo_7b.yaml", "--dry-run", "--world-size", "32",
                    "--memory.gpu_memory_gib", "25"])  # fmt: skip


def test_recompute_reaches_megatrons_transformer_config():
    from vepo_mcore.models.builder import transformer_config

    cfg = load_config(JobConfig, f"{CONFIGS}/tiny.yaml", ["--training.recompute", "full"])
    tc = transformer_config(cfg)
    assert (tc.recompute_granularity, tc.recompute_method, tc.recompute_num_layers) == ("full", "uniform", 1)
    cfg.training.recompute = "selective"
    assert transformer_config(cfg).recompute_granularity == "selective"
