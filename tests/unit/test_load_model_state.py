"""Issue 20.2: a Transformer Engine model's state dict has `_extra_state` entries (FP8 metadata) a
checkpoint may not hold; load_model_state ignores exactly those and names any other mismatch."""

from __future__ import annotations

import io

import pytest
import torch

from vepo_mcore.training.state_dict import load_model_state


class TELikeLinear(torch.nn.Linear):
    """A Linear with TE's extra-state hooks: its state dict carries `<name>._extra_state`."""

    def get_extra_state(self):
        buf = io.BytesIO()
        torch.save({"amax_history": torch.zeros(2)}, buf)  # TE stores FP8 metadata as a byte tensor
        return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)

    def set_extra_state(self, state):
        self.loaded_extra = state


def _te_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(TELikeLinear(4, 4), torch.nn.ReLU(), TELikeLinear(4, 2))


def test_strict_load_fails_on_missing_extra_state_and_the_helper_loads():
    model, source = _te_model(), _te_model()
    with torch.no_grad():
        for p in source.parameters():
            p.add_(1.0)
    checkpoint = {k: v for k, v in source.state_dict().items() if not k.endswith("_extra_state")}
    assert any(k.endswith("_extra_state") for k in model.state_dict())
    with pytest.raises(RuntimeError, match="_extra_state"):
        model.load_state_dict(checkpoint)  # what training/checkpointing.py and convert.py do today
    load_model_state(model, checkpoint)
    for (name, a), b in zip(model.named_parameters(), source.parameters()):
        assert torch.equal(a, b), name


def test_unexpected_extra_state_from_a_te_checkpoint_loads_into_a_local_model():
    te_checkpoint = _te_model().state_dict()
    local = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    load_model_state(local, te_checkpoint)
    assert torch.equal(local[0].weight, te_checkpoint["0.weight"])


def test_any_other_missing_or_unexpected_key_fails_naming_it():
    model = _te_model()
    checkpoint = dict(model.state_dict())
    del checkpoint["2.bias"]
    with pytest.raises(ValueError, match=r"missing from the checkpoint: 2\.bias"):
        load_model_state(model, checkpoint)
    checkpoint = dict(model.state_dict(), **{"3.weight": torch.zeros(1)})
    with pytest.raises(ValueError, match=r"not in the model: 3\.weight"):
        load_model_state(model, checkpoint)


def test_shape_mismatch_still_raises():
    model = _te_model()
    checkpoint = dict(model.state_dict(), **{"0.weight": torch.zeros(3, 4)})
    with pytest.raises(RuntimeError, match="size mismatch"):
        load_model_state(model, checkpoint)
