"""Where the reward model's weights live between two scoring calls (rl.rewards.rm_placement).

    mover = Offloader(model)      # a host copy of every parameter and buffer (pinned under CUDA)
    mover.offload()               # the module now points at the host copies; its device copies are freed
    mover.onload()                # fresh device copies, H2D from the host copies; scores are unchanged
    with mover.on_device(): ...   # onload, run, offload (even when the body raises)

The RM is frozen: its parameters never change after loading, so the host copy made once is the
master and offload() only drops the device copy (no D2H copy); buffers are copied back, as a
forward may update one (Transformer Engine keeps FP8 amax histories in buffers). The module keeps
its Parameter objects (only `.data` is swapped), so megatron's attributes on them
(tensor_model_parallel, partition_dim, ...) survive. An Offloader of a model wrapped for training
(DDP's contiguous parameter buffer) would break it: it is for the frozen RM only. docs/DESIGN.md
("The reward model at 7B") measures the choice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


class Offloader:
    """Moves `module`'s parameters and buffers between its compute device and `offload_device`."""

    def __init__(
        self, module: torch.nn.Module, offload_device: str | torch.device = "cpu", pin: bool | None = None
    ):
        self.module = module
        self.offload_device = torch.device(offload_device)
        self.params = list(module.parameters())  # de-duplicated (a tied weight once)
        if not self.params:
            raise ValueError("Offloader: the module has no parameters")
        self.compute_device = self.params[0].device
        seen: set[int] = {id(p) for p in self.params}
        self.buffers: list[tuple[torch.nn.Module, str]] = []
        for owner in module.modules():
            for name, buf in owner._buffers.items():
                if buf is not None and id(buf) not in seen:
                    seen.add(id(buf))
                    self.buffers.append((owner, name))
        if pin is None:
            pin = torch.cuda.is_available() and self.offload_device.type == "cpu"
        self.pinned = pin
        self.host_params = [self._host_copy(p.data) for p in self.params]
        self.host_buffers = [self._host_copy(owner._buffers[name]) for owner, name in self.buffers]
        self.resident = True
        """Whether the module's tensors are the device copies (True after onload)."""

    def _host_copy(self, tensor: torch.Tensor) -> torch.Tensor:
        host = tensor.detach().to(self.offload_device, copy=True)
        return host.pin_memory() if self.pinned else host

    @property
    def nbytes(self) -> int:
        """Bytes that move per onload (parameters and buffers)."""
        return sum(t.numel() * t.element_size() for t in self.host_params + self.host_buffers)

    def offload(self) -> None:
        """Point the module at the host copies; the device copies are freed (and the CUDA cache emptied,
        so another process, the colocated engine, can take the memory)."""
        if not self.resident:
            return
        for param, host in zip(self.params, self.host_params):
            param.data = host
        for (owner, name), host in zip(self.buffers, self.host_buffers):
            host.copy_(owner._buffers[name])
            owner._buffers[name] = host
        self.resident = False
        if self.compute_device.type == "cuda":
            torch.cuda.empty_cache()

    def onload(self) -> None:
        """Fresh device copies of every parameter and buffer (asynchronous from pinned memory, ordered
        before the forward on the current stream)."""
        if self.resident:
            return
        for param, host in zip(self.params, self.host_params):
            param.data = host.to(self.compute_device, non_blocking=self.pinned, copy=True)
        for (owner, name), host in zip(self.buffers, self.host_buffers):
            owner._buffers[name] = host.to(self.compute_device, non_blocking=self.pinned, copy=True)
        self.resident = True

    @contextlib.contextmanager
    def on_device(self) -> Iterator[None]:
        self.onload()
        try:
            yield
        finally:
            self.offload()


__all__ = ["Offloader"]
