"""FSDP that all-reduces each sharded weight's whole gradient and keeps its own slice, instead of reduce-scattering
it: every rank receives every gradient in full. Passes the course's test (the same sums); breaks "when the gradients
are available, they should be reduce-scattered to the appropriate ranks"."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "corpus"))  # the student-style FSDP it breaks

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from _fixture import *  # noqa: E402,F401,F403
from fsdp_hooks import HookFSDP, fsdp_gather_full_params, fsdp_on_after_backward  # noqa: E402,F401


class AllReduceFSDP(HookFSDP):
    def _grad_ready(self, unit, full):
        grad, full.grad = full.grad, None
        flat = torch.zeros(unit.buf.numel())
        flat[: unit.numel] = grad.reshape(-1).float() / self.world
        dist.all_reduce(flat)
        n, rank = unit.shard.numel(), dist.get_rank()
        mine = flat[rank * n : (rank + 1) * n].clone()
        unit.shard.grad = mine if unit.shard.grad is None else unit.shard.grad + mine
        self.after_backward(unit)


def get_fsdp(module, compute_dtype=None):
    return AllReduceFSDP(module, compute_dtype=compute_dtype)
