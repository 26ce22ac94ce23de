"""Test tiers: tests/unit (pure, fast), tests/dist (multi-process gloo), tests/gpu (skipped
without CUDA), tests/e2e (whole tools). Everything here runs on a 2-core CPU machine."""

import os
import warnings

import pytest
import torch

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "2")
warnings.filterwarnings("ignore", message=".*Apex is not installed.*")
warnings.filterwarnings("ignore", message=".*Transformer Engine.*")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs CUDA (run on a GPU machine)")
    for item in items:
        if "tests/gpu/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(skip_gpu)
        if "tests/dist/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.dist)
