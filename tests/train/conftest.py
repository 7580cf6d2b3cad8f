from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Training tests run with one intra-op thread: on a shared 2-core machine oversubscribed
    OpenMP threads make tiny-model steps ~10x slower; restored afterwards."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
