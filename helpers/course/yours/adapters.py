"""A student's `tests/adapters.py`: import it as pytest would, and call its adapters without trusting them.

The course's three editions name their adapters differently (public in each edition's assignment repository);
ADAPTERS lists every name by topic. An adapter that raises NotImplementedError is "not implemented", not an error.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import sys
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import helpers.course.yours.student_env as E

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


NOT_STUDENT = (
    f"{os.sep}site-packages{os.sep}",
    f"{os.sep}dist-packages{os.sep}",
    f"{os.sep}.venv{os.sep}",
    str(Path(__file__).resolve().parents[2]) + os.sep,  # the companion's own helpers
)


def student_frames(frames: list, path: Path | None) -> list:
    """The frames in the student's own files: under the assignment root, a folder pytest may run from (the repository
    root) or the adapters file's folder; not in an installed package, a virtual environment inside the repository,
    or the companion."""
    dirs = E.run_dirs(path, assignment_root(path)) if path else []
    roots = [str(d) for d in dirs] + ([str(Path(path).resolve().parent)] if path else [])
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


def _path_sources(root: Path) -> list[Path]:
    """The local folders root/pyproject.toml's [tool.uv.sources] installs (`name = { path = "..." }`), as `uv sync`
    would: the 2025 and 2026 templates ship `cs336-basics = { path = "./cs336-basics" }` and invite the student to
    point it at their own assignment 1."""
    pyproject = root / "pyproject.toml"
    text = pyproject.read_text(encoding="utf-8", errors="replace") if pyproject.is_file() else ""
    table = re.search(r"^\[tool\.uv\.sources\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
    paths = re.findall(r"""^[\w.-]+\s*=\s*\{[^}#]*?\bpath\s*=\s*["']([^"']+)""", table.group(1), re.M) if table else []
    return [(root / p).resolve() for p in paths if (root / p).is_dir()]


def prepare(root: Path, dirs: list[Path] | None = None) -> list[str]:
    """Make an assignment importable here without installing anything into it: the root, the local projects its
    pyproject.toml installs ([tool.uv.sources] paths: the student's own cs336-basics where they pointed it) and the
    `cs336-basics` folder every edition ships (in the root, or in a folder pytest may run from: `dirs`, the 2024
    layout) on sys.path in that order, the metadata of their projects (pyproject.toml's name and version) visible to
    importlib.metadata where they are not installed (the 2025 template's package reads its own version at import),
    and NVTX ranges that run on a CPU-only torch build, and CUDA events and streams too (student_env). The folders
    added, in order."""
    E.quiet_nvtx()
    E.quiet_cuda_events()
    basics = [d / "cs336-basics" for d in dict.fromkeys([root, *(dirs or [])]) if (d / "cs336-basics").is_dir()]
    folders = list(dict.fromkeys(str(f) for f in [root, *_path_sources(root), *basics]))
    for folder in folders:
        pyproject = Path(folder) / "pyproject.toml"
        project = _project(pyproject) if pyproject.is_file() else None
        if project is not None:
            E.make_visible(*project)
    for folder in reversed(folders):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    return folders


def fix_for(exc: ModuleNotFoundError, root: Path, path: Path | None = None) -> str:
    """The one command that makes a missing import work, for the module `exc` names; when the module is the
    student's own (a folder of the repository of the adapters file `path` holds it), where it is and how to reach
    it."""
    top = (exc.name or "").split(".")[0]
    dirs = E.run_dirs(path, root) if path else [root]
    found = E.find_module_in(E.repository_folder(path, root), top) if top and path else None
    if found is not None:
        tried = str(dirs[0]) if len(dirs) == 1 else f"{dirs[0]} or {dirs[-1]}"
        return (
            f"{top} is your own code, in {found}, which no sys.path entry reaches when pytest runs from {tried}: "
            "add that folder to sys.path in the adapters file (relative to where you run pytest)"
        )
    venv = root / ".venv" / "bin" / "python"
    submodule = unchecked_submodule(root)
    if top.startswith("cs336") and submodule is not None:
        return (
            f"{submodule} is a git submodule that is not checked out here (an empty folder): cd {root} && git "
            "submodule update --init && uv sync"
        )
    if venv.exists() and not own_environment(root):
        return f"run with --python {venv} (your assignment's environment)"
    if top.startswith("cs336"):
        return (
            f"cd {root} && uv sync, then run with --python {venv} ({top} is not in {root} nor in "
            f"{root / 'cs336-basics'})"
        )
    return f"{sys.executable} -m pip install {PIP_NAMES.get(top, top)}"


def unchecked_submodule(root: Path) -> Path | None:
    """The cs336-basics folder of the repository when .gitmodules names it and it is empty (not checked out)."""
    folder, modules = root / "cs336-basics", root / ".gitmodules"
    if not modules.is_file() or not folder.is_dir() or any(folder.iterdir()):
        return None
    return folder if "cs336-basics" in modules.read_text(errors="replace") else None


def own_environment(root: Path) -> bool:
    """Whether this Python is the assignment's own environment (its .venv), where a missing module is the student's."""
    return Path(sys.prefix).resolve() == (root / ".venv").resolve()


def no_adapters_file(path) -> AdaptersError:
    """The error for a path with no file: what to pass, and the adapters files one or two folders below the folder
    the path names (2024's assignment keeps them in cs336-systems/tests/), when there are any."""
    base = Path(path).parent.parent
    found = sorted(base.glob("*/tests/adapters.py")) + sorted(base.glob("*/*/tests/adapters.py"))
    hint = f"; found: {', '.join(map(str, found[:3]))}" if found and base != Path(path).parent else ""
    return AdaptersError(f"no adapters file at {path}: pass the path to your assignment's tests/adapters.py{hint}")


class _CriticalOnly(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.CRITICAL


class _NotRecompileLimit(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("torch._dynamo hit config.")  # recompile_limit and its kin


def quiet_compile_errors() -> None:
    """In a process that runs a student's code: no error log from torch's fake tensors when their torch.compile'd
    code fails to trace (a screenful on the terminal, above the report); the check catches the exception and reports
    it. Nor dynamo's warning that a compiled function hit its recompile limit: our checks' many shapes, dtypes and
    strides did that, not the student (the function runs on, eagerly; under fullgraph=True the case is judged again
    after a reset, kernels._one_case). Filters, not levels: torch._logging resets its loggers' levels when dynamo
    starts. Nor torch's notices about the calls their code makes, once per rank above the report: this torch's
    deprecation of a collective's name (all_gather_into_tensor in 2.13, the course's 2.11 takes it) and the full
    backward hook that fires on a module whose inputs need no gradient (our checks' token ids)."""
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed\.")
    warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
    for name, kind in (
        ("torch._subclasses.fake_tensor", _CriticalOnly),
        ("torch._dynamo.convert_frame", _NotRecompileLimit),
    ):
        log = logging.getLogger(name)
        if not any(isinstance(f, kind) for f in log.filters):
            log.addFilter(kind())


def guard_interpreter() -> None:
    """Triton's interpreter as the kernel checks run it, in every process that loads a student's file
    (kernels.triton_runtime's fixes, applied as it is imported: bf16 tiles into tl.dot computed as on a GPU, an access
    outside a kernel's tensors refused with OutOfBounds, an autotuned kernel run on its first config). The distributed
    checks' ranks run the student's model, which may call their own Triton kernel (sara-kothari's 2026 LM calls its
    FlashAttention): without the fixes there, its bf16 tiles multiplied as raw 16-bit patterns and the rank died by
    SIGABRT, a crash the report put on a DDP that is right."""
    import helpers.course.yours.kernels.triton_runtime  # noqa: F401 - imported for its patches


def load(path) -> ModuleType:
    """Import the adapters file as pytest would: its own folder and the root (prepare()) first on sys.path, and the
    working directory a folder pytest may run from (the assignment root, else an ancestor up to the repository's root:
    student_env.run_dirs), so that a relative sys.path entry of the file resolves as under pytest; such entries are
    then made absolute. AdaptersError, saying what to do, if it cannot be imported from any of them."""
    global _LOADED_FROM
    quiet_compile_errors()
    guard_interpreter()
    path = Path(path)
    if not path.is_file():
        raise no_adapters_file(path)
    root = assignment_root(path)
    dirs = E.run_dirs(path, root)
    prepare(root, dirs)
    if str(path.resolve().parent) not in sys.path:
        sys.path.insert(0, str(path.resolve().parent))
    furthest = None  # the import error of the try that got furthest in the file (the first try's on a tie)
    for cwd in dirs:
        try:
            module = _exec_from(path, cwd)
        except ModuleNotFoundError as exc:
            if furthest is None or _line_in(exc, path) > _line_in(furthest, path):
                furthest = exc
            continue
        except BaseException as exc:  # noqa: BLE001 - SystemExit and friends from a student's file are errors too
            why = f"{type(exc).__name__}: {exc} (at {where(exc, path)})"
            raise AdaptersError(f"{path} failed to import: {why}") from None
        _LOADED_FROM = path
        if "triton" in sys.modules:  # the student's kernels get the interpreter ours get (helpers.env)
            from helpers.env import fix_triton_interpreter

            fix_triton_interpreter()
        return module
    raise AdaptersError(
        f"{path} failed to import: No module named {furthest.name!r} (at {where(furthest, path)}). "
        f"To fix: {fix_for(furthest, root, path)}"
    ) from None


def _line_in(exc: BaseException, path: Path) -> int:
    """The line of the adapters file `path` where `exc` came from (0 if none): how far its import got."""
    mine = [f.lineno for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename).resolve() == path.resolve()]
    return mine[-1] if mine else 0


def _exec_from(path: Path, cwd: Path) -> ModuleType:
    """The adapters file executed with `cwd` as the working directory; the relative sys.path entries it adds made
    absolute from `cwd` afterwards. When it raises, what it added to sys.path is dropped (the next try starts clean)."""
    spec = importlib.util.spec_from_file_location("student_adapters", path)
    module = importlib.util.module_from_spec(spec)
    before, here = list(sys.path), os.getcwd()
    _forget_relative_finders()
    try:
        os.chdir(cwd)
        spec.loader.exec_module(module)
    except BaseException:
        sys.path[:] = before
        raise
    finally:
        os.chdir(here)
        _forget_relative_finders()
    sys.path[:] = [str(cwd / p) if p and p not in before and not os.path.isabs(p) else p for p in sys.path]
    return module


def _forget_relative_finders() -> None:
    """Drop the import system's finders cached for relative sys.path entries: each was made for the working
    directory of its time (a retry from another folder, or the absolute entries after import, need new ones)."""
    for key in [k for k in sys.path_importer_cache if k and not os.path.isabs(k)]:
        del sys.path_importer_cache[key]


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


def function_type(obj) -> str:
    """'' when `obj` is what the handout asks a getter to return, a torch.autograd.Function subclass; otherwise what
    it is, in words (an instance of one, a class of another kind). Only reported: the course's tests call nothing
    but its .apply, so behaviour is judged through .apply whatever the type."""
    import torch

    if isinstance(obj, type) and issubclass(obj, torch.autograd.Function):
        return ""
    if isinstance(obj, torch.autograd.Function):
        return f"an instance of {type(obj).__name__} (a torch.autograd.Function subclass), not the class itself"
    kind = f"the class {obj.__name__}" if isinstance(obj, type) else f"a {type(obj).__name__} object"
    return f"{kind}, not a torch.autograd.Function subclass"
