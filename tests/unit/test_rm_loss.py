"""RM loss against a naive float64 computation, the pair batch layout, truncation, and the
evaluation summary against hand-counted numbers."""

from __future__ import annotations

import math

import pytest
import torch

from vepo_mcore.rewards.corruptions import CATEGORIES
from vepo_mcore.rm.data import Pair, PairDataset, build_pairs, encode, positive_weights
from vepo_mcore.rm.evaluate import detection_f1, markdown_report, summarise
from vepo_mcore.rm.loss import flatten_pairs, gather_last, rm_loss
from vepo_mcore.tokenizer import load_tokenizer
from vepo_mcore.training.sampler import collate


def _naive(outputs, last, labels, w, pos_weight=None):
    pos_weight = pos_weight if pos_weight is not None else [1.0] * 10
    total, b = 0.0, outputs.shape[0] // 2
    at = [[float(x) for x in outputs[i, int(last[i])]] for i in range(2 * b)]
    for i in range(b):
        margin = at[i][0] - at[b + i][0]
        bt = math.log1p(math.exp(-margin))
        bces = []
        for row in (i, b + i):
            for k in range(10):
                z, y = at[row][1 + k], float(labels[row, k])
                p = 1 / (1 + math.exp(-z))
                bces.append(-(pos_weight[k] * y * math.log(p) + (1 - y) * math.log(1 - p)))
        total += bt + w * sum(bces) / len(bces)
    return total


def test_rm_loss_matches_naive_float64():
    g = torch.Generator().manual_seed(0)
    outputs = torch.randn(6, 9, 11, generator=g, dtype=torch.float64)
    last = torch.tensor([8, 3, 5, 0, 7, 2])
    labels = (torch.rand(6, 10, generator=g) > 0.7).double()
    labels[:3] = 0
    loss, n, report = rm_loss(outputs, last, labels, bce_weight=0.5)
    assert n.item() == 3 and n.dtype == torch.int
    assert loss.item() == pytest.approx(_naive(outputs, last, labels, 0.5), rel=1e-6)
    assert report["loss"][1].item() == 3
    margins = outputs[[0, 1, 2], last[:3], 0] - outputs[[3, 4, 5], last[3:], 0]
    assert report["pair_acc"][0].item() == (margins > 0).sum().item()
    # Positive labels weighted per category (rare categories count more).
    w = torch.linspace(1.0, 19.0, 10, dtype=torch.float64)
    weighted, _, _ = rm_loss(outputs, last, labels, bce_weight=0.5, pos_weight=w)
    assert weighted.item() == pytest.approx(_naive(outputs, last, labels, 0.5, w.tolist()), rel=1e-6)
    assert weighted.item() > loss.item()


def test_positive_weights_count_negatives_over_positives():
    mk = lambda cats: Pair("p", "b", "w", cats, cats[0], "en", "th")  # noqa: E731
    pairs = [mk(("fluency",)), mk(("fluency",)), mk(("intent", "off-target")), mk(("leakage",))]
    w = positive_weights(pairs, cap=5.0)
    # 8 sequences: fluency 2 positives -> 6 / 2; intent 1 -> 7 (capped to 5); accuracy none -> 1.
    assert w[CATEGORIES.index("fluency")] == 3.0 and w[CATEGORIES.index("intent")] == 5.0
    assert w[CATEGORIES.index("accuracy")] == 1.0 and w[CATEGORIES.index("leakage")] == 5.0


def test_rm_loss_gradient_prefers_the_better_side():
    outputs = torch.zeros(4, 5, 11, requires_grad=True)
    loss, _, _ = rm_loss(outputs, torch.tensor([4, 2, 4, 1]), torch.zeros(4, 10))
    loss.backward()
    assert (outputs.grad[:2, :, 0].sum(1) < 0).all()  # descent raises the better score
    assert (outputs.grad[2:, :, 0].sum(1) > 0).all()
    assert outputs.grad[0, :4].abs().sum() == 0  # only the last real token is read


def test_pairs_encode_collate_layout():
    tok = load_tokenizer()
    pairs = build_pairs("dev", ("th", "en"), range(2), ("repetition", "intent"), seed=0, tokenizer=tok)
    assert len(pairs) == 2 * 2 * 2
    assert all(p.prompt.endswith("<|im_start|>assistant\n") and p.src_lang != p.tgt_lang for p in pairs)
    ds = PairDataset(pairs, tok, seq_length=24)
    assert sorted(ds.order) == list(range(8)) and ds.order != list(range(8))  # a seeded shuffle
    items = [ds[0], ds[1], ds[2]]
    batch = flatten_pairs(collate(items))  # the training loop's stacking, then the RM forward step's view
    assert (
        batch["tokens"].shape == (6, 24) and batch["last"].shape == (6,) and batch["labels"].shape == (6, 10)
    )
    assert torch.equal(batch["tokens"][1], items[1]["tokens"][0]) and torch.equal(
        batch["tokens"][4], items[1]["tokens"][1]
    )
    assert batch["labels"][:3].sum() == 0 and batch["labels"][3:].sum(1).min() >= 1
    p0 = pairs[ds.order[0]]
    full = tok.encode(p0.prompt + p0.worse + "<|im_end|>")
    assert encode(tok, p0.prompt, p0.worse, 24) == full[-24:]  # the instruction is too long for 24 here
    assert torch.equal(items[0]["tokens"][1][: len(full[-24:])], torch.tensor(full[-24:]))
    # At 64 the instruction (prompt up to its blank line) fits and is kept with the response end.
    head = tok.encode(p0.prompt[: p0.prompt.index("\n\n") + 2])
    kept = encode(tok, p0.prompt, p0.worse, 64)
    assert len(full) > 64 and len(kept) == 64 and 0 < len(head) <= 16
    assert kept == head + full[-(64 - len(head)) :]
    assert "into" in tok.decode(kept[: len(head)]) and kept[-1] == tok.im_end_id
    short = encode(tok, "<|im_start|>user\nHi\n\nyo<|im_end|>\n<|im_start|>assistant\n", "ok", 64)
    assert short == tok.encode("<|im_start|>user\nHi\n\nyo<|im_end|>\n<|im_start|>assistant\nok<|im_end|>")
    row = items[0]["tokens"][1]
    assert row[items[0]["last"][1]] == tok.im_end_id


def test_off_target_uses_another_languages_line():
    from vepo_mcore.languages import load_flores

    tok = load_tokenizer()
    pairs = build_pairs("dev", ("th", "vi", "en"), range(12), ("off-target",), seed=0, tokenizer=tok)
    other = [p for p in pairs if p.worse != p.source]
    assert 0 < len(other) < len(pairs)  # about half draw a third language's line, the rest copy the source
    for p in other:
        line = next(i for i in range(12) if load_flores(p.tgt_lang, "dev")[i] == p.better)
        third = [lang for lang in ("en", "zh", "th", "ms", "km", "lo", "my", "fil", "id", "vi")
                 if load_flores(lang, "dev")[line] == p.worse]  # fmt: skip
        assert third and p.src_lang not in third and p.tgt_lang not in third
        assert p.worse_categories == ("off-target",)
    none = build_pairs("dev", ("th",), range(12), ("off-target",), seed=0, tokenizer=tok, other_language=0.0)
    assert all(p.worse == p.source for p in none)


def test_summary_and_detection_by_hand():
    mk = lambda cat, lang: Pair("p", "b", "w", (cat,), cat, "en", lang)  # noqa: E731
    pairs = [mk("fluency", "th"), mk("fluency", "vi"), mk("intent", "th")]
    better, worse = torch.tensor([1.0, 0.0, 2.0]), torch.tensor([0.0, 1.0, 1.0])
    zeros = torch.zeros(3, 10)
    worse_probs = zeros.clone()
    f, i = CATEGORIES.index("fluency"), CATEGORIES.index("intent")
    worse_probs[0, f] = 0.9  # one of two fluency corruptions detected
    better_probs = zeros.clone()
    better_probs[2, f] = 0.8  # and one false alarm on a clean reference
    worse_probs[2, i] = 0.7
    result = summarise(pairs, better, worse, better_probs, worse_probs)
    assert result.accuracy == pytest.approx(2 / 3)
    assert result.by_category == {"fluency": (0.5, 2), "intent": (1.0, 1)}
    assert result.by_language["th"] == (1.0, 2)
    assert result.detection["fluency"] == pytest.approx((0.5, 0.5, 0.5, 2))
    assert result.detection["intent"] == pytest.approx((1.0, 1.0, 1.0, 1))
    assert result.detection["leakage"] == (0.0, 0.0, 0.0, 0)
    # Fluency probabilities over the 6 sequences (better rows, then worse): 0, 0, .8, .9, 0, 0, with
    # positives at rows 3 and 4. Ranked: row 3 (hit, 1/1), row 2, then the zeros in input order
    # 0, 1, 4 (hit at rank 5: 2/5), 5 -> AP = (1 + 2/5) / 2.
    assert result.average_precision["fluency"] == pytest.approx((1 + 2 / 5) / 2)
    assert result.average_precision["leakage"] == 0.0
    table = markdown_report(result)
    assert (
        all(f"| {c} |" in table for c in CATEGORIES)
        and "| fluency | 0.500 | 2 |" in table
        and "| 0.700 | 0.333 |" in table
    )
    assert detection_f1(torch.zeros(2, 10).bool(), torch.ones(2, 10).bool())["fluency"] == (0.0, 0.0, 0.0, 2)


def test_gather_last_reads_each_rows_index():
    x = torch.arange(2 * 3 * 1.0).reshape(2, 3, 1)
    assert gather_last(x, torch.tensor([2, 0])).flatten().tolist() == [2.0, 3.0]
