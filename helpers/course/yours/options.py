"""What a run of `yours` asks for, and which module runs each topic (imported by the package and its modules)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Options:
    """What a run of the checks asks for."""

    profile: str = "cpu"  # "cpu": small shapes, gloo; "gpu": the course's shapes
    repeat: int = 1  # distributed checks run this many times (races show up as a differing repeat)
    steps: int = 10  # timed steps per implementation (interleaved; at least 6 pairs for a verdict)
    warmup: int = 2
    timed: bool = True  # time the implementations (the checks alone: False)
    compiled: bool = True  # time torch.compile'd PyTorch too (its first call compiles: seconds on a CPU)
    timeout_s: float = 300.0  # per launched check: a hung collective is reported after this
    timing_skip: tuple = ()  # timing rows ("who:impl") left out: one met a CUDA error in another process
    timing_only: tuple = ()  # only these timing rows (and the baseline): a failed one rerun in a fresh process


RUNNERS = {  # topic -> (module, function): kernels run in one launched rank here, distributed ones launch their own
    "rmsnorm": ("helpers.course.yours.kernels", "rmsnorm_worker"),
    "attention": ("helpers.course.yours.kernels", "attention_worker"),
    "ddp": ("helpers.course.yours.distributed", "run_ddp"),
    "sharding": ("helpers.course.yours.distributed", "run_sharding"),
    "fsdp": ("helpers.course.yours.distributed", "run_fsdp"),
}
IN_ONE_RANK = ("rmsnorm", "attention")
