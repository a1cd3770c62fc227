"""FSDP that accepts compute_dtype and never uses it: weights gathered and used in fp32. Passes the course's test
(its fp16 tolerance covers fp32 compute); breaks "cast the weights to that dtype before communicating or using them
for compute"."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "corpus"))  # the student-style FSDP it breaks

from _fixture import *  # noqa: E402,F401,F403
from fsdp_hooks import HookFSDP, fsdp_gather_full_params, fsdp_on_after_backward  # noqa: E402,F401


def get_fsdp(module, compute_dtype=None):
    return HookFSDP(module)
