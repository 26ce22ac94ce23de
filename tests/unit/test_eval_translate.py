"""translate_direction: ChatML prompts, batching, per-direction cache and resume (with a stand-in engine)."""

from __future__ import annotations

import pytest

import harness.fake_sglang  # noqa: F401  (registers the 'fake_sglang' rollout engine)
from tests.support.reversing_engine import SOURCES, ReversingEngine
from vepo_mcore.eval.systems import system_hypotheses, translate_direction, write_hypotheses
from vepo_mcore.tokenizer.tokenizer import load_tokenizer
from vepo_mcore.translation.directions import Direction
from vepo_mcore.translation.prompts import format_prompt
from vepo_mcore.translation.sample import Sample


def test_prompt_is_chatml_from_the_template():
    tok = load_tokenizer()
    prompt = format_prompt(
        Direction("en", "th"), "Hello.", tok, template="{src_name}->{tgt_name} ({src}-{tgt}): {source}"
    )
    assert prompt == "<|im_start|>user\nEnglish->Thai (en-th): Hello.<|im_end|>\n<|im_start|>assistant\n"
    with_system = format_prompt(Direction("th", "en"), "x", tok, system_prompt="You translate.")
    assert with_system.startswith(
        "<|im_start|>system\nYou translate.<|im_end|>\n<|im_start|>user\nTranslate the following Thai"
    )
    with pytest.raises(ValueError, match="template field 'lang' unknown"):
        format_prompt(Direction("en", "th"), "x", tok, template="{lang}")


def test_translate_batches_and_cleans_lines():
    engine = ReversingEngine()
    hyps = translate_direction(
        engine, Direction("en", "vi"), SOURCES, tokenizer=load_tokenizer(), batch_size=4
    )
    assert hyps == [s[::-1] + " extra line" for s in SOURCES]
    assert [len(c) for c in engine.calls] == [4, 4, 2]
    assert (
        engine.calls[0][1].metadata == {"direction": "en-vi", "index": 1}
        and engine.calls[0][1].tgt_lang == "vi"
    )


def test_interrupted_run_resumes_from_the_cache(tmp_path):
    tok, direction = load_tokenizer(), Direction("th", "en")
    with pytest.raises(RuntimeError, match="engine died"):
        translate_direction(
            ReversingEngine(fail_after_batches=2),
            direction,
            SOURCES,
            tokenizer=tok,
            batch_size=3,
            cache_dir=tmp_path,
        )
    assert (tmp_path / "th-en.partial.jsonl").is_file() and not (tmp_path / "th-en.txt").exists()
    resumed = ReversingEngine()
    hyps = translate_direction(resumed, direction, SOURCES, tokenizer=tok, batch_size=3, cache_dir=tmp_path)
    assert [s.source for batch in resumed.calls for s in batch] == SOURCES[6:]  # only the unfinished part
    assert hyps == translate_direction(ReversingEngine(), direction, SOURCES, tokenizer=tok, batch_size=3)
    assert (tmp_path / "th-en.txt").read_text(encoding="utf-8").count("\n") == len(SOURCES)
    assert not (tmp_path / "th-en.partial.jsonl").exists()
    finished = ReversingEngine()
    assert translate_direction(finished, direction, SOURCES, tokenizer=tok, cache_dir=tmp_path) == hyps
    assert (
        translate_direction(finished, direction, SOURCES[:4], tokenizer=tok, cache_dir=tmp_path) == hyps[:4]
    )
    assert finished.calls == []  # a finished direction is read back, not regenerated


def test_short_cache_is_extended_and_a_cut_record_is_redone(tmp_path):
    tok, direction = load_tokenizer(), Direction("en", "km")
    translate_direction(ReversingEngine(), direction, SOURCES[:3], tokenizer=tok, cache_dir=tmp_path)
    partial = tmp_path / "en-km.partial.jsonl"
    partial.write_text('{"index": 3, "hypothesis": "cached"}\n{"index": 4, "hypo', encoding="utf-8")
    engine = ReversingEngine()
    hyps = translate_direction(
        engine, direction, SOURCES[:6], tokenizer=tok, batch_size=4, cache_dir=tmp_path
    )
    assert [s.source for batch in engine.calls for s in batch] == SOURCES[4:6]
    assert hyps[3] == "cached" and hyps[:3] == [s[::-1] + " extra line" for s in SOURCES[:3]]
    partial.write_text(
        '{"index": 0, "hypothesis": "a"}\nnot json\n{"index": 1, "hypothesis": "b"}\n', encoding="utf-8"
    )
    (tmp_path / "en-km.txt").unlink()
    with pytest.raises(ValueError, match="en-km.partial.jsonl:2: not a JSON record"):
        translate_direction(engine, direction, SOURCES, tokenizer=tok, cache_dir=tmp_path)
    partial.write_text('{"index": 1, "hypothesis": "b"}\n', encoding="utf-8")
    with pytest.raises(ValueError, match="partial.jsonl:1: expected {'index': 0"):
        translate_direction(engine, direction, SOURCES, tokenizer=tok, cache_dir=tmp_path)


def test_sanity_systems_and_hypothesis_files(tmp_path):
    d, refs = Direction("en", "th"), ["r1", "r2"]
    assert system_hypotheses("reference", d, ["s1", "s2"], refs) == refs
    assert system_hypotheses("copy-source", d, ["s1", "s2"], refs) == ["s1", "s2"]
    write_hypotheses(tmp_path / "en-th.txt", ["h1\nmore", "h2", "h3"])
    assert system_hypotheses("hyp-dir", d, ["s1", "s2"], refs, tmp_path) == ["h1 more", "h2"]
    with pytest.raises(ValueError, match="has 3 lines, expected at least 4"):
        system_hypotheses("hyp-dir", d, ["s"] * 4, ["r"] * 4, tmp_path)
    with pytest.raises(FileNotFoundError, match="th-en.txt"):
        system_hypotheses("hyp-dir", Direction("th", "en"), ["s"], ["r"], tmp_path)
    with pytest.raises(ValueError, match="known: hyp-dir, reference, copy-source"):
        system_hypotheses("oracle", d, ["s"], ["r"])


def test_hf_model_system_translates_through_the_fake_sglang_engine(tmp_path):
    """The real engine wiring: run_evaluation with an 'hf-model' system served by SGLangEngine over the
    fake sglang.Engine (a tiny random Qwen2 with the full Qwen2.5 vocabulary), greedy; the hypothesis
    files equal decoding what the engine generates for the same ChatML prompts."""
    import torch

    from tests.support.checkpoints import tiny_qwen2_hf
    from vepo_mcore.config.eval import EvalConfig, EvalSystemConfig
    from vepo_mcore.eval.runner import EvalJob, run_evaluation
    from vepo_mcore.eval.systems import engine_from_hf, greedy_sampling
    from vepo_mcore.languages import load_flores

    tok = load_tokenizer()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        tiny_qwen2_hf(tmp_path / "hf", vocab_size=len(tok), num_layers=1)
        system = EvalSystemConfig(
            kind="hf-model", model_path=str(tmp_path / "hf"), engine="fake_sglang", max_new_tokens=4
        )
        cfg = EvalConfig(directions="en-th,th-en", max_sentences=2, system=system, out_dir=str(tmp_path / "out"),
                         workers=1, plots=False)  # fmt: skip
        job = EvalJob(eval=cfg, progress=False, constraints=False)
        payload = run_evaluation(job)
        assert payload["system"] == "hf" and [r["n"] for r in payload["directions"]] == [2, 2]
        engine = engine_from_hf(tmp_path / "hf", "fake_sglang", tok)
        direction = Direction("en", "th")
        prompts = [
            Sample(prompt_ids=tok.encode(format_prompt(direction, s, tok))) for s in load_flores("en")[:2]
        ]
        direct = engine.generate(prompts, greedy_sampling(tok, 4))
        engine.shutdown()
    finally:
        torch.set_num_threads(threads)
    expected = [
        " ".join(tok.decode(s.response_ids, skip_special_tokens=True).split("\n")).strip() for s in direct
    ]
    assert (tmp_path / "out" / "hyps" / "en-th.txt").read_text(encoding="utf-8").splitlines() == expected
    assert any(expected)
