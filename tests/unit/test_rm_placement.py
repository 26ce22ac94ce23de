"""rm/placement.py's Offloader on CPU (the mechanism; tests/gpu/test_rm_offload.py checks the bytes
leave a CUDA device): after offload() the module's parameters and buffers are the host copies,
onload() gives fresh copies with the same values, a buffer a forward updated survives the round
trip, and on_device() offloads even when the body raises."""

from __future__ import annotations

import pytest
import torch

from vepo_mcore.rm.placement import Offloader


class Counter(torch.nn.Module):
    """Two layers (one weight shared, as a tied embedding would be) and a buffer the forward updates,
    like Transformer Engine's FP8 amax history."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8, bias=False)
        self.b.weight = self.a.weight
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        return self.b(torch.relu(self.a(x)))


def _ptrs(module) -> list[int]:
    return [t.data_ptr() for t in [*module.parameters(), *module.buffers()]]


def test_offload_points_the_module_at_the_host_copies_and_onload_copies_them_back():
    torch.manual_seed(0)
    model = Counter()
    x = torch.randn(3, 8)
    ref = model(x).detach()
    mover = Offloader(model, offload_device="cpu", pin=False)
    assert len(mover.params) == 2  # a.weight (shared with b) once, a.bias
    assert mover.nbytes == (64 + 8) * 4 + 4
    loaded = _ptrs(model)
    host = [t.data_ptr() for t in mover.host_params + mover.host_buffers]
    assert not set(loaded) & set(host)  # the host copies are copies

    mover.offload()
    assert not mover.resident and _ptrs(model) == host
    assert model.b.weight is model.a.weight  # the Parameter objects (and sharing) stay
    mover.onload()
    on_device = _ptrs(model)
    assert mover.resident and not set(on_device) & set(host)
    assert torch.equal(model(x), ref)  # the same weights, bit for bit
    assert model.b.weight.data_ptr() == model.a.weight.data_ptr()

    # The forward's buffer update reaches the host copy; a second onload restores it.
    mover.offload()
    assert _ptrs(model) == host and model.calls.item() == 2 and mover.host_buffers[0].item() == 2
    mover.onload()
    assert model.calls.item() == 2 and torch.equal(model(x), ref)


def test_on_device_offloads_even_when_the_body_raises():
    model = Counter()
    mover = Offloader(model, pin=False)
    mover.offload()
    host = _ptrs(model)
    with pytest.raises(RuntimeError, match="boom"):
        with mover.on_device():
            assert _ptrs(model) != host
            raise RuntimeError("boom")
    assert _ptrs(model) == host and not mover.resident
    mover.offload()  # idempotent
    assert _ptrs(model) == host


def test_frozen_parameters_keep_requires_grad_and_the_module_has_to_have_some():
    model = Counter().requires_grad_(False)
    mover = Offloader(model, pin=False)
    mover.offload()
    mover.onload()
    assert all(isinstance(p, torch.nn.Parameter) and not p.requires_grad for p in model.parameters())
    with pytest.raises(ValueError, match="no parameters"):
        Offloader(torch.nn.ReLU())


def test_rm_placement_is_validated_naming_the_field():
    from vepo_mcore.config.rewards import RewardsConfig

    assert RewardsConfig().rm_placement == "offload"  # the default docs/DESIGN.md argues for
    with pytest.raises(ValueError, match="rl.rewards.rm_placement must be 'resident' or 'offload'"):
        RewardsConfig(rm_placement="remote").validate()
    with pytest.raises(ValueError, match="rl.rewards.rm_batch_size"):
        RewardsConfig(rm_batch_size=0).validate()
