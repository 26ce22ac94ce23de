"""The merge-learning loop against a naive recount-every-step reference and against `tokenizers` BPE."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers.models import BPE

from vepo_mcore.languages import default_tokenizer_dir, flores_path
from vepo_mcore.tokenizer.expand import (
    build_tokenizer,
    count_words,
    iter_corpus,
    read_tokenizer_json,
    segment_words,
)
from vepo_mcore.tokenizer.merges import apply_merges, learn_merges, pair_key
from vepo_mcore.tokenizer.pretokenizer import set_pretokenizer


def naive_learn(word_counts, strings, n_tokens, min_frequency, banned):
    """Recount every pair every step; highest count wins, ties to the smallest (a, b)."""
    words = [(list(w), c) for w, c in word_counts.items()]
    strings = list(strings)
    merges = []
    while len(merges) < n_tokens:
        counts = {}
        for w, c in words:
            for a, b in zip(w, w[1:]):
                if pair_key(a, b) not in banned and strings[a] + strings[b] not in strings:
                    counts[(a, b)] = counts.get((a, b), 0) + c
        if not counts:
            break
        (a, b), best = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        if best < min_frequency:
            break
        new = len(strings)
        strings.append(strings[a] + strings[b])
        merges.append((a, b))
        for k, (w, c) in enumerate(words):
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == (a, b):
                    out.append(new)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            words[k] = (out, c)
    return merges


def random_case(seed):
    rng = random.Random(seed)
    letters = "abcde"
    strings = list(letters) + ["ab", "cd"]  # existing multi-letter tokens no base merge reaches
    word_counts = {}
    for _ in range(rng.randint(5, 40)):
        word = tuple(rng.randrange(len(letters)) for _ in range(rng.randint(1, 9)))
        word_counts[word] = word_counts.get(word, 0) + rng.randint(1, 5)
    banned = {pair_key(rng.randrange(5), rng.randrange(5)) for _ in range(rng.randint(0, 4))}
    return word_counts, strings, banned


@pytest.mark.parametrize("seed", range(30))
def test_learn_merges_matches_naive_reference(seed):
    word_counts, strings, banned = random_case(seed)
    for min_frequency in (1, 2):
        got = learn_merges(word_counts, strings, 25, min_frequency, banned)
        assert got == naive_learn(word_counts, strings, 25, min_frequency, banned)
        all_strings = list(strings)
        for a, b in got:
            assert pair_key(a, b) not in banned
            assert all_strings[a] + all_strings[b] not in all_strings  # never re-creates a token
            all_strings.append(all_strings[a] + all_strings[b])


@pytest.mark.parametrize("seed", range(30))
def test_appended_merges_segment_like_tokenizers_bpe(seed):
    """Library BPE with the learned merges appended gives exactly the loop's segmentation."""
    word_counts, strings, banned = random_case(seed)
    merges = learn_merges(word_counts, strings, 25, 1, banned)
    all_strings = list(strings)
    for a, b in merges:
        all_strings.append(all_strings[a] + all_strings[b])
    vocab = {s: i for i, s in enumerate(all_strings)}
    model = BPE(vocab=vocab, merges=[(all_strings[a], all_strings[b]) for a, b in merges])
    for word in word_counts:
        text = "".join(strings[i] for i in word)
        library = [t.id for t in model.tokenize(text)]
        assert library == apply_merges(word, merges, len(strings))


def test_learn_merges_rejects_bad_arguments():
    with pytest.raises(ValueError, match="min_frequency"):
        learn_merges({(0, 1): 2}, ["a", "b"], 3, min_frequency=0)


def test_learned_merges_are_reachable_on_qwen():
    """Real Qwen2.5 base: Thai words segmented by the expanded tokenizer == the loop's segmentation."""
    data = set_pretokenizer(read_tokenizer_json(default_tokenizer_dir()), "mark_aware")
    base = build_tokenizer(data)
    words = count_words(base, iter_corpus(flores_path("th", "dev"), max_lines=150))
    segmented = segment_words(base, words)
    strings = [""] * 151_643
    for token, token_id in data["model"]["vocab"].items():
        strings[token_id] = token
    merges = learn_merges(segmented, strings, 150)
    assert len(merges) == 150
    vocab = dict(data["model"]["vocab"])
    for a, b in merges:
        vocab[strings[a] + strings[b]] = len(strings)
        strings.append(strings[a] + strings[b])
    data["model"]["vocab"] = vocab
    data["model"]["merges"] = data["model"]["merges"] + [f"{strings[a]} {strings[b]}" for a, b in merges]
    expanded = HFTokenizer.from_str(__import__("json").dumps(data))
    fired = set()
    for word, seg in zip(words, segmented):
        library = [t.id for t in expanded.model.tokenize(word)]
        assert library == apply_merges(seg, merges, 151_643)
        fired.update(i for i in library if i >= 151_643)
    assert len(fired) > 100  # most new tokens appear in the final segmentation of their corpus
