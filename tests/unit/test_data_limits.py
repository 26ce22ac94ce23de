"""Limits with advice: a CPT split too small for one sample of seq_length + 1 tokens is a ValueError
that names the language, the split and what to change (megatron hangs or raises IndexError)."""

from __future__ import annotations

import pytest

from vepo_mcore.config import JobConfig
from vepo_mcore.data.blend import build_cpt_datasets, check_splits_fit
from vepo_mcore.data.preprocess import preprocess
from vepo_mcore.languages import load_flores


@pytest.fixture(scope="module")
def twenty_docs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("limits")
    (tmp / "en.txt").write_text("\n".join(load_flores("en", "dev")[:20]) + "\n")
    preprocess([tmp / "en.txt"], str(tmp / "en_text_document"), progress=False)
    return str(tmp / "en_text_document")


def _cfg(prefix: str, split: str, seq_length: int) -> JobConfig:
    cfg = JobConfig()
    cfg.data.paths, cfg.data.english_weight, cfg.data.split = {"en": prefix}, 1.0, split
    cfg.training.seq_length = seq_length
    return cfg


def test_a_validation_split_without_one_sample_says_what_to_change(twenty_docs):
    cfg = _cfg(twenty_docs, "98,2,0", 512)
    with pytest.raises(ValueError) as raised:
        check_splits_fit(cfg, with_valid=True)
    text = str(raised.value)
    assert (
        "data.paths.en" in text
        and "validation split (data.split '98,2,0' of 20 documents = 0 documents" in text
    )
    assert (
        "training.seq_length + 1 = 513" in text and "training.eval_interval 0" in text and "'90,10,0'" in text
    )
    check_splits_fit(cfg, with_valid=False)  # no validation: the training split is enough
    check_splits_fit(_cfg(twenty_docs, "50,50,0", 64), with_valid=True)
    with pytest.raises(ValueError, match="train split .* lower training.seq_length"):
        check_splits_fit(_cfg(twenty_docs, "98,2,0", 4096), with_valid=False)
    # build_cpt_datasets checks before megatron's builder runs.
    with pytest.raises(ValueError, match="validation split"):
        build_cpt_datasets(cfg, train_samples=8, valid_samples=8)
