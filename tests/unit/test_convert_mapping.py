"""The HF <-> megatron weight mapping (pure tensor code, no process group) and config validation."""

from __future__ import annotations

import json

import pytest
import torch

from tests.support.checkpoints import tiny_qwen2_hf
from vepo_mcore.checkpoint import mapping
from vepo_mcore.checkpoint.convert import dry_run, plan_hf_to_megatron
from vepo_mcore.checkpoint.hf import HFCheckpoint, HFWriter, model_config_from_hf
from vepo_mcore.config import ModelConfig


def _naive_fused_qkv(q, k, v, heads, groups, tp_rank=0, tp=1):
    """Rows of megatron's linear_qkv on one TP rank, built head by head."""
    d = k.shape[0] // groups
    per_group = heads // groups
    rows = []
    for g in range(groups * tp_rank // tp, groups * (tp_rank + 1) // tp):
        for h in range(g * per_group, (g + 1) * per_group):
            rows.append(q[h * d : (h + 1) * d])
        rows.append(k[g * d : (g + 1) * d])
        rows.append(v[g * d : (g + 1) * d])
    return torch.cat(rows)


@pytest.mark.parametrize("heads,groups", [(4, 2), (8, 8), (8, 1), (28, 4)])
def test_qkv_fusion_matches_head_by_head_layout_and_tp_shards(heads, groups):
    d, h = 3, 5
    q, k, v = torch.randn(heads * d, h), torch.randn(groups * d, h), torch.randn(groups * d, h)
    fused = mapping.fuse_qkv(q, k, v, heads, groups)
    assert torch.equal(fused, _naive_fused_qkv(q, k, v, heads, groups))
    for tp in [t for t in (1, 2, 4) if groups % t == 0]:
        shards = mapping.tp_split("decoder.layers.0.self_attention.linear_qkv.weight", fused, tp)
        for r, shard in enumerate(shards):
            assert torch.equal(shard, _naive_fused_qkv(q, k, v, heads, groups, r, tp))
    back = mapping.split_qkv(fused, heads, groups)
    assert all(torch.equal(a, b) for a, b in zip(back, (q, k, v)))
    bias = mapping.fuse_qkv(q[:, 0], k[:, 0], v[:, 0], heads, groups)
    assert torch.equal(bias, _naive_fused_qkv(q, k, v, heads, groups)[:, 0])


def test_fc1_tp_shards_hold_gate_and_up_slices():
    gate, up = torch.randn(8, 3), torch.randn(8, 3)
    name = "decoder.layers.1.mlp.linear_fc1.weight"
    full = mapping.fuse_gate_up(gate, up)
    shards = mapping.tp_split(name, full, 2)
    assert torch.equal(shards[1], torch.cat([gate[4:], up[4:]]))
    assert torch.equal(mapping.tp_merge(name, shards), full)


@pytest.mark.parametrize(
    "name,dim",
    [
        ("decoder.layers.0.self_attention.linear_proj.weight", 1),
        ("decoder.layers.0.mlp.linear_fc2.weight", 1),
        ("embedding.word_embeddings.weight", 0),
        ("output_layer.weight", 0),
    ],
)
def test_row_and_column_parallel_splits(name, dim):
    full = torch.randn(8, 6)
    shards = mapping.tp_split(name, full, 2)
    assert torch.equal(shards[1], full.narrow(dim, full.shape[dim] // 2, full.shape[dim] // 2))
    assert torch.equal(mapping.tp_merge(name, shards), full)


def test_names_te_aliases_and_errors():
    layer, rule = mapping.parse_megatron_name("decoder.layers.7.self_attention.linear_qkv.layer_norm_weight")
    assert (layer, rule.megatron) == (7, "input_layernorm.weight")
    _, rule = mapping.parse_megatron_name("decoder.layers.0.mlp.linear_fc1.layer_norm_weight")
    assert rule.hf == ("post_attention_layernorm.weight",)
    assert mapping.global_layer_name("decoder.layers.1.mlp.linear_fc2.weight", 4) == (
        "decoder.layers.5.mlp.linear_fc2.weight"
    )
    with pytest.raises(ValueError, match="known names"):
        mapping.parse_megatron_name("decoder.layers.0.self_attention.q_proj.weight")


@pytest.mark.parametrize("tie", [False, True])
def test_hf_megatron_hf_round_trip_on_transformers_state_dict(tmp_path, tie):
    """Every HF tensor of a real Qwen2ForCausalLM maps to megatron and back unchanged; padding rows zero."""
    model = tiny_qwen2_hf(tmp_path, tie=tie, vocab_size=320, num_layers=2)
    hf = {k: v for k, v in model.state_dict().items() if not (tie and k == "lm_head.weight")}
    cfg = model_config_from_hf(json.loads((tmp_path / "config.json").read_text()), vocab_size=300)
    full = {
        n: mapping.hf_to_megatron_tensor(n, hf.__getitem__, cfg, 384) for n in mapping.megatron_names(cfg)
    }
    assert full["embedding.word_embeddings.weight"].shape == (384, 64)
    assert not full["embedding.word_embeddings.weight"][300:].any()
    back = dict(mapping.megatron_to_hf_tensors(full, cfg, hf_vocab_rows=320))
    assert sorted(back) == sorted(hf)
    for name, tensor in hf.items():
        expected = tensor.clone()
        if "embed_tokens" in name or "lm_head" in name:
            expected[300:] = 0  # ids >= the real vocab are padding and never leak
        assert torch.equal(back[name], expected), name


def test_no_qkv_bias_exports_zero_biases():
    cfg = ModelConfig(num_layers=1, vocab_size=10, add_qkv_bias=False)
    qkv = torch.randn(cfg.head_dim * 8, cfg.hidden_size)
    out = dict(
        mapping.megatron_to_hf_tensors({"decoder.layers.0.self_attention.linear_qkv.weight": qkv}, cfg)
    )
    assert out["model.layers.0.self_attn.k_proj.bias"].shape == (cfg.head_dim * 2,)
    assert not out["model.layers.0.self_attn.q_proj.bias"].any()


def test_sharded_reader_and_writer(tmp_path):
    tensors = {f"t{i}": torch.full((100,), float(i)) for i in range(5)}
    with HFWriter(tmp_path / "out", max_shard_bytes=900) as writer:
        for name, t in tensors.items():
            writer.add(name, t)
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) == 3
    assert (tmp_path / "out" / "model-00003-of-00003.safetensors").is_file()
    (tmp_path / "out" / "config.json").write_text("{}")
    reader = HFCheckpoint(tmp_path / "out")
    assert all(torch.equal(reader.get(n), t) for n, t in tensors.items())
    with pytest.raises(KeyError, match="no tensor 'nope'"):
        reader.get("nope")


def _edit_config(hf_dir, **changes):
    path = hf_dir / "config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))


@pytest.mark.parametrize(
    "changes,kwargs,field",
    [
        ({"architectures": ["LlamaForCausalLM"]}, {}, "architectures"),
        ({"use_sliding_window": True}, {}, "use_sliding_window"),
        ({}, {"vocab_size": 400}, "vocab_size"),
        ({}, {"tp": 4}, "num_query_groups"),
        ({}, {"tp": 3}, "num_attention_heads"),
        ({}, {"pp": 3}, "num_hidden_layers"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, {}, "rope"),
        ({"vocab_size": 384}, {}, "embed_tokens.weight rows"),
        ({"layer_types": ["sliding_attention", "full_attention"]}, {}, "layer_types"),
    ],
)
def test_unsupported_configs_raise_naming_the_field(tmp_path, changes, kwargs, field):
    tiny_qwen2_hf(tmp_path, vocab_size=320, num_layers=2)
    _edit_config(tmp_path, **changes)
    with pytest.raises(ValueError, match=field):
        plan_hf_to_megatron(tmp_path, **kwargs)


def test_dry_run_lists_every_tensor(tmp_path):
    tiny_qwen2_hf(tmp_path, vocab_size=320, num_layers=2, tie=True)
    text = dry_run(tmp_path, tp=2)
    assert "megatron rows 512" in text
    assert "output_layer" not in text  # tied: HF has no lm_head
    assert (
        "decoder.layers.1.self_attention.linear_qkv.bias [128] <- model.layers.1.self_attn.q_proj.bias"
        in text
    )
    assert "embedding.word_embeddings.weight [512, 64] <- model.embed_tokens.weight  [vocab, column]" in text
    assert len(text.splitlines()) == 1 + 1 + 2 * 7 + 1


def test_qwen25_7b_config_and_vocab_padding():
    """Qwen2.5-7B's config.json with the shipped tokenizer: 151,665 real ids, 152,064 rows at TP=4."""
    from vepo_mcore.checkpoint.hf import tokenizer_vocab_size
    from vepo_mcore.languages import default_tokenizer_dir
    from vepo_mcore.models.vocab import padded_vocab_size

    qwen7b = {
        "architectures": ["Qwen2ForCausalLM"],
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "max_position_embeddings": 131072,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-06,
        "sliding_window": 131072,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    cfg = model_config_from_hf(qwen7b, vocab_size=tokenizer_vocab_size(default_tokenizer_dir()))
    assert (cfg.vocab_size, cfg.head_dim, cfg.num_query_groups, cfg.kv_channels) == (151665, 128, 4, None)
    cfg.validate(4)
    assert padded_vocab_size(cfg.vocab_size, cfg.make_vocab_size_divisible_by, 4) == 152064
    with pytest.raises(ValueError, match=r"tensor_model_parallel_size \(8\)"):
        cfg.validate(8)
