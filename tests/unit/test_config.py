"""The config tree: YAML round trip, dotted overrides, and errors that name the field."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from vepo_mcore.config import JobConfig, load_config, parse_overrides, save_config, to_dict
from vepo_mcore.config.base import field_docs
from vepo_mcore.models.vocab import padded_vocab_size
from vepo_mcore.rl.losses import LOSSES
from vepo_mcore.rl.losses.dapo import DAPOOptions
from vepo_mcore.rl.losses.vepo import VEPOOptions

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "configs"


@pytest.mark.parametrize("name", ["tiny.yaml", "qwen2.5-7b.yaml", "qwen2.5-0.5b.yaml"])
def test_example_configs_load_validate_and_round_trip(name, tmp_path):
    cfg = load_config(JobConfig, EXAMPLES / name)
    save_config(cfg, tmp_path / "saved.yaml")
    again = load_config(JobConfig, tmp_path / "saved.yaml")
    assert to_dict(again) == to_dict(cfg)
    assert again == cfg


def test_qwen25_7b_has_the_real_shape():
    m = load_config(JobConfig, EXAMPLES / "qwen2.5-7b.yaml").model
    assert (m.hidden_size, m.num_layers, m.num_attention_heads, m.num_query_groups) == (3584, 28, 28, 4)
    assert (m.ffn_hidden_size, m.rotary_base, m.norm_epsilon) == (18944, 1e6, 1e-6)
    assert m.add_qkv_bias and not m.tie_word_embeddings and m.max_position_embeddings == 32768
    # The HF checkpoint's 152064 rows are the one padding rule applied at TP=4.
    assert padded_vocab_size(m.vocab_size, m.make_vocab_size_divisible_by, 4) == 152064
    assert load_config(JobConfig, EXAMPLES / "qwen2.5-0.5b.yaml").model.tie_word_embeddings


def test_dotted_overrides_are_typed_and_nested():
    cfg = load_config(
        JobConfig,
        EXAMPLES / "tiny.yaml",
        [
            "--model.num_layers",
            "4",
            "--rl.loss.eps_high=0.3",
            "--training.bf16",
            "true",
            "--data.paths.en",
            "x",
        ],
    )
    assert cfg.model.num_layers == 4 and isinstance(cfg.model.num_layers, int)
    assert cfg.rl.loss.eps_high == 0.3
    # Text YAML would misread stays text: ':' is a YAML error, '800:' the mapping {800: None}.
    for text in (":", "800:", ":800"):
        ranged = load_config(JobConfig, EXAMPLES / "tiny.yaml", ["--rl.prompt_sentences", text])
        assert ranged.rl.prompt_sentences == text
    with pytest.raises(ValueError, match="rl.prompt_sentences"):
        load_config(JobConfig, EXAMPLES / "tiny.yaml", ["--rl.prompt_sentences", "800"])
    assert cfg.training.bf16 is True
    assert cfg.data.paths == {"en": "x"}
    assert parse_overrides(["--a.b-c", "1"]) == {"a": {"b_c": 1}}


def test_a_dotted_key_of_a_mapping_adds_to_it():
    default = load_config(JobConfig, EXAMPLES / "tiny.yaml").rl.rewards.weights
    cfg = load_config(JobConfig, EXAMPLES / "tiny.yaml", ["--rl.rewards.weights.repetition", "0.5"])
    assert cfg.rl.rewards.weights == {**default, "repetition": 0.5} and "mt" in default
    cfg = load_config(JobConfig, EXAMPLES / "tiny.yaml", ["--rl.rewards.weights.length", "0"])
    assert cfg.rl.rewards.weights == {**default, "length": 0}


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (
            ["--model.num_attention_heads", "6", "--parallel.tensor_model_parallel_size", "4"],
            "model.num_attention_heads",
        ),
        (["--model.vocab_size", "1"], "model.vocab_size"),
        (["--model.num_attention_heads", "4", "--model.num_query_groups", "3"], "model.num_query_groups"),
        (["--model.num_layers", "3", "--parallel.pipeline_model_parallel_size", "2"], "model.num_layers"),
        (["--model.num_layers", "two"], "model.num_layers"),
        (["--model.nmu_layers", "2"], "nmu_layers"),
        (["--rl.rollout.sampling.temperature", "0"], "rl.rollout.sampling.temperature"),
        (["--rl.loss.vepo.std_scope", "batch"], "rl.loss.vepo.std_scope"),
        (["--rl.loss.vepo.gamma", "2"], "rl.loss.vepo.gamma"),
        (["--rl.loss.vepo.aplha", "0.1"], "rl.loss.vepo: unknown key"),
        (["--rl.loss.name", "dapo", "--rl.loss.dapo.overlong_buffer", "-1"], "rl.loss.dapo.overlong_buffer"),
        (["--rl.loss.alpha", "0.1"], "did you mean 'vepo.alpha'"),  # a loss's option lives in its section
        (["--rl.loss.logprob_chunk_size", "0"], "rl.loss.logprob_chunk_size"),
        (
            ["--rl.filtering.num_candidates", "2", "--rl.filtering.group_size", "4"],
            "rl.filtering.num_candidates",
        ),
        (
            ["--training.optimizer.min_lr", "1.0", "--training.optimizer.lr", "0.1"],
            "training.optimizer.min_lr",
        ),
    ],
)
def test_bad_configs_raise_value_errors_naming_the_field(overrides, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        load_config(JobConfig, EXAMPLES / "tiny.yaml", overrides)


def test_each_loss_has_its_own_section_from_yaml_and_dotted_flags(tmp_path):
    """rl.loss holds what every loss shares; rl.loss.<name> the options registered with that loss.
    A section of a loss not selected is type-checked and kept, not validated: one flag switches."""
    (tmp_path / "rl.yaml").write_text(
        "rl:\n  loss:\n    name: vepo\n    eps_high: 0.3\n    vepo:\n      alpha: 0.2\n"
        "    dapo:\n      overlong_buffer: -1\n"  # dapo is not selected: not validated
    )
    cfg = load_config(JobConfig, tmp_path / "rl.yaml", ["--rl.loss.vepo.beta", "0.01"])
    assert cfg.rl.loss.options_of() == VEPOOptions(alpha=0.2, beta=0.01)
    assert cfg.rl.loss.options_of("dapo") == DAPOOptions(overlong_buffer=-1)
    assert to_dict(cfg.rl.loss)["vepo"] == {
        "alpha": 0.2,
        "gamma": 0.995,
        "beta": 0.01,
        "std_scope": "microbatch",
    }
    save_config(cfg, tmp_path / "saved.yaml")
    assert load_config(JobConfig, tmp_path / "saved.yaml") == cfg
    with pytest.raises(ValueError, match=r"rl\.loss\.dapo\.overlong_buffer must be >= 0"):
        load_config(JobConfig, tmp_path / "rl.yaml", ["--rl.loss.name", "dapo"])
    dapo = load_config(
        JobConfig, tmp_path / "rl.yaml", ["--rl.loss.name", "dapo", "--rl.loss.dapo.overlong_buffer", "16"]
    )
    assert dapo.rl.loss.options_of().overlong_buffer == 16 and dapo.rl.loss.eps_high == 0.3
    # the selected loss's defaults are written out, so a saved config holds every value a run used
    assert to_dict(load_config(JobConfig, None, ["--rl.loss.name", "ppo"]).rl.loss)["ppo"]["lam"] == 0.95


@pytest.mark.parametrize("name", sorted(n for n, spec in LOSSES.items() if spec.options is not None))
def test_each_loss_options_are_a_documented_kw_only_dataclass(name):
    options = LOSSES[name].options
    assert dataclasses.is_dataclass(options) and all(f.kw_only for f in dataclasses.fields(options))
    fields = {f.name for f in dataclasses.fields(options)}
    assert fields and set(field_docs(options)) == fields, f"rl.loss.{name}: a field without a docstring"
    options().validate()  # the defaults are valid


def test_world_size_checks():
    cfg = load_config(JobConfig, EXAMPLES / "tiny.yaml", ["--parallel.tensor_model_parallel_size", "2"])
    with pytest.raises(ValueError, match="world size 3"):
        cfg.validate(world_size=3)
    with pytest.raises(ValueError, match="training.global_batch_size"):
        cfg.validate(world_size=6)  # DP=3, global 8 not divisible by 4 * 3
    cfg.validate(world_size=4)


def test_missing_config_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        load_config(JobConfig, tmp_path / "nope.yaml")


def test_padding_rule():
    assert padded_vocab_size(151665, 128, 1) == 151680
    assert padded_vocab_size(151665, 128, 4) == 152064
    assert padded_vocab_size(128, 128, 1) == 128
    assert padded_vocab_size(129, 64, 2) == 256
    with pytest.raises(ValueError, match="vocab_size"):
        padded_vocab_size(0)
