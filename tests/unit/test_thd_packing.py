"""The contract of packed SFT on Transformer Engine (data/packing.py, training/forward.py): what the
LM forward step hands megatron's GPTModel, and through it TE's attention, for a packed micro-batch.

TE needs CUDA, so the model here is a recorder with megatron.core 0.16.1's GPTModel.forward
signature checked by inspect; the arguments are checked against what Megatron-LM's SFT builds
(megatron.core.utils.get_thd_batch_on_this_cp_rank) for the same cu_seqlens."""

from __future__ import annotations

import dataclasses
import inspect
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from megatron.core.models.gpt import GPTModel
from megatron.core.packed_seq_params import PackedSeqParams

from vepo_mcore.config import JobConfig
from vepo_mcore.data import packing
from vepo_mcore.data.packing import packed_seq_params, schedule_shape, thd_token_multiple, to_thd
from vepo_mcore.data.sft import pack_conversations
from vepo_mcore.models.gpt import QwenGPTModel
from vepo_mcore.training.forward import forward_step

SEQ = 37  # 2 rows x 37 = 74 tokens: not a multiple of 16, so FP8 pads


def _packed_batch() -> tuple[dict[str, torch.Tensor], list[int]]:
    rng = np.random.default_rng(1)
    encoded = [(rng.integers(1, 400, n), rng.random(n) < 0.5) for n in (12, 20, 9, 30)]
    p = pack_conversations(encoded, seq_length=SEQ, pad_id=0)
    assert p.tokens.shape == (2, SEQ)
    # The naive walk: a sequence starts at every row start and every change of segment id.
    starts = [
        row * SEQ + i
        for row in range(2)
        for i in range(SEQ)
        if i == 0 or p.segment_ids[row, i] != p.segment_ids[row, i - 1]
    ]
    batch = p.tensors()
    return batch, starts


@pytest.mark.parametrize("multiple, total", [(1, 2 * SEQ), (16, 80), (32, 96)])
def test_cu_seqlens_are_int32_cumulative_from_zero_to_the_padded_token_count(multiple, total):
    batch, starts = _packed_batch()
    out, params = to_thd(batch, multiple)
    cu = params.cu_seqlens_q
    expected = starts + [2 * SEQ] + ([total] if total > 2 * SEQ else [])
    assert cu.dtype == torch.int32 and cu.tolist() == expected
    assert cu[0] == 0 and cu[-1] == total and bool((cu[1:] > cu[:-1]).all())
    assert params.cu_seqlens_kv is cu and params.qkv_format == "thd"
    assert params.max_seqlen_q == params.max_seqlen_kv == max(np.diff(expected))
    assert type(params.max_seqlen_q) is int  # TE and megatron's rotary table take a Python int
    for key in ("tokens", "labels", "loss_mask", "position_ids"):
        assert out[key].shape == (1, total)
        assert torch.equal(out[key][0, : 2 * SEQ], batch[key].reshape(-1))
    assert out["loss_mask"][0, 2 * SEQ :].sum() == 0  # padding never counts
    assert out["position_ids"][0, 2 * SEQ :].tolist() == list(range(total - 2 * SEQ))
    assert "segment_ids" not in out and "attention_mask" not in out


def test_packed_seq_params_are_what_megatron_lms_sft_builds():
    from megatron.core.utils import get_thd_batch_on_this_cp_rank

    batch, _ = _packed_batch()
    ours = packed_seq_params(batch["segment_ids"], 16)
    cu = ours.cu_seqlens_q
    max_seqlen = torch.tensor([int((cu[1:] - cu[:-1]).max())])
    _, reference = get_thd_batch_on_this_cp_rank({}, cu, None, max_seqlen, cp_size=1, cp_rank=0)
    for field in dataclasses.fields(PackedSeqParams):
        a, b = getattr(ours, field.name), getattr(reference, field.name)
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, field.name


class TEDotProductAttention(torch.nn.Module):
    """Stands in for megatron.core.extensions.transformer_engine.TEDotProductAttention (needs CUDA):
    the forward step looks for this class name to choose THD."""


class RecordingGPT(torch.nn.Module):
    """Records the call the forward step makes; returns a per-token loss of the input's shape."""

    def __init__(self, fp8: str | None):
        super().__init__()
        self.core_attention = TEDotProductAttention()
        self.config = SimpleNamespace(fp8=fp8, tensor_model_parallel_size=4, sequence_parallel=True)
        self.calls = []

    def forward(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return torch.ones(args[0].shape)


@pytest.mark.parametrize("fp8, total", [(None, 76), ("hybrid", 128)])
def test_forward_step_hands_gpt_model_thd_tokens_and_packed_seq_params(fp8, total):
    batch, _ = _packed_batch()
    batch["attention_mask"] = torch.ones(2, 1, SEQ, SEQ, dtype=torch.bool)  # TE takes none: dropped
    model = RecordingGPT(fp8)  # 74 tokens; TP=4 with sequence parallelism: x4, FP8: x16 on top
    output, loss_func = forward_step(iter([batch]), model)
    ((args, kwargs),) = model.calls
    # Binds to megatron.core 0.16.1's GPTModel.forward once QwenGPTModel takes output_mask off.
    assert "output_mask" in inspect.signature(QwenGPTModel.forward).parameters
    bound = inspect.signature(GPTModel.forward).bind(
        model, *args, **{k: v for k, v in kwargs.items() if k != "output_mask"}
    )
    arguments = bound.arguments
    params = arguments["packed_seq_params"]
    assert isinstance(params, PackedSeqParams) and params.qkv_format == "thd"
    assert arguments["attention_mask"] is None
    assert (
        arguments["input_ids"].shape
        == arguments["position_ids"].shape
        == arguments["labels"].shape
        == (1, total)
    )
    assert kwargs["output_mask"].shape == (1, total)
    assert params.cu_seqlens_q[-1] == total and params.cu_seqlens_q.dtype == torch.int32
    loss_sum, num_tokens, _ = loss_func(output)  # the [1, T] loss mask: padding adds nothing
    assert int(num_tokens) == int(batch["loss_mask"].sum()) == float(loss_sum)


def test_te_attention_takes_packed_seq_params_with_these_fields():
    """megatron 0.16.1's TEDotProductAttention.forward takes packed_seq_params and hands its fields
    (all but cp_group / local_cp_size) to TE's DotProductAttention by name. Without TE the class is a
    placeholder, so its source is read instead of imported."""
    import ast
    import importlib.util

    origin = importlib.util.find_spec("megatron.core.extensions.transformer_engine").origin
    tree = ast.parse(open(origin).read())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TEDotProductAttention"]
    (forward,) = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "forward"]
    assert "packed_seq_params" in [a.arg for a in forward.args.args]
    names = {f.name for f in dataclasses.fields(PackedSeqParams)}
    assert {"qkv_format", "cu_seqlens_q", "cu_seqlens_kv", "max_seqlen_q", "max_seqlen_kv"} <= names


def test_schedule_shape_is_one_row_of_all_tokens_under_thd(monkeypatch):
    cfg = JobConfig()
    cfg.data.mode = "sft"
    cfg.training.seq_length, cfg.training.micro_batch_size = 100, 3
    assert schedule_shape(cfg) == (100, 3)  # local spec: [s, b, h] between stages
    monkeypatch.setattr(packing, "use_transformer_engine", lambda cfg: True)
    assert schedule_shape(cfg) == (300, 1)
    cfg.model.fp8.format = "hybrid"
    assert schedule_shape(cfg) == (304, 1)  # padded to 16, as forward_step pads
    cfg.data.sft_packing = False
    assert schedule_shape(cfg) == (100, 3)
    assert thd_token_multiple(True, 4, True) == 64 and thd_token_multiple(False, 4, False) == 1


def test_thd_with_context_parallelism_is_refused_naming_the_setting():
    batch, _ = _packed_batch()
    model = RecordingGPT(None)
    model.config.context_parallel_size = 2
    with pytest.raises(ValueError, match="parallel.context_parallel_size"):
        forward_step(iter([batch]), model)
