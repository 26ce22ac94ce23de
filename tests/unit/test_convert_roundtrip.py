"""HF -> megatron (TP=1, in this process) -> HF: identical tensors, and transformers loads the export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.support.checkpoints import tiny_qwen2_hf
from vepo_mcore.checkpoint.convert import hf_to_megatron, megatron_to_hf
from vepo_mcore.checkpoint.hf import HFCheckpoint

REPO_TOOL = "tools/convert_hf.py"


def _tensors(hf_dir) -> dict[str, torch.Tensor]:
    reader = HFCheckpoint(hf_dir)
    return {name: reader.get(name) for name in reader.names()}


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(tie=False, dtype=torch.float32, max_shard_size="60KB"),  # sharded input with an index
        dict(tie=True, dtype=torch.bfloat16),
    ],
)
def test_hf_megatron_hf_is_byte_identical(tmp_path, kwargs):
    from transformers import Qwen2ForCausalLM

    original = tiny_qwen2_hf(tmp_path / "hf", vocab_size=320, num_layers=2, **kwargs)
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file() == ("max_shard_size" in kwargs)
    hf_to_megatron(tmp_path / "hf", tmp_path / "mc")
    megatron_to_hf(tmp_path / "mc", tmp_path / "back", max_shard_bytes=40_000)
    before, after = _tensors(tmp_path / "hf"), _tensors(tmp_path / "back")
    assert sorted(before) == sorted(after)
    for name, tensor in before.items():
        assert after[name].dtype == tensor.dtype, name
        assert torch.equal(after[name].view(torch.uint8), tensor.view(torch.uint8)), name
    assert (tmp_path / "back" / "model.safetensors.index.json").is_file()
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert config["vocab_size"] == 320 and config["tie_word_embeddings"] == kwargs["tie"]
    reloaded = Qwen2ForCausalLM.from_pretrained(tmp_path / "back", dtype=kwargs["dtype"]).eval()
    expected = original.state_dict()
    for name, tensor in reloaded.state_dict().items():
        assert torch.equal(tensor, expected[name]), name


def test_padding_rows_never_leak(tmp_path):
    """384-row megatron vocab for 300 real ids: rows >= 300 are zero in megatron and in the export."""
    from megatron.core.dist_checkpointing import load_plain_tensors

    from vepo_mcore.checkpoint.convert import local_process_group

    tiny_qwen2_hf(tmp_path / "hf", vocab_size=320, num_layers=2, qkv_bias=False)
    hf_to_megatron(tmp_path / "hf", tmp_path / "mc", vocab_size=300)
    with local_process_group():
        plain = load_plain_tensors(str(tmp_path / "mc" / "iter_0000000"))
    embedding = plain["embedding.word_embeddings.weight"]
    assert embedding.shape == (384, 64) and not embedding[300:].any()
    megatron_to_hf(tmp_path / "mc", tmp_path / "back")
    before, after = _tensors(tmp_path / "hf"), _tensors(tmp_path / "back")
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        assert after[name].shape == (320, 64)  # the source checkpoint's row count
        assert torch.equal(after[name][:300], before[name][:300]) and not after[name][300:].any()
    # No qkv bias in the source: megatron has none, HF gets zero biases (Qwen2 always has them).
    assert not after["model.layers.1.self_attn.v_proj.bias"].any()
    assert "model.layers.1.self_attn.v_proj.bias" not in before


def test_cli_dry_run_and_error(tmp_path, capsys, monkeypatch):
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "convert_hf", Path(__file__).resolve().parents[2] / REPO_TOOL
    )
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    tiny_qwen2_hf(tmp_path / "hf", vocab_size=320, num_layers=2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the tool hides GPUs; restored after this test
    convert = ["hf-to-megatron", "--hf", str(tmp_path / "hf"), "--out", str(tmp_path / "mc")]
    tool.main([*convert, "--tp", "2", "--dry-run"])
    out = capsys.readouterr().out
    assert (
        "mlp.linear_fc1.weight [352, 64] <- model.layers.0.mlp.gate_proj.weight + model.layers.0.mlp.up_proj.weight"
        in out
    )
    assert not (tmp_path / "mc").exists()
    with pytest.raises(ValueError, match="vocab_size"):
        tool.main([*convert, "--vocab-size", "999"])


def test_missing_files_raise(tmp_path):
    with pytest.raises(FileNotFoundError, match="config.json"):
        HFCheckpoint(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        HFCheckpoint(tmp_path)
    with pytest.raises(FileNotFoundError, match="config.yaml"):
        megatron_to_hf(tmp_path, tmp_path / "out")
    (tmp_path / "config.yaml").write_text("model: {}\n")
    with pytest.raises(FileNotFoundError, match="latest_checkpointed_iteration"):
        megatron_to_hf(tmp_path, tmp_path / "out")


def test_training_loop_loads_converted_checkpoint(tmp_path):
    """vepo_mcore.training.checkpointing.load_checkpoint reads a conversion as a weights-only checkpoint."""
    from vepo_mcore.checkpoint.convert import local_process_group
    from vepo_mcore.checkpoint.mapping import megatron_to_hf_tensors
    from vepo_mcore.config import JobConfig, load_config
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.parallel import init_model_parallel
    from vepo_mcore.training.checkpointing import load_checkpoint, save_checkpoint

    tiny_qwen2_hf(tmp_path / "hf", vocab_size=320, num_layers=2)
    hf_to_megatron(tmp_path / "hf", tmp_path / "mc")
    cfg = load_config(JobConfig, tmp_path / "mc" / "config.yaml")
    with local_process_group():
        init_model_parallel(cfg.parallel)
        model = build_model(cfg)
        state = load_checkpoint(tmp_path / "mc", model)
        loaded = {n: t.clone() for n, t in megatron_to_hf_tensors(model.state_dict(), cfg.model, 320)}
        save_checkpoint(tmp_path / "train", 5, model, config=cfg)
    assert state.iteration == 0 and state.path.endswith("iter_0000000")
    original = _tensors(tmp_path / "hf")
    assert sorted(loaded) == sorted(original)
    assert all(torch.equal(loaded[n], t) for n, t in original.items())
    # A training checkpoint exports too; without hf_config.json beside it the rows are the padded size.
    megatron_to_hf(tmp_path / "train", tmp_path / "exported")
    exported = _tensors(tmp_path / "exported")
    assert exported["lm_head.weight"].shape == (384, 64) and not exported["lm_head.weight"][320:].any()
    assert all(torch.equal(exported[n][: t.shape[0]], t) for n, t in original.items())
    from transformers import Qwen2ForCausalLM

    model = Qwen2ForCausalLM.from_pretrained(
        tmp_path / "exported"
    )  # config.json built from ModelConfig alone
    assert model.config.vocab_size == 384 and model.config.num_key_value_heads == 2
    # ... and reshards through the tool (a training checkpoint: iteration 5, its own key set), TP=2.
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "convert_hf", Path(__file__).resolve().parents[2] / REPO_TOOL
    )
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    tool.main(["reshard", "--ckpt", str(tmp_path / "train"), "--out", str(tmp_path / "tp2"), "--tp", "2"])
    resharded = load_config(JobConfig, tmp_path / "tp2" / "config.yaml")
    assert resharded.parallel.tensor_model_parallel_size == 2
    megatron_to_hf(tmp_path / "tp2", tmp_path / "exported_tp2")
    again = _tensors(tmp_path / "exported_tp2")
    from vepo_mcore.checkpoint.stream import read_metadata

    stored = read_metadata(tmp_path / "tp2" / "iter_0000000").state_dict_metadata
    assert tuple(stored["output_layer.weight"].size) == (512, 64)  # re-padded for TP=2
    assert again["lm_head.weight"].shape == (384, 64) and not again["lm_head.weight"][320:].any()
    assert all(torch.equal(again[n][: t.shape[0]], t) for n, t in original.items())
