"""The project's CPT train step through its own loop against megatron.core's raw GPTModel step.

    .venv/bin/python benchmarks/train_step.py                 # hidden 256, 4 layers, seq 512, vocab 152k
    .venv/bin/python benchmarks/train_step.py --seq 256 --repeats 2

One process, the threads torch starts with (the machine's cores), fp32, one 512-token sequence per
step. Prints:
- ratio: time of megatron's raw step (GPTModel forward with labels, vocab_parallel_cross_entropy,
  sum, backward; no DDP, no optimizer, no data loading) / time of the project's step (LMTrainer.step:
  the data iterator, the forward step with the loss mask, megatron's schedule and DDP, the chunked
  output layer + loss, Adam, the LR schedule). Same weights, same tokens, the two alternating after
  a warm-up step each; the minimum of the repeats (the least-disturbed run of each), medians too.
  Goal >= 1.0. A side reading times the raw step followed by torch's fused AdamW over the raw
  model's parameters (what the project's step runs for its optimizer on CPU).
- gemm_fraction: the project step's model FLOP/s (3 x the forward FLOPs of a causal LM: the GEMMs,
  and attention's QK^T and PV at full length, megatron's convention; the chunked loss's own extra
  work is not counted) over the fp32 GEMM rate measured in the same run on the output layer's
  three shapes ([T, h] x [h, V], [T, V] x [V, h], [V, T] x [T, h]): the rate this machine can reach
  on the step's dominant work, measured after every round of steps, the best of them against the
  fastest step (one reading of the rate alone swings 130-170 GFLOP/s on the 2 cores). Goal >= 0.8.
  Also printed, not the goal's reading: each round's step over the rate read right after it (the
  spread within one run; the JSON's "gemm_fraction_rounds").
- peak memory of one step above what the process holds before it (weights, gradients, Adam state,
  after a warm-up step), at two sequence lengths, for both steps: the project's must not grow with
  T x V (megatron's holds the [T, V] logits and their softmax). Read from VmHWM after resetting it
  through /proc/self/clear_refs (Linux); large tensors are mmap'd, so freed memory leaves the RSS.
  The chunked path keeps its work buffers between steps (models/output_loss.HostBuffers); they are
  dropped before each measured step, so its peak includes them.

Ends with one JSON line {"bench": "train_step", "ratio": r, "goal": 1.0, "higher_is_better": true,
"gemm_fraction": f, ...}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RATIO_GOAL, GEMM_GOAL = 1.0, 0.8


def _config(seq: int, vocab: int):
    from vepo_mcore.config import JobConfig

    cfg = JobConfig()
    m = cfg.model
    m.num_layers, m.hidden_size, m.ffn_hidden_size = 4, 256, 704
    m.num_attention_heads, m.num_query_groups = 4, 2
    m.vocab_size, m.max_position_embeddings, m.tie_word_embeddings = vocab, max(seq, 1024), True
    t = cfg.training
    t.micro_batch_size, t.global_batch_size, t.seq_length, t.train_iters = 1, 1, seq, 1000
    t.logging.progress_bar = False
    return cfg


def _dataset(seq: int, vocab: int, n: int = 8) -> list[dict]:
    import torch

    g = torch.Generator().manual_seed(0)
    rows = torch.randint(0, vocab, (n, seq + 1), generator=g)
    return [{"tokens": r[:-1].clone(), "labels": r[1:].clone(), "loss_mask": torch.ones(seq)} for r in rows]


def _raw_megatron(cfg, project_model):
    """megatron.core's own GPTModel at the same config, with the project model's weights, and its
    stock local layer spec (its DotProductAttention: what a megatron user runs on CPU)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from vepo_mcore.models.builder import model_vocab_size, transformer_config

    spec = get_gpt_layer_local_spec(normalization="RMSNorm")
    model = GPTModel(
        config=transformer_config(cfg), transformer_layer_spec=spec, vocab_size=model_vocab_size(cfg),
        max_sequence_length=cfg.model.max_position_embeddings, parallel_output=True,
        share_embeddings_and_output_weights=cfg.model.tie_word_embeddings, position_embedding_type="rope",
        rotary_base=int(cfg.model.rotary_base),
    )  # fmt: skip
    state = {k: v for k, v in project_model.module.state_dict().items() if not k.endswith("_extra_state")}
    model.load_state_dict(state)
    return model


def _raw_step(model, data):
    """megatron's raw step: forward with labels (its output layer + vocab_parallel_cross_entropy), backward."""
    import torch

    batch = next(data)
    tokens = batch["tokens"]
    positions = torch.arange(tokens.shape[1]).unsqueeze(0).expand_as(tokens)
    model.zero_grad(set_to_none=True)
    loss = model(tokens, positions, None, labels=batch["labels"])
    (loss * batch["loss_mask"]).sum().backward()


class _Setup:
    def __init__(self, seq: int, vocab: int):
        from vepo_mcore.training.forward import forward_step
        from vepo_mcore.training.sampler import micro_batches
        from vepo_mcore.training.trainer import LMTrainer

        self.cfg = _config(seq, vocab)
        data = _dataset(seq, vocab)
        self.trainer = LMTrainer(self.cfg, data, None, forward_step, None, None)
        self.raw = _raw_megatron(self.cfg, self.trainer.model)
        self.raw_data = micro_batches(data, 0, 1, 0, 1)
        import torch

        # A side reading, not the goal's reference: the raw step plus torch's fused AdamW, the
        # optimizer the project's step runs on CPU (LR small: the weights barely move).
        self.raw_adam = torch.optim.AdamW(self.raw.parameters(), lr=1e-6, weight_decay=0.0, fused=True)

    def project(self):
        self.trainer.step()

    def megatron(self):
        _raw_step(self.raw, self.raw_data)

    def megatron_adam(self):
        _raw_step(self.raw, self.raw_data)
        self.raw_adam.step()


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_above(fn) -> int | None:
    """Bytes of RSS one call of fn reaches above the RSS before it (None where VmHWM cannot be reset).
    The chunked path's reused work buffers are dropped first, so they count as the step's own."""
    from vepo_mcore.models.output_loss import BUFFERS

    BUFFERS.release()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    before = _rss()
    fn()
    with open("/proc/self/status") as f:
        hwm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
    return hwm - before


def _timed(fn) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one call."""
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - start, time.process_time() - cpu


def output_layer_peaks(tokens: int, hidden: int, vocab_rows: int) -> dict[str, int | None]:
    """Peak bytes above the inputs of the output layer + loss alone (forward and backward), the
    project's chunked function and megatron's ColumnParallelLinear GEMM + vocab_parallel_cross_entropy."""
    import torch
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    from vepo_mcore.models.output_loss import output_layer_cross_entropy

    g = torch.Generator().manual_seed(2)
    x = torch.randn(tokens, hidden, generator=g).requires_grad_()
    w = (torch.randn(vocab_rows, hidden, generator=g) * 0.02).requires_grad_()
    labels = torch.randint(0, vocab_rows, (tokens,), generator=g)
    w.grad = torch.zeros_like(w)  # the gradient buffer exists before the step, as in training
    x.grad = torch.zeros_like(x)

    def project():
        output_layer_cross_entropy(x, w, labels, loss_weights=torch.ones(tokens)).sum().backward()

    def megatron():
        logits = torch.nn.functional.linear(x, w).unsqueeze(1)  # [s, b, V]
        vocab_parallel_cross_entropy(logits, labels.unsqueeze(1)).sum().backward()

    return {"project": _peak_above(project), "megatron": _peak_above(megatron)}


def gemm_rate(tokens: int, hidden: int, vocab: int, repeats: int = 3) -> float:
    """fp32 FLOP/s of the output layer's forward, dgrad and wgrad GEMMs (best of `repeats`)."""
    import torch

    g = torch.Generator().manual_seed(1)
    x = torch.randn(tokens, hidden, generator=g)
    w = torch.randn(vocab, hidden, generator=g)
    dy = torch.randn(tokens, vocab, generator=g)
    out = torch.empty(tokens, vocab)
    dx, dw = torch.empty(tokens, hidden), torch.empty(vocab, hidden)

    def three():
        torch.mm(x, w.t(), out=out)
        torch.mm(dy, w, out=dx)
        torch.mm(dy.t(), x, out=dw)

    three()
    best = min(_timed(three)[0] for _ in range(repeats))
    return 3 * 2 * tokens * hidden * vocab / best


def model_flops(cfg, seq: int, vocab_rows: int) -> float:
    """Training FLOPs of one sequence: 3 x forward (GEMMs + attention at full length)."""
    m = cfg.model
    h, f, layers = m.hidden_size, m.ffn_hidden_size, m.num_layers
    kv = h * m.num_query_groups // m.num_attention_heads
    per_token = 2 * (layers * (h * (h + 2 * kv) + h * h + 3 * h * f) + h * vocab_rows) + layers * 4 * seq * h
    return 3.0 * per_token * seq


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--long-seq", type=int, default=1024, help="second length for the memory comparison")
    p.add_argument("--vocab", type=int, default=151_665, help="real vocabulary (padded to 152,064)")
    p.add_argument("--repeats", type=int, default=4)
    args = p.parse_args()
    import torch

    from vepo_mcore.models.builder import model_vocab_size
    from vepo_mcore.parallel import init_model_parallel

    cfg = _config(args.seq, args.vocab)
    init_model_parallel(cfg.parallel, seed=cfg.training.seed)  # one process, gloo
    setup = _Setup(args.seq, args.vocab)
    rows = model_vocab_size(setup.cfg)
    methods = {"project": setup.project, "megatron": setup.megatron}
    for fn in methods.values():
        fn()  # warm-up: gradients and Adam state exist before anything is measured
    memory = {args.seq: {name: _peak_above(fn) for name, fn in methods.items()}}
    timed = {**methods, "megatron+adam": setup.megatron_adam}
    setup.megatron_adam()  # Adam's state exists before the measured steps
    times = {name: [] for name in timed}
    cpu = {name: [] for name in timed}
    rates = []  # the GEMM rate measured between the rounds of steps: the best of it, as of the steps
    for _ in range(args.repeats):
        for name, fn in timed.items():
            wall, seconds = _timed(fn)
            times[name].append(wall)
            cpu[name].append(seconds)
        rates.append(gemm_rate(args.seq, setup.cfg.model.hidden_size, rows, repeats=2))
    rate = max(rates)
    del setup
    long = _Setup(args.long_seq, args.vocab)
    for fn in (long.project, long.megatron):
        fn()  # warm-up: gradients and Adam state exist before the measured step
    memory[args.long_seq] = {"project": _peak_above(long.project), "megatron": _peak_above(long.megatron)}
    del long
    head = {t: output_layer_peaks(t, 256, rows) for t in (args.seq, 4 * args.seq)}

    best = {k: min(v) for k, v in times.items()}
    ratio = best["megatron"] / best["project"]
    median_ratio = statistics.median(times["megatron"]) / statistics.median(times["project"])
    cpu_ratio = min(cpu["megatron"]) / min(cpu["project"])
    flops = model_flops(_config(args.seq, args.vocab), args.seq, rows)
    fraction = flops / best["project"] / rate
    # each round's step against the rate measured right after it: the spread within one run
    per_round = sorted(flops / t / r for t, r in zip(times["project"], rates))
    mib = {s: {k: (v or 0) / 2**20 for k, v in d.items()} for s, d in memory.items()}
    logits_mib = {s: s * rows * 4 / 2**20 for s in memory}
    print(
        f"hidden 256, 4 layers, vocab {args.vocab} (padded {rows}), tied, fp32, 1 x {args.seq} tokens/step, "
        f"threads={torch.get_num_threads()}, load average {os.getloadavg()[0]:.1f}"
    )
    for name in timed:
        t = times[name]
        print(
            f"  {name:13s} step min {min(t):.3f} s  median {statistics.median(t):.3f} s  ({args.seq / min(t):.0f} tokens/s)"
        )
    print(
        f"ratio megatron / project: {ratio:.3f} (medians {median_ratio:.3f}, CPU seconds {cpu_ratio:.3f}; "
        f"goal >= {RATIO_GOAL})"
    )
    with_adam = best["megatron+adam"] / best["project"]
    print(f"side reading, megatron raw step + fused AdamW / project: {with_adam:.3f}")
    print(
        f"fp32 GEMM rate on the output layer's shapes: {rate / 1e9:.1f} GFLOP/s; project step "
        f"{flops / best['project'] / 1e9:.1f} GFLOP/s of model FLOPs = {fraction:.3f} of it (goal >= {GEMM_GOAL})"
    )
    print(
        f"  round by round (each step against the rate read right after it): "
        f"{', '.join(f'{x:.3f}' for x in per_round)}, median {statistics.median(per_round):.3f}"
    )
    for s in memory:
        print(
            f"  peak above weights/grads/Adam, seq {s}: project {mib[s]['project']:.0f} MiB, megatron "
            f"{mib[s]['megatron']:.0f} MiB (one fp32 [T, V] logits tensor: {logits_mib[s]:.0f} MiB)"
        )
    growth = {k: mib[args.long_seq][k] - mib[args.seq][k] for k in methods}
    extra_logits = logits_mib[args.long_seq] - logits_mib[args.seq]
    print(
        f"  growth from {args.seq} to {args.long_seq} tokens: project {growth['project']:.0f} MiB, megatron "
        f"{growth['megatron']:.0f} MiB (one more [T, V] copy: {extra_logits:.0f} MiB)"
    )
    head_copies = {t: {k: (v or 0) / (t * rows * 4) for k, v in d.items()} for t, d in head.items()}
    for t, d in head_copies.items():
        print(
            f"  output layer + loss alone, {t} tokens, peak above inputs and gradient buffers: project "
            f"{d['project']:.3f}, megatron {d['megatron']:.3f} copies of the fp32 [T, V] logits"
        )
    record = {
        "bench": "train_step",
        "ratio": round(ratio, 4),
        "goal": RATIO_GOAL,
        "higher_is_better": True,
        "gemm_fraction": round(fraction, 4),
        "gemm_goal": GEMM_GOAL,
        "gemm_fraction_rounds": [round(x, 4) for x in per_round],
        "ratio_median": round(median_ratio, 4),
        "ratio_cpu_seconds": round(cpu_ratio, 4),
        "output_layer_peak_copies": {
            str(t): {k: round(v, 4) for k, v in d.items()} for t, d in head_copies.items()
        },
        "project_step_s": round(best["project"], 4),
        "megatron_step_s": round(best["megatron"], 4),
        "megatron_adam_step_s": round(best["megatron+adam"], 4),
        "ratio_vs_megatron_with_adam": round(with_adam, 4),
        "gemm_gflops": round(rate / 1e9, 2),
        "model_gflops": round(flops / best["project"] / 1e9, 2),
        "peak_mib": {str(s): {k: round(v, 1) for k, v in d.items()} for s, d in mib.items()},
        "peak_growth_in_logits_copies": {k: round(v / extra_logits, 3) for k, v in growth.items()},
        "seq": args.seq,
        "vocab": args.vocab,
        "threads": torch.get_num_threads(),
        "load_average": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(record))


if __name__ == "__main__":
    main()
