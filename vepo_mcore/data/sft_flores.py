"""The tiny SFT set of the quickstart and tests, in ChatML jsonl, built from FLORES-200 dev.

    files = build_flores_sft_set("data/sft_tiny", per_source=200)
    # general.jsonl       English instructions (repeat, upper-case, count words, last word)
    # multilingual.jsonl  the same kind of instructions on the nine other languages
    # translation.jsonl   translation between language pairs with an ASEAN language on one side
    # reasoning.jsonl     name the source language, then translate into English or Chinese

Every answer is computable from FLORES text, so the set needs nothing but the shipped files.
FLORES devtest is never used (it is the evaluation set).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from vepo_mcore.config.data import SFTPhaseConfig
from vepo_mcore.languages import EXPANDED_LANGS, LANGS, language, load_flores, sentence_range

SOURCES = ("general", "multilingual", "translation", "reasoning")


def _strip_punct(word: str) -> str:
    return word.strip(".,;:!?\"'()[]«»“”‘’")


# Instruction templates: (name, prompt(text, lang name) -> str, answer(text) -> str | None).
_TASKS: list[tuple[str, Callable[[str, str], str], Callable[[str], str | None]]] = [
    ("repeat", lambda t, n: f"Repeat the following {n} sentence exactly.\n\n{t}", lambda t: t),
    ("upper", lambda t, n: f"Rewrite this {n} sentence in upper case.\n\n{t}", lambda t: t.upper()),
    (
        "count_words",
        lambda t, n: (
            f"How many space-separated words does this {n} sentence have? Answer with a number.\n\n{t}"
        ),
        lambda t: str(len(t.split())),
    ),
    (
        "last_word",
        lambda t, n: f"What is the last word of this {n} sentence? Answer with the word only.\n\n{t}",
        lambda t: _strip_punct(t.split()[-1]) if t.split() and _strip_punct(t.split()[-1]) else None,
    ),
]


def _chat(user: str, assistant: str, system: str | None = None) -> dict:
    messages = [{"role": "system", "content": system}] if system else []
    messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return {"messages": messages}


def instruction_examples(langs: list[str], n: int, rng: np.random.Generator) -> list[dict]:
    """n instruction-following conversations over FLORES dev sentences of `langs`."""
    flores = {lang: load_flores(lang, "dev") for lang in langs}
    out = []
    while len(out) < n:
        lang = langs[rng.integers(len(langs))]
        text = flores[lang][rng.integers(len(flores[lang]))]
        _, prompt, answer = _TASKS[rng.integers(len(_TASKS))]
        reply = answer(text)
        if reply:
            system = "You are a helpful assistant." if rng.random() < 0.3 else None
            out.append(_chat(prompt(text, language(lang).name), reply, system))
    return out


def translation_examples(n: int, rng: np.random.Generator) -> list[dict]:
    """n translation conversations; one side of every pair is an ASEAN (expanded) language."""
    flores = {lang: load_flores(lang, "dev") for lang in LANGS}
    out = []
    while len(out) < n:
        src, tgt = rng.choice(LANGS, size=2, replace=False)
        if src not in EXPANDED_LANGS and tgt not in EXPANDED_LANGS:
            continue
        i = rng.integers(len(flores[src]))
        s, t = language(src).name, language(tgt).name
        out.append(_chat(f"Translate the following {s} text into {t}.\n\n{flores[src][i]}", flores[tgt][i]))
    return out


def translation_chat(src: str, tgt: str, source: str, target: str) -> dict:
    """One translation conversation src -> tgt in the evaluation and RL prompt's words
    (eval.systems.DEFAULT_TEMPLATE)."""
    return _chat(
        f"Translate the following {language(src).name} text into {language(tgt).name}.\n\n{source}", target
    )


def direction_examples(
    directions: list[tuple[str, str]], split: str = "dev", sentences: str = ":", window: int = 1
) -> list[dict]:
    """Every FLORES `split` sentence (in the START:STOP range `sentences`) of every (src, tgt)
    direction as one translation conversation; with window > 1 also every run of 2..window
    consecutive sentences of the range, joined by spaces on both sides (concatenation augmentation:
    the same sentences in more contexts, and answers whose length has to follow the source's).

    The user turn is the evaluation and RL prompt (eval.systems.DEFAULT_TEMPLATE, written out here
    so this layer does not import eval), so SFT, RL and evaluation see one prompt format.
    """
    if split != "dev":
        raise ValueError(f"SFT data comes from FLORES dev only (devtest is for evaluation), got {split!r}")
    if window < 1:
        raise ValueError(f"window must be >= 1 sentence, got {window}")
    out, rows = [], sentence_range(sentences)
    for src, tgt in directions:
        sources, targets = load_flores(src, split)[rows], load_flores(tgt, split)[rows]
        for k in range(1, window + 1):
            out += [
                translation_chat(src, tgt, " ".join(sources[i : i + k]), " ".join(targets[i : i + k]))
                for i in range(len(sources) - k + 1)
            ]
    return out


def reasoning_examples(n: int, rng: np.random.Generator) -> list[dict]:
    """n conversations that name the source language, then translate into English or Chinese."""
    flores = {lang: load_flores(lang, "dev") for lang in LANGS}
    out = []
    while len(out) < n:
        src = EXPANDED_LANGS[rng.integers(len(EXPANDED_LANGS))]
        tgt = ("en", "zh")[rng.integers(2)]
        i = rng.integers(len(flores[src]))
        t = language(tgt).name
        prompt = f"Which language is the following text written in? Then translate it into {t}.\n\n{flores[src][i]}"
        answer = f"The text is written in {language(src).name}.\n\n{t} translation: {flores[tgt][i]}"
        out.append(_chat(prompt, answer))
    return out


def build_flores_sft_set(out_dir: str | Path, per_source: int = 200, seed: int = 0) -> dict[str, str]:
    """Write the four source files (per_source conversations each); returns source -> path."""
    if per_source < 1:
        raise ValueError(f"per_source must be >= 1, got {per_source}")
    rng = np.random.default_rng(seed)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sets = {
        "general": instruction_examples(["en"], per_source, rng),
        "multilingual": instruction_examples([lang for lang in LANGS if lang != "en"], per_source, rng),
        "translation": translation_examples(per_source, rng),
        "reasoning": reasoning_examples(per_source, rng),
    }
    paths = {}
    for name, rows in sets.items():
        path = out / f"{name}.jsonl"
        with path.open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        paths[name] = str(path)
    return paths


def default_sft_phases(paths: dict[str, str], samples_per_phase: int = 0) -> list[SFTPhaseConfig]:
    """The 3-phase curriculum of SPEC section 3 over the four sources, 5:1 general : multilingual.

    1 instruction following: general 5, multilingual 1
    2 ASEAN translation: general 5, translation 1
    3 translation + reasoning: general 5, translation 0.5, reasoning 0.5
    """
    missing = sorted(set(SOURCES) - set(paths))
    if missing:
        raise ValueError(f"SFT sources {missing} missing; need {list(SOURCES)}")
    layout = [
        ("instruction_following", {"general": 5.0, "multilingual": 1.0}),
        ("asean_translation", {"general": 5.0, "translation": 1.0}),
        ("translation_reasoning", {"general": 5.0, "translation": 0.5, "reasoning": 0.5}),
    ]
    return [
        SFTPhaseConfig(
            name=name,
            paths={source: paths[source] for source in weights},
            weights=weights,
            num_samples=samples_per_phase,
        )
        for name, weights in layout
    ]
