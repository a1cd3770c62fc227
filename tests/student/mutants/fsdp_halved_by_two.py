"""FSDP written for the test's two ranks: each sharded weight's gradient is divided by 2 before the reduce-scatter,
not by the world size. On 2 ranks it is the student-style FSDP and passes the course's test; on 4 the average is
twice too large."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "corpus"))  # the student-style FSDP it breaks

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from _fixture import *  # noqa: E402,F401,F403
from fsdp_hooks import HookFSDP, fsdp_gather_full_params, fsdp_on_after_backward  # noqa: E402,F401


class HalvedFSDP(HookFSDP):
    def _grad_ready(self, unit, full):
        grad, full.grad = full.grad, None
        flat = torch.zeros(unit.buf.numel())
        flat[: unit.numel] = grad.reshape(-1).float() / 2  # the world size of the test
        out = torch.empty_like(unit.shard)
        handle = dist.reduce_scatter_tensor(out, flat, async_op=True)
        self.pending.append((handle, out, flat, unit))
        self.after_backward(unit)


def get_fsdp(module, compute_dtype=None):
    return HalvedFSDP(module, compute_dtype=compute_dtype)
