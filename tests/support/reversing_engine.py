"""Stand-in rollout engines for the translate, cache and resume tests (tests/unit/test_eval_translate.py,
tests/dist/test_translate_cache.py), and the sources they translate."""

from __future__ import annotations

from vepo_mcore.translation.sample import Sample

SOURCES = [f"sentence number {i}" for i in range(10)]


class ReversingEngine:
    """Deterministic stand-in for a rollout engine: the 'translation' is the reversed source."""

    def __init__(self, fail_after_batches: int | None = None):
        self.calls: list[list[Sample]] = []
        self.fail_after_batches = fail_after_batches

    def generate(self, prompts: list[Sample], sampling) -> list[Sample]:
        if self.fail_after_batches is not None and len(self.calls) >= self.fail_after_batches:
            raise RuntimeError("engine died")
        self.calls.append(prompts)
        out = []
        for p in prompts:
            assert p.prompt.endswith("<|im_start|>assistant\n")
            out.append(Sample(prompt=p.prompt, response=p.source[::-1] + "\nextra line", src_lang=p.src_lang,
                              tgt_lang=p.tgt_lang, finish_reason="stop"))  # fmt: skip
        return out


class CollectiveReversingEngine(ReversingEngine):
    """As a model-parallel engine: every generate call is collective (here, a barrier)."""

    def generate(self, prompts, sampling):
        import torch.distributed as dist

        dist.barrier()
        return super().generate(prompts, sampling)
