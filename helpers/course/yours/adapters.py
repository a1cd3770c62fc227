"""A student's `tests/adapters.py`: import it as pytest would, and call its adapters without trusting them.

The course's three editions name their adapters differently (public in each edition's assignment repository);
ADAPTERS lists every name by topic. An adapter that raises NotImplementedError is "not implemented", not an error.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import tempfile
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


NOT_STUDENT = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}", f"{os.sep}.venv{os.sep}")


def student_frames(frames: list, path: Path | None) -> list:
    """The frames in the student's own files: under the assignment root (or the adapters file's folder), not in an
    installed package or a virtual environment inside the repository."""
    roots = [str(assignment_root(path)), str(Path(path).resolve().parent)] if path else []
    return [
        f
        for f in frames
        if any(f.filename.startswith(r) for r in roots) and not any(part in f.filename for part in NOT_STUDENT)
    ]


def where(exc: BaseException, path: Path | None = None) -> str:
    """'file:line' of the deepest frame in the student's files (see student_frames), else the deepest frame."""
    frames = traceback.extract_tb(exc.__traceback__)
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    mine = student_frames(frames, path or _LOADED_FROM) or frames
    return f"{mine[-1].filename}:{mine[-1].lineno}" if mine else "?"


_LOADED_FROM: Path | None = None  # the adapters file this process loaded (where() looks for the student's frames)
PIP_NAMES = {"einops": "einops", "jaxtyping": "jaxtyping", "einx": "einx"}  # module -> the package that provides it


def _project(pyproject: Path) -> tuple[str, str] | None:
    """(name, version) of a pyproject.toml's [project] table, read without a TOML library (Python 3.10 has none)."""
    text = pyproject.read_text(encoding="utf-8", errors="replace")
    table = re.search(r"^\[project\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    name = table and re.search(r'^name\s*=\s*["\']([^"\']+)', table.group(1), re.M)
    version = table and re.search(r'^version\s*=\s*["\']([^"\']+)', table.group(1), re.M)
    return (name.group(1), version.group(1) if version else "0") if name else None


def prepare(root: Path) -> list[str]:
    """Make an assignment importable here without installing anything into it: the root and <root>/cs336-basics
    (every edition ships it there) on sys.path, and the metadata of their projects (pyproject.toml's name and
    version) visible to importlib.metadata where they are not installed (the 2025 template's package reads its own
    version at import). The folders added, in order."""
    import importlib.metadata as md

    folders = [str(root)] + [str(root / sub) for sub in ("cs336-basics",) if (root / sub).is_dir()]
    meta = None
    for folder in folders:
        pyproject = Path(folder) / "pyproject.toml"
        project = _project(pyproject) if pyproject.is_file() else None
        if project is None:
            continue
        try:
            md.version(project[0])
            continue  # installed (uv sync, pip install -e): its own metadata wins
        except md.PackageNotFoundError:
            pass
        meta = meta or tempfile.mkdtemp(prefix="yours-metadata-")
        info = Path(meta) / f"{re.sub(r'[-_.]+', '_', project[0])}-{project[1]}.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project[0]}\nVersion: {project[1]}\n")
    for folder in reversed(folders):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    if meta:
        sys.path.append(meta)
    return folders


def fix_for(exc: ModuleNotFoundError, root: Path) -> str:
    """The one command that makes a missing import work, for the module `exc` names."""
    top = (exc.name or "").split(".")[0]
    venv = root / ".venv" / "bin" / "python"
    if venv.exists():
        return f"run with --python {venv} (your assignment's environment)"
    if top.startswith("cs336"):
        return (
            f"cd {root} && uv sync, then run with --python {venv} ({top} is not in {root} nor in "
            f"{root / 'cs336-basics'})"
        )
    return f"{sys.executable} -m pip install {PIP_NAMES.get(top, top)}"


def load(path) -> ModuleType:
    """Import the adapters file as pytest would from the assignment's root: its own folder and the root (prepare())
    first on sys.path, the root as the working directory while it imports (so a relative sys.path entry of the file
    resolves as under pytest; such entries are then made absolute). AdaptersError, saying what to do, if it cannot."""
    global _LOADED_FROM
    path = Path(path)
    if not path.is_file():
        raise AdaptersError(f"no adapters file at {path}: pass the path to your assignment's tests/adapters.py")
    root = assignment_root(path)
    prepare(root)
    if str(path.resolve().parent) not in sys.path:
        sys.path.insert(0, str(path.resolve().parent))
    spec = importlib.util.spec_from_file_location("student_adapters", path)
    module = importlib.util.module_from_spec(spec)
    before, cwd = set(sys.path), os.getcwd()
    try:
        os.chdir(root)
        spec.loader.exec_module(module)
    except ModuleNotFoundError as exc:
        raise AdaptersError(
            f"{path} failed to import: No module named {exc.name!r} (at {where(exc, path)}). "
            f"To fix: {fix_for(exc, root)}"
        ) from None
    except BaseException as exc:  # noqa: BLE001 - SystemExit and friends from a student's file are errors too
        raise AdaptersError(f"{path} failed to import: {type(exc).__name__}: {exc} (at {where(exc, path)})") from None
    finally:
        os.chdir(cwd)
        sys.path[:] = [str(root / p) if p and p not in before and not os.path.isabs(p) else p for p in sys.path]
    _LOADED_FROM = path
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
