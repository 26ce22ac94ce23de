"""rewards.mt = 'chrf_contrast': chrF++ against the reference minus the mean chrF++ against other
FLORES dev sentences of the target language, checked against sacreBLEU's CHRF(word_order=2) itself;
text that ignores the source earns about nothing, a translation keeps its score."""

from __future__ import annotations

import pytest
from sacrebleu.metrics import CHRF

from vepo_mcore.config.rewards import RewardsConfig
from vepo_mcore.languages import load_flores
from vepo_mcore.rewards import rlvr_reward, run_reward
from vepo_mcore.rewards.contrast import contrast_sentences
from vepo_mcore.translation.sample import Sample

CHRF_PP = CHRF(word_order=2)


def _sacrebleu(hypothesis: str, reference: str) -> float:
    return CHRF_PP.sentence_score(hypothesis, [reference]).score / 100.0


def _samples(responses: list[str], references: list[str], tgt: str = "vi") -> list[Sample]:
    return [Sample(source="x", response=r, reference=ref, src_lang="en", tgt_lang=tgt)
            for r, ref in zip(responses, references)]  # fmt: skip


def test_contrast_sentences_are_other_dev_sentences_of_the_target_language_chosen_per_reference():
    dev = load_flores("th", "dev")
    picks = contrast_sentences(dev[5], "th", 8)
    assert len(set(picks)) == 8 and dev[5] not in picks and set(picks) <= set(dev)
    assert contrast_sentences(dev[5], "th", 8) == picks  # the same prompt gets the same contrast set
    assert contrast_sentences(dev[6], "th", 8) != picks
    assert not set(picks) & set(load_flores("th", "devtest"))
    with pytest.raises(ValueError, match="contrast_references = 5000 but FLORES dev has only 996"):
        contrast_sentences(dev[5], "th", 5000)


def test_value_is_own_chrf_minus_weighted_mean_over_the_contrast_sentences():
    references = load_flores("vi", "devtest")[:3]
    responses = [references[0], references[1][: len(references[1]) // 2], "Các nhà khoa học đã nói."]
    cfg = RewardsConfig(mt="chrf_contrast", contrast_references=4, contrast_weight=0.5)
    result = run_reward("chrf_contrast", _samples(responses, references), cfg)
    for response, reference, value, raw in zip(responses, references, result.values, result.raw):
        others = [_sacrebleu(response, c) for c in contrast_sentences(reference, "vi", 4)]
        assert raw == pytest.approx(_sacrebleu(response, reference))
        assert value == pytest.approx(raw - 0.5 * sum(others) / 4)


def test_generic_text_earns_about_nothing_while_translations_keep_their_score():
    references = load_flores("vi", "devtest")[:40]
    generic = "Các nhà khoa học đã phát hiện ra rằng những người này có thể"  # one answer for every prompt
    cfg = RewardsConfig(mt="chrf_contrast")
    plain = run_reward("chrf", _samples([generic] * 40, references), cfg).values
    contrast = run_reward("chrf_contrast", _samples([generic] * 40, references), cfg).values
    exact = run_reward("chrf_contrast", _samples(references, references), cfg).values
    assert sum(plain) / 40 > 0.07  # plain chrF++ pays ~9 points for it
    assert abs(sum(contrast) / 40) < 0.01
    assert min(exact) > 0.7


def test_it_is_the_mt_term_of_the_rlvr_reward_and_bad_settings_are_refused():
    references = load_flores("th", "devtest")[:2]
    samples = _samples(references, references, tgt="th")
    rlvr_reward(samples, RewardsConfig(mt="chrf_contrast", normalize=False))
    own = [_sacrebleu(r, r) for r in references]
    assert all(s.reward_terms["mt_raw"] == pytest.approx(o) and s.reward_terms["mt"] < o
               for s, o in zip(samples, own))  # fmt: skip
    with pytest.raises(ValueError, match="contrast_references must be >= 1"):
        RewardsConfig(mt="chrf_contrast", contrast_references=0).validate()
    with pytest.raises(ValueError, match="needs a reference translation"):
        run_reward("chrf_contrast", [Sample(response="a", tgt_lang="th")], RewardsConfig())
