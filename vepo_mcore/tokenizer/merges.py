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


def _merge_words(
    words: list[list[int]],
    freqs: list[int],
    indices: set[int],
    a: int,
    b: int,
    new: int,
    counts: dict[int, int],
    where: dict[int, set[int]],
    dead: set[int],
) -> set[int]:
    """Merge (a, b) -> new in the given words in place, updating pair counts; returns changed keys.

    Only the neighbours of each occurrence change: (prev, a) -> (prev, new), (b, next) -> (new, next).
    `where` may keep words that no longer hold a pair; they simply have no match later.
    """
    touched: set[int] = set()

    def change(x: int, y: int, delta: int, i: int) -> None:
        k = (x << _SHIFT) | y
        if delta > 0:
            if k in dead:
                return
            counts[k] += delta
            where[k].add(i)
        elif k in counts:
            counts[k] += delta
        touched.add(k)

    for i in indices:
        word, f = words[i], freqs[i]
        j = 0
        while j < len(word) - 1:
            if word[j] == a and word[j + 1] == b:
                if j > 0:
                    change(word[j - 1], a, -f, i)
                    change(word[j - 1], new, f, i)
                if j + 2 < len(word):
                    change(b, word[j + 2], -f, i)
                    change(new, word[j + 2], f, i)
                word[j : j + 2] = [new]
            j += 1
    return touched


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
        touched = _merge_words(words, freqs, where.pop(key), a, b, new, counts, where, dead)
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
