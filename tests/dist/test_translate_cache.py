"""translate_direction inside a process group: the ranks of one model-parallel engine share the
per-direction cache, resume from it after a failure, and only rank 0 writes it."""

from __future__ import annotations

import pytest

from tests.support.reversing_engine import SOURCES, CollectiveReversingEngine
from vepo_mcore.eval.systems import translate_direction
from vepo_mcore.tokenizer.tokenizer import load_tokenizer
from vepo_mcore.translation.directions import Direction


def _two_ranks_share_a_cache(rank, world, cache):
    from pathlib import Path

    import torch.distributed as dist

    tok, direction = load_tokenizer(), Direction("th", "en")
    with pytest.raises(RuntimeError, match="engine died"):
        translate_direction(
            CollectiveReversingEngine(fail_after_batches=2), direction, SOURCES, tokenizer=tok, batch_size=3,
            cache_dir=cache,
        )  # fmt: skip
    dist.barrier()
    # Two finished batches, written once (by rank 0), so the resume's index check holds.
    assert (Path(cache) / "th-en.partial.jsonl").read_text().count("\n") == 6
    resumed = CollectiveReversingEngine()
    hyps = translate_direction(resumed, direction, SOURCES, tokenizer=tok, batch_size=3, cache_dir=cache)
    assert [s.source for batch in resumed.calls for s in batch] == SOURCES[6:]
    assert hyps == [s[::-1] + " extra line" for s in SOURCES]
    dist.barrier()  # rank 0 writes the final file after the others return
    assert (Path(cache) / "th-en.txt").read_text(encoding="utf-8").count("\n") == len(SOURCES)


@pytest.mark.dist
def test_ranks_of_one_engine_share_the_cache_and_rank0_writes_it(tmp_path):
    from vepo_mcore.parallel.launch import run_processes

    run_processes(_two_ranks_share_a_cache, 2, args=(str(tmp_path),))
    assert not (tmp_path / "th-en.partial.jsonl").exists()
