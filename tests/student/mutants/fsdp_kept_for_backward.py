"""FSDP that lets go of each gathered weight after its layer's forward by dropping its own reference (a new, empty
buffer) instead of freeing the storage: the matmul's saved weight keeps the full weight alive until backward, which
uses it without gathering again. Passes the course's test; breaks "free the gathered weights after use"."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "corpus"))  # the student-style FSDP it breaks

from _fixture import *  # noqa: E402,F401,F403
from fsdp_hooks import HookFSDP, fsdp_gather_full_params, fsdp_on_after_backward  # noqa: E402,F401

import torch  # noqa: E402


class DroppingFSDP(HookFSDP):
    def after_forward(self, unit):
        self.wait(unit)
        unit.buf = torch.empty_like(unit.buf)  # the gathered one lives on in autograd's saved tensors
        unit.buf.untyped_storage().resize_(0)

    def before_backward(self, unit):
        pass  # the saved weight is still there


def get_fsdp(module, compute_dtype=None):
    return DroppingFSDP(module, compute_dtype=compute_dtype)
