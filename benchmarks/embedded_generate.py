"""Tokens/s of the embedded rollout engine vs transformers' `generate`, same weights, same sampling.

    .venv/bin/python benchmarks/embedded_generate.py [--threads 2] [--repeats 5]

A random megatron.core GPTModel of the toy recipe's RL shape (hidden 256, 4 layers, 4 heads / 2
query groups, vocabulary 18,366, tied embeddings, fp32) is converted with the checkpoint mapping into
transformers' Qwen2ForCausalLM. Both sample at temperature 0.7 over the full vocabulary (no top-k,
no top-p) at two shapes, batch 8 x (32 prompt + 64 new tokens) and batch 32 x (32 + 32), every
sequence running to its full length. transformers runs as a user runs it: a plain `generate` call
with its defaults, outside the CPU shim's torch-function mode that the engine's process installs.
Runs alternate (engine, transformers, engine, ...) so the machine's load hits both alike; the
medians give the ratio per shape. A greedy run checks that both produce the same sequences.
Ends with one JSON line; its "ratio" is the worse shape's (embedded tokens/s / transformers').
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

SHAPES = ((8, 32, 64), (32, 32, 32))  # (batch, prompt tokens, new tokens)
TEMPERATURE = 0.7
GOAL = 1.5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of each, per shape")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from vepo_mcore.checkpoint.convert import local_process_group
    from vepo_mcore.rollout.base import SamplingParams
    from vepo_mcore.rollout.embedded import EmbeddedEngine

    with local_process_group():
        cfg, model = _megatron_model()
        hf_model = _as_transformers(model, cfg)
        engine = EmbeddedEngine(model, cfg, batch_size=max(b for b, _, _ in SHAPES))
        g = torch.Generator().manual_seed(0)
        results, greedy = {}, None
        for batch, prompt_len, new in SHAPES:
            prompts = torch.randint(0, cfg.model.vocab_size, (batch, prompt_len), generator=g)

            def ours(temperature=TEMPERATURE, prompts=prompts, new=new):
                sampling = SamplingParams(temperature=temperature, max_new_tokens=new, seed=0)
                return [s.response_ids for s in engine.generate(prompts.tolist(), sampling)]

            def theirs(temperature=TEMPERATURE, prompts=prompts, new=new):
                with _outside_torch_function_modes():
                    sampled = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
                    out = hf_model.generate(
                        input_ids=prompts,
                        attention_mask=torch.ones_like(prompts),
                        max_new_tokens=new,
                        **(sampled if temperature > 0 else dict(do_sample=False)),
                    )
                return out[:, prompts.shape[1] :].tolist()

            if greedy is None:  # the same sequences from the same weights (and a warm-up of both)
                a, b = ours(0.0), theirs(0.0)
                greedy = (sum(x == y for x, y in zip(a, b)), len(a))
            wall = {"embedded": [], "transformers": []}
            cpu = {"embedded": [], "transformers": []}
            for _ in range(args.repeats):
                for name, run in (("embedded", ours), ("transformers", theirs)):
                    start, start_cpu = time.perf_counter(), time.process_time()
                    out = run()
                    wall[name].append(time.perf_counter() - start)
                    cpu[name].append(time.process_time() - start_cpu)
                    assert all(len(seq) == new for seq in out), name
            tokens = batch * new
            med = {name: statistics.median(t) for name, t in wall.items()}
            med_cpu = {name: statistics.median(t) for name, t in cpu.items()}
            shape = f"{batch}x({prompt_len}+{new})"
            results[shape] = {
                "embedded_tokens_per_s": round(tokens / med["embedded"], 1),
                "transformers_tokens_per_s": round(tokens / med["transformers"], 1),
                "ratio": round(med["transformers"] / med["embedded"], 3),
                # CPU seconds (all threads) per run: steadier than wall time on a loaded machine
                "cpu_ratio": round(med_cpu["transformers"] / med_cpu["embedded"], 3),
            }
            print(
                f"batch {shape}: embedded {tokens / med['embedded']:8.1f} tokens/s, transformers "
                f"{tokens / med['transformers']:8.1f} tokens/s, ratio {results[shape]['ratio']:.2f} "
                f"(CPU time ratio {results[shape]['cpu_ratio']:.2f})"
            )
    print(f"greedy sequences identical: {greedy[0]}/{greedy[1]}")
    record = {
        "bench": "embedded_generate",
        "ratio": min(r["ratio"] for r in results.values()),
        "goal": GOAL,
        "higher_is_better": True,
        "shapes": results,
        "greedy_identical": greedy[0] == greedy[1],
        "threads": args.threads,
        "repeats": args.repeats,
        "load_average_1min": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(record))


def _megatron_model():
    """The toy RL recipe's model shape (recipes/toy/configs/rl.yaml), random weights, TP=1, CPU."""
    from vepo_mcore.config import JobConfig
    from vepo_mcore.models.builder import build_model
    from vepo_mcore.parallel import init_model_parallel

    cfg = JobConfig()
    m = cfg.model
    m.num_layers, m.hidden_size, m.ffn_hidden_size = 4, 256, 704
    m.num_attention_heads, m.num_query_groups = 4, 2
    m.vocab_size, m.max_position_embeddings, m.tie_word_embeddings = 18366, 1024, True
    init_model_parallel(cfg.parallel, seed=0)
    return cfg, build_model(cfg).eval()


def _as_transformers(model, cfg):
    """Qwen2ForCausalLM holding the same weights (the checkpoint mapping's megatron -> HF names)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from vepo_mcore.checkpoint.hf import hf_config_from_model
    from vepo_mcore.checkpoint.mapping import megatron_to_hf_tensors

    vocab = cfg.model.vocab_size
    hf_config = Qwen2Config(**hf_config_from_model(cfg.model, None, vocab, torch.float32))
    with _outside_torch_function_modes():
        hf_model = Qwen2ForCausalLM(hf_config).eval()
    state = {k: v.detach() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    missing, unexpected = hf_model.load_state_dict(
        dict(megatron_to_hf_tensors(state, cfg.model, hf_vocab_rows=vocab)), strict=False
    )
    if unexpected or set(missing) - {"lm_head.weight"}:  # lm_head is tied to the embedding
        raise RuntimeError(f"conversion mismatch: missing {missing}, unexpected {unexpected}")
    hf_model.generation_config.pad_token_id = 0
    hf_model.generation_config.eos_token_id = None  # every sequence runs to max_new_tokens, as ours
    return hf_model


@contextlib.contextmanager
def _outside_torch_function_modes():
    """No torch-function mode active (the CPU shim installs one process-wide): a user's process."""
    from torch.overrides import _pop_mode_temporarily

    with contextlib.ExitStack() as stack:
        while torch._C._len_torch_function_stack() > 0:
            stack.enter_context(_pop_mode_temporarily())
        yield


if __name__ == "__main__":
    main()
