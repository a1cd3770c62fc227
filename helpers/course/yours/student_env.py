"""The student's environment as the course's own runs give it (helpers.course.yours.adapters loads the file with it):
the folders pytest may run from, NVTX ranges that work on a CPU-only torch build, and the metadata of the student's
packages visible without installing them, with nothing written to disk.

What the course gives a student (../shared/curricula.md, "The student's environment"): pytest runs from the repository
root, so an adapters file may put paths relative to that root on sys.path even when `tests/` sits in a subfolder (the
2024 layout: `cs336-systems/tests/adapters.py` beside `cs336-basics/`); the handouts suggest NVTX ranges, which a CUDA
build of torch runs with or without a GPU but a CPU-only build refuses ("NVTX functions not installed"); the 2025
template's package reads its own version through importlib.metadata, which works once `uv sync` installed it.
"""

from __future__ import annotations

import contextlib
import importlib.metadata as md
import os
import re
import sys
import time
from pathlib import Path

# ---- where pytest runs from ----


def repository_root(path: Path) -> Path | None:
    """The git repository the file is in (the nearest ancestor holding .git), or None (an unpacked archive)."""
    for parent in Path(path).resolve().parents:
        if (parent / ".git").exists():
            return parent
    return None


def run_dirs(path: Path, root: Path) -> list[Path]:
    """The folders a student may run pytest from, in the order a relative path is tried: the assignment root `root`,
    then each ancestor up to the repository root (the git root; without one, two levels up)."""
    repo, up = repository_root(path), list(root.parents)
    up = up[: up.index(repo) + 1] if repo in up else [] if repo == root else up[:2]
    return [root, *[p for p in up if p != Path(p.anchor)]]


def repository_folder(path: Path, root: Path) -> Path:
    """The student's whole repository, where their own modules may be: the git root, else the assignment root (an
    unpacked archive's neighbours may be anyone's)."""
    return repository_root(path) or root


SKIP_DIRS = {".git", ".venv", "venv", "node_modules", "site-packages", "__pycache__", "data", "wandb", "outputs"}


def find_module_in(top: Path, name: str, depth: int = 4, most: int = 5000) -> Path | None:
    """The folder that holds module `name` (a package folder or a .py file) under `top` (the student's repository:
    see repository_folder), at most `depth` levels down and `most` folders read, outside virtual environments and
    data; None if none does."""
    for seen, (folder, subdirs, files) in enumerate(os.walk(top)):
        if seen >= most:
            return None
        if f"{name}.py" in files or (name in subdirs and (Path(folder) / name / "__init__.py").is_file()):
            return Path(folder)
        level = len(Path(folder).relative_to(top).parts)
        subdirs[:] = [] if level >= depth else sorted(d for d in subdirs if d not in SKIP_DIRS and d[0] != ".")
    return None


# ---- NVTX on a CPU-only torch build ----


class NoNVTX:
    """torch.cuda.nvtx's native calls as no-ops, for a CPU-only torch build, whose own stub raises "NVTX functions
    not installed": the ranges the handouts suggest mark a profile and change no result. Depths as NVTX counts them."""

    def __init__(self):
        self.depth = 0

    def rangePushA(self, msg: str) -> int:  # noqa: N802 - torch._C._nvtx's names
        self.depth += 1
        return self.depth - 1

    def rangePop(self) -> int:  # noqa: N802
        self.depth = max(0, self.depth - 1)
        return self.depth

    def markA(self, msg: str) -> None:  # noqa: N802
        return None

    def rangeStartA(self, msg: str) -> int:  # noqa: N802
        return 0

    def rangeEnd(self, range_id: int) -> None:  # noqa: N802
        return None

    def deviceRangeStart(self, msg: str, stream: int = 0) -> None:  # noqa: N802
        return None

    def deviceRangeEnd(self, handle, stream: int = 0) -> None:  # noqa: N802
        return None


def quiet_nvtx() -> bool:
    """Make torch.cuda.nvtx's ranges no-ops in this process where this torch has no NVTX (a CPU-only build); a CUDA
    build keeps its own (it runs them with or without a GPU). True when NVTX was stubbed."""
    import torch
    import torch.cuda.nvtx as nvtx

    if hasattr(torch._C, "_nvtx"):
        return False
    if not isinstance(nvtx._nvtx, NoNVTX):
        nvtx._nvtx = NoNVTX()
    return True


class HostEvent:
    """torch.cuda.Event on a CPU-only torch build: record() notes the host's clock (work here is synchronous, so
    elapsed_time is the work's), the rest no-ops. Students time their hooks with CUDA events, as the handout's
    profiling advice suggests; on a CUDA build without a GPU torch's own work."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.at = None

    def record(self, stream=None) -> None:
        self.at = time.perf_counter()

    def elapsed_time(self, end: HostEvent) -> float:
        return 1e3 * ((end.at or 0.0) - (self.at or 0.0))  # ms, as CUDA's

    def wait(self, stream=None) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


class HostStream:
    """torch.cuda.Stream on a CPU-only torch build: one host stream, everything already done."""

    def __init__(self, device=None, priority: int = 0, **kwargs):
        self.device = device

    def wait_stream(self, stream) -> None:
        return None

    def wait_event(self, event) -> None:
        return None

    def record_event(self, event=None):
        event = event or HostEvent()
        event.record()
        return event

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True


CUDA_STUBS = {  # torch.cuda's names a student's code may call without a GPU, as a CPU-only build runs them here
    "Event": HostEvent,
    "Stream": HostStream,
    "synchronize": lambda device=None: None,
    "current_stream": lambda device=None: HostStream(),
    "default_stream": lambda device=None: HostStream(),
    "stream": lambda stream=None: contextlib.nullcontext(stream),
}


def quiet_cuda_events() -> bool:
    """Make torch.cuda's events, streams and synchronize work on a CPU-only torch build (they raise there; a CUDA
    build runs them with or without a GPU): the logic around them is judged, not the build. True when stubbed."""
    import torch

    if torch.version.cuda is not None or torch.version.hip is not None:
        return False
    for name, stub in CUDA_STUBS.items():
        setattr(torch.cuda, name, stub)
    return True


# ---- the student's packages' metadata, without installing them ----


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class _Metadata(md.Distribution):
    """A distribution known only by its name and version (those of a pyproject.toml's [project] table)."""

    def __init__(self, name: str, version: str):
        self._text = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"

    def read_text(self, filename):
        return self._text if filename == "METADATA" else None

    def locate_file(self, path):
        return None


class StudentMetadata:
    """A finder on sys.meta_path that answers importlib.metadata for the student's projects that are not installed
    (it imports nothing): in memory, so no folder is left behind when a launched process ends without cleaning up."""

    dists: dict = {}  # normalised name -> _Metadata

    @classmethod
    def find_spec(cls, *args, **kwargs):
        return None

    @classmethod
    def find_distributions(cls, context=None):
        name = getattr(context, "name", None)
        want = name and _normal(name)
        return [d for name, d in cls.dists.items() if want is None or name == want]


def make_visible(name: str, version: str) -> None:
    """importlib.metadata finds (name, version) from now on in this process, unless it is installed (its own wins)."""
    try:
        md.version(name)
        return  # installed (uv sync, pip install -e), or already made visible
    except md.PackageNotFoundError:
        pass
    StudentMetadata.dists[_normal(name)] = _Metadata(name, version)
    if StudentMetadata not in sys.meta_path:
        sys.meta_path.append(StudentMetadata)
