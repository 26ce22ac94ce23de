"""Trim a byte-level BPE tokenizer to the ids a corpus uses (the toy recipe's small vocabulary).

A toy model with Qwen2.5's 151,665-row vocabulary spends almost all of its parameters and compute
in the two embeddings. `trim_tokenizer` keeps only what encoding the given texts needs:

- every id the source tokenizer produces on the texts, closed under the merges that build them
  (every intermediate token of the BPE merge sequence survives), plus the 256 byte-level symbols
  (so any text still encodes) and the added tokens (ChatML);
- the merges whose two parts and result all survive, in the source order.

So the trimmed tokenizer encodes the given texts to exactly the source tokenizer's segmentation
(ids mapped through `source_ids`; `trim_tokenizer` checks it), decodes any of its ids to the same
text as the source, and still encodes unseen text (into shorter pieces). It is a plain
tokenizer.json directory: checkpoints, HF export and transformers' AutoTokenizer use it as is.

    trimmed = trim_tokenizer("out/qwen2.5-expanded", texts, "out/toy-tokenizer")
    trimmed.source_ids[new_id]                       # the id in the source tokenizer

`min_count=k` keeps only the ids the texts use at least k times (and their closure): a corpus's rare
words then encode into shorter pieces, and the segmentation check covers the texts made of kept ids.

`prefix=` another trimmed directory keeps that one's ids as the prefix of this one (new ids are
appended), so tokenizer/embedding_rows.py can grow a model trained on `prefix` to this vocabulary.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer

from vepo_mcore.tokenizer.expand import (
    TOKENIZER_FILES,
    _with_added_tokens_in_vocab,
    build_tokenizer,
    file_sha256,
    read_tokenizer_json,
)

TRIM_MANIFEST = "trim_manifest.json"


def _byte_alphabet() -> list[str]:
    """The 256 symbols of the byte-level pre-tokenizer (GPT-2's bytes_to_unicode)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    extra = (b for b in range(256) if b not in printable)
    return [chr(b) for b in printable] + [chr(256 + n) for n, _ in enumerate(extra)]


@dataclass
class TrimmedTokenizer:
    path: Path
    source_ids: list[int]
    """new id -> id in the source tokenizer."""
    prefix_size: int
    """ids 0..prefix_size-1 are the prefix tokenizer's (0 without a prefix)."""

    @property
    def vocab_size(self) -> int:
        return len(self.source_ids)


def _merge_pairs(merges: list) -> list[tuple[str, str]]:
    return [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in merges]


def _closure(tokens: set[str], producers: dict[str, list[tuple[str, str]]]) -> set[str]:
    """`tokens` plus every part of every merge that builds one of them, recursively."""
    out, stack = set(tokens), list(tokens)
    while stack:
        for pair in producers.get(stack.pop(), ()):
            for part in pair:
                if part not in out:
                    out.add(part)
                    stack.append(part)
    return out


def trim_tokenizer(
    source_dir: str | Path,
    texts: Iterable[str],
    out_dir: str | Path,
    prefix: str | Path | None = None,
    min_count: int = 1,
) -> TrimmedTokenizer:
    """Write the trimmed tokenizer of `source_dir` for `texts` to `out_dir` (see the module doc)."""
    if min_count < 1:
        raise ValueError(f"min_count must be >= 1, got {min_count}")
    source_dir, out = Path(source_dir), Path(out_dir)
    data = _with_added_tokens_in_vocab(read_tokenizer_json(source_dir))
    model = data["model"]
    source = build_tokenizer(data)
    texts = list(texts)
    if not texts:
        raise ValueError("trim_tokenizer needs at least one text")
    added = {a["content"]: a["id"] for a in data.get("added_tokens", [])}
    id_to_token = {i: t for t, i in model["vocab"].items()}
    encodings = [e.ids for e in source.encode_batch(texts, add_special_tokens=False)]
    counts = Counter(i for ids in encodings for i in ids)
    used = {id_to_token[i] for i, n in counts.items() if n >= min_count}
    pairs = _merge_pairs(model["merges"])
    producers: dict[str, list[tuple[str, str]]] = {}
    for a, b in pairs:
        producers.setdefault(a + b, []).append((a, b))
    alphabet = [s for s in _byte_alphabet() if s in model["vocab"]]
    if len(alphabet) != 256:
        raise ValueError(
            f"{source_dir}: not a byte-level BPE vocabulary ({len(alphabet)} of 256 byte symbols)"
        )
    kept = _closure(used - set(added), producers) | set(alphabet)

    prefix_tokens: list[str] = []
    if prefix is not None:
        prefix_data = read_tokenizer_json(prefix)
        prefix_vocab = _with_added_tokens_in_vocab(prefix_data)["model"]["vocab"]
        prefix_tokens = sorted(prefix_vocab, key=prefix_vocab.get)
        missing = [t for t in prefix_tokens if t not in model["vocab"]]
        if missing:
            raise ValueError(
                f"prefix {prefix} has {len(missing)} tokens {missing[:5]} that {source_dir} lacks"
            )
    # Order: the prefix's tokens (its regular tokens, then its added tokens), or the regular tokens
    # kept by source id then the added tokens; then whatever else is kept, by source id.
    head = prefix_tokens or [*sorted(kept, key=model["vocab"].get), *sorted(added, key=added.get)]
    tail = sorted((kept | set(added)) - set(head), key=model["vocab"].get)
    order = head + tail
    keep = set(order)
    new_vocab = {token: i for i, token in enumerate(order)}
    new_merges = [f"{a} {b}" for a, b in pairs if a in keep and b in keep and a + b in keep]

    data["model"] = {**model, "vocab": new_vocab, "merges": new_merges}
    data["added_tokens"] = [{**a, "id": new_vocab[a["content"]]} for a in data.get("added_tokens", [])]
    trimmed = HFTokenizer.from_str(json.dumps(data, ensure_ascii=False))
    source_ids = [model["vocab"][t] for t in order]
    checked = [t for t, ids in zip(texts, encodings) if all(counts[i] >= min_count for i in ids)]
    _check_same_segmentation(source, trimmed, checked, source_ids)

    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    _write_side_files(source_dir, out, new_vocab)
    manifest = {
        "source_tokenizer": str(source_dir),
        "source_tokenizer_sha256": file_sha256(source_dir / "tokenizer.json"),
        "prefix_tokenizer": str(prefix) if prefix is not None else None,
        "prefix_size": len(prefix_tokens),
        "vocab_size": len(order),
        "texts": len(texts),
        "min_count": min_count,
        "source_ids": source_ids,
    }
    (out / TRIM_MANIFEST).write_text(json.dumps(manifest) + "\n", encoding="utf-8")
    return TrimmedTokenizer(out, source_ids, len(prefix_tokens))


def _check_same_segmentation(
    source: HFTokenizer, trimmed: HFTokenizer, texts: list[str], source_ids: list[int]
) -> None:
    a = source.encode_batch(texts, add_special_tokens=False)
    b = trimmed.encode_batch(texts, add_special_tokens=False)
    for line, (x, y) in enumerate(zip(a, b), start=1):
        if x.ids != [source_ids[i] for i in y.ids]:
            raise RuntimeError(
                f"text {line}: the trimmed tokenizer segments differently ({texts[line - 1][:60]!r})"
            )


def _write_side_files(source_dir: Path, out: Path, vocab: dict[str, int]) -> None:
    """tokenizer_config.json / added_tokens.json with the added tokens' new ids; the rest copied."""
    for name in TOKENIZER_FILES:
        if (source_dir / name).is_file():
            shutil.copyfile(source_dir / name, out / name)
    config_file = out / "tokenizer_config.json"
    if config_file.is_file():
        config = json.loads(config_file.read_text(encoding="utf-8"))
        decoder = config.get("added_tokens_decoder", {})
        config["added_tokens_decoder"] = {str(vocab[v["content"]]): v for v in decoder.values()}
        # The generic fast class takes tokenizer.json as written (see expand.py).
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        config_file.write_text(json.dumps(config, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    added_file = out / "added_tokens.json"
    if added_file.is_file():
        added = json.loads(added_file.read_text(encoding="utf-8"))
        added_file.write_text(json.dumps({t: vocab[t] for t in added}, indent=2) + "\n", encoding="utf-8")


def load_source_ids(tokenizer_dir: str | Path) -> list[int] | None:
    """new id -> source id of a trimmed tokenizer directory, or None when it was not trimmed."""
    file = Path(tokenizer_dir) / TRIM_MANIFEST
    return json.loads(file.read_text(encoding="utf-8"))["source_ids"] if file.is_file() else None
