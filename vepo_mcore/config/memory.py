"""Memory section: the GPU the run is planned for (training/memory_plan.py; printed by --dry-run)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True)
class MemoryConfig:
    """Inputs of the per-GPU memory plan that the config tree does not already hold."""

    gpu_memory_gib: float = 79.6
    """Memory of one GPU in GiB (2**30 bytes): an 80 GB H100 shows 81,559 MiB = 79.6 GiB to CUDA;
    an H200 141 GB about 139.8. The dry run fails when the plan's peak exceeds it."""
    reserve_gib: float = 4.0
    """Held back for what the plan does not itemise: the CUDA context (~0.5 GiB per process, two
    with a colocated engine), NCCL buffers, cuBLAS workspaces, the caching allocator's fragmentation."""
    rl_prompt_tokens: int = 640
    """Longest RL prompt in tokens, for the RL sequence length (prompt + rl.rollout.sampling.
    max_new_tokens): the longest FLORES dev prompt in the chat template is 618 Qwen2.5 tokens
    (Myanmar; English 97); an expanded tokenizer makes it shorter."""

    def validate(self) -> None:
        """ValueErrors naming the field."""
        if self.gpu_memory_gib <= 0:
            raise ValueError(f"memory.gpu_memory_gib must be positive, got {self.gpu_memory_gib}")
        if not 0 <= self.reserve_gib < self.gpu_memory_gib:
            raise ValueError(
                f"memory.reserve_gib must be in [0, memory.gpu_memory_gib), got {self.reserve_gib}"
            )
        if self.rl_prompt_tokens < 1:
            raise ValueError(f"memory.rl_prompt_tokens must be >= 1, got {self.rl_prompt_tokens}")
