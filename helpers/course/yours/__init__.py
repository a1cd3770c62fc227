"""`python -m helpers yours PATH/TO/tests/adapters.py`: a student's implementation checked, timed and accounted
beside ours and PyTorch's (issue 21).

    python -m helpers yours ../assignment2-systems/tests/adapters.py
    python -m helpers yours adapters.py --topics rmsnorm,attention --repeat 3

Each topic runs the student's code in launched processes (helpers.launch), so a crash, a hang or a NaN is reported
as that topic's error and the other topics still run. Topic modules: `kernels` (rmsnorm, attention) and
`distributed` (ddp, sharding, fsdp); each exposes run_TOPIC(adapters_path: str, opts: Options) -> TopicResult.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Options:
    """What a run of the checks asks for."""
    profile: str = "cpu"  # "cpu": small shapes, gloo; "gpu": the course's shapes
    repeat: int = 1  # distributed checks run this many times (races show up as a differing repeat)
    steps: int = 10  # timed steps per implementation (interleaved; at least 6 pairs for a verdict)
    warmup: int = 2
    timeout_s: float = 300.0  # per launched check: a hung collective is reported after this
