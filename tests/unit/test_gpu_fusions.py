"""The GPU fusions (models/fusions.py): which of gradient_accumulation_fusion, overlap_grad_reduce and
apply_rope_fusion each machine and config gets and why, that the builder and wrap_model pass the
decision to megatron (nothing fused on CPU), that megatron's own linears build and run unfused when
apex is missing, and the memory plan's unfused weight gradient."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vepo_mcore.config import JobConfig, load_config
from vepo_mcore.models import fusions as fusions_module
from vepo_mcore.models.fusions import SWITCHES, build_with_fusions, gpu_fusions, log_fusions_off

GPU_TE = dict(cuda=True, te_version="2.11.0", apex_grad_fusion=False, dp_size=8)
"""The image's GPU: Transformer Engine 2.11, no apex, eight data-parallel ranks."""
NAMES = ("gradient_accumulation_fusion", "overlap_grad_reduce", "apply_rope_fusion")


def _decide(cfg: JobConfig | None = None, **machine):
    return gpu_fusions(cfg or JobConfig(), **{**GPU_TE, **machine})


def test_gpu_with_transformer_engine_and_several_data_parallel_ranks_gets_all_three():
    fusions = _decide()
    assert fusions.settings == dict.fromkeys(NAMES, True) and fusions.off == {}


@pytest.mark.parametrize("te_version", [None, "2.11.0"])
@pytest.mark.parametrize("apex", [False, True])
@pytest.mark.parametrize("dp_size", [1, 8])
def test_nothing_is_fused_on_cpu(te_version, apex, dp_size):
    fusions = _decide(cuda=False, te_version=te_version, apex_grad_fusion=apex, dp_size=dp_size)
    assert fusions.settings == dict.fromkeys(NAMES, False)
    assert set(fusions.off.values()) == {"no CUDA"}


@pytest.mark.parametrize(
    ("impl", "te_version", "apex", "on"),
    [
        ("auto", "2.11.0", False, True),  # TE's linears fuse; the output layer stays unfused
        ("auto", None, False, False),  # local spec, megatron's linears, no apex
        ("auto", None, True, True),  # local spec with apex's kernel
        ("local", "2.11.0", False, False),
        ("local", "2.11.0", True, True),
        ("transformer_engine", "2.11.0", False, True),
    ],
)
def test_gradient_accumulation_fusion_needs_te_layers_or_apex(impl, te_version, apex, on):
    cfg = JobConfig()
    cfg.model.transformer_impl = impl
    fusions = _decide(cfg, te_version=te_version, apex_grad_fusion=apex)
    assert fusions.settings["gradient_accumulation_fusion"] is on
    if not on:
        assert "apex's fused_weight_gradient_mlp_cuda" in fusions.off["gradient_accumulation_fusion"]


@pytest.mark.parametrize(
    ("te_version", "cp", "why"),
    [
        (None, 1, "Transformer Engine is not installed"),
        ("1.3.0", 1, "Transformer Engine 1.3.0 < 1.4"),
        ("1.4.0", 1, None),
        ("1.11.0+cu12", 2, "< 1.12 under context parallelism"),
        ("1.12.0", 2, None),
        ("2.11.0.dev0+abc", 2, None),
    ],
)
def test_rope_fusion_needs_transformer_engine(te_version, cp, why):
    cfg = JobConfig()
    cfg.parallel.context_parallel_size = cp
    fusions = _decide(cfg, te_version=te_version)
    assert fusions.settings["apply_rope_fusion"] is (why is None)
    if why:
        assert why in fusions.off["apply_rope_fusion"]


@pytest.mark.parametrize(
    ("dp_size", "tied", "pp", "why"),
    [
        (1, False, 1, "one data-parallel rank"),
        (2, False, 1, None),
        (2, True, 1, "model.tie_word_embeddings at PP = 1"),
        (2, True, 2, None),  # each stage's copy gets a dummy gradient (models/main_grad.py)
    ],
)
def test_overlap_grad_reduce_needs_data_parallel_ranks_and_a_gradient_for_every_weight(
    dp_size, tied, pp, why
):
    cfg = JobConfig()
    cfg.model.tie_word_embeddings = tied
    cfg.parallel.pipeline_model_parallel_size = pp
    fusions = _decide(cfg, dp_size=dp_size)
    assert fusions.settings["overlap_grad_reduce"] is (why is None)
    if why:
        assert why in fusions.off["overlap_grad_reduce"]


@pytest.mark.parametrize("name", NAMES)
def test_each_switch_forces_only_its_fusion_off_naming_the_field(name):
    cfg = JobConfig()
    field = SWITCHES[name]
    setattr(cfg.training.fusions, field.rsplit(".", 1)[1], False)
    fusions = _decide(cfg, apex_grad_fusion=True)
    assert fusions.off == {name: f"{field} is false"}


def test_one_line_per_fusion_off_on_a_gpu_once_and_none_on_cpu(monkeypatch, capsys):
    monkeypatch.setattr(fusions_module, "_LOGGED", set())
    cpu = _decide(cuda=False)
    log_fusions_off(cpu, *NAMES)
    assert capsys.readouterr().err == ""
    gpu = _decide(te_version=None, dp_size=1)
    log_fusions_off(gpu, *NAMES)
    log_fusions_off(gpu, *NAMES)  # a second model built in the same process
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "fusion off: gradient_accumulation_fusion (without Transformer Engine, the local spec uses "
        "megatron's linears, which need apex's fused_weight_gradient_mlp_cuda (not installed))",
        "fusion off: overlap_grad_reduce (one data-parallel rank: no gradient reduction to overlap)",
        "fusion off: apply_rope_fusion (Transformer Engine is not installed (the fused RoPE is its kernel))",
    ]


@pytest.fixture(scope="module")
def tiny():
    from vepo_mcore.parallel import init_model_parallel

    cfg = JobConfig()
    m = cfg.model
    m.num_layers, m.hidden_size, m.ffn_hidden_size, m.vocab_size = 2, 32, 64, 128
    m.num_attention_heads, m.num_query_groups, m.make_vocab_size_divisible_by = 4, 2, 64
    init_model_parallel(cfg.parallel)
    return cfg


def test_on_cpu_megatron_gets_every_fusion_off(tiny):
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.training.optimizer import wrap_model

    model = build_model(tiny)
    assert not model.config.gradient_accumulation_fusion and not model.config.apply_rope_fusion
    assert not wrap_model(model, tiny).ddp_config.overlap_grad_reduce


def test_wrap_model_passes_the_overlap_decision_to_ddp(tiny, monkeypatch):
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.training import optimizer

    decided = fusions_module.Fusions(dict.fromkeys(NAMES, False) | {"overlap_grad_reduce": True}, {})
    monkeypatch.setattr(optimizer, "gpu_fusions", lambda cfg, **machine: decided)
    assert optimizer.wrap_model(build_model(tiny), tiny).ddp_config.overlap_grad_reduce


def _grads(model, tokens) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    model(tokens, positions, None, labels=tokens).float().mean().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_without_apex_megatrons_linears_build_past_its_check_and_run_unfused(tiny, monkeypatch):
    """The TE spec's output layer is megatron's ColumnParallelLinear, which refuses
    gradient_accumulation_fusion without apex: build_with_fusions builds it and keeps it unfused."""
    from megatron.core.tensor_parallel import layers

    from vepo_mcore.models import builder

    fused = fusions_module.Fusions(dict.fromkeys(NAMES, False) | {"gradient_accumulation_fusion": True}, {})
    monkeypatch.setattr(builder, "gpu_fusions", lambda cfg, **machine: fused)
    config = builder.transformer_config(tiny)
    assert config.gradient_accumulation_fusion and not layers._grad_accum_fusion_available
    with pytest.raises(RuntimeError, match="fused_weight_gradient_mlp_cuda"):
        layers.ColumnParallelLinear(32, 64, config=config, init_method=torch.nn.init.zeros_)

    torch.manual_seed(0)
    model = builder.build_model(tiny)
    assert model.config.gradient_accumulation_fusion and not layers._grad_accum_fusion_available
    linears = [
        m for m in model.modules() if isinstance(m, (layers.ColumnParallelLinear, layers.RowParallelLinear))
    ]
    assert model.output_layer in linears and not any(m.gradient_accumulation_fusion for m in linears)

    monkeypatch.undo()
    torch.manual_seed(0)
    reference = builder.build_model(tiny)
    reference.load_state_dict(model.state_dict())
    tokens = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(0))
    ours, expected = _grads(model, tokens), _grads(reference, tokens)
    assert ours.keys() == expected.keys()
    for name, grad in expected.items():
        torch.testing.assert_close(ours[name], grad, msg=name)


def test_build_with_fusions_leaves_megatrons_check_alone_when_fusion_is_off_or_apex_present():
    from megatron.core.tensor_parallel import layers

    flags = []

    def build():
        flags.append(layers._grad_accum_fusion_available)
        return torch.nn.Linear(1, 1)

    build_with_fusions(SimpleNamespace(gradient_accumulation_fusion=True), build, apex_grad_fusion=True)
    build_with_fusions(SimpleNamespace(gradient_accumulation_fusion=False), build, apex_grad_fusion=False)
    assert flags == [False, False]  # no apex on this machine: megatron's flag as it found it


def _cpt_7b(*overrides: str) -> JobConfig:
    return load_config(
        JobConfig, "examples/configs/qwen2.5-7b.yaml", ["--training.seq_length", "4096", *overrides]
    )


def test_memory_plan_counts_the_weight_gradient_only_without_gradient_accumulation_fusion():
    from vepo_mcore.training.memory_plan import memory_plan

    fused = memory_plan(_cpt_7b(), world_size=64)
    assert fused.item("unfused weight gradient") is None
    unfused = memory_plan(_cpt_7b("--training.fusions.gradient_accumulation", "false"), world_size=64)
    item = unfused.item("unfused weight gradient")
    # Qwen2.5-7B at TP=4: SwiGLU's fc1 [2 x 18,944 / 4, 3,584] in bf16, the largest weight of a layer.
    assert item.phase == "training" and item.bytes == 2 * 18944 // 4 * 3584 * 2
    assert unfused.training_peak - fused.training_peak == pytest.approx(item.bytes)
    assert {i.name for i in unfused.items} - {i.name for i in fused.items} == {"unfused weight gradient"}
    local = memory_plan(
        _cpt_7b("--model.transformer_impl", "local", "--model.fp8.format", "null"), world_size=64
    )
    assert local.item("unfused weight gradient").bytes == item.bytes
