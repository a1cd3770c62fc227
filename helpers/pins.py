"""What the Makefile reads of the installed torch without importing it (an import takes seconds), run as a script:
which Triton `make setup` installs beside torch, before the rest of the environment is installed (`python
helpers/pins.py PIN` prints the requirement to install, or nothing), and whether `make test` is the GPU smoke run
(`python helpers/pins.py --cuda` prints 1 or 0)."""

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


def gpu_build(version: dict) -> bool:
    """Whether a torch build, by its torch/version.py (`version`: that file's names), was built for a GPU that
    torch.cuda drives (CUDA, or ROCm through HIP): only then is it worth importing torch to ask for a device."""
    return bool(version.get("cuda") or version.get("hip"))


def has_cuda() -> int:
    """1 where torch.cuda.is_available(), else 0; a CPU build of torch answers from its version.py, unimported."""
    import importlib.util
    import os
    import runpy

    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return 0
    if not gpu_build(runpy.run_path(os.path.join(os.path.dirname(spec.origin), "version.py"))):
        return 0
    import torch

    return int(torch.cuda.is_available())


if __name__ == "__main__":
    if sys.argv[1:] == ["--cuda"]:
        print(has_cuda())
    else:  # the installed torch's requirements, read from its metadata
        import importlib.metadata

        print(triton_to_install(importlib.metadata.requires("torch"), sys.argv[1]) or "")
