"""Embedding resize of HF Qwen2 directories through tools/resize_embeddings.py: transformers loads the
result, original-vocab logits are unchanged, new rows (embed_tokens and lm_head, tied and untied)
are the mean of their pieces' rows, padding rows are zero."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
import torch

from tests.support.checkpoints import tiny_qwen2_hf
from vepo_mcore.languages import default_tokenizer_dir, flores_path, load_flores
from vepo_mcore.models.vocab import padded_vocab_size
from vepo_mcore.tokenizer.expand import expand_tokenizer
from vepo_mcore.tokenizer.tokenizer import Tokenizer, load_tokenizer

BASE = 151_665
TOOL = Path(__file__).resolve().parents[2] / "tools" / "resize_embeddings.py"


@pytest.fixture(scope="module")
def expanded(tmp_path_factory):
    """~20 Thai tokens learned on 100 FLORES dev lines (under a second)."""
    out = tmp_path_factory.mktemp("tok")
    corpora = {"th": [flores_path("th", "dev")]}
    expand_tokenizer(default_tokenizer_dir(), corpora, n_tokens=20, max_lines=100, protect=()).save(out)
    return out


def _tool():
    spec = importlib.util.spec_from_file_location("resize_embeddings", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


@pytest.mark.parametrize("tie", [False, True])
def test_hf_resize_keeps_logits_and_means_pieces(tmp_path, expanded, tie):
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    original = tiny_qwen2_hf(tmp_path / "hf", tie=tie, vocab_size=152_064, num_layers=2).eval()
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt"):
        (tmp_path / "hf" / name).write_text("stale")  # must never reach the output...
    shutil.copyfile(
        default_tokenizer_dir() / "tokenizer.json", tmp_path / "hf" / "tokenizer.json"
    )  # ...but this
    _tool().main(
        ["--hf-in", str(tmp_path / "hf"), "--hf-out", str(tmp_path / "out"), "--tokenizer", str(expanded)]
    )

    exp = Tokenizer(expanded)
    new_vocab, rows = exp.vocab_size, padded_vocab_size(exp.vocab_size, 128, 1)
    assert new_vocab > BASE + 10 and rows == 151_808
    resized = Qwen2ForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    assert resized.config.vocab_size == rows and resized.config.tie_word_embeddings == tie
    assert not (tmp_path / "out" / "vocab.json").exists() and not (tmp_path / "out" / "merges.txt").exists()
    assert len(AutoTokenizer.from_pretrained(tmp_path / "out")) == new_vocab

    base = load_tokenizer()
    tokens = torch.tensor([base.encode(" ".join(load_flores("en", "devtest")[:2]))[:48]])
    with torch.no_grad():
        old_logits = original(tokens).logits.double()
        new_logits = resized(tokens).logits.double()
    diff = (new_logits[..., :BASE] - old_logits[..., :BASE]).abs().max().item()
    assert diff <= 1e-5, f"original-vocab logits moved by {diff}"
    assert new_logits[..., new_vocab:].abs().max() == 0

    old_in = original.get_input_embeddings().weight.double()
    old_out = original.get_output_embeddings().weight.double()
    new_in = resized.get_input_embeddings().weight.double()
    new_out = resized.get_output_embeddings().weight.double()
    assert torch.equal(new_in[:BASE], old_in[:BASE]) and torch.equal(new_out[:BASE], old_out[:BASE])
    assert new_in[new_vocab:].abs().sum() == 0 and new_out[new_vocab:].abs().sum() == 0
    checked = 0
    for new_id in range(BASE, new_vocab):
        text = exp.decode([new_id])
        if "\ufffd" in text:  # ends inside a UTF-8 character: the unit tests cover its byte pieces
            continue
        pieces = base.encode(text)
        torch.testing.assert_close(new_in[new_id], old_in[pieces].mean(0), rtol=0, atol=1e-6)
        torch.testing.assert_close(new_out[new_id], old_out[pieces].mean(0), rtol=0, atol=1e-6)
        torch.testing.assert_close(
            new_logits[..., new_id], old_logits[..., pieces].mean(-1), rtol=0, atol=1e-5
        )
        checked += 1
    assert checked >= 10


def test_hf_resize_rejects_a_model_of_another_tokenizer(tmp_path, expanded):
    tiny_qwen2_hf(tmp_path / "hf", vocab_size=320, num_layers=1)  # refused before any tensor is read
    shutil.copyfile(expanded / "tokenizer.json", tmp_path / "hf" / "tokenizer.json")  # already expanded
    with pytest.raises(ValueError, match="base tokenizer"):
        _tool().main(
            ["--hf-in", str(tmp_path / "hf"), "--hf-out", str(tmp_path / "out"), "--tokenizer", str(expanded)]
        )


def test_cli_needs_one_of_the_two_paths(expanded):
    with pytest.raises(SystemExit):
        _tool().main(["--hf-in", "a", "--megatron-save", "b", "--tokenizer", str(expanded)])
    with pytest.raises(SystemExit):
        _tool().main(["--hf-in", "a", "--hf-out", "b", "--tokenizer", str(expanded), "--parallel.x=1"])
