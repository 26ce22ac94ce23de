"""RM scores and category probabilities are the same under TP=1 and TP=2 (weights moved through
dist_checkpointing), on real ChatML-encoded FLORES pairs of varied lengths (padding included)."""

from __future__ import annotations

import pytest
import torch

from tests.dist.model_utils import load_model, save_model, tiny_cfg
from vepo_mcore.parallel.launch import run_processes


def _rm(tp: int, vocab: int, seed: int):
    from vepo_mcore.parallel import init_model_parallel
    from vepo_mcore.rm.model import build_reward_model

    cfg = tiny_cfg(tp=tp, num_layers=2)
    cfg.model.vocab_size = vocab
    cfg.model.transformer_impl = "local"
    init_model_parallel(cfg.parallel, seed=seed)
    return build_reward_model(cfg).eval()


def _tp_scores(rank, world, tmp):
    from vepo_mcore.rm.data import build_pairs
    from vepo_mcore.rm.model import score_texts
    from vepo_mcore.tokenizer import load_tokenizer

    tok = load_tokenizer()
    pairs = build_pairs(
        "devtest", ("th", "en", "my"), range(2), ("accuracy", "leakage"), seed=2, tokenizer=tok
    )
    prompts, responses = [p.prompt for p in pairs] * 2, [p.better for p in pairs] + [p.worse for p in pairs]

    ref_model = _rm(1, len(tok), seed=1)
    torch.nn.init.normal_(ref_model.output_layer.weight, std=0.5)  # scores far from 0, so a mismatch shows
    save_model(ref_model, f"{tmp}/tp1")
    ref_scores, ref_probs = score_texts(ref_model, tok, prompts, responses, seq_length=96, batch_size=5)

    model = _rm(2, len(tok), seed=7)
    load_model(model, f"{tmp}/tp1")
    scores, probs = score_texts(model, tok, prompts, responses, seq_length=96, batch_size=5)
    assert ref_scores.abs().max() > 0.1
    assert torch.allclose(scores, ref_scores, atol=1e-5, rtol=0), (scores - ref_scores).abs().max()
    assert torch.allclose(probs, ref_probs, atol=1e-5, rtol=0)

    # The registered reward loads a TP=1 RM checkpoint into this TP=2 layout (every rank scores).
    from vepo_mcore.config.rewards import RewardsConfig
    from vepo_mcore.rm import reward as rm_term
    from vepo_mcore.rewards.registry import run_reward
    from vepo_mcore.translation.sample import Sample
    from vepo_mcore.training.checkpointing import save_checkpoint

    cfg = tiny_cfg(tp=1, num_layers=2)
    cfg.model.vocab_size, cfg.model.transformer_impl, cfg.training.seq_length = len(tok), "local", 96
    _rm(1, len(tok), seed=1)  # back to the TP=1 layout to save as the trainer would
    ref_again = _rm(1, len(tok), seed=5)
    load_model(ref_again, f"{tmp}/tp1")
    save_checkpoint(f"{tmp}/rm_ckpt", 3, ref_again, config=cfg)
    _rm(2, len(tok), seed=7)  # the "RL job" runs TP=2
    rm_term.clear_cache()
    samples = [Sample(prompt=p, response=r) for p, r in zip(prompts, responses)]
    got = run_reward("rm", samples, RewardsConfig(mt="rm", rm_checkpoint=f"{tmp}/rm_ckpt"))
    assert torch.allclose(torch.tensor(got.values), ref_scores, atol=1e-5, rtol=0)
    rm_term.clear_cache()


@pytest.mark.dist
def test_rm_scores_tp2_equal_tp1(tmp_path):
    run_processes(_tp_scores, 2, args=(str(tmp_path),))


def _layout_losses(rank, world, tmp):
    """The RM forward step + loss through megatron's schedule: PP=2 and TP=2 give PP=1's losses."""
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from vepo_mcore.parallel import init_model_parallel
    from vepo_mcore.rm.data import PairDataset, build_pairs
    from vepo_mcore.rm.loss import make_forward_step
    from vepo_mcore.rm.model import build_reward_model
    from vepo_mcore.tokenizer import load_tokenizer
    from vepo_mcore.training.sampler import collate

    tok = load_tokenizer()
    pairs = build_pairs("dev", ("vi", "km"), range(2), ("repetition", "format"), seed=4, tokenizer=tok)
    ds = PairDataset(pairs, tok, seq_length=40)
    batches = [collate([ds[0], ds[1]]), collate([ds[2], ds[3]])]  # the training loop's stacking

    def losses(tp, pp, seed, load=None, save=None):
        cfg = tiny_cfg(tp=tp, pp=pp, num_layers=2)
        cfg.model.vocab_size, cfg.model.transformer_impl = len(tok), "local"
        init_model_parallel(cfg.parallel, seed=seed)
        model = build_reward_model(cfg)
        model.config.calculate_per_token_loss = True  # as wrap_model sets it for training
        if load:
            load_model(model, load)
        else:
            torch.nn.init.normal_(model.output_layer.weight, std=0.5)
            save_model(model, save)
        out = get_forward_backward_func()(
            forward_step_func=make_forward_step(0.5), data_iterator=iter(batches), model=[model],
            num_microbatches=2, seq_length=40, micro_batch_size=4, forward_only=True,
        )  # fmt: skip
        if not parallel_state.is_pipeline_last_stage():
            return None
        return torch.stack([r["loss"][0] / r["loss"][1] for r in out])

    ref = losses(1, 1, 1, save=f"{tmp}/ref")
    for tp, pp in ((1, 2), (2, 1)):
        got = losses(tp, pp, 9, load=f"{tmp}/ref")
        if got is not None:
            assert torch.allclose(got, ref, atol=1e-5, rtol=0), (tp, pp, got, ref)


@pytest.mark.dist
def test_rm_loss_equal_across_tp_pp_layouts(tmp_path):
    run_processes(_layout_losses, 2, args=(str(tmp_path),))
