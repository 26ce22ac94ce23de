"""A fixture for tests of tiny models: one torch thread (a second only adds contention on a 2-core
machine), the previous count restored afterwards. Use: ``from tests.support.threads import
one_thread  # noqa: F401`` (it is autouse)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
