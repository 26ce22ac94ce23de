"""Peak memory of checkpoint conversion relative to the model's size (goal: ratio <= 1.1).

    .venv/bin/python benchmarks/convert_memory.py                 # ~1.15B params, bf16
    .venv/bin/python benchmarks/convert_memory.py --layers 2      # quick run

Writes a random Qwen2 checkpoint (safetensors, 1 GB shards, the shipped Qwen2.5 tokenizer) to a
temporary directory outside the repository, then converts it with tools/convert_hf.py in child
processes, as a user runs it: HF -> Megatron at TP=1 and TP=2, and each of those back to HF.
For each it prints the peak memory of the conversion (PSS summed over its process tree, sampled
with psutil, or the largest process's ru_maxrss, whichever is larger) divided by the HF
checkpoint's size on disk (the model bytes). The ratio reported is the worst of the four.
Everything is deleted afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch
from safetensors.torch import save_file

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def qwen2_config(layers: int, hidden: int, ffn: int, heads: int, kv_heads: int, vocab_rows: int) -> dict:
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": hidden,
        "intermediate_size": ffn,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "vocab_size": vocab_rows,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1_000_000.0,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "hidden_act": "silu",
        "dtype": "bfloat16",
    }


def tensor_shapes(cfg: dict) -> list[tuple[str, tuple[int, ...]]]:
    h, f, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    d = h // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * d
    shapes = [("model.embed_tokens.weight", (v, h))]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes += [
            (p + "input_layernorm.weight", (h,)),
            (p + "self_attn.q_proj.weight", (h, h)),
            (p + "self_attn.q_proj.bias", (h,)),
            (p + "self_attn.k_proj.weight", (kv, h)),
            (p + "self_attn.k_proj.bias", (kv,)),
            (p + "self_attn.v_proj.weight", (kv, h)),
            (p + "self_attn.v_proj.bias", (kv,)),
            (p + "self_attn.o_proj.weight", (h, h)),
            (p + "post_attention_layernorm.weight", (h,)),
            (p + "mlp.gate_proj.weight", (f, h)),
            (p + "mlp.up_proj.weight", (f, h)),
            (p + "mlp.down_proj.weight", (h, f)),
        ]
    return shapes + [("model.norm.weight", (h,)), ("lm_head.weight", (v, h))]


def write_random_checkpoint(out: Path, cfg: dict, shard_bytes: int = 1 << 30) -> int:
    """Random bf16 safetensors shards + index, written one shard at a time; returns the parameter count."""
    out.mkdir(parents=True)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    generator = torch.Generator().manual_seed(0)
    shards: list[dict[str, torch.Tensor]] = [{}]
    files, weight_map, size, params = [], {}, 0, 0

    def flush():
        name = f"shard-{len(files)}.safetensors"
        save_file(shards[-1], str(out / name), metadata={"format": "pt"})
        files.append((name, list(shards[-1])))
        shards[-1] = {}

    for name, shape in tensor_shapes(cfg):
        t = (torch.randn(shape, generator=generator) * 0.02).to(torch.bfloat16)
        params += t.numel()
        if shards[-1] and size + t.numel() * 2 > shard_bytes:
            flush()
            size = 0
        shards[-1][name] = t
        size += t.numel() * 2
    flush()
    for i, (tmp, names) in enumerate(files):
        final = f"model-{i + 1:05d}-of-{len(files):05d}.safetensors"
        (out / tmp).rename(out / final)
        weight_map.update(dict.fromkeys(names, final))
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return params


def run_and_measure(cmd: list[str], cwd: Path, env: dict) -> tuple[int, int, float]:
    """(peak PSS summed over the process tree, sampled every 50 ms; the child's ru_maxrss; seconds).

    PSS, not RSS, for the sum: the checkpoint writer forks, and a forked child's RSS counts the
    pages it shares with its parent a second time. ru_maxrss comes from wait4 on this child
    (its largest process among itself and the descendants it waited for).
    """
    start = time.time()
    log = tempfile.TemporaryFile()  # a file, not a pipe: a full pipe would stall the child
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
    root = psutil.Process(proc.pid)
    peak = 0
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        try:
            procs = [root, *root.children(recursive=True)]
            peak = max(peak, sum(p.memory_full_info().pss for p in procs))
        except psutil.Error:
            pass
        time.sleep(0.05)
    proc.returncode = os.waitstatus_to_exitcode(status)
    log.seek(0)
    if proc.returncode != 0:
        output = log.read().decode(errors="replace")
        raise RuntimeError(f"{' '.join(cmd[1:3])} failed ({proc.returncode}):\n{output[-4000:]}")
    return peak, usage.ru_maxrss * 1024, time.time() - start  # ru_maxrss is in KiB on Linux


def ratio_of(what: str, peak: int, maxrss: int, seconds: float, disk: int) -> float:
    ratio = max(peak, maxrss) / disk
    print(
        f"{what}: {seconds:.1f} s, peak PSS (process tree) {peak / 2**30:.2f} GiB, "
        f"largest process ru_maxrss {maxrss / 2**30:.2f} GiB, ratio to model bytes {ratio:.3f}",
        flush=True,
    )
    return ratio


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--ffn", type=int, default=5632)
    parser.add_argument("--vocab-rows", type=int, default=151936)
    parser.add_argument("--tp", default="1,2", help="TP sizes to convert at, comma-separated")
    # Another checkout's tools/convert_hf.py and package (e.g. a worktree of an older commit),
    # to measure the code before a change with this same script.
    parser.add_argument("--repo", default=str(REPO), help=argparse.SUPPRESS)
    parser.add_argument("--write-checkpoint-to", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    from vepo_mcore.languages import default_tokenizer_dir

    cfg = qwen2_config(args.layers, args.hidden, args.ffn, 16, 2, args.vocab_rows)
    if args.write_checkpoint_to:
        print(write_random_checkpoint(Path(args.write_checkpoint_to), cfg))
        return
    tmp = Path(tempfile.mkdtemp(prefix="vepo_convert_bench_"))
    try:
        hf_dir = tmp / "hf"
        # Generated in a child process: a child forked from a big parent starts with the parent's
        # RSS, which ru_maxrss would then report for the conversion.
        shape_args = [a for a in sys.argv[1:] if not a.startswith("--repo")]
        written = subprocess.run(
            [sys.executable, __file__, *shape_args, "--write-checkpoint-to", str(hf_dir)],
            check=True,
            capture_output=True,
            text=True,
        )
        params = int(written.stdout.split()[-1])
        for tok_file in default_tokenizer_dir().iterdir():
            if tok_file.suffix in (".json", ".jinja"):
                shutil.copyfile(tok_file, hf_dir / tok_file.name)
        disk = sum(p.stat().st_size for p in hf_dir.glob("*.safetensors"))
        print(f"params {params / 1e9:.3f} B, HF checkpoint on disk {disk / 2**30:.2f} GiB (bf16)", flush=True)
        repo = Path(args.repo).resolve()
        env = {
            **os.environ,
            "PYTHONPATH": str(repo),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
        }
        tool = [sys.executable, str(repo / "tools" / "convert_hf.py")]
        ratios = {}
        for tp in [int(t) for t in args.tp.split(",")]:
            mc_dir, back_dir = tmp / f"mc_tp{tp}", tmp / f"hf_back_tp{tp}"
            to_mc = [*tool, "hf-to-megatron", "--hf", str(hf_dir), "--out", str(mc_dir), "--tp", str(tp)]
            ratios[f"hf_to_megatron_tp{tp}"] = ratio_of(
                f"HF -> Megatron, TP={tp}", *run_and_measure(to_mc, repo, env), disk
            )
            to_hf = [*tool, "megatron-to-hf", "--ckpt", str(mc_dir), "--out", str(back_dir)]
            ratios[f"megatron_to_hf_tp{tp}"] = ratio_of(
                f"Megatron (TP={tp}) -> HF", *run_and_measure(to_hf, repo, env), disk
            )
            shutil.rmtree(mc_dir)
            shutil.rmtree(back_dir)
        worst = max(ratios.values())
        print(f"worst ratio peak memory / model bytes = {worst:.3f}  (goal <= 1.1)")
        result = {"bench": "convert_memory", "ratio": round(worst, 4), "goal": 1.1, "higher_is_better": False}
        result.update(ratios={k: round(v, 4) for k, v in ratios.items()}, model_bytes=disk, params=params)
        print(json.dumps(result))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
