"""R_mt: chrF++ and BLEU against the sacrebleu CLI; COMET and reward-model errors."""

import subprocess
import sys
from pathlib import Path

import pytest

from vepo_mcore.config.rewards import RewardsConfig
from vepo_mcore.languages import load_flores
from vepo_mcore.rewards.mt import bleu_score, chrf_score, mt_reward
from vepo_mcore.translation.sample import Sample

SACREBLEU = str(Path(sys.executable).with_name("sacrebleu"))


def _cli(hyp: str, ref: str, tmp_path: Path, *args: str) -> float:
    (tmp_path / "hyp.txt").write_text(hyp + "\n", encoding="utf-8")
    (tmp_path / "ref.txt").write_text(ref + "\n", encoding="utf-8")
    out = subprocess.run(
        [SACREBLEU, str(tmp_path / "ref.txt"), "-i", str(tmp_path / "hyp.txt"), "-b", "-w", "6", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(out.stdout.strip())


def test_chrf_matches_the_sacrebleu_cli(tmp_path):
    ref = load_flores("vi")[2]
    hyp = " ".join(ref.split()[:-3]) + " một hai"
    expected = _cli(hyp, ref, tmp_path, "-m", "chrf", "--chrf-word-order", "2")
    assert chrf_score(hyp, ref) == pytest.approx(expected / 100, abs=1e-6)
    assert chrf_score(ref, ref) == pytest.approx(1.0)


@pytest.mark.parametrize("tgt,tokenize", [("zh", "zh"), ("th", "char"), ("en", "13a")])
def test_bleu_uses_the_target_tokenizer_like_the_cli(tmp_path, tgt, tokenize):
    ref = load_flores(tgt)[7]
    hyp = ref[: int(len(ref) * 0.7)]
    expected = _cli(hyp, ref, tmp_path, "-m", "bleu", "-tok", tokenize)
    # One sentence: the corpus score equals the sentence score when all 4-gram orders match.
    assert bleu_score(hyp, ref, tgt) == pytest.approx(expected / 100, abs=1e-5)


def test_mt_reward_dispatch_and_errors():
    ref = load_flores("id")[0]
    samples = [
        Sample(response=ref, reference=ref, tgt_lang="id"),
        Sample(response="", reference=ref, tgt_lang="id"),
    ]
    assert mt_reward(samples, RewardsConfig()).values == pytest.approx([1.0, 0.0])
    assert mt_reward(samples, RewardsConfig(mt="bleu")).values == pytest.approx([1.0, 0.0])
    assert mt_reward(samples, RewardsConfig(mt="none")).values == [0.0, 0.0]
    with pytest.raises(
        ValueError, match="rewards.mt 'chrf2' is not a registered reward term; registered: .*bleu.*chrf"
    ):
        mt_reward(samples, RewardsConfig(mt="chrf2"))
    with pytest.raises(ValueError, match="needs a reference"):
        mt_reward([Sample(response="x", tgt_lang="id")], RewardsConfig())
    with pytest.raises(ValueError, match="comet_checkpoint"):
        mt_reward(samples, RewardsConfig(mt="comet"))


def test_comet_missing_package_or_checkpoint_is_a_clear_error(tmp_path):
    samples = [Sample(source="a", response="b", reference="c", tgt_lang="en")]
    cfg = RewardsConfig(mt="comet", comet_checkpoint=str(tmp_path / "missing.ckpt"))
    try:
        import comet  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="unbabel-comet"):
            mt_reward(samples, cfg)
    else:
        with pytest.raises(FileNotFoundError, match="missing.ckpt"):
            mt_reward(samples, cfg)


def test_reward_model_term_is_registered_by_the_layer_above():
    """rewards/ sits below rm/: the term `rm` exists once vepo_mcore.rm.reward is imported, and
    asking for it before then names the module to import."""
    import subprocess
    import sys

    code = (
        "from vepo_mcore.config.rewards import RewardsConfig\n"
        "from vepo_mcore.rewards.mt import mt_reward\n"
        "from vepo_mcore.translation.sample import Sample\n"
        "try:\n    mt_reward([Sample(response='x')], RewardsConfig(mt='rm'))\n"
        "except ValueError as error:\n    print(error)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "import vepo_mcore.rm.reward" in out
    from vepo_mcore.rewards.registry import registered_rewards
    from vepo_mcore.rm import reward  # noqa: F401

    assert "rm" in registered_rewards()
