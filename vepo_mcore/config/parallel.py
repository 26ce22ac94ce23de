"""Parallel section: how the model and data are split across processes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(kw_only=True)
class ParallelConfig:
    """Tensor / pipeline / context / data parallel layout. DP size = world / (TP * PP * CP)."""

    tensor_model_parallel_size: int = 1
    """TP: attention heads, MLP columns and the vocab are split across this many ranks."""
    pipeline_model_parallel_size: int = 1
    """PP: layers are split into this many stages."""
    virtual_pipeline_model_parallel_size: int | None = None
    """Interleaved pipeline chunks per stage. Not supported (must stay null = plain 1F1B): the training
    loop and the embedded rollout engine run one model chunk per stage (validate says so)."""
    context_parallel_size: int = 1
    """CP: the sequence is split across this many ranks (GPU only)."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism on TP ranks (GPU only)."""
    backend: Literal["auto", "nccl", "gloo"] = "auto"
    """Process-group backend; 'auto' = nccl with CUDA, gloo without."""
    distributed_timeout_minutes: int = 30
    """Collective timeout."""

    def validate(self, world_size: int | None = None) -> None:
        for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"parallel.{name} must be >= 1, got {getattr(self, name)}")
        if world_size is not None:
            model_parallel = (
                self.tensor_model_parallel_size
                * self.pipeline_model_parallel_size
                * self.context_parallel_size
            )
            if world_size % model_parallel:
                raise ValueError(
                    f"world size {world_size} is not divisible by TP*PP*CP = {model_parallel} "
                    "(parallel.tensor_model_parallel_size * pipeline_model_parallel_size * context_parallel_size)"
                )
        if self.virtual_pipeline_model_parallel_size is not None:
            # The model is built, trained (train_step's model=[model]), checkpointed and served by the
            # embedded engine (rollout/embedded.py, static_decode.py, weight_sync.py) as one chunk.
            raise ValueError(
                f"parallel.virtual_pipeline_model_parallel_size={self.virtual_pipeline_model_parallel_size}: "
                "virtual (interleaved) pipeline stages are not supported: the training loop (CPT, SFT, RM and "
                "RL with any rl.rollout.engine) and the embedded rollout engine run one model chunk per "
                "pipeline stage. Set parallel.virtual_pipeline_model_parallel_size to null and split the "
                "layers with parallel.pipeline_model_parallel_size alone (to cut the pipeline bubble, use "
                "more micro-batches per step: training.global_batch_size / training.micro_batch_size)"
            )
        if self.sequence_parallel and self.tensor_model_parallel_size == 1:
            raise ValueError("parallel.sequence_parallel needs parallel.tensor_model_parallel_size > 1")

    @property
    def model_parallel_size(self) -> int:
        """TP * PP * CP: the ranks one model replica spans (the smallest world size)."""
        return (
            self.tensor_model_parallel_size * self.pipeline_model_parallel_size * self.context_parallel_size
        )

    def data_parallel_size(self, world_size: int) -> int:
        return world_size // (
            self.tensor_model_parallel_size * self.pipeline_model_parallel_size * self.context_parallel_size
        )
