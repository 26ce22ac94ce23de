"""Claim C7 at toy scale: where the SFT policy concentrates its next-token mass, does VEPO spread it?

    study = decision_point_study("runs/toy/seed0/sft", "reports/toy/grid_runs/vepo_kl-none_s0/checkpoint",
                                 records)            # records: the SFT policy's held-out jsonl rows

Both policies score the same token sequences: each held-out prompt followed by the SFT policy's own
greedy answer (and <|im_end|>). At every answer position we take each policy's next-token
distribution at tau 1 over the real vocabulary; the measure is the mean entropy per answer, compared
with a paired bootstrap over answers. The figure's decision point is chosen by the SFT policy alone:
the position of the first answer where its entropy is highest.
"""

from __future__ import annotations

from pathlib import Path

import torch

TOP_TOKENS = 12


def _load(checkpoint: str | Path):
    """(model, tokenizer) of a Megatron checkpoint, in eval mode, inside an initialised process group."""
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.tokenizer import load_tokenizer
    from vepo_mcore.training.checkpointing import checkpoint_config, load_checkpoint

    cfg, path = checkpoint_config(checkpoint)
    model = build_model(cfg)
    load_checkpoint(path, model, finetune=True)
    model.eval()
    return model, load_tokenizer(cfg.tokenizer.path)


@torch.no_grad()
def answer_distributions(
    model, sequences: list[tuple[list[int], list[int]]], vocab: int
) -> list[torch.Tensor]:
    """Per (prompt ids, answer ids): [len(answer), vocab] next-token probabilities at tau 1 at the
    positions that predict each answer token (padded vocabulary rows dropped)."""
    out = []
    for prompt, answer in sequences:
        tokens = torch.tensor([prompt + answer])
        positions = torch.arange(tokens.shape[1]).unsqueeze(0)
        logits = model(tokens, positions, None)[0, len(prompt) - 1 : -1, :vocab]
        out.append(torch.softmax(logits.float(), dim=-1))
    return out


def _entropy(probs: torch.Tensor) -> torch.Tensor:
    return -(probs * probs.clamp_min(1e-30).log()).sum(-1)


def decision_point_study(sft: str | Path, rl: str | Path, records: list[dict], n: int = 40) -> dict:
    """Mean answer entropy of both policies on the SFT policy's first n held-out answers, the
    paired 95% interval of the difference, and the top tokens at the decision point."""
    from vepo_mcore.config.parallel import ParallelConfig
    from vepo_mcore.eval.bootstrap import paired_mean_diff_ci
    from vepo_mcore.parallel import destroy, init_distributed, init_model_parallel
    from vepo_mcore.translation.directions import parse_directions
    from vepo_mcore.translation.prompts import format_prompt

    init_distributed()
    try:
        init_model_parallel(ParallelConfig(), seed=0)
        model_sft, tokenizer = _load(sft)
        model_rl, _ = _load(rl)
        vocab = len(tokenizer)
        sequences = []
        for record in records[:n]:
            direction = parse_directions(record["direction"])[0]
            prompt = tokenizer.encode(format_prompt(direction, record["source"], tokenizer))
            sequences.append((prompt, tokenizer.encode(record["hypothesis"]) + [tokenizer.im_end_id]))
        before = answer_distributions(model_sft, sequences, vocab)
        after = answer_distributions(model_rl, sequences, vocab)
    finally:
        destroy()
    h_before = [float(_entropy(p).mean()) for p in before]
    h_after = [float(_entropy(p).mean()) for p in after]
    first_before, first_after = before[0], after[0]
    t = int(_entropy(first_before).argmax())
    top = torch.topk(first_before[t], TOP_TOKENS).indices.tolist()
    answer = sequences[0][1]
    return {
        "answers": len(sequences),
        "entropy_sft": sum(h_before) / len(h_before),
        "entropy_rl": sum(h_after) / len(h_after),
        "entropy_delta_ci95": list(paired_mean_diff_ci(h_before, h_after)),
        "top1_sft": sum(float(p.max(-1).values.mean()) for p in before) / len(before),
        "top1_rl": sum(float(p.max(-1).values.mean()) for p in after) / len(after),
        "point": {
            "direction": records[0]["direction"],
            "context": tokenizer.decode(answer[:t]),
            "position": t,
            "ids": top,
            "tokens": [tokenizer.decode([i]) for i in top],
            "p_sft": [float(first_before[t, i]) for i in top],
            "p_rl": [float(first_after[t, i]) for i in top],
            "entropy_sft": float(_entropy(first_before[t])),
            "entropy_rl": float(_entropy(first_after[t])),
        },
    }
