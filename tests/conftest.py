"""Fixtures shared by several test modules."""

import pytest
import torch.distributed as dist


@pytest.fixture(scope="module")
def one_rank():
    """A 1-rank gloo process group in this process (no spawn), destroyed afterwards."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()
