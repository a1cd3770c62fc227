"""A student's `tests/adapters.py`: import it as pytest would, and call its adapters without trusting them.

The course's three editions name their adapters differently (public in each edition's assignment repository);
ADAPTERS lists every name by topic. An adapter that raises NotImplementedError is "not implemented", not an error.
"""
from __future__ import annotations

import importlib.util
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

ADAPTERS = {  # topic -> implementation -> the adapter names that make it up (first: the constructor)
    "rmsnorm": {
        "pytorch": ("get_rmsnorm_autograd_function_pytorch",),
        "triton": ("get_rmsnorm_autograd_function_triton",),
        "backward_g": ("rmsnorm_backward_g_pytorch",),
        "backward_x": ("rmsnorm_backward_x_pytorch",),
    },
    "attention": {
        "pytorch": ("get_flashattention_autograd_function_pytorch",),
        "triton": ("get_flashattention_autograd_function_triton",),
    },
    "ddp": {
        "individual": ("get_ddp_individual_parameters", "ddp_individual_parameters_on_after_backward"),
        "bucketed": ("get_ddp_bucketed", "ddp_bucketed_on_after_backward", "ddp_bucketed_on_train_batch_start"),
        "ddp": ("get_ddp", "ddp_on_after_backward"),  # the 2026 edition's one flavour
    },
    "sharding": {"sharded": ("get_sharded_optimizer",)},
    "fsdp": {"fsdp": ("get_fsdp", "fsdp_on_after_backward", "fsdp_gather_full_params")},
}
TOPICS = tuple(ADAPTERS)
NOT_IMPLEMENTED = "not implemented"
ABSENT = "absent"  # the file has no such adapter (another edition's name)


class AdaptersError(ValueError):
    """The adapters file could not be used at all: missing, or failing to import (its error with file and line)."""


def assignment_root(path: Path) -> Path:
    """The directory that holds the student's packages (so `from cs336_systems import ...` works): the nearest
    ancestor, up to three levels, with a pyproject.toml or setup.py (the assignment repository), else the parent of a
    `tests` folder, else the file's own directory."""
    path = path.resolve()
    for parent in list(path.parents)[:3]:
        if (parent / "pyproject.toml").is_file() or (parent / "setup.py").is_file():
            return parent
    return path.parent.parent if path.parent.name == "tests" else path.parent


def where(exc: BaseException, path: Path | None = None) -> str:
    """'file:line' of the deepest frame of a student's code (in `path`'s assignment, else the deepest frame)."""
    frames = traceback.extract_tb(exc.__traceback__)
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    root = str(assignment_root(path)) if path else None
    mine = [f for f in frames if root and f.filename.startswith(root)] or frames
    return f"{mine[-1].filename}:{mine[-1].lineno}" if mine else "?"


def load(path) -> ModuleType:
    """Import the adapters file as pytest would: its own folder and the assignment root first on sys.path.
    AdaptersError if it cannot."""
    path = Path(path)
    if not path.is_file():
        raise AdaptersError(f"no adapters file at {path}: pass the path to your assignment's tests/adapters.py")
    for folder in (str(path.resolve().parent), str(assignment_root(path))):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    spec = importlib.util.spec_from_file_location("student_adapters", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001 - SystemExit and friends from a student's file are errors too
        raise AdaptersError(f"{path} failed to import: {type(exc).__name__}: {exc} (at {where(exc, path)})") from None
    return module


@dataclass
class Adapter:
    """One implementation's adapters from the file: the callables, or why there are none."""
    topic: str
    impl: str
    status: str = "ok"  # "ok" | NOT_IMPLEMENTED | ABSENT
    fns: dict = field(default_factory=dict)  # adapter name -> callable

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def implementations(module: ModuleType, topic: str) -> list[Adapter]:
    """Every implementation of `topic` the file names; status ABSENT when it names none of its adapters."""
    out = []
    for impl, names in ADAPTERS[topic].items():
        fns = {n: getattr(module, n) for n in names if callable(getattr(module, n, None))}
        out.append(Adapter(topic, impl, "ok" if fns else ABSENT, fns))
    return out


def call(fn, *args, **kwargs):
    """Call a student's adapter; NotImplementedError becomes the NOT_IMPLEMENTED marker, anything else propagates."""
    try:
        return fn(*args, **kwargs)
    except NotImplementedError:
        return NOT_IMPLEMENTED


def functions(path, topic: str, device: str = "cpu") -> dict:
    """{'yours:IMPL': apply} of the autograd Functions a file implements for a kernel topic (rmsnorm, attention), for
    a notebook's "yours" rows: imported in this process (`python -m helpers yours` checks them in its own first).
    No path: {}. Triton implementations only where there is a GPU (the CPU's interpreter times Python)."""
    if not path:
        return {}
    module, out = load(path), {}
    for adapter in implementations(module, topic):
        name = ADAPTERS[topic][adapter.impl][0]
        if not adapter.ok or not name.startswith("get_") or (adapter.impl == "triton" and device == "cpu"):
            continue
        cls = call(adapter.fns[name])
        if cls is not NOT_IMPLEMENTED and hasattr(cls, "apply"):
            out[f"yours:{adapter.impl}"] = cls.apply
    return out
