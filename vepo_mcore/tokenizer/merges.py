"""BPE merge learning on top of an existing segmentation (the loop `tokenizers` does not offer).

`tokenizers` can train BPE from scratch but cannot continue training an existing model. Merges
learned from scratch and appended to Qwen's list often never fire, because the base merges have
already segmented a word differently. Here each word starts from its *base* segmentation (ids of
the existing vocabulary) and we repeatedly merge the most frequent adjacent pair, so every learned
merge is reachable when appended after the existing ones.

Exactness: a learned merge always creates a token that did not exist before, so no earlier
(existing) merge can involve it, and merging never makes two pre-existing tokens adjacent. Hence
the tokenizer with the merges appended segments every training word exactly as this loop does
(tests check that against `tokenizers`).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence

_SHIFT = 32
_MASK = (1 << _SHIFT) - 1


def pair_key(a: int, b: int) -> int:
    """One int per ordered id pair (cheaper to hash and store by the million than tuples)."""
    return (a << _SHIFT) | b


def _merge_word(word: list[int], a: int, b: int, new: int) -> list[int]:
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
            out.append(new)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def learn_merges(
    word_counts: Mapping[tuple[int, ...], int],
    token_strings: Sequence[str],
    n_tokens: int,
    min_frequency: int = 2,
    banned: set[int] | frozenset[int] = frozenset(),
    on_merge: Callable[[int], None] | None = None,
) -> list[tuple[int, int]]:
    """Learn up to `n_tokens` merges, each creating a new token.

    word_counts: segmented word (ids into token_strings) -> frequency.
    token_strings: id -> token string for every existing id (len = first new id).
    banned: pair_key(a, b) of pairs that must never be merged (protected languages).
    Returns merges (a, b) in learned order; the i-th creates id len(token_strings) + i whose
    string is strings[a] + strings[b]. A pair whose concatenation already exists is skipped.
    Stops early when the best pair occurs fewer than `min_frequency` times. Ties go to the
    smallest (a, b) so runs are deterministic.
    """
    if n_tokens < 0 or min_frequency < 1:
        raise ValueError(f"n_tokens must be >= 0 and min_frequency >= 1, got {n_tokens}, {min_frequency}")
    strings = list(token_strings)
    known = set(strings)
    dead = set(banned)  # keys never counted: banned pairs and pairs whose merge result already exists
    words: list[list[int]] = []
    freqs: list[int] = []
    for word, count in word_counts.items():
        if len(word) > 1 and count > 0:
            words.append(list(word))
            freqs.append(count)

    counts: dict[int, int] = defaultdict(int)
    where: dict[int, set[int]] = defaultdict(set)
    for i, word in enumerate(words):
        for x, y in zip(word, word[1:]):
            key = pair_key(x, y)
            if key not in dead:
                counts[key] += freqs[i]
                where[key].add(i)
    heap = [(-c, k) for k, c in counts.items()]
    heapq.heapify(heap)

    merges: list[tuple[int, int]] = []
    while len(merges) < n_tokens and heap:
        neg, key = heapq.heappop(heap)
        current = counts.get(key, 0)
        if current != -neg:  # stale entry: counts only shrink lazily in the heap
            if current > 0:
                heapq.heappush(heap, (-current, key))
            continue
        if current < min_frequency:
            break
        a, b = key >> _SHIFT, key & _MASK
        merged = strings[a] + strings[b]
        dead.add(key)
        if merged in known:
            counts.pop(key, None)
            where.pop(key, None)
            continue
        new = len(strings)
        strings.append(merged)
        known.add(merged)
        merges.append((a, b))
        touched: set[int] = set()
        for i in where.pop(key):
            word, f = words[i], freqs[i]
            for x, y in zip(word, word[1:]):
                k = pair_key(x, y)
                if k in counts:
                    counts[k] -= f
                    where[k].discard(i)
                    touched.add(k)
            word = words[i] = _merge_word(word, a, b, new)
            for x, y in zip(word, word[1:]):
                k = pair_key(x, y)
                if k not in dead:
                    counts[k] += f
                    where[k].add(i)
                    touched.add(k)
        counts.pop(key, None)
        for k in touched:
            c = counts.get(k, 0)
            if c > 0:
                heapq.heappush(heap, (-c, k))
            else:
                counts.pop(k, None)
                where.pop(k, None)
        if on_merge is not None:
            on_merge(len(merges))
    return merges


def apply_merges(word: Sequence[int], merges: Sequence[tuple[int, int]], first_id: int) -> list[int]:
    """Segment a base-segmented word with learned merges in rank order (what BPE inference does).

    Reference for tests: merge i (creating first_id + i) fires wherever its pair is adjacent,
    lowest rank first, leftmost first.
    """
    rank = {pair: i for i, pair in enumerate(merges)}
    out = list(word)
    while len(out) > 1:
        best = min((rank.get((x, y), len(rank)), j) for j, (x, y) in enumerate(zip(out, out[1:])))
        if best[0] == len(rank):
            break
        r = best[0]
        out = _merge_word(out, merges[r][0], merges[r][1], first_id + r)
    return out
