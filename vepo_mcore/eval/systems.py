"""Where hypotheses come from: hypothesis files, the sanity systems, or a rollout engine.

Systems (a registry; `--system NAME`):
  hyp-dir      read DIR/{src}-{tgt}.txt (one hypothesis per line, line-aligned with FLORES)
  reference    the reference itself (upper bound: BLEU 100, chrF 100)
  copy-source  the untranslated source (lower bound; measures script/vocabulary overlap)

Model translation goes through `translate_direction(engine, ...)`: any rollout engine of
vepo_mcore.rollout (embedded Megatron sampler, SGLang) with
`generate(prompts: list[Sample], sampling: SamplingParams) -> list[Sample]`; prompts carry the
ChatML text and its token ids, the response text is the hypothesis. Prompts are ChatML built from one configurable template; hypotheses are
cached per direction so an interrupted run resumes where it stopped.
The engine side is imported inside the functions that translate: the file systems load nothing heavy.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from tqdm import tqdm

from vepo_mcore.config import JobConfig
from vepo_mcore.eval.metrics import read_lines
from vepo_mcore.translation.directions import Direction
from vepo_mcore.translation.prompts import DEFAULT_TEMPLATE, clean_hypothesis, prompt_samples
from vepo_mcore.translation.sample import Sample

# Imported where used: torch, vepo_mcore.rollout.base and vepo_mcore.checkpoint.hf (pull torch: the file
# systems load nothing heavy).


class Engine(Protocol):
    """The part of the rollout engine interface translation needs."""

    def generate(self, prompts: list[Sample], sampling: Any) -> list[Sample]: ...


def greedy_sampling(tokenizer, max_new_tokens: int = 256):
    """Greedy SamplingParams stopping at <|im_end|> / <|endoftext|> (the rollout engines' type)."""
    from vepo_mcore.rollout.base import SamplingParams

    return SamplingParams(
        temperature=0.0, max_new_tokens=max_new_tokens, stop_token_ids=tuple(tokenizer.stop_ids)
    )


def _cache_paths(cache_dir: Path, direction: Direction) -> tuple[Path, Path]:
    return cache_dir / f"{direction}.txt", cache_dir / f"{direction}.partial.jsonl"


def translate_direction(
    engine: Engine,
    direction: Direction,
    sources: Sequence[str],
    *,
    tokenizer,
    sampling: Any = None,
    references: Sequence[str] | None = None,
    template: str = DEFAULT_TEMPLATE,
    system_prompt: str | None = None,
    batch_size: int = 64,
    cache_dir: str | Path | None = None,
) -> list[str]:
    """Translate `sources` (n sentences) with `engine`; returns n one-line hypotheses.

    With `cache_dir` (one directory per system: the cache does not key on model or template),
    finished batches are appended to {dir}.partial.jsonl and the complete result is written to
    {dir}.txt; a rerun returns the first n lines of {dir}.txt or resumes after the last finished
    line (a shorter {dir}.txt from a --max-sentences run is extended). `sampling` is passed to the
    engine unchanged (greedy or sampled); None means greedy decoding up to 256 new tokens, stopping
    at the tokenizer's stop ids. Under a process group every rank calls this (a model-parallel
    engine is collective) and reads the cache; rank 0 alone writes it.
    """
    import torch.distributed as dist

    collective = dist.is_initialized() and dist.get_world_size() > 1
    writer = not collective or dist.get_rank() == 0
    if sampling is None:
        sampling = greedy_sampling(tokenizer)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    n = len(sources)
    final = partial = None
    done: list[str] = []
    if cache_dir is not None:
        cache = Path(cache_dir)
        cache.mkdir(parents=True, exist_ok=True)
        final, partial = _cache_paths(cache, direction)
        if final.is_file():
            done = read_lines(final)
            if len(done) >= n:
                return done[:n]
        if partial.is_file():
            lines = partial.read_text(encoding="utf-8").splitlines()
            for lineno, line in enumerate(lines, 1):
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    if lineno == len(lines):  # the write the interruption cut short
                        break
                    raise ValueError(f"{partial}:{lineno}: not a JSON record") from None
                if record.get("index") != len(done) or not isinstance(record.get("hypothesis"), str):
                    raise ValueError(
                        f"{partial}:{lineno}: expected {{'index': {len(done)}, 'hypothesis': str}}, got {line[:80]}"
                    )
                done.append(record["hypothesis"])
            done = done[:n]
    for start in range(len(done), n, batch_size):
        stop = min(start + batch_size, n)
        prompts = prompt_samples(
            direction, sources, tokenizer, references, template, system_prompt, range(start, stop)
        )
        outputs = engine.generate(prompts, sampling)
        if len(outputs) != len(prompts):
            raise ValueError(
                f"engine returned {len(outputs)} samples for {len(prompts)} prompts ({direction})"
            )
        batch = [clean_hypothesis(sample.response) for sample in outputs]
        done.extend(batch)
        if partial is not None and writer:
            with partial.open("a", encoding="utf-8") as fh:
                for offset, hyp in enumerate(batch):
                    fh.write(
                        json.dumps({"index": start + offset, "hypothesis": hyp}, ensure_ascii=False) + "\n"
                    )
    if final is not None:
        if collective:
            dist.barrier()  # every rank has read the cache before rank 0 replaces it
        if writer:
            write_hypotheses(final, done)
            partial.unlink(missing_ok=True)
    return done


def write_hypotheses(path: str | Path, hypotheses: Sequence[str]) -> None:
    """One hypothesis per line (newlines inside a hypothesis become spaces)."""
    Path(path).write_text("".join(clean_hypothesis(h) + "\n" for h in hypotheses), encoding="utf-8")


def read_hypothesis_file(hyp_dir: str | Path, direction: Direction, n: int) -> list[str]:
    """DIR/{src}-{tgt}.txt truncated to the first n lines; a file shorter than n is an error."""
    path = Path(hyp_dir) / f"{direction}.txt"
    if not path.is_file():
        raise FileNotFoundError(f"hypothesis file {path} for direction {direction} does not exist")
    lines = read_lines(path)
    if len(lines) < n:
        raise ValueError(f"{path} has {len(lines)} lines, expected at least {n} (one per source sentence)")
    return lines[:n]


SystemFn = Callable[[Direction, list[str], list[str]], list[str]]
"""(direction, sources, references) -> hypotheses."""

SYSTEMS: dict[str, SystemFn] = {
    "reference": lambda direction, sources, references: list(references),
    "copy-source": lambda direction, sources, references: list(sources),
}
"""Sanity systems that need no model."""


def system_hypotheses(
    system: str,
    direction: Direction,
    sources: list[str],
    references: list[str],
    hyp_dir: str | Path | None = None,
) -> list[str]:
    """Hypotheses of a named system ('hyp-dir' needs `hyp_dir`)."""
    if system == "hyp-dir":
        if hyp_dir is None:
            raise ValueError("system 'hyp-dir' needs a hypothesis directory (--hyp-dir)")
        return read_hypothesis_file(hyp_dir, direction, len(sources))
    if system not in SYSTEMS:
        raise ValueError(f"unknown system {system!r}; known: hyp-dir, {', '.join(SYSTEMS)}")
    return SYSTEMS[system](direction, sources, references)


def engine_from_hf(hf_dir: str | Path, engine: str = "sglang", tokenizer=None):
    """A rollout engine serving a Hugging Face Qwen2 directory: 'sglang' (GPU), or any registered engine name."""
    from vepo_mcore.checkpoint.hf import model_config_from_hf, read_hf_config
    from vepo_mcore.rollout.base import build_engine

    cfg = JobConfig()
    cfg.model = model_config_from_hf(read_hf_config(hf_dir), vocab_size=len(tokenizer) if tokenizer else None)
    cfg.rl.rollout.engine = engine
    return build_engine(cfg, tokenizer=tokenizer, model_path=hf_dir)


def translate_directions(
    engine: Engine,
    directions: Sequence[Direction],
    hyp_dir: str | Path,
    *,
    tokenizer,
    load: Callable[[Direction], tuple[list[str], list[str]]],
    sampling: Any = None,
    template: str = DEFAULT_TEMPLATE,
    system_prompt: str | None = None,
    batch_size: int = 64,
    progress: bool = True,
) -> Path:
    """Translate every direction into hyp_dir/{src}-{tgt}.txt (the --hyp-dir layout), resuming finished work.

    load(direction) -> (sources, references) as evaluated (split, max_sentences applied).
    """
    iterable = directions
    if progress:
        iterable = tqdm(directions, desc="translate", unit="dir")
    for direction in iterable:
        sources, references = load(direction)
        translate_direction(
            engine,
            direction,
            sources,
            tokenizer=tokenizer,
            sampling=sampling,
            references=references,
            template=template,
            system_prompt=system_prompt,
            batch_size=batch_size,
            cache_dir=hyp_dir,
        )
    return Path(hyp_dir)
