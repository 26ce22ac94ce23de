"""Embedding rows for new tokens: mean of the base rows of their pieces; originals kept; padding zero."""

from __future__ import annotations

import pytest
import torch

from vepo_mcore.languages import default_tokenizer_dir, flores_path, load_flores
from vepo_mcore.tokenizer.embedding_rows import new_row_sources, resize_embedding
from vepo_mcore.tokenizer.expand import expand_tokenizer
from vepo_mcore.tokenizer.tokenizer import Tokenizer, load_tokenizer

BASE = 151_665


@pytest.fixture(scope="module")
def expanded(tmp_path_factory):
    """A small unprotected expansion (th + ms): enough to exercise new ids, fast to build."""
    out = tmp_path_factory.mktemp("tok")
    corpora = {"th": [flores_path("th", "dev")], "ms": [flores_path("ms", "dev")]}
    result = expand_tokenizer(default_tokenizer_dir(), corpora, n_tokens=60, max_lines=200, protect=())
    result.save(out)
    return Tokenizer(out)


@pytest.fixture(scope="module")
def sources(expanded):
    return new_row_sources(load_tokenizer(), expanded)


def test_sources_are_base_encodings_of_the_decoded_token(expanded, sources):
    base = load_tokenizer()
    assert sorted(sources) == list(range(BASE, expanded.vocab_size)) and len(sources) == 120
    for new_id, ids in sources.items():
        token = expanded.backend.id_to_token(new_id)
        assert "".join(base.backend.id_to_token(i) for i in ids) == token  # pieces spell the token's bytes
        assert len(ids) >= 2 and max(ids) < BASE
        text = expanded.decode([new_id])
        if "\ufffd" not in text:  # whole characters: exactly the base tokenizer's encoding of the text
            assert ids == base.encode(text)


def test_resize_rows(expanded, sources):
    base = load_tokenizer()
    torch.manual_seed(0)
    weight = torch.randn(152_064, 8, dtype=torch.bfloat16)  # Qwen2.5-7B rows incl. padding
    new_vocab = expanded.vocab_size
    padded = ((new_vocab + 127) // 128) * 128
    out = resize_embedding(weight, new_vocab, padded, sources)
    assert out.shape == (padded, 8) and out.dtype == torch.bfloat16
    assert torch.equal(out[:BASE], weight[:BASE])
    assert torch.count_nonzero(out[new_vocab:]) == 0
    lines = load_flores("th", "devtest")[:100] + load_flores("ms", "devtest")[:100]
    new_ids = sorted({i for line in lines for i in expanded.encode(line) if i >= BASE})
    assert len(new_ids) > 20, "expected the Thai/Malay lines to use new tokens"
    for new_id in new_ids:
        pieces = base.encode(expanded.decode([new_id]))
        reference = weight[pieces].double().mean(dim=0)
        torch.testing.assert_close(out[new_id].double(), reference, rtol=1e-2, atol=1e-2)  # bf16 rounding


def test_resize_float64_exact_mean():
    weight = torch.arange(12, dtype=torch.float64).reshape(6, 2)  # 5 base rows + 1 padding row
    out = resize_embedding(weight, 7, 8, {5: [0, 3], 6: [1, 2, 4]})
    assert torch.equal(out[:5], weight[:5])
    assert torch.equal(out[5], (weight[0] + weight[3]) / 2)
    assert torch.allclose(out[6], (weight[1] + weight[2] + weight[4]) / 3)
    assert torch.count_nonzero(out[7]) == 0


def test_resize_rejects_bad_input():
    weight = torch.zeros(5, 2)
    with pytest.raises(ValueError, match="padded_rows"):
        resize_embedding(weight, 6, 5, {5: [0]})
    with pytest.raises(ValueError, match="source ids"):
        resize_embedding(weight, 6, 8, {5: [5]})
    with pytest.raises(ValueError, match="cover new ids"):
        resize_embedding(torch.zeros(8, 2), 7, 8, {5: [0], 7: [0]})


def test_sources_reject_a_smaller_expanded_tokenizer(expanded):
    with pytest.raises(ValueError, match="fewer than the base"):
        new_row_sources(expanded, load_tokenizer())
