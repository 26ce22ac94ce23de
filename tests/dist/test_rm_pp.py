"""RM scoring at pipeline parallel size 2 gives the PP=1 scores and category probabilities on both
ranks, for texts of different lengths in micro-batches that do not divide them (padding rows and
padding tokens included), through score_texts and through the registered reward R_mt = rm; the
held-out evaluation split over DP=2 ranks summarises exactly what one rank scoring everything does."""

from __future__ import annotations

import pytest
import torch

from tests.dist.model_utils import tiny_cfg
from vepo_mcore.parallel.launch import run_processes


def _texts(tok) -> tuple[list[str], list[str]]:
    from vepo_mcore.languages import load_flores

    src, tgt = load_flores("en", "dev"), load_flores("th", "dev")
    prompts = [
        tok.apply_chat(
            [{"role": "user", "content": f"Translate to Thai: {src[i]}"}], add_generation_prompt=True
        )
        for i in range(10)
    ]
    # Responses from 1 to 3 sentences: rows of clearly different lengths.
    responses = [" ".join(tgt[i : i + 1 + i % 3]) for i in range(10)]
    return prompts, responses


def _pp_scores(rank, world, tmp):
    from megatron.core import parallel_state as ps

    from vepo_mcore.config.rewards import RewardsConfig
    from vepo_mcore.languages import default_tokenizer_dir
    from vepo_mcore.parallel import init_model_parallel
    from vepo_mcore.rm import reward as rm_term
    from vepo_mcore.rewards.mt import mt_reward
    from vepo_mcore.translation.sample import Sample
    from vepo_mcore.rm.data import Pair
    from vepo_mcore.rm.evaluate import evaluate_pairs, summarise
    from vepo_mcore.rm.model import build_reward_model, load_reward_model, score_texts
    from vepo_mcore.tokenizer import load_tokenizer
    from vepo_mcore.training.checkpointing import save_checkpoint

    tok = load_tokenizer()
    prompts, responses = _texts(tok)
    seq_length = 80  # some rows are longer: encode keeps their last 80 tokens

    # Reference at TP=PP=1 (both processes hold the same replica, DP=2), saved as the trainer would.
    cfg = tiny_cfg(tp=1, pp=1, num_layers=2)
    cfg.model.vocab_size, cfg.model.transformer_impl, cfg.training.seq_length = len(tok), "local", seq_length
    init_model_parallel(cfg.parallel, seed=1)
    torch.manual_seed(3)
    ref_model = build_reward_model(cfg).eval()
    torch.nn.init.normal_(ref_model.output_layer.weight, std=0.5)  # scores far from 0, so a mismatch shows
    save_checkpoint(f"{tmp}/rm", 2, ref_model, config=cfg, tokenizer_dir=default_tokenizer_dir())
    ref_scores, ref_probs = score_texts(ref_model, tok, prompts, responses, seq_length, batch_size=4)
    lengths = {len(tok.encode(p + r)) for p, r in zip(prompts, responses)}
    assert len(lengths) >= 5 and max(lengths) > seq_length, lengths
    assert ref_scores.shape == (10,) and ref_probs.shape == (10, 10)
    assert ref_scores.std() > 0.05, ref_scores

    # DP=2 evaluation: each rank scores every other pair (7: uneven shares), all ranks get the whole table.
    pairs = [
        Pair(prompts[i], responses[i], responses[i + 1], ("accuracy",), "accuracy", "en", "th")
        for i in range(7)
    ]
    whole = [score_texts(ref_model, tok, prompts[:7], [getattr(p, side) for p in pairs], seq_length, 4)
             for side in ("better", "worse")]  # fmt: skip
    want = summarise(pairs, whole[0][0], whole[1][0], whole[0][1], whole[1][1])
    got_eval = evaluate_pairs(ref_model, tok, pairs, seq_length, batch_size=4)
    assert got_eval.accuracy == want.accuracy and got_eval.detection == want.detection
    assert got_eval.average_precision == pytest.approx(want.average_precision, abs=1e-6)

    # PP=2: each process holds one of the two layers; the checkpoint reshards into this layout.
    cfg.parallel.pipeline_model_parallel_size = 2
    init_model_parallel(cfg.parallel, seed=9)
    assert ps.get_pipeline_model_parallel_world_size() == 2
    model, _, tok2 = load_reward_model(f"{tmp}/rm")
    assert len(model.decoder.layers) == 1
    scores, probs = score_texts(model, tok2, prompts, responses, seq_length, batch_size=4)
    assert scores.device.type == "cpu" and scores.dtype == torch.float32
    assert torch.allclose(scores, ref_scores, atol=1e-5, rtol=0), (rank, (scores - ref_scores).abs().max())
    assert torch.allclose(probs, ref_probs, atol=1e-5, rtol=0), (rank, (probs - ref_probs).abs().max())

    # The registered reward loads the checkpoint into the running PP=2 layout; both ranks get the scores.
    rm_term.clear_cache()
    samples = [Sample(prompt=p, response=r) for p, r in zip(prompts, responses)]
    got = mt_reward(samples, RewardsConfig(mt="rm", rm_checkpoint=f"{tmp}/rm"))
    rm_term.clear_cache()
    assert torch.allclose(torch.tensor(got.values), ref_scores, atol=1e-5, rtol=0), (rank, got.values)
    assert torch.allclose(torch.tensor(got.raw), ref_probs.max(-1).values, atol=1e-5, rtol=0)


@pytest.mark.dist
def test_rm_scores_pp2_equal_pp1(tmp_path):
    run_processes(_pp_scores, 2, args=(str(tmp_path),))
