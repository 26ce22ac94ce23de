"""A tiny reward model trained on CPU with the shared train_step beats chance on held-out FLORES
devtest pairs; its checkpoint serves the registered reward `rm` (R_mt) with the same scores; a
policy checkpoint initialises its trunk."""

from __future__ import annotations

import pytest
import torch

from vepo_mcore.parallel.launch import run_processes

CATS = ("explanation", "intent")
LANGS = ("en", "th", "vi", "zh")


def tiny_rm_cfg(vocab: int, tmp: str):
    from vepo_mcore.config import JobConfig

    cfg = JobConfig()
    m = cfg.model
    m.num_layers, m.hidden_size, m.ffn_hidden_size = 2, 64, 128
    m.num_attention_heads, m.num_query_groups = 4, 2
    m.vocab_size, m.make_vocab_size_divisible_by, m.transformer_impl = vocab, 128, "local"
    t = cfg.training
    # Sequences keep their last 48 tokens: the response end, where these two categories show.
    t.seq_length, t.micro_batch_size, t.global_batch_size, t.train_iters = 48, 8, 8, 30
    t.optimizer.lr, t.optimizer.min_lr, t.scheduler.warmup_iters = 2e-3, 0.0, 3
    t.checkpoint.save = f"{tmp}/rm"
    return cfg


def _train_and_serve(rank, world, tmp):
    from vepo_mcore.config.rewards import RewardsConfig
    from vepo_mcore.rewards.mt import mt_reward
    from vepo_mcore.rewards.rlvr import rlvr_reward
    from vepo_mcore.rm import reward as rm_term
    from vepo_mcore.rm.data import build_pairs
    from vepo_mcore.rm.evaluate import evaluate_pairs
    from vepo_mcore.rm.model import load_reward_model, score_texts
    from vepo_mcore.rm.train import train_rm
    from vepo_mcore.tokenizer import load_tokenizer
    from vepo_mcore.translation.sample import Sample

    tok = load_tokenizer()
    cfg = tiny_rm_cfg(len(tok), tmp)
    train = build_pairs("dev", LANGS, range(60), CATS, seed=0, tokenizer=tok)
    test = build_pairs("devtest", LANGS, range(15), CATS, seed=1, tokenizer=tok)

    torch.manual_seed(0)
    cfg.training.eval_interval, cfg.training.eval_iters = 15, 2
    history = train_rm(cfg, train, tok, valid_pairs=test)
    losses = [h["train/loss"] for h in history]
    assert losses[-1] < losses[0] - 0.3, [round(v, 3) for v in losses]
    held_out = [h["valid/pair_acc"] for h in history if "valid/pair_acc" in h]  # held-out pairs, steps 15, 30
    assert len(held_out) == 2 and held_out[-1] > 0.7, held_out
    model = load_reward_model(f"{tmp}/rm")[0]  # the saved checkpoint, as tools/train_rm.py evaluates it
    result = evaluate_pairs(model, tok, test, cfg.training.seq_length)
    # An untrained or gradient-broken RM sits near 0.5; these categories are learnt in ~20 steps.
    assert result.accuracy > 0.8, result
    assert result.by_category["explanation"][0] > 0.7 and result.by_category["intent"][0] > 0.7, result
    # The category head learnt too: it flags explanations on corrupted rows more than on references.
    _, p_clean = score_texts(model, tok, [p.prompt for p in test], [p.better for p in test], 48)
    _, p_bad = score_texts(model, tok, [p.prompt for p in test], [p.worse for p in test], 48)
    k = 8  # CATEGORIES.index("explanation")
    assert p_bad[:, k].mean() > p_clean[:, k].mean() + 0.1, (p_bad[:, k].mean(), p_clean[:, k].mean())

    # The registered reward, through R_mt, loads the saved checkpoint and gives the same scores.
    rm_term.clear_cache()
    pairs = test[:6]
    samples = [Sample(prompt=p.prompt, response=r) for p in pairs for r in (p.better, p.worse)]
    got = mt_reward(samples, RewardsConfig(mt="rm", rm_checkpoint=f"{tmp}/rm"))
    want, _ = score_texts(model, tok, [s.prompt for s in samples], [s.response for s in samples], 48)
    assert torch.allclose(torch.tensor(got.values), want, atol=1e-5), (got.values, want)
    # Combined with the RLVR terms: R_mt is the RM score, the verifiable terms are added beside it.
    rich = [
        Sample(prompt=p.prompt, response=p.worse, source=p.source, src_lang=p.src_lang, tgt_lang=p.tgt_lang)
        for p in pairs
    ]
    rlvr_reward(rich, RewardsConfig(mt="rm", rm_checkpoint=f"{tmp}/rm", normalize=False))
    want_worse = want[1::2]
    for s, score in zip(rich, want_worse.tolist()):
        assert abs(s.reward_terms["mt"] - score) < 1e-5 and {"lid", "length", "mixing"} <= set(s.reward_terms)
        others = sum(
            w * max(-5.0, min(5.0, s.reward_terms[k]))
            for k, w in RewardsConfig().weights.items()
            if k != "mt"
        )
        assert abs(s.reward_terms["total"] - (max(-5.0, min(5.0, score)) + others)) < 1e-5
    # A sample with only source + languages gets the translation prompt built for it.
    bare = Sample(source="Hello.", response="สวัสดี", src_lang="en", tgt_lang="th")
    assert len(mt_reward([bare], RewardsConfig(mt="rm", rm_checkpoint=f"{tmp}/rm")).values) == 1
    rm_term.clear_cache()


def test_tiny_rm_learns_and_serves_as_reward(tmp_path):
    run_processes(_train_and_serve, 1, args=(str(tmp_path),))


def _policy_init(rank, world, tmp):
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.parallel import init_model_parallel
    from vepo_mcore.rm.model import build_reward_model, load_policy_weights
    from vepo_mcore.rm.train import rm_model_provider
    from vepo_mcore.training.checkpointing import save_checkpoint

    cfg = tiny_rm_cfg(1000, tmp)
    cfg.model.num_layers = 1
    init_model_parallel(cfg.parallel, seed=3)
    policy = build_model(cfg)
    save_checkpoint(f"{tmp}/policy", 5, policy)
    torch.manual_seed(11)
    rm = build_reward_model(cfg)
    head = rm.output_layer.weight.detach().clone()
    fresh = rm.decoder.layers[0].mlp.linear_fc1.weight.detach().clone()
    left = load_policy_weights(rm, f"{tmp}/policy")
    assert set(left) == {"output_layer.weight", "output_layer.bias"}, left
    policy_sd = policy.state_dict()
    for name, value in rm.state_dict().items():
        if name.startswith("output_layer.") or name.endswith("_extra_state"):
            continue
        assert torch.equal(value, policy_sd[name]), name
    assert not torch.equal(rm.decoder.layers[0].mlp.linear_fc1.weight, fresh)
    assert torch.equal(rm.output_layer.weight, head)

    # The training loop's model provider starts from rm.init_from on a fresh run...
    cfg.rm.init_from = f"{tmp}/policy"
    trunk = "decoder.layers.0.mlp.linear_fc1.weight"
    assert torch.equal(rm_model_provider(cfg).state_dict()[trunk], policy_sd[trunk])
    # ...but not when the run resumes its own checkpoint (which the loop then loads).
    save_checkpoint(cfg.training.checkpoint.save, 1, build_reward_model(cfg))
    assert not torch.equal(rm_model_provider(cfg).state_dict()[trunk], policy_sd[trunk])
    cfg.rm.init_from = f"{tmp}/nowhere"
    cfg.training.checkpoint.save = None
    with pytest.raises(FileNotFoundError, match="nowhere"):
        rm_model_provider(cfg)


def test_rm_trunk_initialises_from_policy_checkpoint(tmp_path):
    run_processes(_policy_init, 1, args=(str(tmp_path),))


def _resume(rank, world, tmp):
    from vepo_mcore.rm.data import build_pairs
    from vepo_mcore.rm.train import train_rm
    from vepo_mcore.tokenizer import load_tokenizer

    tok = load_tokenizer()
    pairs = build_pairs("dev", ("lo", "fil"), range(6), ("accuracy", "format", "leakage"), tokenizer=tok)

    def run(save, iters):
        cfg = tiny_rm_cfg(len(tok), tmp)
        cfg.training.train_iters, cfg.training.checkpoint.save = iters, f"{tmp}/{save}"
        cfg.training.micro_batch_size, cfg.training.global_batch_size = 2, 4
        return {h["step"]: h for h in train_rm(cfg, pairs, tok)}

    straight = run("straight", 4)
    first, resumed = run("split", 2), run("split", 4)
    assert sorted(first) == [1, 2] and sorted(resumed) == [3, 4]  # the relaunch continued at step 3
    for step in (3, 4):
        for key in ("train/loss", "train/bce_loss", "train/grad_norm"):
            assert resumed[step][key] == straight[step][key], (step, key)


def test_train_rm_resumes_exactly(tmp_path):
    run_processes(_resume, 1, args=(str(tmp_path),))


def _tool(rank, world, tmp):
    import json
    from pathlib import Path

    from tools.train_rm import main

    summary = main(
        [
            "--rm.train_lines", "2", "--rm.test_lines", "1", "--rm.langs", "[th, en]",
            "--rm.categories", "[fluency, leakage]", "--rm.report_dir", f"{tmp}/report",
            "--model.num_layers", "1", "--model.hidden_size", "32",
            "--model.ffn_hidden_size", "64", "--model.num_attention_heads", "2", "--model.num_query_groups", "1",
            "--model.transformer_impl", "local", "--training.seq_length", "32", "--training.micro_batch_size", "2",
            "--training.global_batch_size", "4", "--training.train_iters", "2",
            "--training.checkpoint.save", f"{tmp}/ckpt",
        ]
    )  # fmt: skip
    table = Path(f"{tmp}/report/eval.md").read_text()
    assert "| fluency |" in table and "| th |" in table and "| en |" in table
    saved = json.loads(Path(f"{tmp}/report/eval.json").read_text())
    assert saved["pairs"] == summary["pairs"] == 4 and saved["train_pairs"] == 8
    assert (Path(tmp) / "ckpt" / "iter_0000002" / "config.yaml").is_file()
    assert (Path(tmp) / "report" / "curves.png").stat().st_size > 1000
    with pytest.raises(ValueError, match="rm.categories: unknown"):
        main(["--rm.categories", "[grammar]", "--training.checkpoint.save", f"{tmp}/x"])


def test_train_rm_tool_writes_tables_and_checkpoint(tmp_path):
    run_processes(_tool, 1, args=(str(tmp_path),))


def _sequence_parallel_config(rank, world, tmp):
    import copy

    from vepo_mcore.languages import default_tokenizer_dir
    from vepo_mcore.parallel import destroy, init_model_parallel
    from vepo_mcore.rm.model import build_reward_model, load_reward_model
    from vepo_mcore.training.checkpointing import save_checkpoint

    cfg = tiny_rm_cfg(1000, tmp)
    init_model_parallel(cfg.parallel, seed=3)
    # The config a TP=2 GPU run with sequence parallelism saves (torch_dist tensors do not depend on
    # the layout they were saved from).
    saved = copy.deepcopy(cfg)
    saved.parallel.tensor_model_parallel_size, saved.parallel.sequence_parallel = 2, True
    save_checkpoint(
        f"{tmp}/rm", 1, build_reward_model(cfg), config=saved, tokenizer_dir=default_tokenizer_dir()
    )
    destroy()
    model, loaded_cfg, _ = load_reward_model(f"{tmp}/rm")  # served at TP=1: sequence parallelism is dropped
    assert loaded_cfg.parallel.tensor_model_parallel_size == 1 and not loaded_cfg.parallel.sequence_parallel
    assert not model.config.sequence_parallel


def test_rm_saved_with_sequence_parallelism_loads_at_tp1(tmp_path):
    run_processes(_sequence_parallel_config, 1, args=(str(tmp_path),))
