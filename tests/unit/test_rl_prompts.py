"""RL prompts: a resumable stream over FLORES, and a sentence range that keeps RL prompts apart from
the sentences SFT translated."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from vepo_mcore.config.rl import RLConfig
from vepo_mcore.data.sft_flores import direction_examples
from vepo_mcore.languages import load_flores, sentence_range
from vepo_mcore.rl.prompts import TranslationPrompts
from vepo_mcore.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def test_sentence_range_parses_and_refuses_bad_ranges():
    assert sentence_range("800:") == slice(800, None)
    assert sentence_range(":800") == slice(None, 800)
    assert sentence_range("10:20") == slice(10, 20)
    assert sentence_range(":") == slice(None, None)
    for bad in ("800", "a:", "-5:", "1:2:3"):
        with pytest.raises(ValueError, match="sentence range"):
            sentence_range(bad)
    cfg = RLConfig(prompt_sentences="800")
    with pytest.raises(ValueError, match="'800'"):
        cfg.validate()


def test_rl_prompts_and_sft_data_split_one_flores_split_without_overlap(tokenizer):
    prompts = TranslationPrompts(tokenizer, "en-vi,vi-en", "dev", seed=3, sentences="990:")
    seen = {(s.metadata["direction"], s.metadata["index"]) for s in prompts.next_batch(14)}
    assert len(seen) == 14 and {i for _, i in seen} == set(range(990, 997))  # one epoch: every pair
    sft = direction_examples([("en", "vi"), ("vi", "en")], "dev", sentences=":990")
    assert len(sft) == 2 * 990
    sft_sources = {c["messages"][0]["content"].split("\n\n", 1)[1] for c in sft}
    en, vi = load_flores("en", "dev"), load_flores("vi", "dev")
    held = {en[i] for i in range(990, 997)} | {vi[i] for i in range(990, 997)}
    assert not held & sft_sources
    sample = prompts.sample(prompts.directions[0], 995, 0)
    assert sample.source == en[995] and sample.reference == vi[995]


def test_an_empty_range_and_a_changed_range_are_refused(tokenizer):
    with pytest.raises(ValueError, match="selects none"):
        TranslationPrompts(tokenizer, "en-vi", "dev", sentences="5000:")
    state = TranslationPrompts(tokenizer, "en-vi", "dev", sentences="900:").state_dict()
    with pytest.raises(ValueError, match="rl.prompt_sentences"):
        TranslationPrompts(tokenizer, "en-vi", "dev", sentences="800:").load_state_dict(state)


def test_toy_holdout_moves_the_last_dev_sentences_from_sft_to_rl(tmp_path):
    from recipes.toy.recipe import ToyPlan, _sft_and_rl_split

    all_dev = tmp_path / "translation.jsonl"
    assert _sft_and_rl_split(ToyPlan(out=tmp_path, directions="en-vi"), all_dev) == (all_dev, ":")
    path, prompts = _sft_and_rl_split(ToyPlan(out=tmp_path, directions="en-vi", rl_holdout=7), all_dev)
    assert prompts == "990:" and len(path.read_text(encoding="utf-8").splitlines()) == 990


def test_sft_window_adds_joined_runs_of_consecutive_sentences_inside_the_sft_range(tmp_path):
    from recipes.toy.recipe import ToyPlan, _sft_and_rl_split

    en, vi = load_flores("en", "dev"), load_flores("vi", "dev")
    rows = direction_examples([("en", "vi")], "dev", sentences=":10", window=3)
    assert len(rows) == 10 + 9 + 8  # singles, then pairs, then triples
    user, answer = (m["content"] for m in rows[10 + 9 + 7]["messages"])  # the last triple: 7, 8, 9
    assert user.endswith("\n\n" + " ".join(en[7:10])) and answer == " ".join(vi[7:10])
    with pytest.raises(ValueError, match="window must be >= 1"):
        direction_examples([("en", "vi")], "dev", window=0)
    all_dev = tmp_path / "translation.jsonl"
    plan = ToyPlan(out=tmp_path, directions="en-vi", rl_holdout=7, sft_window=2)
    path, prompts = _sft_and_rl_split(plan, all_dev)
    users = [
        json.loads(line)["messages"][0]["content"] for line in path.read_text(encoding="utf-8").splitlines()
    ]
    assert prompts == "990:" and len(users) == 990 + 989  # no run reaches into the RL sentences
    assert any(en[989] in u for u in users) and not any(en[i] in u for u in users for i in range(990, 997))


def test_toy_rl_validation_takes_the_last_rl_sentences_and_picks_the_best_checkpoint(tmp_path):
    from recipes.toy.recipe import ToyPlan, _validation_split, select_rl_checkpoint

    assert _validation_split(ToyPlan(out=tmp_path, rl_holdout=197), "800:") == ("800:", [])
    prompts, args = _validation_split(ToyPlan(out=tmp_path, rl_holdout=197, rl_validation=50), "800:")
    assert prompts == "800:947" and args[:4] == [
        "--rl.eval_sentences",
        "947:",
        "--training.eval_interval",
        "40",
    ]
    cfg = RLConfig(prompt_sentences=prompts, eval_sentences=args[1])
    cfg.validate()  # apart: accepted
    with pytest.raises(ValueError, match="must be below rl_holdout"):
        _validation_split(ToyPlan(out=tmp_path, rl_holdout=0, rl_validation=50), ":")
    # Checkpoints 40, 80, 120 with validation rows (120's on disk too), 160 without a checkpoint.
    rl = tmp_path / "rl"
    scores = {40: (90.0, 14.0), 80: (93.0, 14.5), 120: (92.0, 15.5), 160: (99.0, 20.0)}
    rows = [{"step": s, "train/loss": 0.1} for s in range(1, 161)]
    rows += [{"step": s, "valid/overall_pass": o, "valid/chrf": c, "valid/stop_rate": 100.0}
             for s, (o, c) in scores.items()]  # fmt: skip
    rl.mkdir()
    (rl / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for step in (40, 80, 120):
        (rl / f"iter_{step:07d}").mkdir()
    assert select_rl_checkpoint(tmp_path) == rl / "iter_0000080"  # 107.5 beats 104.0 and 107.5 later
    choice = json.loads((tmp_path / "rl_selected.json").read_text())
    assert choice["step"] == 80 and choice["score"] == 107.5 and set(choice["valid"]) == {"40", "80", "120"}
    (rl / "iter_0000160").mkdir()
    assert select_rl_checkpoint(tmp_path) == rl / "iter_0000160"


@pytest.mark.parametrize(
    ("until", "trained", "evaluated"),
    [
        ("sft", ["resize", "cpt", "sft"], ["cpt", "sft"]),
        ("rl", ["resize", "cpt", "sft", "rl"], ["cpt", "sft", "rl"]),
    ],
)
def test_run_seed_stops_after_its_until_stage_and_evaluates_what_it_trained(tmp_path, monkeypatch, until, trained,
                                                                            evaluated):  # fmt: skip
    import recipes.toy.recipe as recipe

    launched = []
    monkeypatch.setattr(recipe, "_train", lambda plan, name, *a, **k: launched.append(name))
    monkeypatch.setattr(recipe, "_run", lambda plan, args, log: launched.append(Path(log).stem))
    monkeypatch.setattr(recipe, "select_rl_checkpoint", lambda root: root / "rl")
    plan = recipe.ToyPlan(out=tmp_path, directions="en-vi", until=until, log=open(os.devnull, "w"))
    paths = {"base_tok": tmp_path, "toy_tok": tmp_path, "cpt_data": tmp_path, "sft": tmp_path / "t.jsonl",
             "base": tmp_path}  # fmt: skip
    recipe.run_seed(plan, 0, paths)
    assert [n for n in launched if not n.startswith("eval_")] == ["resize", *trained[1:]]
    assert [n for n in launched if n.startswith("eval_")] == [f"eval_heldout_{n}" for n in evaluated]
    assert json.loads((tmp_path / "seed0" / "rl_prompts.json").read_text())["directions"] == "en-vi"


def test_an_interrupted_training_stage_is_not_done_and_reruns(tmp_path):
    from recipes.toy.recipe import _trained

    save = tmp_path / "rl"
    assert not _trained(save)  # nothing yet

    def checkpoint(step: int) -> None:  # what save_checkpoint leaves: metadata, the run's config, `latest`
        (save / f"iter_{step:07d}").mkdir(parents=True)
        (save / f"iter_{step:07d}" / "metadata.json").write_text("{}")
        (save / f"iter_{step:07d}" / "config.yaml").write_text("training:\n  train_iters: 200\n")
        (save / "latest_checkpointed_iteration.txt").write_text(str(step))

    checkpoint(40)
    checkpoint(80)
    assert not _trained(save)  # stopped at step 84: resumes from 80
    checkpoint(200)
    assert _trained(save)
