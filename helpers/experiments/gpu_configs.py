"""What each notebook builds for an edition at the gpu or cpu profile, without a machine: its models, batches and
contexts as its own setup function makes them (notebook 01's Setup.resolve, 04's and 05's setting, 07's
Setup.resolve). helpers.experiments.gpu_plans plans their memory, helpers.course.dry_run walks them on the meta device
and times their cells; tests/test_gpu_plans.py holds each to the notebook's own setup, per edition.

    config_01("gpu", "2025")["memory"]      # [("2.7B-2025", 128), ("2.7B-2025", 256), ("2.7B-2025", 512)]
    config_01("gpu", "2025", gpu_bytes=40e9)["profile_size"]   # "large-2025": xl-2025's step needs ~44 GB
    config_05("gpu", "2026", gpus=1, gpu_bytes=40e9)["memory_models"]    # what two ranks on a 40 GB card hold
"""

from __future__ import annotations

from helpers.experiments import benchmarking, ddp, fsdp_sections, sharding
from helpers.experiments.gpu_plans_bytes import H100_BYTES, ranks_per_gpu
from helpers.model import sizes_for

EDITIONS = tuple(benchmarking.EDITIONS)  # the course's editions: 2024, 2025, 2026
DEFAULT_EDITION = "2026"  # every notebook's EDITION default
NOTEBOOK_EDITIONS = {  # the editions each notebook builds the models of (its parameters cell's EDITION)
    "01": EDITIONS,
    "04": EDITIONS,
    "05": EDITIONS,
    "07": ("2026",),  # no EDITION knob: Setup.resolve's 2026 (FSDP is asked by 2026 only)
}


def check_edition(edition: str) -> str:
    """`edition` as a string, or a ValueError naming the course's editions."""
    if str(edition) not in EDITIONS:
        raise ValueError(f"unknown edition {edition!r}; the course's editions are {', '.join(EDITIONS)}")
    return str(edition)


def built_edition(notebook: str, edition: str) -> str | None:
    """The edition whose models `notebook` builds when asked for `edition` (None: it has no edition)."""
    editions = NOTEBOOK_EDITIONS.get(notebook)
    if editions is None:
        return None
    return check_edition(edition) if check_edition(edition) in editions else editions[-1]


# ---- what each notebook builds, per edition (the tests hold these to the notebooks' own setup functions) ----


def config_01(profile: str = "gpu", edition: str = DEFAULT_EDITION, gpu_bytes: float | None = None) -> dict:
    """Notebook 01's Setup.resolve(profile, budget, edition) without the machine: the edition's sizes, batch, context,
    timed passes and the profiled size a card of gpu_bytes holds (None: the edition's), and §5's memory runs as
    (size, context) pairs."""
    plan = benchmarking.EDITIONS[check_edition(edition)]
    e, sizes = plan.for_profile(profile), sizes_for(profile, edition)
    memory = [(e["memory_size"], t) for t in e["memory_contexts"]] or [(s, e["context"]) for s in sizes]
    profiled = plan.profiled_on(profile, gpu_bytes)[0]
    return dict(
        sizes=sizes, kinds=plan.kinds, memory=memory, batch=e["batch"], context=e["context"], profile_size=profiled
    )


def config_04(profile: str = "gpu", edition: str = DEFAULT_EDITION, gpus: int = 1, gpu_bytes: float | None = None):
    """Notebook 04's config on `gpus` GPUs of gpu_bytes (ddp.config_for, as its setting builds it: the sizes whose
    speed launch the ranks' share of a card holds; None: every size)."""
    return ddp.config_for(profile, check_edition(edition), ranks_per_gpu(2, gpus), gpu_bytes)


def config_05(profile: str = "gpu", edition: str = DEFAULT_EDITION, gpus: int = 1, gpu_bytes: float = H100_BYTES):
    """Notebook 05's config on `gpus` GPUs of gpu_bytes (sharding.config_for: the largest models the ranks' share of a
    card holds, as its setting picks them)."""
    shared = ranks_per_gpu(2, gpus)
    return sharding.config_for(profile, check_edition(edition), shared, gpu_bytes if profile == "gpu" else None)


def config_07(profile: str = "gpu", edition: str = DEFAULT_EDITION, gpu_bytes: float | None = None) -> dict:
    """Notebook 07's config (fsdp_sections.Setup.resolve's: the profile's models named as `edition` names them, §5's
    sweep on a model a card of gpu_bytes holds; None: the profile's)."""
    return fsdp_sections.config_for(profile, check_edition(edition), gpu_bytes)
