"""The toy recipe: the paper's whole chain on 2 CPU cores, driven by recipes/toy/configs/*.yaml.

    run_toy(ToyPlan(out="runs/toy", seeds=[0, 1, 2]))      # tools/run_toy.py

Shared by every seed (built once, in OUT/shared):
  1  tokenizer  expand Qwen2.5 for the 8 languages (tools/expand_tokenizer.py on FLORES dev), then
                trim the stock and the expanded tokenizers to the ids the toy's data uses
                (tokenizer/trim.py): the "base" vocabulary (English) and the toy's vocabulary,
                whose first ids are the base's, so the embedding resize applies;
     bitext     (with plan.bitext) English <-> X parallel text from Debian localisation packages
                (tools/build_parallel_corpus.py; its 500 held-out pairs per language are the
                in-domain test set)
     data       SFT conversations of the toy's directions and the CPT corpora: FLORES dev, plus
                the parallel text in both directions (SFT) and as monolingual documents (CPT).
  0  base       a short English pretraining with the base vocabulary (the toy's "Qwen2.5"; one for
                every seed, as every seed of the 7B recipe starts from the same released model)
Per seed (OUT/seed<N>):
  1b resize     tools/resize_embeddings.py to the toy's vocabulary (new rows = mean of pieces)
  2  cpt        1:1 English : (th, vi), the expanded vocabulary
  3  sft        translation SFT in the toy's directions
  4  rl         VEPO on dev prompts (tools/train_vepo.py), validated on held-out dev prompts every
                rl_eval_interval steps with rl_validation
  5  eval       greedy held-out evaluation on FLORES devtest (tools/eval_heldout.py) of the policy
                before SFT (the CPT checkpoint), after SFT and after RL (with rl_validation: the
                RL checkpoint with the best validation score); with plan.bitext also of the SFT and
                RL policies on the in-domain held-out pairs

Every stage is the same entry script the 7B recipe runs; only the configs differ. A stage whose
output exists is skipped and the training stages resume their own checkpoints, so rerunning the
command continues an interrupted run. Stage wall times go to OUT/seed<N>/timings.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from vepo_mcore.eval.heldout import read_records, write_records
from vepo_mcore.languages import EXPANDED_LANGS, flores_path, load_flores
from vepo_mcore.training.checkpointing import checkpoint_config, iteration_dir, resolve_checkpoint
from vepo_mcore.translation.directions import parse_directions

CONFIGS = Path(__file__).resolve().parent / "configs"
TOOLS = Path(__file__).resolve().parents[2] / "tools"
"""The entry scripts every stage runs: a recipe lives in the checkout, beside tools/."""


@dataclass(kw_only=True)
class ToyPlan:
    """What run_toy runs; the stage budgets default to the configs' train_iters."""

    out: Path
    seeds: list[int] = field(default_factory=lambda: [0])
    directions: str = "en-th,en-vi,th-en,vi-en"
    nproc: int = 1
    """Training processes (DP); the toy is fastest as one process with both cores' threads."""
    threads: int = 2
    iters: dict[str, int] = field(default_factory=dict)
    """stage (base, cpt, sft, rl) -> train_iters override."""
    overrides: dict[str, list[str]] = field(default_factory=dict)
    """stage (base, cpt, sft, rl, or all) -> extra dotted overrides (--rl.loss.name grpo ...)."""
    eval_sentences: int = 150
    max_new_tokens: int = 96
    rl_holdout: int = 0
    """> 0: the last N FLORES dev sentences leave the SFT data and are the RL prompts (the
    tokenizer and CPT still see all of dev); 0: SFT and RL share all of dev."""
    sft_window: int = 1
    """> 1: SFT also trains on runs of 2..sft_window consecutive sentences, joined
    (data.sft_flores.direction_examples); the vocabulary is trimmed on single sentences either way."""
    rl_validation: int = 0
    """> 0: the last N RL prompt sentences are held out of RL as its validation set
    (rl.eval_sentences), scored every rl_eval_interval steps, each of those checkpoints kept; the
    held-out evaluation then takes the one with the best validation overall pass + chrF++
    (OUT/seed<N>/rl_selected.json). Needs rl_holdout > N. 0: the last RL checkpoint."""
    rl_eval_interval: int = 40
    """RL steps between validations (with rl_validation)."""
    bitext: bool = False
    """Add the parallel text of tools/build_parallel_corpus.py (Debian packages, fetched with
    apt-get into bitext_cache) to CPT and SFT; False: FLORES dev only (the quickstart)."""
    bitext_cache: Path = Path.home() / ".cache" / "vepo_mcore" / "debs"
    bitext_pairs: int = 30_000
    """Parallel pairs per language used (the first N of its shuffled train.jsonl): keeps languages
    with more text from outweighing the others."""
    bitext_weight: float = 0.7
    """SFT share of the parallel-text conversations (the rest: the FLORES dev directions)."""
    name_swap: float = 0.0
    """> 0: this SFT share goes to the SFT conversations whose names are swapped for made-up ones
    (data/name_swap.py), the other sources keep their ratio; 0: none."""
    vocab_min_count: int = 1
    """The toy's vocabularies keep the ids their data uses at least this often (tokenizer/trim.py);
    rarer words encode into shorter pieces, so the output layer stays small as the data grows."""
    until: str = "rl"
    """The last training stage of a seed (resize, cpt, sft or rl); the evaluations of the stages
    run still run. "sft" makes what the grid starts from."""
    log: object = sys.stdout

    @property
    def langs(self) -> list[str]:
        directions = parse_directions(self.directions)
        return sorted({d.src for d in directions} | {d.tgt for d in directions})


def thread_env(threads: int) -> dict[str, str]:
    """The environment of a child process limited to `threads` compute threads."""
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
            "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip


def run_logged(args: list[str], log_file: Path, threads: int) -> None:
    """Run a command with its output appended to log_file; a failure raises with the log's tail."""
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with log_file.open("a", encoding="utf-8") as log:
        result = subprocess.run(args, stdout=log, stderr=subprocess.STDOUT, env=thread_env(threads))
    if result.returncode:
        excerpt = failure_excerpt(log_file.read_text(encoding="utf-8", errors="replace"))
        raise RuntimeError(
            f"{' '.join(args[:4])} ... failed ({result.returncode}); log {log_file}:\n{excerpt}"
        )


def failure_excerpt(log: str, lines: int = 15) -> str:
    """The last Python traceback in a child's log that is not torchrun's own ChildFailedError (which
    follows the worker's and says nothing of the cause), else the error lines a tools/ script prints
    for a user's mistake (config.cli: "error: ..."), else the log's last `lines` lines."""
    blocks = log.split("Traceback (most recent call last)")[1:]
    for block in reversed(blocks):
        body = block.splitlines(True)
        # the block ends at its exception line: the first line after the frames not indented
        end = next(
            (i for i, line in enumerate(body[1:], 1) if line.strip() and not _is_frame(line)), len(body) - 1
        )
        if "ChildFailedError" not in body[end]:
            return "Traceback (most recent call last)" + "".join(body[: end + 1][-2 * lines :])
    errors = [line for line in log.splitlines(True) if _untagged(line).lower().startswith("error: ")]
    if errors:
        return "".join(errors[-lines:])
    return "".join(log.splitlines(True)[-lines:])


def _untagged(line: str) -> str:
    """A log line without torchrun's "[rankN]: " prefix."""
    return line.split("]: ", 1)[1] if line.startswith("[rank") and "]: " in line else line


def _is_frame(line: str) -> bool:
    """A traceback line below the header: indented, or prefixed by torchrun's "[rankN]:" tag."""
    text = _untagged(line)
    return text[:1].isspace() or text.startswith(("^", "~"))


def torchrun(script: str, nproc: int = 1) -> list[str]:
    """The launcher prefix of one of tools/*.py on nproc local processes (gloo on a free port)."""
    from vepo_mcore.parallel.init import free_port

    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "--master-addr", "127.0.0.1", "--master-port", str(free_port()), str(TOOLS / script)]  # fmt: skip


def _run(plan: ToyPlan, args: list[str], log_file: Path) -> None:
    run_logged(args, log_file, plan.threads)


def _torchrun(plan: ToyPlan, script: str, args: list[str], log_file: Path) -> None:
    _run(plan, [*torchrun(script, plan.nproc), *args], log_file)


def _has_checkpoint(path: Path) -> bool:
    return resolve_checkpoint(path) is not None


def _trained(save: Path) -> bool:
    """A training stage is done when its newest checkpoint is its run's last iteration (the
    train_iters saved with it); an interrupted stage is not, and its rerun resumes from the checkpoint."""
    if resolve_checkpoint(save) is None:
        return False
    cfg, checkpoint = checkpoint_config(save)
    return int(checkpoint.name.removeprefix("iter_")) >= cfg.training.train_iters


class _Stages:
    """Times each stage of one directory and prints a line per stage."""

    def __init__(self, plan: ToyPlan, root: Path):
        self.plan, self.root = plan, root
        self.file = root / "timings.json"
        self.timings = json.loads(self.file.read_text()) if self.file.is_file() else {}

    def __call__(self, name: str, done: bool, fn) -> None:
        if done:
            print(f"[toy] {self.root.name}/{name}: done before, skipped", file=self.plan.log, flush=True)
            return
        print(f"[toy] {self.root.name}/{name} ({time.strftime('%H:%M:%S')})", file=self.plan.log, flush=True)
        start = time.time()
        fn()
        self.timings[name] = self.timings.get(name, 0.0) + time.time() - start
        self.root.mkdir(parents=True, exist_ok=True)
        self.file.write_text(json.dumps(self.timings, indent=1) + "\n")
        print(f"[toy] {self.root.name}/{name}: {self.timings[name]:.0f} s", file=self.plan.log, flush=True)


def build_shared(plan: ToyPlan) -> dict[str, Path]:
    """Tokenizers and data every seed uses; returns their paths."""
    from vepo_mcore.data.corpus import build_flores_cpt_corpus
    from vepo_mcore.data.sft_flores import direction_examples, translation_chat
    from vepo_mcore.tokenizer import load_tokenizer
    from vepo_mcore.tokenizer.trim import trim_tokenizer

    shared = plan.out / "shared"
    paths = {
        "expanded": shared / "tokenizer" / "expanded",
        "base_tok": shared / "tokenizer" / "base",
        "toy_tok": shared / "tokenizer" / "toy",
        "sft": shared / "data" / "sft" / "translation.jsonl",
        "base_data": shared / "data" / "base",
        "cpt_data": shared / "data" / "cpt",
        "bitext": shared / "bitext",
        "bitext_sft": shared / "data" / "sft" / "bitext.jsonl",
        "base": shared / "base",
    }
    stage = _Stages(plan, shared)
    targets = [lang for lang in plan.langs if lang != "en"]
    if plan.bitext:
        command = [sys.executable, str(TOOLS / "build_parallel_corpus.py"), "--langs", *targets,
                   "--out", str(paths["bitext"]), "--cache", str(plan.bitext_cache)]  # fmt: skip
        stage("bitext", (paths["bitext"] / "data.json").is_file(),
              lambda: _run(plan, command, shared / "logs" / "bitext.log"))  # fmt: skip
    # The paper's expansion (4,000 merges per language on that language's corpus: here FLORES dev)
    # for the low-resource languages the toy translates.
    corpora = [arg for lang in plan.langs if lang in EXPANDED_LANGS
               for arg in ("--corpus", f"{lang}={flores_path(lang, 'dev')}")]  # fmt: skip
    stage(
        "tokenizer_expand",
        (paths["expanded"] / "tokenizer.json").is_file(),
        lambda: _run(
            plan,
            [
                sys.executable,
                str(TOOLS / "expand_tokenizer.py"),
                "--no-compare",
                *corpora,
                "--out",
                str(paths["expanded"]),
                "--report-dir",
                str(shared / "tokenizer" / "report"),
            ],
            shared / "logs" / "expand_tokenizer.log",
        ),  # fmt: skip
    )

    def data_and_trim() -> None:
        conversations = direction_examples([(d.src, d.tgt) for d in parse_directions(plan.directions)])
        base = load_tokenizer()
        write_records(conversations, paths["sft"])
        pairs = _bitext_pairs(plan, paths["bitext"]) if plan.bitext else {}
        parallel = [translation_chat(d.src, d.tgt, *(row if d.src == "en" else row[::-1]))
                    for d in parse_directions(plan.directions) if "en" in (d.src, d.tgt)
                    for row in pairs.get(d.tgt if d.src == "en" else d.src, [])]  # fmt: skip
        if plan.bitext:
            write_records(parallel, paths["bitext_sft"])
        chats = [base.apply_chat(c["messages"]) for c in conversations + parallel]
        # The base vocabulary: what English text and the prompts' scaffolding need (the toy's
        # "Qwen2.5" knows English); the toy's vocabulary: what all its data needs, base ids first.
        scaffolding = [base.apply_chat(c["messages"][:1]) for c in conversations[:: len(conversations) // 4]]
        english = load_flores("en", "dev") + [s.split("\n\n")[0] for s in scaffolding]
        english += [en for rows in pairs.values() for en, _ in rows]
        english.append(base.apply_chat([{"role": "user", "content": "."}], add_generation_prompt=True))
        trim_tokenizer(base.path, english, paths["base_tok"], min_count=plan.vocab_min_count)
        trim_tokenizer(paths["expanded"], chats, paths["toy_tok"], prefix=paths["base_tok"],
                       min_count=plan.vocab_min_count)  # fmt: skip
        documents = {lang: _documents([t for _, t in rows]) for lang, rows in pairs.items()}
        documents["en"] = _documents(sorted({en for rows in pairs.values() for en, _ in rows}))
        build_flores_cpt_corpus(paths["base_data"], ["en"], tokenizer_dir=paths["base_tok"],
                                extra_documents={"en": documents["en"]})  # fmt: skip
        build_flores_cpt_corpus(paths["cpt_data"], plan.langs, tokenizer_dir=paths["toy_tok"],
                                extra_documents=documents)  # fmt: skip

    stage("data_and_trim", (paths["toy_tok"] / "tokenizer.json").is_file(), data_and_trim)
    base_data = _data_paths({"en": paths["base_data"] / "cpt_en_text_document"})
    stage("base", _trained(paths["base"]), lambda: _train(
        plan, "base", "pretrain_cpt.py", paths["base_tok"], paths["base"], BASE_SEED, base_data, shared / "logs"))  # fmt: skip
    return paths


BASE_SEED = 0
"""The seed of the one base model (stage 0) every seed's chain starts from."""


def _train(plan: ToyPlan, name: str, script: str, tokenizer: Path, save: Path, seed: int, extra: list[str],
           logs: Path) -> None:  # fmt: skip
    """One training stage: configs/<name>.yaml with the toy's tokenizer, seed and overrides, saved to `save`."""
    args = ["--config", str(CONFIGS / f"{name}.yaml"), "--tokenizer.path", str(tokenizer),
            "--model.vocab_size", str(_vocab(tokenizer)), "--training.checkpoint.save", str(save),
            "--training.seed", str(1000 + seed), *_iters(plan, name), *extra, *plan.overrides.get("all", []),
            *plan.overrides.get(name, [])]  # fmt: skip
    _torchrun(plan, script, args, logs / f"{name}.log")


def _bitext_pairs(plan: ToyPlan, bitext: Path) -> dict[str, list[tuple[str, str]]]:
    """lang -> the first plan.bitext_pairs (English, X) pairs of its train.jsonl."""
    out = {}
    for lang in plan.langs:
        path = bitext / lang / "train.jsonl"
        if lang != "en" and path.is_file():
            rows = read_records(path)[: plan.bitext_pairs]
            out[lang] = [(r["en"], r["text"]) for r in rows]
    return out


def _documents(texts: list[str], per_document: int = 8) -> list[str]:
    """Short strings (UI messages, help paragraphs) grouped into CPT documents, one per line."""
    return ["\n".join(texts[i : i + per_document]) for i in range(0, len(texts), per_document)]


def _vocab(tokenizer_dir: Path) -> int:
    from vepo_mcore.tokenizer import load_tokenizer

    return len(load_tokenizer(tokenizer_dir))


def _iters(plan: ToyPlan, stage: str) -> list[str]:
    return ["--training.train_iters", str(plan.iters[stage])] if stage in plan.iters else []


def run_seed(plan: ToyPlan, seed: int, paths: dict[str, Path]) -> Path:
    """Stages 1b-5 of one seed; returns the seed's directory."""
    root = plan.out / f"seed{seed}"
    logs = root / "logs"
    stage = _Stages(plan, root)
    base_tok, toy_tok = paths["base_tok"], paths["toy_tok"]

    def train(name: str, script: str, tokenizer: Path, extra: list[str]) -> None:
        _train(plan, name, script, tokenizer, root / name, seed, extra, logs)

    def start_from(name: str) -> list[str]:
        return ["--training.checkpoint.load", str(root / name), "--training.checkpoint.finetune", "true"]

    cpt_data = _data_paths({lang: paths["cpt_data"] / f"cpt_{lang}_text_document" for lang in plan.langs})
    sft_file, rl_prompts = _sft_and_rl_split(plan, paths["sft"])
    rl_prompts, validation = _validation_split(plan, rl_prompts)
    # What RL trains on, for the runs that start from this seed's SFT checkpoint (the grid).
    root.mkdir(parents=True, exist_ok=True)
    prompts = {"directions": plan.directions, "prompt_sentences": rl_prompts}
    (root / "rl_prompts.json").write_text(json.dumps(prompts))
    sft_data = ["--data.sft_phases", json.dumps([sft_phase(plan, sft_file, paths.get("bitext_sft"))])]
    resize = [sys.executable, str(TOOLS / "resize_embeddings.py"), "--megatron-load", str(paths["base"]),
              "--megatron-save", str(root / "resized"), "--tokenizer", str(toy_tok), "--base-tokenizer", str(base_tok)]  # fmt: skip
    rl_from_sft = ["--rl.directions", plan.directions, "--rl.prompt_sentences", rl_prompts,
                   "--training.checkpoint.load", str(root / "sft"), *validation]  # fmt: skip
    trainings = [  # (stage, its checkpoint, how to run it)
        ("resize", "resized", lambda: _run(plan, resize, logs / "resize.log")),
        ("cpt", "cpt", lambda: train("cpt", "pretrain_cpt.py", toy_tok, [*cpt_data, *start_from("resized")])),
        ("sft", "sft", lambda: train("sft", "pretrain_cpt.py", toy_tok, [*sft_data, *start_from("cpt")])),
        ("rl", "rl", lambda: train("rl", "train_vepo.py", toy_tok, rl_from_sft)),
    ]  # fmt: skip
    last = [name for name, _, _ in trainings].index(plan.until)
    for name, checkpoint, fn in trainings[: last + 1]:
        stage(name, (_has_checkpoint if name == "resize" else _trained)(root / checkpoint), fn)

    def heldout(
        checkpoint: Path, out: Path, indomain: bool, sentences: int, hyps: Path | None = None
    ) -> None:
        test_set = (
            ["--bitext", str(paths["bitext"])] if indomain else ["--hyp-dir", str(hyps)] if hyps else []
        )
        command = [sys.executable, str(TOOLS / "eval_heldout.py"), "--checkpoint", str(checkpoint),
                   "--directions", plan.directions, "--max-sentences", str(sentences),
                   "--max-new-tokens", str(plan.max_new_tokens), "--out", str(out), *test_set]  # fmt: skip
        _run(plan, command, logs / f"eval_{out.stem}.log")

    def evaluate(name: str, out: Path, indomain: bool = False) -> None:
        checkpoint = root / name
        if name == "rl" and plan.rl_validation > 0:  # chosen when the evaluation runs, not on a rerun
            checkpoint = select_rl_checkpoint(root)
        heldout(checkpoint, out, indomain, plan.eval_sentences, None if indomain else root / f"hyps_{name}")

    evaluated = [name for name, _, _ in trainings[1 : last + 1]]
    for name in evaluated:  # cpt: the policy before SFT, for the base -> SFT change
        out = root / f"heldout_{name}.jsonl"
        stage(f"eval_{name}", out.is_file(), lambda name=name, out=out: evaluate(name, out))
        if plan.bitext and name != "cpt":
            out = root / f"heldout_{name}_indomain.jsonl"
            stage(
                f"eval_{name}_indomain", out.is_file(), lambda name=name, out=out: evaluate(name, out, True)
            )
    # The SFT checkpoints the config keeps before the last: chrf_source by SFT step.
    if plan.bitext and "sft" in evaluated:
        for step in sft_curve_steps(root):
            for indomain in (False, True):
                out = curve_record(root, step, indomain)
                stage(f"curve_{out.stem}", out.is_file(), lambda step=step, out=out, indomain=indomain: heldout(
                    iteration_dir(root / "sft", step), out, indomain, CURVE_SENTENCES))  # fmt: skip
    return root


CURVE_SENTENCES = 50
"""Sentences per direction behind each point of the chrf_source-by-SFT-step curve."""


def sft_curve_steps(root: Path) -> list[int]:
    """The steps of root/sft's kept checkpoints before its last (whose records are heldout_sft*)."""
    steps = sorted(int(p.name.removeprefix("iter_")) for p in (root / "sft").glob("iter_*") if p.is_dir())
    return steps[:-1]


def curve_record(root: Path, step: int, indomain: bool) -> Path:
    """Where the held-out records of root's SFT checkpoint at `step` go (devtest or in-domain)."""
    return root / "sft_curve" / f"heldout_sft{step}{'_indomain' if indomain else ''}.jsonl"


def _validation_split(plan: ToyPlan, rl_prompts: str) -> tuple[str, list[str]]:
    """(RL's prompt sentences, its validation overrides) under plan.rl_validation: the last N of the
    prompt sentences become rl.eval_sentences."""
    if plan.rl_validation <= 0:
        return rl_prompts, []
    if plan.rl_validation >= plan.rl_holdout:
        raise ValueError(
            f"rl_validation ({plan.rl_validation}) must be below rl_holdout ({plan.rl_holdout}): validation "
            "comes from the RL sentences, which SFT never saw, and RL needs some left to train on"
        )
    first, end = int(rl_prompts.rstrip(":")), len(load_flores("en", "dev"))
    split, every = end - plan.rl_validation, str(plan.rl_eval_interval)
    return f"{first}:{split}", ["--rl.eval_sentences", f"{split}:", "--training.eval_interval", every,
                                "--training.checkpoint.save_interval", every, "--training.checkpoint.keep_last", "0"]  # fmt: skip


SELECTION = ("overall_pass", "chrf")
"""The validation metrics whose sum picks the RL checkpoint (pass rate in percent + chrF++ 0-100)."""


def select_checkpoint(checkpoints: Path, metrics: Path, record: Path) -> Path:
    """The checkpoint under `checkpoints` with the best validation score in `metrics` (SELECTION
    summed over the valid/* row of its step; the earliest of equals), recorded in `record`."""
    from vepo_mcore.training.logging import read_metrics

    rows = [
        row for row in read_metrics(metrics)
        if all(f"valid/{k}" in row for k in SELECTION) and iteration_dir(checkpoints, row["step"]).is_dir()
    ]  # fmt: skip
    if not rows:
        raise FileNotFoundError(
            f"{checkpoints}: no checkpoint with a validation row in {metrics} (rl.eval_sentences unset?)"
        )

    def score(row: dict) -> float:
        return sum(row[f"valid/{k}"] for k in SELECTION)

    best = max(rows, key=lambda r: (score(r), -r["step"]))
    choice = {"step": best["step"], "score": score(best),
              "criterion": " + ".join(f"valid/{k}" for k in SELECTION),
              "valid": {r["step"]: {k[6:]: v for k, v in r.items() if k.startswith("valid/")} for r in rows}}  # fmt: skip
    record.write_text(json.dumps(choice, indent=1) + "\n")
    return iteration_dir(checkpoints, best["step"])


def select_rl_checkpoint(root: Path) -> Path:
    """The RL checkpoint of root (a seed directory) validation chose, recorded in root/rl_selected.json."""
    return select_checkpoint(root / "rl", root / "rl" / "metrics.jsonl", root / "rl_selected.json")


def _sft_and_rl_split(plan: ToyPlan, all_dev: Path) -> tuple[Path, str]:
    """The SFT file and the RL prompts' sentence range under plan.rl_holdout and plan.sft_window."""
    if plan.rl_holdout <= 0 and plan.sft_window == 1:
        return all_dev, ":"
    from vepo_mcore.data.sft_flores import direction_examples

    first = len(load_flores("en", "dev")) - max(plan.rl_holdout, 0)
    window = "" if plan.sft_window == 1 else f"_window{plan.sft_window}"
    path = all_dev.with_name(f"translation_first{first}{window}.jsonl")
    if not path.is_file():
        pairs = [(d.src, d.tgt) for d in parse_directions(plan.directions)]
        rows = direction_examples(pairs, sentences=f":{first}", window=plan.sft_window)
        write_records(rows, path)
    return path, f"{first}:" if plan.rl_holdout > 0 else ":"


def sft_phase(plan: ToyPlan, translation: Path, bitext: Path | None) -> dict:
    """The SFT stage's one data phase (data.sft_phases): the FLORES dev directions (`translation`),
    with plan.bitext the parallel text (`bitext`) at plan.bitext_weight, with plan.name_swap their
    name-swapped conversations at that share (the others keep their ratio)."""
    paths, weights = {"translation": str(translation)}, {"translation": 1.0}
    if plan.bitext:
        paths["bitext"] = str(bitext)
        weights = {"translation": 1.0 - plan.bitext_weight, "bitext": plan.bitext_weight}
    if plan.name_swap > 0:
        paths["names"] = str(_name_swapped(paths.values()))
        weights = {k: w * (1.0 - plan.name_swap) for k, w in weights.items()} | {"names": plan.name_swap}
    return {"name": "translation", "paths": paths, "weights": weights}


def _name_swapped(files: Iterable[str]) -> Path:
    """The name-swapped conversations of the SFT files (data/name_swap.py), built once beside the
    first of them."""
    from vepo_mcore.data.name_swap import name_swapped_chats

    files = [Path(f) for f in files]
    path = files[0].with_name("names_" + "_".join(f.stem for f in files) + ".jsonl")
    if not path.is_file():
        chats = name_swapped_chats([row for f in files for row in read_records(f)], seed=0)
        partial = path.with_suffix(".partial")
        write_records(chats, partial)
        partial.rename(path)  # whole or absent: seeds run side by side share it
    return path


def _data_paths(paths: dict[str, Path]) -> list[str]:
    return [arg for lang, prefix in paths.items() for arg in (f"--data.paths.{lang}", str(prefix))]


def precision_flags(plan: ToyPlan) -> list[str]:
    """The configs train in bf16 (fp32 master weights), ~1.5x fp32's speed on a CPU with AMX tiles.
    Without AMX bf16 runs tens of times slower than fp32 (benchmarks/RESULTS.md), so
    there every stage trains in fp32: these flags, put before plan.overrides. [] on a GPU, on a CPU
    with AMX, or where the run sets training.bf16 itself."""
    import torch

    if torch.cuda.is_available() or torch.cpu._is_amx_tile_supported():
        return []
    if any("--training.bf16" in flags for flags in plan.overrides.values()):
        return []
    return ["--training.bf16", "false"]


def run_toy(plan: ToyPlan) -> list[Path]:
    """The shared stages, then every seed; returns the seed directories."""
    plan.out.mkdir(parents=True, exist_ok=True)
    if flags := precision_flags(plan):
        plan = replace(plan, overrides={**plan.overrides, "all": [*flags, *plan.overrides.get("all", [])]})
        print("[toy] this CPU has no AMX, where bf16 trains tens of times slower than fp32: every stage "
              "trains in fp32 (--set all.training.bf16=true forces bf16)", file=plan.log, flush=True)  # fmt: skip
    paths = build_shared(plan)
    return [run_seed(plan, seed, paths) for seed in plan.seeds]


def stage_flags(iters: list[str], sets: list[str]) -> tuple[dict[str, int], dict[str, list[str]]]:
    """run_toy's `--iters STAGE=N` and `--set STAGE.FIELD=VALUE` -> (train_iters per stage, dotted
    overrides per stage)."""

    def pairs(values: list[str], flag: str) -> list[tuple[str, str]]:
        out = []
        for value in values:
            key, sep, rest = value.partition("=")
            if not sep:
                raise ValueError(f"{flag} {value!r}: expected NAME=VALUE")
            out.append((key, rest))
        return out

    overrides: dict[str, list[str]] = {}
    for key, value in pairs(sets, "--set"):
        stage, _, field = key.partition(".")
        overrides.setdefault(stage, []).extend([f"--{field}", value])
    return {stage: int(n) for stage, n in pairs(iters, "--iters")}, overrides
