"""The paper's RL grid at toy scale: 6 algorithms x KL {none, k3} from the toy's SFT checkpoint,
seeds for the cells the claims compare, two twins (DAPO with the overlong penalty, REINFORCE++ with a
per-prompt baseline), and VEPO with one part removed at a time (the ablations), each on every seed.

    runs = plan_grid(seeds=[0, 1, 2])
    run_grid(runs, GridSetup.from_toy("runs/toy/seed0"), "reports/toy/grid_runs", steps=200, workers=2)
    records = grid_records(read_histories(runs, "reports/toy/grid_runs"),
                           read_heldout(runs, "reports/toy/grid_runs"))     # -> reports/toy/grid.json

Every run is tools/train_vepo.py with recipes/toy/configs/rl.yaml and the same overrides except
what defines its algorithm (rl.loss.name; DAPO also turns on dynamic sampling), its KL estimator,
for a twin the field that makes it (TWINS), and for an ablation the one field that removes
its part (ABLATIONS). The settings are those under which the paper's mechanisms act: several
optimizer updates per rollout batch (ratios leave 1, the clips act), K > G candidates with RLVR
filtering on (it removes some; the recipe's own RL stage trains unfiltered), the recipe's sampling
temperature, and its learning rate spread over the updates of a batch (GridSetup.lr). The
reference pass runs every step, so rl/kl_k1..k3 are measured in every run, KL optimised or not.

With validation sentences (the toy's rl.eval_sentences), every run is validated and checkpointed
every eval_interval steps; when it ends, the checkpoint with the best validation score (the toy
recipe's SELECTION) is evaluated greedily on FLORES devtest (OUT/<name>/heldout.jsonl, the step
in selected.json) and the checkpoints are deleted, except VEPO without KL's (the decision-point
study reads the first it finds and keeps its result, decision.json, beside the run's records).
Runs write OUT/<name>/metrics.jsonl; a run whose metrics hold every step (and whose held-out
records exist, with validation) is skipped and an interrupted one resumes from its newest
checkpoint, so rerunning continues the grid.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from functools import cache
from pathlib import Path
from statistics import fmean

from recipes.toy.recipe import CONFIGS, TOOLS, run_logged, select_checkpoint, torchrun
from vepo_mcore.config.rl import LossConfig
from vepo_mcore.training.logging import read_metrics

ALGORITHMS = ("vepo", "ppo", "grpo", "dapo", "rloo", "reinforce_pp")
KL_REGIMES = ("none", "k3")
"""KL regimes planned by default; "k2" can be added (every run measures k1, k2 and k3 either way)."""
SEEDED = ("vepo", "grpo")
"""The algorithms run on every seed (the claims compare them); the others run on the first."""
FULL = "full"
ABLATIONS: dict[str, tuple[str, str]] = {
    "no_entropy_shaping": ("rl.loss.vepo.alpha", "0"),
    "no_entropy_bonus": ("rl.loss.vepo.beta", "0"),
    "tau1_ratio": ("rl.loss.ratio_mode", "untempered"),
    "symmetric_clip": ("rl.loss.eps_high", str(LossConfig().eps_low)),
    "group_std": ("rl.loss.vepo.std_scope", "group"),
    "seq_mean": ("rl.loss.loss_agg", "seq_mean"),
}
"""VEPO with one part removed -> the one field (and value) that removes it: alpha = 0 (no entropy
shaping of the advantage), beta = 0 (no entropy bonus), ratios of the tau-1 policies instead of the
tempered ones, eps_high = eps_low, the reward std of each prompt's group instead of the rollout
batch's, the mean of per-response token means instead of the token mean."""
TWINS: dict[str, tuple[str, str]] = {
    "overlong": ("dapo", "rl.loss.dapo.overlong_buffer"),
    "baseline": ("reinforce_pp", "rl.loss.reinforce_pp.baseline"),
}
"""A second arm of one algorithm on the first seed at KL none -> (algorithm, the field that makes it):
DAPO with the soft overlong penalty (the overlong study; its buffer GridSetup.overlong_buffer) and
REINFORCE++ with each prompt's mean reward as its baseline ('group': REINFORCE++-baseline), the arm
that tells whether REINFORCE++'s losses come from comparing every answer with the whole batch."""
TWIN_VALUES = {"baseline": "group"}
"""The value of each twin's field, where the grid's setup does not set it."""
ABLATION_KL = "none"
"""The KL regime of the ablations (and of the full VEPO runs they are compared with)."""
KL_ARM = ("group_std", "k3")
"""An ablation that also runs with a KL regime in the loss, on every seed: (variant, KL). VEPO with k3
gains less devtest chrF++ than GRPO with k3; VEPO divides advantages by the rollout batch's reward std,
which holds the spread between prompts as well as within them, so its advantages are smaller and the
KL term weighs more. VEPO with the group std and k3 is the run that tells (claims.claim_kl_arm)."""


@cache
def recipe_rl(*keys: str):
    """A value of the toy recipe's RL config (configs/rl.yaml), e.g. recipe_rl("training", "seed")."""
    import yaml

    value = yaml.safe_load((CONFIGS / "rl.yaml").read_text())
    for key in keys:
        value = value[key]
    return value


def recipe_batch_lr() -> float:
    """The recipe's learning rate times its optimizer updates per rollout batch."""
    return (
        recipe_rl("training", "optimizer", "lr")
        * recipe_rl("rl", "mini_batches")
        * recipe_rl("rl", "ppo_epochs")
    )


@dataclass(frozen=True)
class GridRun:
    """One RL run of the grid."""

    algorithm: str
    kl: str
    seed: int
    twin: str = ""
    """The algorithm's second arm this run is (a key of TWINS), or "" for the algorithm itself."""
    variant: str = FULL
    """The VEPO part this run removes (a key of ABLATIONS), or "full"."""

    def __post_init__(self) -> None:
        if self.variant != FULL and (self.variant not in ABLATIONS or self.algorithm != "vepo"):
            raise ValueError(
                f"grid run variant {self.variant!r} of {self.algorithm!r}: variants are ablations of VEPO, "
                f"one of {sorted(ABLATIONS)} (or {FULL!r})"
            )
        if self.twin and TWINS.get(self.twin, ("",))[0] != self.algorithm:
            raise ValueError(f"grid run twin {self.twin!r} of {self.algorithm!r}: twins are {TWINS}")

    @property
    def name(self) -> str:
        return f"{self.label}{'' if self.variant == FULL else f'-{self.variant}'}_kl-{self.kl}_s{self.seed}"

    @property
    def label(self) -> str:
        """The algorithm, and the twin it is ('dapo-overlong'): grid.json's algorithm field."""
        return f"{self.algorithm}-{self.twin}" if self.twin else self.algorithm

    @property
    def keeps_checkpoint(self) -> bool:
        return self.algorithm == "vepo" and self.kl == "none" and not self.twin and self.variant == FULL


@dataclass(frozen=True)
class GridSetup:
    """What every run shares: the SFT checkpoint, its tokenizer, the prompts and the settings."""

    sft: Path
    tokenizer: Path
    vocab_size: int
    directions: str = "en-th,en-vi,th-en,vi-en"
    prompt_sentences: str = ":"
    eval_sentences: str = ""
    """Validation sentences (rl.eval_sentences, the toy's: the RL prompts' held-out tail); "" = no
    validation, no checkpoint choice and no held-out evaluation."""
    temperature: float = field(default_factory=lambda: recipe_rl("rl", "rollout", "sampling", "temperature"))
    """The recipe's tau for sampling, old log-probs and loss: where its entropy falls (0.4)."""
    kl_coef: float = 0.05
    """KL coefficient of the runs that optimise one (k1/k2/k3)."""
    lr: float | None = None
    """Constant learning rate; None: the recipe's, scaled by its updates per rollout batch over the
    run's (`update_lr`), so that a rollout batch moves the policy as far as the recipe's updates of
    one batch do. Four updates a batch at 1e-4 each drop the toy's validation overall from 92 to 50
    within 40 steps (VEPO without KL, seed 0)."""
    mini_batches: int = 4
    """Optimizer updates per rollout batch and epoch (the 7B recipe: 4). With one, every update is
    on-policy, the ratio is 1 and no clip (PPO's, DAPO's and VEPO's clip-higher) ever acts."""
    ppo_epochs: int = 1
    """Passes over each rollout batch."""
    micro_batch_size: int = 8
    """Responses per micro-batch: a mini-batch (prompts_per_step * group_size / mini_batches) must
    split into whole ones."""
    num_candidates: int = 8
    """K candidates sampled per prompt, of which RLVR filtering keeps group_size (the 7B recipe: 8)."""
    group_size: int = 4
    """G responses per prompt trained on."""
    eval_interval: int = 40
    """RL steps between validations (and the checkpoints they choose from)."""
    heldout_sentences: int = 150
    """FLORES devtest sentences per direction of the held-out evaluation (the toy recipe's)."""
    max_new_tokens: int = field(
        default_factory=lambda: recipe_rl("rl", "rollout", "sampling", "max_new_tokens")
    )
    """Response length cap of the rollouts and the held-out evaluation: the recipe's."""
    overlong_buffer: int = 16
    """DAPO's soft overlong buffer in the overlong arm (tokens before the cap where the penalty grows)."""
    bf16: bool = field(default_factory=lambda: recipe_rl("training", "bf16"))
    """The runs' precision: the SFT checkpoint's (from_toy), as the toy's own RL stage trains in
    the precision of the chain before it (recipe.precision_flags)."""
    extra: tuple[str, ...] = ()
    """Dotted overrides every run takes last (--rl.prompts_per_step 4)."""

    @classmethod
    def from_toy(cls, seed_dir: str | Path, **settings) -> GridSetup:
        """The setup of one toy seed (tools/run_toy.py): its SFT checkpoint, the tokenizer that
        checkpoint was trained with, and its RL stage's prompts and validation (toy_rl_prompts)."""
        from vepo_mcore.training.checkpointing import checkpoint_config

        seed_dir = Path(seed_dir)
        if not (seed_dir / "sft").is_dir():
            raise FileNotFoundError(
                f"{seed_dir / 'sft'} does not exist: the grid starts from a toy seed's SFT checkpoint; "
                f"make it with `python tools/run_toy.py --out {seed_dir.parent} --seeds "
                f"{seed_dir.name.removeprefix('seed')} --until sft --iters sft=2500` (the SFT the committed "
                "runs start from; ~45 min on 2 cores)"
            )
        sft_cfg, _ = checkpoint_config(seed_dir / "sft")
        return cls(sft=seed_dir / "sft", tokenizer=Path(sft_cfg.tokenizer.path), vocab_size=sft_cfg.model.vocab_size,
                   bf16=sft_cfg.training.bf16, **{**toy_rl_prompts(seed_dir), **settings})  # fmt: skip

    @property
    def validates(self) -> bool:
        return bool(self.eval_sentences)

    @property
    def update_lr(self) -> float:
        """The learning rate of every optimizer update (see `lr`)."""
        if self.lr is not None:
            return self.lr
        return recipe_batch_lr() / (self.mini_batches * self.ppo_epochs)

    def settings(self, steps: int) -> dict:
        """What makes two runs of one algorithm, KL and seed the same experiment: every setting but
        the checkpoint's location (start.json holds it beside the weights' fingerprint)."""
        shared = {
            f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("sft", "tokenizer", "lr")
        }
        return {**shared, "extra": list(self.extra), "lr": self.update_lr, "steps": steps}

    def overrides(self, run: GridRun, steps: int, out: Path) -> list[str]:
        flags = [
            "--config", str(CONFIGS / "rl.yaml"), "--tokenizer.path", str(self.tokenizer),
            "--model.vocab_size", str(self.vocab_size), "--training.checkpoint.load", str(self.sft),
            "--training.train_iters", str(steps), "--training.seed", str(1000 + run.seed),
            "--training.logging.metrics_jsonl", str(out / run.name / "metrics.jsonl"),
            "--rl.directions", self.directions, "--rl.prompt_sentences", self.prompt_sentences,
            "--rl.loss.name", run.algorithm, "--rl.kl.estimator", run.kl, "--rl.kl.coef", str(self.kl_coef),
            "--rl.kl.measure_interval", "1", "--rl.mini_batches", str(self.mini_batches),
            "--rl.ppo_epochs", str(self.ppo_epochs), "--training.micro_batch_size", str(self.micro_batch_size),
            "--rl.filtering.enabled", "true", "--rl.filtering.num_candidates", str(self.num_candidates),
            "--rl.filtering.group_size", str(self.group_size),
            "--training.optimizer.lr", str(self.update_lr), "--training.optimizer.min_lr", str(self.update_lr),
            "--rl.rollout.sampling.temperature", str(self.temperature),
            "--rl.rollout.sampling.max_new_tokens", str(self.max_new_tokens),
            "--training.bf16", str(self.bf16).lower(),
        ]  # fmt: skip
        if run.algorithm == "dapo":
            flags += ["--rl.filtering.dynamic_sampling", "true"]
        if run.twin:
            value = str(self.overlong_buffer) if run.twin == "overlong" else TWIN_VALUES[run.twin]
            flags += [f"--{TWINS[run.twin][1]}", value]
        if run.variant != FULL:
            field_name, value = ABLATIONS[run.variant]
            flags += [f"--{field_name}", value]
        if self.validates:
            every = str(self.eval_interval)
            flags += ["--rl.eval_sentences", self.eval_sentences, "--training.eval_interval", every,
                      "--training.checkpoint.save_interval", every, "--training.checkpoint.keep_last", "0"]  # fmt: skip
        if self.validates or run.keeps_checkpoint:
            flags += ["--training.checkpoint.save", str(out / run.name / "checkpoint")]
        return [*flags, *self.extra]

    def heldout_command(self, checkpoint: Path, records: Path) -> list[str]:
        """tools/eval_heldout.py on FLORES devtest, as the toy recipe evaluates its RL policy."""
        return [sys.executable, str(TOOLS / "eval_heldout.py"), "--checkpoint", str(checkpoint),
                "--directions", self.directions, "--max-sentences", str(self.heldout_sentences),
                "--max-new-tokens", str(self.max_new_tokens), "--out", str(records)]  # fmt: skip


def toy_rl_prompts(seed_dir: Path) -> dict[str, str]:
    """The directions, prompt sentences and validation sentences of a toy seed's RL stage: those
    run_toy planned (rl_prompts.json; the recipe validates on the dev sentences after the prompts'
    range, so a range with an end gives the validation "END:"), or else those its RL run used; {}
    when neither is there."""
    from vepo_mcore.training.checkpointing import checkpoint_config

    if (seed_dir / "rl_prompts.json").is_file():
        planned = json.loads((seed_dir / "rl_prompts.json").read_text())
        stop = planned["prompt_sentences"].partition(":")[2]
        return {**planned, "eval_sentences": f"{stop}:" if stop else ""}
    if (seed_dir / "rl" / "config.yaml").is_file():
        rl = checkpoint_config(seed_dir / "rl")[0].rl
        return {"directions": rl.directions, "prompt_sentences": rl.prompt_sentences,
                "eval_sentences": rl.eval_sentences}  # fmt: skip
    return {}


def plan_grid(
    algorithms=ALGORITHMS, kls=KL_REGIMES, seeds=(0, 1, 2), seeded=SEEDED, twins=tuple(TWINS),
    ablations=tuple(ABLATIONS),
) -> list[GridRun]:  # fmt: skip
    """Per seed, first seeds first: every algorithm x KL cell on the first seed and the `seeded`
    algorithms' cells on every seed; after the first seed's cells its `twins` (each where its
    algorithm and KL none are in the grid); then that seed's VEPO ablations at ABLATION_KL, and the
    KL_ARM ablation at its KL (where both are planned)."""
    runs = []
    for seed in seeds:
        runs += [GridRun(a, kl, seed) for a in algorithms for kl in kls if seed == seeds[0] or a in seeded]
        if seed == seeds[0] and "none" in kls:
            runs += [GridRun(TWINS[t][0], "none", seed, twin=t) for t in twins if TWINS[t][0] in algorithms]
        runs += [GridRun("vepo", ABLATION_KL, seed, variant=v) for v in ablations]
        if KL_ARM[0] in ablations and KL_ARM[1] in kls:
            runs.append(GridRun("vepo", KL_ARM[1], seed, variant=KL_ARM[0]))
    return runs


def report_plan(runs: list[GridRun]) -> list[GridRun]:
    """The runs a report covers: the default plan's and `runs`, so that a grid run on a subset
    (--algorithms ppo) still reports on every finished run of its folder, not on the subset alone."""
    return list(dict.fromkeys([*plan_grid(), *runs]))


def is_complete(out: Path, run: GridRun, steps: int, heldout: bool = False) -> bool:
    """Whether the run's metrics hold every step (and, with `heldout`, its held-out records exist)."""
    history = read_metrics(out / run.name / "metrics.jsonl")
    done = len(history) >= steps and history[-1]["step"] >= steps
    return done and (not heldout or (out / run.name / "heldout.jsonl").is_file())


START = "start.json"
"""A grid folder's record of what its runs share: the SFT checkpoint they started from (path and
weights' fingerprint) and the settings they ran with (GridSetup.settings)."""


SFT_HELDOUT = "sft_heldout.jsonl"
"""The SFT checkpoint's held-out records on the runs' sentences (the same command as a run's): the
held-out table's first row and the base of every run's paired interval."""


def weights_fingerprint(checkpoint: Path) -> str:
    """A short hash of a checkpoint's weight files (their sha256 from its integrity record, or read):
    the same weights give the same fingerprint wherever the checkpoint lives."""
    from vepo_mcore.training.checkpointing import INTEGRITY_FILE, file_digest, resolve_checkpoint

    path = resolve_checkpoint(checkpoint)
    if path is None:
        raise FileNotFoundError(f"{checkpoint} holds no checkpoint (no latest_checkpointed_iteration.txt)")
    record = path / INTEGRITY_FILE
    if record.is_file():
        files = json.loads(record.read_text())["files"]
        hashes = {name: f["sha256"] for name, f in files.items() if name.endswith(".distcp")}
    else:
        hashes = {p.name: file_digest(p) for p in path.glob("*.distcp")}
    return hashlib.sha256(json.dumps(sorted(hashes.items())).encode()).hexdigest()[:16]


def machine_name() -> str:
    """This machine as start.json records it: the CPU's model, AMX or not, torch's version. A
    checkpoint trained again on another kind of CPU (or in another precision) differs in its last
    bits, so the fingerprint check refuses it."""
    import platform

    import torch

    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []
    cpu = next((line.partition(":")[2].strip() for line in lines if line.startswith("model name")), "")
    amx = "AMX" if torch.cpu._is_amx_tile_supported() else "no AMX"
    return f"{cpu or platform.processor() or 'unknown CPU'}, {amx}, torch {torch.__version__}"


def check_start(out: Path, sft: Path, settings: dict | None = None) -> None:
    """Refuse to add runs to a grid folder whose runs started from other weights or ran with other
    settings (a grid compares runs that differ in their algorithm, KL, seed and variant only); record
    the starting point and settings of a new one in out/start.json."""
    fingerprint, file, settings = weights_fingerprint(sft), out / START, settings or {}
    if file.is_file():
        recorded = json.loads(file.read_text())
        if recorded["fingerprint"] != fingerprint:
            made_on = f", on {recorded['machine']}" if "machine" in recorded else ""
            raise ValueError(
                f"{out}: its runs started from {recorded['sft']} (weights {recorded['fingerprint']}{made_on}), this "
                f"grid from {sft} (weights {fingerprint}, here on {machine_name()}); a checkpoint trained again on "
                f"another kind of CPU or in another precision differs in its last bits. Move {out} aside or pass "
                "--out to start the grid afresh"
            )
        if "settings" not in recorded:
            raise ValueError(f"{file} records no settings: which settings its runs ran with is unknown; "
                             f"move {out} aside or pass --out to start the grid afresh")  # fmt: skip
        before = recorded["settings"]
        changed = sorted(k for k in {*before, *settings} if before.get(k) != settings.get(k))
        if changed:
            diffs = ", ".join(f"{k} {before.get(k)!r} -> {settings.get(k)!r}" for k in changed)
            raise ValueError(f"{out}: its runs ran with other settings ({diffs}); pass the same settings, "
                             f"or move {out} aside or pass --out to start the grid afresh")  # fmt: skip
        return
    if any(p.is_dir() for p in out.glob("*_kl-*")):
        raise ValueError(f"{out} holds runs but no {START}: which SFT checkpoint they started from is unknown; "
                         f"move {out} aside or pass --out")  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    record = {"sft": str(sft), "fingerprint": fingerprint, "machine": machine_name(), "settings": settings}
    file.write_text(json.dumps(record, indent=1) + "\n")


def run_grid(runs: list[GridRun], setup: GridSetup, out: str | Path, steps: int, workers: int = 2,
             threads: int = 1, log=print) -> float:  # fmt: skip
    """Run every incomplete run (`workers` at a time, `threads` each), then its held-out evaluation
    at the validation-chosen checkpoint; returns the wall seconds."""
    out = Path(out)
    check_start(out, setup.sft, setup.settings(steps))
    if setup.validates and not (out / SFT_HELDOUT).is_file():
        run_logged(setup.heldout_command(setup.sft, out / SFT_HELDOUT), out / "sft_heldout.log", threads)
    todo = [run for run in runs if not is_complete(out, run, steps, setup.validates)]
    log(
        f"grid: {len(runs)} runs x {steps} steps, {len(runs) - len(todo)} done before, {workers} at a time -> {out}"
    )
    start = time.time()

    def one(run: GridRun) -> None:
        run_dir, t0 = out / run.name, time.time()
        checkpoints = run_dir / "checkpoint"
        if not is_complete(out, run, steps) or (setup.validates and not checkpoints.is_dir()):
            # An interrupted run resumes from its newest checkpoint (the trainer drops the metrics rows
            # after it; resume is exact, tests/faults); without one it trains again from the SFT weights.
            run_logged([*torchrun("train_vepo.py"), *setup.overrides(run, steps, out)], run_dir / "train.log",
                       threads)  # fmt: skip
        if setup.validates:
            chosen = select_checkpoint(checkpoints, run_dir / "metrics.jsonl", run_dir / "selected.json")
            run_logged(
                setup.heldout_command(chosen, run_dir / "heldout.jsonl"), run_dir / "heldout.log", threads
            )
            if not run.keeps_checkpoint:
                shutil.rmtree(checkpoints)
        done = sum(is_complete(out, r, steps, setup.validates) for r in runs)
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


def _over_steps(history: list[dict], key: str, reduce) -> float | None:
    values = [row[key] for row in history if key in row]
    return reduce(values) if values else None


def half_entropy_step(history: list[dict], window: int = 5) -> int | None:
    """The first step whose mean sampled entropy over the last `window` steps is below half the run's
    first 10% window (entropy_first): where the run collapses by the claims' rule; None if it never does."""
    start = _window(history, "rollout/entropy", False)
    rows = [row for row in history if "rollout/entropy" in row]
    for i in range(window - 1, len(rows)):
        if sum(row["rollout/entropy"] for row in rows[i - window + 1 : i + 1]) / window < 0.5 * start:
            return rows[i]["step"]
    return None


def read_histories(runs: list[GridRun], out: str | Path) -> dict[GridRun, list[dict]]:
    """Each run's per-step rows, for the runs that logged any."""
    histories = {run: read_metrics(Path(out) / run.name / "metrics.jsonl") for run in runs}
    return {run: rows for run, rows in histories.items() if rows}


def heldout_summary(records: list[dict]) -> dict:
    """eval.heldout.summarize of a run's held-out records, with the overall pass rate of its worst
    direction ("worst_overall_pass") and which direction that is ("worst_direction")."""
    from vepo_mcore.eval.heldout import by_direction, summarize

    per_direction = by_direction(records, ("overall_pass",))
    worst = min(per_direction, key=per_direction.__getitem__)
    return {
        **summarize(records),
        "worst_overall_pass": per_direction[worst],
        "worst_direction": worst.split("/")[0],
    }


def read_heldout(runs: list[GridRun], out: str | Path) -> dict[GridRun, dict]:
    """Each evaluated run's held-out summary (eval.heldout.summarize of heldout.jsonl) with the
    validation-chosen step it was taken at ("step") and, where the grid evaluated its SFT checkpoint
    (SFT_HELDOUT), the paired 95% intervals of the run minus the SFT policy ("delta_ci95")."""
    from vepo_mcore.eval.heldout import paired_deltas, read_records

    sft_file = Path(out) / SFT_HELDOUT
    sft = read_records(sft_file) if sft_file.is_file() else None
    summaries = {}
    for run in runs:
        run_dir = Path(out) / run.name
        if (run_dir / "heldout.jsonl").is_file():
            selected = run_dir / "selected.json"
            step = json.loads(selected.read_text())["step"] if selected.is_file() else None
            records = read_records(run_dir / "heldout.jsonl")
            summaries[run] = {**heldout_summary(records), "step": step,
                              "delta_ci95": paired_deltas(sft, records) if sft else {}}  # fmt: skip
    return summaries


def grid_records(
    histories: dict[GridRun, list[dict]], heldout: dict[GridRun, dict] | None = None
) -> list[dict]:
    """One record per run (reports/toy/grid.json): the first and last values are means over the
    first and last 10% of steps (at least 3), so one noisy step does not decide them; maxima and
    means are over every step (adv_std_mean: the advantages' std, rl/adv_std; kl_k3_last: the k3
    estimate of KL(policy || reference) at the end); heldout_* are the devtest scores at the
    validation-chosen step (None when the run has none; heldout_overall_worst the overall pass of the
    worst direction, heldout_worst_direction), *_delta_ci95 their paired 95% intervals against the
    SFT policy."""
    records = []
    for run, history in histories.items():
        entropy = [row["rollout/entropy"] for row in history]
        scores = (heldout or {}).get(run, {})
        records.append({
            "name": run.name, "algorithm": run.label,
            "variant": run.variant, "kl": run.kl, "seed": run.seed, "steps": history[-1]["step"],
            "entropy_first": _window(history, "rollout/entropy", False),
            "entropy_last": _window(history, "rollout/entropy", True), "entropy_min": min(entropy),
            "entropy_half_step": half_entropy_step(history),
            "length_first": _window(history, "rollout/len_mean", False),
            "length_last": _window(history, "rollout/len_mean", True),
            "reward_first": _window(history, "reward/total", False),
            "reward_last": _window(history, "reward/total", True),
            "clip_fraction_max": _over_steps(history, "rl/clip_frac", max),
            "ratio_max": _over_steps(history, "rl/ratio_max", max),
            "filtered_share_mean": _over_steps(history, "filter/filtered_share", fmean),
            "group_chrf_first": _window(history, "rollout/group_chrf", False),
            "group_chrf_last": _window(history, "rollout/group_chrf", True),
            "entropy_len_corr_mean": _over_steps(history, "rollout/entropy_len_corr", fmean),
            "kl_k3_last": _window(history, "rl/kl_k3", True), "adv_std_mean": _over_steps(history, "rl/adv_std", fmean),
            "heldout_chrf": scores.get("chrf"), "heldout_chrf_source": scores.get("chrf_source"),
            "heldout_same_opening": scores.get("same_opening"), "heldout_overall": scores.get("overall_pass"),
            "heldout_overall_worst": scores.get("worst_overall_pass"),
            "heldout_worst_direction": scores.get("worst_direction"), "heldout_step": scores.get("step"),
            "heldout_chrf_delta_ci95": scores.get("delta_ci95", {}).get("chrf"),
            "heldout_chrf_source_delta_ci95": scores.get("delta_ci95", {}).get("chrf_source"),
        })  # fmt: skip
    return records


def set_flags(items: list[str]) -> list[str]:
    """run_grid's `--set FIELD=VALUE` items -> dotted flags for every run."""
    flags = []
    for item in items:
        field_name, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set {item!r}: expected FIELD=VALUE")
        flags += [f"--{field_name}", value]
    return flags


def timed_grid(
    runs: list[GridRun],
    setup: GridSetup,
    out: str | Path,
    steps: int,
    workers: int,
    threads: int,
    report_only: bool = False,
) -> float | None:
    """Run the grid (unless report_only) and add its wall time to OUT/wall_s.json; returns the total
    wall seconds every call has spent on it (None before the first)."""
    wall_file = Path(out) / "wall_s.json"
    if not report_only:
        wall = run_grid(runs, setup, out, steps, workers, threads)
        previous = json.loads(wall_file.read_text())["wall_s"] if wall_file.is_file() else 0.0
        wall_file.write_text(json.dumps({"wall_s": previous + wall, "workers": workers, "threads": threads}))
    return json.loads(wall_file.read_text())["wall_s"] if wall_file.is_file() else None
