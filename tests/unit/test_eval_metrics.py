"""Metrics equal the sacrebleu command line on the same files (th, zh, km, en, fil targets; spBLEU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vepo_mcore.eval.metrics import build_metric, corpus_score, read_lines
from vepo_mcore.languages import language, load_flores

SACREBLEU = Path(sys.executable).parent / "sacrebleu"
N = 250


def perturbed(lines: list[str], seed: int) -> list[str]:
    """A deterministic imperfect 'translation': drop, swap or truncate parts of the reference."""
    out = []
    for i, line in enumerate(lines):
        k = (i * 7 + seed) % 5
        if k == 0:
            out.append(line[: len(line) // 2])
        elif k == 1:
            words = line.split()
            out.append(" ".join(words[1:] + words[:1]))
        elif k == 2:
            out.append(line + "  ")  # trailing spaces: the CLI right-strips lines
        elif k == 3:
            out.append(line[len(line) // 3 :])
        else:
            out.append(line)
    out[5] = ""  # an empty hypothesis line
    return out


def run_cli(ref: Path, hyp: Path, args: list[str], env: dict | None = None) -> list[dict]:
    cmd = [str(SACREBLEU), str(ref), "-i", str(hyp), "-f", "json", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    parsed = json.loads(proc.stdout)
    return parsed if isinstance(parsed, list) else [parsed]


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


@pytest.mark.parametrize("tgt", ["th", "zh", "km", "fil"])
def test_scores_and_signatures_equal_sacrebleu_cli(tmp_path, tgt):
    refs = load_flores(tgt)[:N]
    ref_file = write(tmp_path / "ref.txt", refs)
    hyp_file = write(tmp_path / "hyp.txt", perturbed(refs, seed=len(tgt)))
    hyps, refs_read = read_lines(hyp_file), read_lines(ref_file)
    tok = language(tgt).bleu_tokenize
    # BLEU and chrF at 2 decimals, chrF++ at the CLI's default 1 decimal
    cli = run_cli(ref_file, hyp_file, ["-m", "bleu", "chrf", "-tok", tok, "-w", "2"])
    cli_pp = run_cli(ref_file, hyp_file, ["-m", "chrf", "--chrf-word-order", "2"])
    for name, entry, width in (("bleu", cli[0], 2), ("chrf", cli[1], 2), ("chrf++", cli_pp[0], 1)):
        ours = corpus_score(name, hyps, refs_read, tgt)
        assert ours.format(width) == f"{entry['score']:.{width}f}", (name, tgt, width)
        assert ours.signature == entry["signature"], (name, tgt)
        assert ours.display_name == entry["name"]
    assert f"tok:{tok}" in corpus_score("bleu", hyps, refs_read, tgt).signature


def test_spbleu_from_local_model_equals_cli_flores200(tmp_path):
    """A local sentencepiece model scored as spBLEU equals `sacrebleu -tok flores200` using that model file."""
    sentencepiece = pytest.importorskip("sentencepiece")
    train = tmp_path / "train.txt"
    write(train, [line for code in ("th", "en", "my") for line in load_flores(code, "dev")[:300]])
    prefix = tmp_path / "spm"
    sentencepiece.SentencePieceTrainer.train(
        input=str(train), model_prefix=str(prefix), vocab_size=800, character_coverage=1.0, minloglevel=2
    )
    model = Path(f"{prefix}.model")
    # sacrebleu looks for $SACREBLEU/models/<basename of the flores200 URL>
    cache = tmp_path / "sacrebleu_home"
    (cache / "models").mkdir(parents=True)
    (cache / "models" / "flores200sacrebleuspm").write_bytes(model.read_bytes())
    env = {**os.environ, "SACREBLEU": str(cache)}
    for tgt in ("th", "my"):
        refs = load_flores(tgt)[:N]
        ref_file = write(tmp_path / f"ref.{tgt}", refs)
        hyp_file = write(tmp_path / f"hyp.{tgt}", perturbed(refs, seed=3))
        cli = run_cli(ref_file, hyp_file, ["-m", "bleu", "-tok", "flores200", "-w", "3"], env=env)[0]
        ours = corpus_score("bleu", read_lines(hyp_file), read_lines(ref_file), tgt, spm_model=model)
        assert ours.format(3) == f"{cli['score']:.3f}"
        assert ours.signature == cli["signature"]
        assert "tok:flores200" in ours.signature
        # spBLEU really differs from the char-level BLEU of the same files
        assert ours.score != corpus_score("bleu", read_lines(hyp_file), read_lines(ref_file), tgt).score


def test_unknown_metric_and_missing_spm_model(tmp_path):
    with pytest.raises(ValueError, match="known: bleu, chrf, chrf\\+\\+"):
        build_metric("ter", "en")
    with pytest.raises(FileNotFoundError, match="spm_model"):
        build_metric("bleu", "th", spm_model=tmp_path / "missing.model")
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        corpus_score("chrf", ["a", "b"], ["a"], "en")


def test_read_lines_matches_cli_newline_rules(tmp_path):
    path = tmp_path / "x.txt"
    path.write_bytes("a b  \nline\u2028with separator\n\nlast".encode())
    assert read_lines(path) == ["a b", "line\u2028with separator", "", "last"]
