"""Which Triton `make setup` installs beside torch; torch-free, run as a script by the Makefile before the rest of the
environment is installed (`python helpers/pins.py PIN` prints the requirement to install, or nothing)."""

from __future__ import annotations

import re
import sys

COURSE_TRITON = "triton==3.6.0; platform_system == 'Linux'"  # the course's (torch 2.11's, the GPU image's)


def _requirement_name(requirement: str) -> str:
    """A requirement's distribution name, normalized ("Triton==3.6.0; ..." -> "triton")."""
    return re.split(r"[\s;\[<>=!~(@]", requirement.strip(), maxsplit=1)[0].lower().replace("_", "-")


def triton_to_install(torch_requires: list[str] | None, pin: str = COURSE_TRITON) -> str | None:
    """What `make setup` installs beside torch: None where torch requires a Triton itself (PyPI's CUDA wheels name the
    one they were built for: 2.11 its 3.6, 2.13 its own; nightlies pytorch-triton), so inductor gets its own;
    else `pin` (a CPU build requires none: the course's Triton, so a student's kernel runs in its interpreter).
    `torch_requires`: importlib.metadata.requires("torch")."""
    required = [r for r in torch_requires or [] if not re.search(r"\bextra\s*==", r)]  # an extra is not torch's own
    return None if any("triton" in _requirement_name(r) for r in required) else pin


if __name__ == "__main__":  # the installed torch's requirements, read from its metadata (importing torch takes seconds)
    import importlib.metadata

    print(triton_to_install(importlib.metadata.requires("torch"), sys.argv[1]) or "")
