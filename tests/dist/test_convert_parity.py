"""HF -> megatron at TP=2 / PP=2, loaded at several layouts: logits equal transformers' Qwen2ForCausalLM.

One module-scoped fixture converts two tiny random models (untied with qkv bias at TP=2; tied
without qkv bias at PP=2); one 2-process run then loads each checkpoint at TP=2, PP=2 and
TP=1 (resharding) and saves the logits. fp32 throughout.
"""

from __future__ import annotations

import pytest
import torch

from tests.support.checkpoints import megatron_logits_worker, tiny_qwen2_hf
from vepo_mcore.checkpoint.convert import hf_to_megatron, local_process_group, megatron_to_hf
from vepo_mcore.checkpoint.reshard import reshard_checkpoint
from vepo_mcore.parallel.launch import run_processes


def _plain_tensors(iter_dir) -> dict[str, torch.Tensor]:
    """Every global tensor of a dist checkpoint, unsharded (common.pt values left out)."""
    from megatron.core.dist_checkpointing import load_plain_tensors

    with local_process_group():
        loaded = load_plain_tensors(str(iter_dir))
    return {k: v for k, v in loaded.items() if isinstance(v, torch.Tensor)}


pytestmark = pytest.mark.dist

REAL_VOCAB = 300  # the HF checkpoints have 320 rows; ids >= 300 are padding
LAYOUTS = [(2, 1), (1, 2), (1, 1)]


def _convert_and_forward(rank, world_size, conversions, jobs, tokens, root):
    """One 2-process group does the conversions, a reshard and every forward (spawning is slow)."""
    for hf_dir, out_dir, tp, pp in conversions:
        hf_to_megatron(hf_dir, out_dir, tp=tp, pp=pp, vocab_size=REAL_VOCAB)
        _megatron_save(hf_dir, f"{out_dir}_megatron_save", tp, pp)
    reshard_checkpoint(root / "untied_bias_tp2", root / "resharded_pp2", tp=1, pp=2)
    for ckpt, out_file, tp, pp in jobs:
        megatron_logits_worker(rank, world_size, ckpt, tokens, out_file, tp, pp)
    _hf_tensors_from_live_tp2_model(rank, root)


def _megatron_save(hf_dir, out_dir, tp, pp):
    """The conversion before streaming: build this rank's model, fill it from HF, megatron's save."""
    from vepo_mcore.checkpoint.convert import (
        load_hf_into_model,
        plan_hf_to_megatron,
        save_megatron_checkpoint,
        weights_only_common,
    )
    from vepo_mcore.checkpoint.hf import HFCheckpoint
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.parallel import init_model_parallel

    cfg, _ = plan_hf_to_megatron(hf_dir, tp, pp, REAL_VOCAB)
    init_model_parallel(cfg.parallel)
    model = build_model(cfg, init_weights=False)
    load_hf_into_model(model, HFCheckpoint(hf_dir), cfg)
    save_megatron_checkpoint(model, out_dir, common=weights_only_common(cfg))


def _hf_tensors_from_live_tp2_model(rank, root):
    """The weight-sync path: gather a TP=2 model's shards and map them to HF names."""
    from vepo_mcore.checkpoint.convert import load_megatron_checkpoint
    from vepo_mcore.checkpoint.mapping import megatron_to_hf_tensors
    from vepo_mcore.config import JobConfig, ParallelConfig, load_config
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.parallel import init_model_parallel
    from vepo_mcore.rollout.weight_sync import full_megatron_tensors

    cfg = load_config(JobConfig, root / "untied_bias_tp2" / "config.yaml")
    cfg.parallel = ParallelConfig(tensor_model_parallel_size=2)
    init_model_parallel(cfg.parallel)
    model = build_model(cfg)
    load_megatron_checkpoint(model, root / "untied_bias_tp2")
    hf = {n: t.clone() for n, t in megatron_to_hf_tensors(full_megatron_tensors(model, cfg), cfg.model, 320)}
    if rank == 0:
        torch.save(hf, root / "live_tp2_hf.pt")


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("convert")
    tokens = torch.randint(0, REAL_VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    models = {
        "untied_bias_tp2": (dict(tie=False, qkv_bias=True, seed=1), 2, 1),
        "tied_nobias_pp2": (dict(tie=True, qkv_bias=False, seed=2), 1, 2),
    }
    reference, conversions, jobs = {}, [], []
    for name, (kwargs, tp, pp) in models.items():
        model = tiny_qwen2_hf(root / f"hf_{name}", **kwargs)
        with torch.no_grad():
            reference[name] = model(tokens).logits[..., :REAL_VOCAB]
        conversions.append((str(root / f"hf_{name}"), str(root / name), tp, pp))
        for ltp, lpp in LAYOUTS:
            jobs.append((str(root / name), str(root / f"{name}_tp{ltp}pp{lpp}.pt"), ltp, lpp))
    jobs.append((str(root / "resharded_pp2"), str(root / "resharded_pp2_tp2pp1.pt"), 2, 1))
    run_processes(_convert_and_forward, 2, args=(conversions, jobs, tokens, root))
    return root, reference


@pytest.mark.parametrize("name", ["untied_bias_tp2", "tied_nobias_pp2"])
@pytest.mark.parametrize("tp,pp", LAYOUTS)
def test_megatron_logits_match_transformers(converted, name, tp, pp):
    root, reference = converted
    logits = torch.load(root / f"{name}_tp{tp}pp{pp}.pt")
    assert logits.shape[-1] == {1: 384, 2: 512}[tp]  # 300 ids padded to a multiple of 128 * TP
    diff = (logits[..., :REAL_VOCAB] - reference[name]).abs().max().item()
    assert diff <= 1e-4, f"{name} at TP={tp} PP={pp}: max |logits - transformers| = {diff}"


def test_resharded_checkpoint_matches_original(converted):
    """TP=2 checkpoint rewritten at PP=2: same global tensors, config records the layout, same logits."""
    from vepo_mcore.config import JobConfig, load_config

    root, reference = converted
    original = _plain_tensors(root / "untied_bias_tp2" / "iter_0000000")
    resharded = _plain_tensors(root / "resharded_pp2" / "iter_0000000")
    assert sorted(original) == sorted(resharded)
    for key, tensor in original.items():
        rows = resharded[key].shape[0] if ("word_embeddings" in key or "output_layer" in key) else None
        assert torch.equal(tensor[:rows], resharded[key]), key
    cfg = load_config(JobConfig, root / "resharded_pp2" / "config.yaml")
    assert (cfg.parallel.tensor_model_parallel_size, cfg.parallel.pipeline_model_parallel_size) == (1, 2)
    logits = torch.load(root / "resharded_pp2_tp2pp1.pt")
    assert (logits[..., :REAL_VOCAB] - reference["untied_bias_tp2"]).abs().max().item() <= 1e-4


def test_live_tp2_model_maps_to_original_hf_tensors(converted):
    from vepo_mcore.checkpoint.hf import HFCheckpoint

    root, _ = converted
    live = torch.load(root / "live_tp2_hf.pt")
    reader = HFCheckpoint(root / "hf_untied_bias_tp2")
    assert sorted(live) == sorted(reader.names())
    for name, tensor in live.items():
        expected = reader.get(name)
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            expected[REAL_VOCAB:] = 0
        assert torch.equal(tensor, expected), name


def test_tp2_to_hf_to_tp1_equals_original_gathered(converted):
    """Megatron TP=2 -> HF -> Megatron TP=1: every global tensor equals the TP=2 checkpoint's."""
    root, _ = converted
    megatron_to_hf(root / "untied_bias_tp2", root / "hf_back")
    hf_to_megatron(root / "hf_back", root / "again_tp1", tp=1, pp=1, vocab_size=REAL_VOCAB)
    original = _plain_tensors(root / "untied_bias_tp2" / "iter_0000000")
    again = _plain_tensors(root / "again_tp1" / "iter_0000000")
    assert sorted(original) == sorted(again)
    for key, tensor in original.items():
        if "word_embeddings" in key or "output_layer" in key:
            assert tensor.shape[0] == 512 and again[key].shape[0] == 384  # padded at TP=2 vs TP=1
            assert torch.equal(tensor[:384], again[key]) and not tensor[REAL_VOCAB:].any(), key
        else:
            assert torch.equal(tensor, again[key]), key


def test_tied_pp2_checkpoint_exports_to_transformers(converted):
    """PP=2, tied, no qkv bias -> HF: transformers loads it and reproduces the source logits."""
    from transformers import Qwen2ForCausalLM

    root, reference = converted
    megatron_to_hf(root / "tied_nobias_pp2", root / "hf_tied_back")
    model = Qwen2ForCausalLM.from_pretrained(root / "hf_tied_back").eval()
    assert model.config.tie_word_embeddings and model.config.vocab_size == 320
    assert not model.model.layers[0].self_attn.q_proj.bias.any()
    tokens = torch.randint(0, REAL_VOCAB, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(tokens).logits[..., :REAL_VOCAB]
    assert (logits - reference["tied_nobias_pp2"]).abs().max().item() <= 1e-5


@pytest.mark.parametrize("name", ["untied_bias_tp2", "tied_nobias_pp2"])
def test_streamed_conversion_equals_megatron_save(converted, name):
    """hf_to_megatron (no model built, chunk by chunk) writes what megatron's save of the built
    TP=2 / PP=2 model writes: the same keys, chunks and dtypes, and equal tensors."""
    from vepo_mcore.checkpoint import stream

    root, _ = converted

    def layout(path):
        out = {}
        for key, md in stream.read_metadata(path).state_dict_metadata.items():
            chunks = sorted((tuple(c.offsets), tuple(c.sizes)) for c in getattr(md, "chunks", []))
            out[key] = (
                tuple(getattr(md, "size", ())),
                getattr(getattr(md, "properties", None), "dtype", None),
                chunks,
            )
        return out

    streamed, reference = root / name / "iter_0000000", root / f"{name}_megatron_save"
    assert layout(streamed) == layout(reference)
    before, after = _plain_tensors(reference), _plain_tensors(streamed)
    assert sorted(before) == sorted(after)
    for key, tensor in before.items():
        assert after[key].dtype == tensor.dtype and torch.equal(after[key], tensor), key
