"""The paper's RL grid at toy scale: 6 algorithms x KL {none, k2, k3} from the toy's SFT checkpoint,
seeds for the cells the claims compare, and DAPO's overlong study.

    runs = plan_grid(seeds=[0, 1, 2])
    run_grid(runs, GridSetup.from_toy("runs/toy/seed0"), "reports/toy/grid_runs", steps=40, workers=2)
    records = grid_records(read_histories(runs, "reports/toy/grid_runs"))   # -> reports/toy/grid.json

Every run is tools/train_vepo.py with recipes/toy/configs/rl.yaml and the same overrides except
what defines its algorithm (rl.loss.name; DAPO also turns on dynamic sampling, and its overlong
twin the soft overlong penalty) and its KL estimator. The reference pass runs every step, so
rl/kl_k1..k3 are measured in every run, KL optimised or not. Runs write OUT/<name>/metrics.jsonl
and keep no checkpoint, except VEPO without KL (OUT/<name>/checkpoint, for the decision-point
figure). A run whose metrics hold every step is skipped, so rerunning continues the grid.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from recipes.toy.recipe import CONFIGS, run_logged, torchrun
from vepo_mcore.training.logging import read_metrics

ALGORITHMS = ("vepo", "ppo", "grpo", "dapo", "rloo", "reinforce_pp")
KL_REGIMES = ("none", "k2", "k3")
SEEDED = ("vepo", "grpo")
"""The algorithms run on every seed (the claims compare them); the others run on the first."""


@dataclass(frozen=True)
class GridRun:
    """One RL run of the grid."""

    algorithm: str
    kl: str
    seed: int
    overlong: bool = False
    """DAPO with the soft overlong penalty (the overlong study's second arm)."""

    @property
    def name(self) -> str:
        return f"{self.algorithm}{'-overlong' if self.overlong else ''}_kl-{self.kl}_s{self.seed}"

    @property
    def keeps_checkpoint(self) -> bool:
        return self.algorithm == "vepo" and self.kl == "none" and not self.overlong


@dataclass(frozen=True)
class GridSetup:
    """What every run shares: the SFT checkpoint, its tokenizer, the prompts and the settings."""

    sft: Path
    tokenizer: Path
    vocab_size: int
    directions: str = "en-th,en-vi,th-en,vi-en"
    prompt_sentences: str = ":"
    temperature: float = 1.0
    """The paper's tau (SPEC default): the grid studies sampling dynamics, not greedy scores."""
    kl_coef: float = 0.05
    lr: float = 2e-4
    """Constant learning rate: twice the toy's RL rate, so 40 steps move the policy as far as ~80."""
    mini_batches: int = 2
    """Updates per rollout batch (the 7B recipe: 4). With one, every update is on-policy, the ratio is
    1 and no clip (PPO's, DAPO's and VEPO's clip-higher) ever acts."""
    overlong_buffer: int = 16
    extra: tuple[str, ...] = ()
    """Dotted overrides every run takes last (--rl.prompts_per_step 4)."""

    @classmethod
    def from_toy(cls, seed_dir: str | Path, **settings) -> GridSetup:
        """The setup of one toy seed (tools/run_toy.py): its SFT checkpoint, the tokenizer that
        checkpoint was trained with, and its RL stage's prompts (toy_rl_prompts)."""
        from vepo_mcore.training.checkpointing import checkpoint_config

        seed_dir = Path(seed_dir)
        if not (seed_dir / "sft").is_dir():
            raise FileNotFoundError(
                f"{seed_dir / 'sft'} does not exist: the grid starts from a toy seed's SFT checkpoint; "
                f"make it with `python tools/run_toy.py --out {seed_dir.parent} --seeds "
                f"{seed_dir.name.removeprefix('seed')} --no-report` (~33 min on 2 cores)"
            )
        sft_cfg, _ = checkpoint_config(seed_dir / "sft")
        return cls(sft=seed_dir / "sft", tokenizer=Path(sft_cfg.tokenizer.path),
                   vocab_size=sft_cfg.model.vocab_size, **{**toy_rl_prompts(seed_dir), **settings})  # fmt: skip

    def overrides(self, run: GridRun, steps: int, out: Path) -> list[str]:
        flags = [
            "--config", str(CONFIGS / "rl.yaml"), "--tokenizer.path", str(self.tokenizer),
            "--model.vocab_size", str(self.vocab_size), "--training.checkpoint.load", str(self.sft),
            "--training.train_iters", str(steps), "--training.seed", str(1000 + run.seed),
            "--training.logging.metrics_jsonl", str(out / run.name / "metrics.jsonl"),
            "--rl.directions", self.directions, "--rl.prompt_sentences", self.prompt_sentences,
            "--rl.loss.name", run.algorithm, "--rl.kl.estimator", run.kl, "--rl.kl.coef", str(self.kl_coef),
            "--rl.kl.measure_interval", "1", "--rl.mini_batches", str(self.mini_batches),
            "--training.optimizer.lr", str(self.lr), "--training.optimizer.min_lr", str(self.lr),
            "--rl.rollout.sampling.temperature", str(self.temperature),
        ]  # fmt: skip
        if run.algorithm == "dapo":
            flags += ["--rl.filtering.dynamic_sampling", "true"]
        if run.overlong:
            flags += ["--rl.loss.overlong_buffer", str(self.overlong_buffer)]
        if run.keeps_checkpoint:
            flags += ["--training.checkpoint.save", str(out / run.name / "checkpoint")]
        return [*flags, *self.extra]


def toy_rl_prompts(seed_dir: Path) -> dict[str, str]:
    """The directions and prompt sentences of a toy seed's RL stage: those run_toy planned
    (rl_prompts.json), or else those its RL run used; {} when neither is there."""
    from vepo_mcore.training.checkpointing import checkpoint_config

    if (seed_dir / "rl_prompts.json").is_file():
        return json.loads((seed_dir / "rl_prompts.json").read_text())
    if (seed_dir / "rl" / "config.yaml").is_file():
        rl = checkpoint_config(seed_dir / "rl")[0].rl
        return {"directions": rl.directions, "prompt_sentences": rl.prompt_sentences}
    return {}


def plan_grid(
    algorithms=ALGORITHMS, kls=KL_REGIMES, seeds=(0, 1, 2), seeded=SEEDED, overlong: bool = True
) -> list[GridRun]:
    """Every algorithm x KL cell on the first seed, the `seeded` algorithms' cells on every seed,
    and (with DAPO and KL none in the grid) DAPO with the overlong penalty; first seeds first."""
    runs = [
        GridRun(a, kl, s) for s in seeds for a in algorithms for kl in kls if s == seeds[0] or a in seeded
    ]
    if overlong and "dapo" in algorithms and "none" in kls:
        runs.insert(len(algorithms) * len(kls), GridRun("dapo", "none", seeds[0], overlong=True))
    return runs


def is_complete(out: Path, run: GridRun, steps: int) -> bool:
    history = read_metrics(out / run.name / "metrics.jsonl")
    return len(history) >= steps and history[-1]["step"] >= steps


def run_grid(runs: list[GridRun], setup: GridSetup, out: str | Path, steps: int, workers: int = 2,
             threads: int = 1, log=print) -> float:  # fmt: skip
    """Run every incomplete run (`workers` at a time, `threads` each); returns the wall seconds."""
    out = Path(out)
    todo = [run for run in runs if not is_complete(out, run, steps)]
    log(
        f"grid: {len(runs)} runs x {steps} steps, {len(runs) - len(todo)} done before, {workers} at a time -> {out}"
    )
    start = time.time()

    def one(run: GridRun) -> None:
        (out / run.name / "metrics.jsonl").unlink(missing_ok=True)  # a partial run starts over
        t0 = time.time()
        run_logged([*torchrun("train_vepo.py"), *setup.overrides(run, steps, out)], out / run.name / "train.log",
                   threads)  # fmt: skip
        done = sum(is_complete(out, r, steps) for r in runs)
        eta = (time.time() - start) / max(done - (len(runs) - len(todo)), 1) * (len(runs) - done)
        log(f"grid: {run.name} {time.time() - t0:.0f} s | {done}/{len(runs)} done | eta {eta / 60:.0f} min")

    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(one, run) for run in todo]
        try:
            for future in futures:
                future.result()
        except BaseException:
            pool.shutdown(cancel_futures=True)  # the runs already started finish; no new one starts
            raise
    return time.time() - start


def _window(history: list[dict], key: str, last: bool, frac: float = 0.1) -> float | None:
    values = [row[key] for row in history if key in row]
    if not values:
        return None
    n = max(3, round(frac * len(values)))
    part = values[-n:] if last else values[:n]
    return sum(part) / len(part)


def read_histories(runs: list[GridRun], out: str | Path) -> dict[GridRun, list[dict]]:
    """Each run's per-step rows, for the runs that logged any."""
    histories = {run: read_metrics(Path(out) / run.name / "metrics.jsonl") for run in runs}
    return {run: rows for run, rows in histories.items() if rows}


def grid_records(histories: dict[GridRun, list[dict]]) -> list[dict]:
    """One record per run (reports/toy/grid.json): the first and last values are means over the
    first and last 10% of steps (at least 3), so one noisy step does not decide them."""
    records = []
    for run, history in histories.items():
        entropy = [row["rollout/entropy"] for row in history]
        records.append({
            "name": run.name, "algorithm": run.algorithm + ("-overlong" if run.overlong else ""),
            "kl": run.kl, "seed": run.seed, "steps": history[-1]["step"],
            "entropy_first": _window(history, "rollout/entropy", False),
            "entropy_last": _window(history, "rollout/entropy", True), "entropy_min": min(entropy),
            "length_first": _window(history, "rollout/len_mean", False),
            "length_last": _window(history, "rollout/len_mean", True),
            "reward_first": _window(history, "reward/total", False),
            "reward_last": _window(history, "reward/total", True),
        })  # fmt: skip
    return records
