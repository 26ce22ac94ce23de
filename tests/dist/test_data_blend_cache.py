"""CPT blend under a 2-process gloo group: rank 0 builds and caches megatron's indices, rank 1 loads
them, and both see exactly the samples a single process builds."""

from __future__ import annotations

import pytest
import torch

from vepo_mcore.config.job import JobConfig
from vepo_mcore.data.blend import build_cpt_datasets
from vepo_mcore.data.corpus import build_flores_cpt_corpus
from vepo_mcore.parallel.launch import run_processes

SAMPLES = 120


def _cfg(paths: dict[str, str], cache: str | None) -> JobConfig:
    cfg = JobConfig()
    cfg.data.paths = paths
    cfg.data.cache_dir = cache
    cfg.training.seq_length = 32
    return cfg


def _build_on_rank(rank: int, world: int, paths: dict[str, str], cache: str, out: str) -> None:
    train, valid = build_cpt_datasets(_cfg(paths, cache), SAMPLES, valid_samples=8)
    tokens = torch.stack([train[i]["tokens"] for i in range(SAMPLES)])
    torch.save({"train": tokens, "valid": valid[0]["tokens"]}, f"{out}/rank{rank}.pt")


@pytest.mark.dist
def test_two_ranks_share_the_cache_and_match_one_process(tmp_path):
    paths = build_flores_cpt_corpus(tmp_path / "corpus", ("en", "lo", "fil"), sentences_per_doc=8)
    cache = tmp_path / "cache"
    run_processes(_build_on_rank, 2, args=(paths, str(cache), str(tmp_path)))
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    train, valid = build_cpt_datasets(_cfg(paths, None), SAMPLES, valid_samples=8)
    reference = torch.stack([train[i]["tokens"] for i in range(SAMPLES)])
    for got in ranks:
        assert torch.equal(got["train"], reference)
        assert torch.equal(got["valid"], valid[0]["tokens"])
    written = sorted(p.name.split("-", 1)[1] for p in cache.iterdir())
    assert "BlendedDataset-train-dataset_index.npy" in written
    assert sum(name == "GPTDataset-train-shuffle_index.npy" for name in written) == 3
