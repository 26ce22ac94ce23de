"""Tokens/s of the embedded Megatron rollout engine vs transformers' `generate` on the same tiny model.

    .venv/bin/python benchmarks/embedded_generate.py [--batch 8] [--new-tokens 64] [--layers 4] [--threads 1]

A random tiny Qwen2ForCausalLM is saved, converted into the Megatron GPTModel with the checkpoint
mapping (TP=1, CPU), and both generate greedily from the same left-padded prompts. Prints both
rates, the ratio (embedded / transformers) and whether the greedy tokens agree.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: tests.support
    from tests.support.checkpoints import tiny_qwen2_hf
    from vepo_mcore.checkpoint.convert import load_hf_into_model, local_process_group, plan_hf_to_megatron
    from vepo_mcore.checkpoint.hf import HFCheckpoint
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.parallel import init_model_parallel
    from vepo_mcore.rollout.base import SamplingParams
    from vepo_mcore.rollout.embedded import EmbeddedEngine

    tmp = Path(tempfile.mkdtemp(prefix="bench_embedded_"))
    hf_model = tiny_qwen2_hf(tmp / "hf", vocab_size=args.vocab, num_layers=args.layers)
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(8, 33, (args.batch,), generator=g).tolist()
    prompts = [torch.randint(0, args.vocab, (n,), generator=g).tolist() for n in lengths]

    with local_process_group():
        cfg, _ = plan_hf_to_megatron(tmp / "hf", 1, 1, None)
        cfg.rl.rollout.batch_size = args.batch
        init_model_parallel(cfg.parallel)
        model = build_model(cfg).eval()
        reader = HFCheckpoint(tmp / "hf")
        load_hf_into_model(model, reader, cfg)
        reader.close()
        engine = EmbeddedEngine(model, cfg)
        sampling = SamplingParams(temperature=0, max_new_tokens=args.new_tokens)
        ids, mask = _left_pad(prompts)
        hf_model.generation_config.pad_token_id = 0
        gen_kwargs = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False)
        with torch.no_grad():  # warm-up both
            engine.generate(prompts[:2], SamplingParams(temperature=0, max_new_tokens=2))
            hf_model.generate(input_ids=ids[:2], attention_mask=mask[:2], max_new_tokens=2, do_sample=False)
            # Interleaved repeats, best of each: a shared machine's load hits both alike.
            best_embedded = best_hf = float("inf")
            for _ in range(args.repeats):
                start = time.perf_counter()
                samples = engine.generate(prompts, sampling)
                best_embedded = min(best_embedded, time.perf_counter() - start)
                start = time.perf_counter()
                hf_out = hf_model.generate(input_ids=ids, attention_mask=mask, **gen_kwargs)
                best_hf = min(best_hf, time.perf_counter() - start)

    tokens = args.batch * args.new_tokens
    hf_tokens = hf_out[:, ids.shape[1] :].tolist()
    agree = sum(s.response_ids == h for s, h in zip(samples, hf_tokens))
    print(
        f"model: {args.layers} layers, hidden 64, vocab {args.vocab}; batch {args.batch}, {args.new_tokens} new tokens"
    )
    print(f"embedded megatron engine: {tokens / best_embedded:9.1f} tokens/s")
    print(f"transformers generate:    {tokens / best_hf:9.1f} tokens/s")
    print(f"ratio embedded / transformers: {best_hf / best_embedded:.2f}")
    print(f"greedy sequences identical: {agree}/{args.batch}")


def _left_pad(prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.tensor(p)
        mask[i, width - len(p) :] = 1
    return ids, mask


if __name__ == "__main__":
    main()
