"""Refusals of the Megatron embedding resize that need no process group: a checkpoint whose
model.vocab_size is not the base tokenizer's length, a missing checkpoint, a missing tokenizer."""

from __future__ import annotations

import pytest

from vepo_mcore.checkpoint.resize import plan_resize, resize_megatron_checkpoint
from vepo_mcore.config import JobConfig, save_config
from vepo_mcore.languages import default_tokenizer_dir


def _fake_checkpoint(root, vocab_size):
    """config.yaml and the `latest` pointer: all the resize reads before touching tensors."""
    cfg = JobConfig()
    cfg.model.vocab_size = vocab_size
    (root / "iter_0000000").mkdir(parents=True)
    save_config(cfg, root / "iter_0000000" / "config.yaml")
    (root / "iter_0000000" / "metadata.json").write_text("{}")
    (root / "latest_checkpointed_iteration.txt").write_text("0")
    return root


def test_refuses_a_model_of_another_vocab(tmp_path):
    ckpt = _fake_checkpoint(tmp_path / "ckpt", 151_680)
    with pytest.raises(
        ValueError, match=r"config.yaml: the model's vocab size is 151680 but the base tokenizer"
    ):
        resize_megatron_checkpoint(ckpt, tmp_path / "out", default_tokenizer_dir())
    assert not (tmp_path / "out").exists()


def test_refuses_a_directory_without_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match="holds no checkpoint"):
        resize_megatron_checkpoint(tmp_path, tmp_path / "out", default_tokenizer_dir())


def test_refuses_a_missing_expanded_tokenizer(tmp_path):
    with pytest.raises(Exception, match="tokenizer.json|No such file"):
        plan_resize(default_tokenizer_dir(), tmp_path / "nothing", 151_665, "x")


def test_identity_expansion_adds_no_rows():
    plan = plan_resize(default_tokenizer_dir(), default_tokenizer_dir(), 151_665, "x")
    assert (plan.base_vocab, plan.new_vocab, plan.sources) == (151_665, 151_665, {})
