"""CPT blending through megatron.core's BlendedMegatronDatasetBuilder: weights, realised ratios, samples."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vepo_mcore.config.job import JobConfig
from vepo_mcore.data.blend import build_cpt_datasets, language_blend, realised_language_share
from vepo_mcore.data.corpus import build_flores_cpt_corpus
from vepo_mcore.data.indexed import read_documents

LANGS3 = ("en", "th", "km")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return build_flores_cpt_corpus(tmp_path_factory.mktemp("cpt"), LANGS3, sentences_per_doc=8)


def cpt_config(paths: dict[str, str], **data) -> JobConfig:
    cfg = JobConfig()
    cfg.data.paths = dict(paths)
    for key, value in data.items():
        setattr(cfg.data, key, value)
    cfg.training.seq_length = 32
    return cfg


def test_language_blend_english_half_rest_shared():
    paths = {lang: f"/x/{lang}" for lang in ("en", "th", "km", "vi", "my")}
    assert language_blend(cpt_config(paths).data) == pytest.approx(
        {"en": 0.5, "th": 0.125, "km": 0.125, "vi": 0.125, "my": 0.125}
    )
    weighted = cpt_config(
        paths, english_weight=0.4, language_weights={"th": 3.0, "km": 1.0, "vi": 0.0, "my": 2.0}
    )
    assert language_blend(weighted.data) == pytest.approx({"en": 0.4, "th": 0.3, "km": 0.1, "my": 0.2})


@pytest.mark.parametrize(
    "data, message",
    [
        ({"paths": {"xx": "/p"}}, "unknown language"),
        ({"paths": {"th": "/p"}}, "has no 'en'"),
        ({"paths": {"en": "/p"}, "language_weights": {"th": 1.0}}, "which data.paths lacks"),
        ({"paths": {}}, "data.paths is empty"),
    ],
)
def test_language_blend_errors_name_the_field(data, message):
    with pytest.raises(ValueError, match=message):
        language_blend(cpt_config(**data).data)


def test_blend_ratios_within_two_percent_over_10k_samples(corpus):
    cfg = cpt_config(corpus, language_weights={"th": 3.0, "km": 1.0})
    target = {"en": 0.5, "th": 0.375, "km": 0.125}
    train, valid = build_cpt_datasets(cfg, train_samples=10_000, valid_samples=50)
    assert len(train) >= 10_000 and len(valid) >= 50
    # Count the dataset each of the first 10k samples really comes from (not megatron's index).
    counts = {lang: 0 for lang in LANGS3}
    order = [part.dataset_path for part in train.datasets]
    by_prefix = {prefix: lang for lang, prefix in corpus.items()}
    for i in range(10_000):
        counts[by_prefix[order[int(train[i]["dataset_id"])]]] += 1
    for lang, share in target.items():
        assert abs(counts[lang] / 10_000 - share) < 0.02, (lang, counts)
    realised = realised_language_share(train, cfg.data, 10_000)
    assert realised == pytest.approx({lang: counts[lang] / 10_000 for lang in LANGS3})


def test_samples_are_windows_of_their_language(corpus):
    cfg = cpt_config(corpus)
    train, _ = build_cpt_datasets(cfg, train_samples=300, valid_samples=0)
    streams = {lang: np.concatenate(read_documents(prefix)) for lang, prefix in corpus.items()}
    by_prefix = {prefix: lang for lang, prefix in corpus.items()}
    for i in range(0, 300, 37):
        sample = train[i]
        lang = by_prefix[train.datasets[int(sample["dataset_id"])].dataset_path]
        tokens, labels = sample["tokens"], sample["labels"]
        assert tokens.shape == labels.shape == (32,)
        assert torch.equal(tokens[1:], labels[:-1])
        assert sample["loss_mask"].sum() == 32 and torch.equal(sample["position_ids"], torch.arange(32))
        # Every bigram of the sample occurs in its language's token stream (documents may be
        # shuffled, so only pairs inside one document are checked: skip pairs across an EOD).
        stream = streams[lang]
        pairs = set(zip(stream[:-1].tolist(), stream[1:].tolist()))
        eod = 151643
        full = torch.cat([tokens, labels[-1:]]).tolist()
        for a, b in zip(full[:-1], full[1:]):
            assert a == eod or (a, b) in pairs


def test_single_language_needs_no_blend(corpus):
    cfg = cpt_config({"en": corpus["en"]})
    train, valid = build_cpt_datasets(cfg, train_samples=20)
    assert valid is None
    assert realised_language_share(train, cfg.data) == {"en": 1.0}
    assert len(train) >= 20


@pytest.mark.parametrize(
    "data, message",
    [
        ({"paths": {"en": "/p", "xx": "/q"}}, r"data.paths has unknown language\(s\) \['xx'\]"),
        (
            {"paths": {"en": "/p", "th": "/q"}, "language_weights": {"en": 1.0}},
            r"language_weights has \['en'\]",
        ),
        ({"paths": {"th": "/q"}}, "data.english_weight is 0.5 but data.paths has no 'en'"),
    ],
)
def test_config_validate_catches_blend_mistakes_early(data, message):
    with pytest.raises(ValueError, match=message):
        cpt_config(**data).validate()
    cpt_config(paths={"th": "/q"}, english_weight=0.0).validate()
