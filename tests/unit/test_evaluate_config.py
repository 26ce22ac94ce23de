"""tools/evaluate.py on the config tree: dotted flags set the eval section's fields, a wrong field
is a ValueError naming it and the known keys, and the quickstart's call runs."""

from __future__ import annotations

import json

import pytest

from tools.evaluate import main
from vepo_mcore.config import to_dict
from vepo_mcore.config.job import job_from_cli
from vepo_mcore.languages import load_flores


def _eval(argv: list[str]) -> dict:
    return to_dict(job_from_cli(argv, "")[1].eval)


def test_dotted_flags_set_the_eval_fields():
    got = _eval([
        "--eval.system.hyp_dir", "h/rl", "--eval.baseline.hyp_dir", "h/sft", "--eval.max_sentences", "8",
        "--eval.workers", "1", "--eval.plots", "false", "--eval.system.checkpoint", "runs/x/rl",
    ])  # fmt: skip
    assert got["system"]["hyp_dir"] == "h/rl" and got["baseline"]["hyp_dir"] == "h/sft"
    assert got["plots"] is False and got["workers"] == 1 and got["max_sentences"] == 8
    assert got["system"]["checkpoint"] == "runs/x/rl"


@pytest.mark.parametrize("flag", ["--hyp-dir", "--hf-model", "--checkpoint", "--out"])
def test_flags_outside_the_config_tree_are_refused(flag):
    with pytest.raises(ValueError, match="unknown key"):
        _eval([flag, "x"])


def test_a_yaml_eval_section_gives_defaults_that_flags_override(tmp_path):
    cfg = tmp_path / "job.yaml"
    cfg.write_text("eval:\n  directions: e2x\n  split: dev\n  system: {kind: copy-source}\n")
    got = _eval(["--config", str(cfg), "--eval.directions", "en-th"])
    assert got["directions"] == "en-th" and got["split"] == "dev" and got["system"]["kind"] == "copy-source"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--eval.directon", "e2x"],
            r"eval: unknown key\(s\) \['directon'\]; known keys are \[.*'directions'",
        ),
        (
            ["--eval.system.hypdir", "h"],
            r"eval.system: unknown key\(s\) \['hypdir'\]; known keys are \[.*'hyp_dir'",
        ),
        (["--eval.split", "test"], r"eval.split: 'test' is not one of \['dev', 'devtest'\]"),
        (["--eval.system.kind", "oracle"], r"eval.system.kind: 'oracle' matches none of"),
        (["--eval.max_sentences", "many"], r"eval.max_sentences: 'many' matches none of"),
        (["--eval.system.kind", "hf-model"], r"eval.system.kind 'hf-model' needs eval.system.model_path"),
        (["--eval.workers", "-1"], r"eval.workers must be >= 0"),
    ],
)
def test_a_bad_field_is_named(argv, message):
    with pytest.raises(ValueError, match=message):
        _eval(argv)


def test_the_quickstart_call_scores_rl_against_sft(tmp_path, capsys):
    """examples/quickstart_cpu.sh stage 3 (its flags verbatim) writes what tools/quickstart_summary.py reads."""
    for system, keep in (("rl", 3), ("sft", 2)):
        hyps = tmp_path / f"hyps_{system}"
        hyps.mkdir()
        for d in ("en-th", "th-en"):
            refs = load_flores(d.split("-")[1])[:6]
            (hyps / f"{d}.txt").write_text(
                "".join(r[: len(r) * keep // 4] + "\n" for r in refs), encoding="utf-8"
            )
    out = tmp_path / "eval_rl"
    main([
        "--eval.system.hyp_dir", str(tmp_path / "hyps_rl"), "--eval.system.name", "rl",
        "--eval.baseline.hyp_dir", str(tmp_path / "hyps_sft"), "--eval.baseline.name", "sft",
        "--eval.directions", "en-th,th-en", "--eval.max_sentences", "6", "--eval.out_dir", str(out),
        "--eval.workers", "1", "--eval.plots", "false", "--eval.bootstrap_samples", "50",
    ])  # fmt: skip
    scores = json.loads((out / "scores.json").read_text())
    assert scores["system"] == "rl" and scores["bootstrap"]["baseline"] == "sft"
    assert set(scores["groups"]["avg"]) == {"bleu", "chrf", "chrf++"}
    assert (out / "bootstrap.md").is_file() and not list(out.glob("*.png"))
    printed = capsys.readouterr().out
    assert "| rl |" in printed and "Paired bootstrap: rl vs baseline sft" in printed


def test_dry_run_prints_the_eval_section(capsys):
    assert main(["--dry-run", "--eval.directions", "e2x", "--eval.system.kind", "copy-source"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("eval:\n  directions: e2x\n") and "kind: copy-source" in printed


def test_a_checkpoint_system_is_translated_then_scored_as_its_hyps(tmp_path, monkeypatch):
    """The wiring of --eval.system.checkpoint (the translation itself runs in tests/dist/test_gpu_paths.py):
    translate_checkpoint gets the eval fields and writes OUT/hyps, rank 0 scores them under the
    checkpoint's name."""
    import torch.distributed as dist

    import vepo_mcore.eval.translate_checkpoint as generate
    import vepo_mcore.parallel as parallel

    calls = []

    def translate(checkpoint, out_dir, directions, split, max_sentences, max_new_tokens, batch_size):
        calls.append((checkpoint, directions, split, max_sentences, max_new_tokens, batch_size))
        for d in directions.split(","):
            lines = load_flores(d.split("-")[1], split)[:max_sentences]
            (tmp_path / "hyps").mkdir(exist_ok=True)
            (tmp_path / "hyps" / f"{d}.txt").write_text("".join(x + "\n" for x in lines), encoding="utf-8")

    monkeypatch.setattr(generate, "translate_checkpoint", translate)
    monkeypatch.setattr(parallel, "init_distributed", lambda: None)
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    main([
        "--eval.system.checkpoint", str(tmp_path / "rl_step9"), "--eval.directions", "en-th",
        "--eval.max_sentences", "4", "--eval.system.max_new_tokens", "16", "--eval.out_dir", str(tmp_path),
        "--eval.workers", "1", "--eval.plots", "false",
    ])  # fmt: skip
    assert calls == [(str(tmp_path / "rl_step9"), "en-th", "devtest", 4, 16, 64)]
    scores = json.loads((tmp_path / "scores.json").read_text())
    assert scores["system"] == "rl_step9" and scores["groups"]["avg"]["bleu"] == pytest.approx(100.0)
