"""tools/expand_tokenizer.py end to end on a small budget: tokenizer dir, manifest, report files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from vepo_mcore.languages import flores_path
from vepo_mcore.tokenizer.expand import MANIFEST, file_sha256

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def test_expand_tool_writes_tokenizer_manifest_and_report(tmp_path):
    th = tmp_path / "th.txt"
    th.write_text("\n".join(flores_path("th", "dev").read_text(encoding="utf-8").splitlines()[:300]) + "\n")
    ms = tmp_path / "ms.jsonl"
    lines = flores_path("ms", "dev").read_text(encoding="utf-8").splitlines()[:300]
    ms.write_text("".join(json.dumps({"text": line}) + "\n" for line in lines))
    out, report_dir = tmp_path / "tok", tmp_path / "report"
    cmd = [sys.executable, "tools/expand_tokenizer.py", "--corpus", f"th={th}", "--corpus", f"ms={ms}"]
    cmd += ["--wordfreq", "ms", "--tokens-per-lang", "80", "--protect-words", "5000", "--no-compare"]
    cmd += ["--out", str(out)]
    cmd += ["--report-dir", str(report_dir)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "vocab 151825" in proc.stdout

    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
        MANIFEST,
    ):
        assert (out / name).is_file(), name
    manifest = json.loads((out / MANIFEST).read_text())
    assert (
        manifest["languages"]["th"]["first_id"] == 151_665
        and manifest["languages"]["ms"]["first_id"] == 151_745
    )
    ms_file, ms_wordfreq = manifest["languages"]["ms"]["sources"]
    assert ms_file == {"path": str(ms), "sha256": file_sha256(ms), "lines": 300}
    assert ms_wordfreq["path"] == "wordfreq:ms" and ms_wordfreq["lines"] > 50_000
    assert len(ms_wordfreq["sha256"]) == 64
    assert manifest["pretokenizer"] == "mark_aware"

    report = json.loads((report_dir / "compression.json").read_text())
    assert set(report["compression"]) == {"en", "zh", "th", "ms", "km", "lo", "my", "fil", "id", "vi"}
    th_row = report["compression"]["th"]
    assert th_row["gain"]["expanded_mark_aware"] == round(
        th_row["tokens"]["base"] / th_row["tokens"]["expanded_mark_aware"], 3
    )
    assert th_row["gain"]["expanded_mark_aware"] > 1.75  # more than the regex change alone
    assert report["invariants"]["mark_aware"]["errors"] == []
    markdown = (report_dir / "compression.md").read_text()
    assert "wordfreq:ms" in report["training_data"] and "What larger corpora would change" in markdown
    assert Image.open(report_dir / "compression.png").size[0] > 500


def test_expand_tool_rejects_unknown_language(tmp_path):
    cmd = [sys.executable, "tools/expand_tokenizer.py", "--corpus", "xx=a.txt", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "LANG=PATH" in proc.stderr
