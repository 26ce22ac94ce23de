"""Embedding resize of Megatron checkpoints (SPEC section 1) on a tiny model with the real Qwen2.5
vocabulary: TP=2 equals TP=1 gathered, PP=2 equals PP=1, original-vocab logits unchanged, new rows
= mean of pieces (untied at TP=2, tied at PP=2), config and tokenizer follow."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.dist.model_utils import positions, tiny_cfg
from vepo_mcore.languages import default_tokenizer_dir, flores_path, load_flores
from vepo_mcore.parallel.launch import run_processes
from vepo_mcore.tokenizer.expand import expand_tokenizer
from vepo_mcore.tokenizer.tokenizer import Tokenizer, load_tokenizer

BASE = 151_665


@pytest.fixture(scope="module")
def expanded(tmp_path_factory):
    """~20 Thai tokens learned on 100 FLORES dev lines: enough new ids, built in under a second."""
    out = tmp_path_factory.mktemp("tok")
    corpora = {"th": [flores_path("th", "dev")]}
    expand_tokenizer(default_tokenizer_dir(), corpora, n_tokens=20, max_lines=100, protect=()).save(out)
    return str(out)


def _cfg(tp=1, pp=1, tied=False):
    cfg = tiny_cfg(tp=tp, pp=pp, num_layers=2, tie_word_embeddings=tied)
    cfg.model.vocab_size = BASE  # divisible_by 64: 151,680 rows at TP=1 and 2; 151,744 / 151,808 after
    return cfg


def _tensors(path, num_layers=2):
    from vepo_mcore.checkpoint.convert import checkpoint_tensors

    return {name: t.double() for name, t in checkpoint_tensors(path, num_layers)}


def _logits(cfg, load, tokens):
    from tests.dist.model_utils import gather_logits
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.parallel import init_model_parallel
    from vepo_mcore.training.checkpointing import load_checkpoint

    init_model_parallel(cfg.parallel, seed=99)  # a different init: everything must come from the load
    model = build_model(cfg)
    load_checkpoint(load, model, finetune=True)
    with torch.no_grad():
        return gather_logits(model(tokens, positions(tokens), None)).double()


def _check_logits(tmp, orig, resized, new_cfg, old_cfg, sources):
    from vepo_mcore.training.checkpointing import checkpoint_config

    saved_cfg, _ = checkpoint_config(f"{tmp}/{resized}")
    assert saved_cfg.model.vocab_size == new_cfg.model.vocab_size
    text = " ".join(load_flores("en", "devtest")[:2])
    tokens = torch.tensor([load_tokenizer().encode(text)[:48]])  # no new tokens: English is invariant
    old = _logits(old_cfg, f"{tmp}/{orig}", tokens)
    new = _logits(new_cfg, f"{tmp}/{resized}", tokens)
    diff = (new[..., :BASE] - old[..., :BASE]).abs().max().item()
    assert diff <= 1e-5, f"original-vocab logits moved by {diff} after the resize"
    # The output layer is linear: a new row that is the mean of its pieces' rows gives the mean logit.
    for new_id, pieces in sources.items():
        torch.testing.assert_close(new[..., new_id], old[..., pieces].mean(-1), rtol=0, atol=1e-5)
    padded_logits = new[..., new_cfg.model.vocab_size :]
    assert padded_logits.numel() > 0 and padded_logits.abs().max() == 0  # zero rows, zero logits


def _reference_pieces(base, expanded, new_id, sources):
    """SPEC: the base encoding of the decoded token; a token ending inside a UTF-8 character decodes
    to U+FFFD, and there the pieces are the base tokens spelling its bytes (checked in the unit tests)."""
    text = expanded.decode([new_id])
    return sources[new_id] if "\ufffd" in text else base.encode(text)


def _worker(rank, world, tmp, expanded):
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.parallel import init_model_parallel
    from vepo_mcore.tokenizer.embedding_rows import new_row_sources
    from vepo_mcore.checkpoint.resize import resize_megatron_checkpoint
    from vepo_mcore.training.checkpointing import save_checkpoint

    for tied in (False, True):  # originals at TP=1 (DP=2), random weights incl. padding rows
        cfg = _cfg(tied=tied)
        init_model_parallel(cfg.parallel, seed=3 + tied)
        save_checkpoint(
            f"{tmp}/orig_{tied}", 0, build_model(cfg), config=cfg, tokenizer_dir=default_tokenizer_dir()
        )

    if rank == 0:  # a converted checkpoint's HF config: export must see the new row count
        Path(f"{tmp}/orig_False/hf_config.json").write_text('{"vocab_size": 152064, "rope_theta": 5.0}')
    torch.distributed.barrier()
    resize_megatron_checkpoint(f"{tmp}/orig_False", f"{tmp}/tp1", expanded)
    resize_megatron_checkpoint(
        f"{tmp}/orig_False", f"{tmp}/tp2", expanded, overrides=["--parallel.tensor_model_parallel_size=2"]
    )
    resize_megatron_checkpoint(
        f"{tmp}/orig_False", f"{tmp}/pp2", expanded, overrides=["--parallel.pipeline_model_parallel_size=2"]
    )
    resize_megatron_checkpoint(
        f"{tmp}/orig_True",
        f"{tmp}/tied_pp2",
        expanded,
        overrides=["--parallel.pipeline_model_parallel_size=2"],
    )
    new_vocab = Tokenizer(expanded).vocab_size
    sources = new_row_sources(load_tokenizer(), Tokenizer(expanded))

    # Logits at TP=2 (untied) and TP=1 (the tied checkpoint written at PP=2, loaded at PP=1).
    new_cfg = _cfg(tp=2)
    new_cfg.model.vocab_size = new_vocab
    _check_logits(tmp, "orig_False", "tp2", new_cfg, _cfg(tp=2), sources)
    new_cfg = _cfg(tied=True)
    new_cfg.model.vocab_size = new_vocab
    _check_logits(tmp, "orig_True", "tied_pp2", new_cfg, _cfg(tied=True), sources)

    # Tensors: TP=2 == TP=1 gathered; new rows = float64 mean of the base encoding's rows.
    orig, tp1, tp2 = _tensors(f"{tmp}/orig_False"), _tensors(f"{tmp}/tp1"), _tensors(f"{tmp}/tp2")
    assert set(tp1) == set(tp2) == set(orig) and "output_layer.weight" in tp2
    pp2 = _tensors(f"{tmp}/pp2")  # untied at PP=2: embedding on stage 0, output layer on stage 1
    assert set(pp2) == set(tp1) and all(torch.equal(pp2[name], tp1[name]) for name in tp1)
    base, exp = load_tokenizer(), Tokenizer(expanded)
    for name in orig:
        if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
            assert tp1[name].shape[0] == 151_744 and tp2[name].shape[0] == 151_808
            assert torch.equal(tp1[name][:new_vocab], tp2[name][:new_vocab]), name
            assert tp1[name][new_vocab:].abs().sum() == 0 and tp2[name][new_vocab:].abs().sum() == 0
            assert torch.equal(tp2[name][:BASE], orig[name][:BASE]), name
            for new_id in range(BASE, new_vocab):
                pieces = _reference_pieces(base, exp, new_id, sources)
                torch.testing.assert_close(tp2[name][new_id], orig[name][pieces].mean(0), rtol=0, atol=1e-6)
        else:
            assert torch.equal(tp1[name], orig[name]) and torch.equal(tp2[name], orig[name]), name
    orig, tied = _tensors(f"{tmp}/orig_True"), _tensors(f"{tmp}/tied_pp2")
    assert "output_layer.weight" not in tied and set(tied) == set(orig)
    emb = "embedding.word_embeddings.weight"
    assert tied[emb].shape[0] == 151_744 and tied[emb][new_vocab:].abs().sum() == 0
    assert torch.equal(tied[emb][:BASE], orig[emb][:BASE])
    for new_id, pieces in sources.items():
        torch.testing.assert_close(tied[emb][new_id], orig[emb][pieces].mean(0), rtol=0, atol=1e-6)


@pytest.mark.dist
def test_resize_megatron_tp_pp(tmp_path, expanded):
    run_processes(_worker, 2, args=(str(tmp_path), expanded))
    from vepo_mcore.config import JobConfig, load_config

    hf_config = json.loads((tmp_path / "tp2" / "hf_config.json").read_text())
    assert hf_config == {"vocab_size": 151_744, "rope_theta": 5.0}  # padded at TP=1 (divisible by 64)
    assert not (tmp_path / "tied_pp2" / "hf_config.json").exists()
    for name in ("tp1", "tp2", "pp2", "tied_pp2"):
        cfg = load_config(JobConfig, tmp_path / name / "iter_0000000" / "config.yaml")
        assert cfg.model.vocab_size == Tokenizer(expanded).vocab_size
        assert cfg.tokenizer.path == expanded
        for where in (tmp_path / name, tmp_path / name / "iter_0000000"):
            copied = (where / "tokenizer" / "tokenizer.json").read_bytes()
            assert copied == (Path(expanded) / "tokenizer.json").read_bytes()
            assert (where / "tokenizer" / "expansion_manifest.json").is_file()
