"""FSDP that starts gathering every layer's weight when the forward starts (after the first, which records the call
order), freeing each after its layer's forward: the prefetch is unbounded. Passes the course's test; breaks "only
start gathering after the layer two before the current one has completed its forward pass"."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "corpus"))  # the student-style FSDP it breaks

from _fixture import *  # noqa: E402,F401,F403
from fsdp_hooks import HookFSDP, fsdp_gather_full_params, fsdp_on_after_backward  # noqa: E402,F401


class EagerFSDP(HookFSDP):
    def _pre_forward(self, m, args):
        if self.order is not None and not self.calls:
            for unit in self.order:
                self.start_gather(unit)
        return super()._pre_forward(m, args)


def get_fsdp(module, compute_dtype=None):
    return EagerFSDP(module, compute_dtype=compute_dtype)
