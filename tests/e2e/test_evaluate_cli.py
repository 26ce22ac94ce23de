"""tools/evaluate.py on hypothesis files: the printed signatures and the written CSV equal the sacrebleu CLI."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from vepo_mcore.languages import load_flores

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
def test_evaluate_cli_on_hypothesis_files(tmp_path):
    hyps = tmp_path / "hyps"
    hyps.mkdir()
    for d in ("en-th", "th-zh"):
        tgt = d.split("-")[1]
        lines = [r[: len(r) * 3 // 4] for r in load_flores(tgt)[:60]]
        (hyps / f"{d}.txt").write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "evaluate.py"), "--eval.system.hyp_dir", str(hyps),
         "--eval.directions", "en-th,th-zh", "--eval.max_sentences", "60", "--eval.out_dir", str(out),
         "--eval.baseline.kind", "copy-source", "--eval.bootstrap_samples", "100", "--eval.workers", "1",
         "--eval.plots", "false"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert "tok:char" in proc.stdout and "tok:zh" in proc.stdout and "nw:2" in proc.stdout
    assert "| hyps |" in proc.stdout and "Paired bootstrap: hyps vs baseline copy-source" in proc.stdout
    rows = {r["direction"]: r for r in csv.DictReader((out / "scores.csv").open())}
    # the same files through the sacrebleu CLI (references truncated to the evaluated lines)
    ref = tmp_path / "ref.zh"
    ref.write_text("".join(x + "\n" for x in load_flores("zh")[:60]), encoding="utf-8")
    cli = subprocess.run(
        [str(Path(sys.executable).parent / "sacrebleu"), str(ref), "-i", str(hyps / "th-zh.txt"), "-m", "bleu", "chrf",
         "-tok", "zh", "-f", "json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    bleu, chrf = json.loads(cli.stdout)
    assert rows["th-zh"]["bleu"] == f"{bleu['score']:.1f}" and rows["th-zh"]["chrf"] == f"{chrf['score']:.1f}"
    assert bleu["signature"] in proc.stdout
