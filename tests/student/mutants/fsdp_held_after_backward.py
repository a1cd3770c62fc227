"""FSDP that frees each gathered weight after its layer's forward and gathers it again for backward, but keeps what
backward gathered until the next forward starts: every layer's full weight is still held after backward. Passes the
course's test; breaks "free the gathered weights after use"."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "corpus"))  # the student-style FSDP it breaks

from _fixture import *  # noqa: E402,F401,F403
from fsdp_hooks import HookFSDP, fsdp_gather_full_params, fsdp_on_after_backward  # noqa: E402,F401


class LateFSDP(HookFSDP):
    def after_backward(self, unit):
        self.wait(unit)  # freed by the next forward

    def release_all(self):
        pass

    def forward(self, *args, **kwargs):
        for unit in self.units:
            self.free(unit)
        return super().forward(*args, **kwargs)


def get_fsdp(module, compute_dtype=None):
    return LateFSDP(module, compute_dtype=compute_dtype)
