"""What machine this is, which run profile to use, and seeding.

Every notebook starts with ``profile = resolve_profile(PROFILE)`` and shows
``environment_table()`` so its numbers say which machine made them.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import random

import torch
import torch.distributed as dist

PROFILES = {
    "cpu": "quick: gloo, Triton interpreter, CPU-scale model presets (the '/cpu' sizes), small messages; "
    "minutes on a 2-core laptop",
    "gpu": "full: CUDA, compiled Triton, the reference model sizes (small..2.7B), NCCL when there is one GPU per rank",
}


AUTO_PROFILE_VAR = "HELPERS_PROFILE"  # what "auto" means when set: `make test` sets cpu (the gpu sizes are writeup's)


def resolve_profile(profile: str = "auto") -> str:
    """Turn a notebook's PROFILE parameter into "cpu" or "gpu" ("auto": $HELPERS_PROFILE when set, else gpu when
    CUDA is present)."""
    profile = (profile or "auto").lower()
    if profile == "auto":
        profile = os.environ.get(AUTO_PROFILE_VAR, "").lower() or ("gpu" if torch.cuda.is_available() else "cpu")
    if profile not in PROFILES:
        raise ValueError(f"unknown PROFILE={profile!r}; use 'auto', 'cpu' or 'gpu'")
    if profile == "gpu" and not torch.cuda.is_available():
        raise ValueError("PROFILE='gpu' needs CUDA, and torch sees no GPU here; use 'auto' or 'cpu'")
    return profile


def device_type() -> str:
    """Where a notebook's tensors go: "cuda" when torch sees a GPU, else "cpu", whatever the profile (the profile picks
    only the sizes; compiled Triton refuses host tensors, so a kernel's inputs follow the machine too)."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def card_bytes() -> float | None:
    """The memory of the GPU this process runs on as torch reports it (mem_get_info's total), or None without CUDA:
    the card the notebooks' setups fit their gpu sizes to (gpu_plans_bytes.fits_card)."""
    return float(torch.cuda.mem_get_info()[1]) if torch.cuda.is_available() else None


def _cpu_name() -> str:
    """The CPU model name from /proc/cpuinfo, else what platform knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> set[str]:
    """The CPU's instruction-set flags from /proc/cpuinfo (empty where there is none, e.g. macOS)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def package_version(name: str) -> str | None:
    """Installed version of a distribution without importing it (importing triton would fix its mode)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def usable_cores() -> int:
    """Cores this process may run on (respects taskset/cgroup affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def share_of_cores(cores: list[int], worker: int, workers: int) -> list[int]:
    """Worker `worker`'s share of `cores` when `workers` processes split them (every workers-th core, so shares
    differ by at most one core); all of them when there are more workers than cores."""
    if not 0 <= worker < workers:
        raise ValueError(f"worker {worker} of {workers}: expected 0 <= worker < workers")
    return cores[worker::workers] if workers <= len(cores) else list(cores)


def machine_facts() -> dict:
    """Device, core and GPU counts and library versions: the provenance of every measurement."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {
        "device": torch.cuda.get_device_name(0) if gpus else _cpu_name(),
        "device_type": "cuda" if gpus else "cpu",
        "gpu_count": gpus,
        "cpu_count": usable_cores(),
        "torch": torch.__version__,
        "triton": package_version("triton"),
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
    }


def backends() -> dict:
    """Which torch.distributed backends this build offers and which devices each can use here."""
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {
        "gloo": dist.is_gloo_available(),
        "nccl": dist.is_nccl_available() and gpus > 0,
        "mpi": dist.is_mpi_available(),
    }


def import_triton():
    """(triton, triton.language), or (None, None) where Triton is not installed (e.g. macOS): what every kernel module
    imports, with the interpreter fixed for NumPy >= 2.4 (fix_triton_interpreter)."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None, None
    fix_triton_interpreter()
    return triton, tl


def fix_triton_interpreter() -> bool:
    """Make Triton's interpreter run what a GPU runs. (1) A grid given as a list (`lambda meta: [n]`, which the
    compiled launcher takes) fails there with "can only concatenate list (not "tuple") to list" (3.6 to 3.9): it is
    made a tuple. (2) Triton 3.6's interpreter (the course's pin) turns a scalar, a one-element array, into a loop
    bound or an index with int(array), which NumPy 2.4 refuses ("only 0-dimensional arrays can be converted to Python
    scalars"): every `range(...)` over a kernel argument fails. Newer Tritons squeeze the array first; give older ones
    the same `__index__`. (3) A Python bool for an argument that is not constexpr (`causal` as a runtime flag; a GPU
    takes it as an int1) fails in 3.6's interpreter ("numpy data itemsize (32 bits) exceeds dtype primitive_bitwidth
    (1 bits)"): converted as 3.7 and newer do. (4) A triton.language function imported by name into the kernel's
    module (`from triton.language import make_block_ptr`; the compiler resolves it as tl.make_block_ptr) is patched
    for the interpreter as tl's own are; unpatched it raised "Did you forget to add @triton.jit ?" (3.6 to 3.9).
    True when (2) was applied (here or earlier)."""
    import inspect

    import numpy as np
    from triton.runtime import interpreter

    _tuple_grids(interpreter)
    _bool_arguments(interpreter)
    _imported_builtins(interpreter)

    patch = getattr(interpreter, "_patch_lang_tensor", None)
    if patch is None or getattr(patch, "squeezes", False):
        return patch is not None
    if int(np.__version__.split(".")[0]) * 100 + int(np.__version__.split(".")[1]) < 204:
        return False
    try:
        if "squeeze()" in inspect.getsource(patch):
            return False  # this Triton already squeezes (3.7 and newer)
    except (OSError, TypeError):
        pass

    def squeezing(tensor, scope):
        patch(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    squeezing.squeezes = True
    interpreter._patch_lang_tensor = squeezing
    return True


def _tuple_grids(interpreter) -> None:
    """GridExecutor takes any sequence as its grid, as the compiled launcher does (fix_triton_interpreter, (1))."""
    cls = getattr(interpreter, "GridExecutor", None)
    if cls is None or getattr(cls, "tuple_grids", False):
        return
    init = cls.__init__

    def as_tuple(grid):
        return tuple(grid) if isinstance(grid, list) else grid

    def __init__(self, fn, arg_names, grid, *args, **kwargs):
        tupled = (lambda meta: as_tuple(grid(meta))) if callable(grid) else as_tuple(grid)
        init(self, fn, arg_names, tupled, *args, **kwargs)

    cls.__init__ = __init__
    cls.tuple_grids = True


def _bool_arguments(interpreter) -> None:
    """A bool kernel argument is an int1 scalar in the interpreter (fix_triton_interpreter, (3))."""
    convert = getattr(interpreter, "_implicit_cvt", None)
    if convert is None or getattr(convert, "bools", False):
        return
    import numpy as np
    import triton.language as tl

    def with_bools(arg):
        if isinstance(arg, bool):  # before int: a bool is one
            return tl.tensor(interpreter.TensorHandle(np.array([arg], dtype=np.bool_), tl.int1), tl.int1)
        return convert(arg)

    with_bools.bools = True
    interpreter._implicit_cvt = with_bools


class _Globals:
    """A function's globals as an object, whose names the interpreter's patch scope sets and restores."""

    def __init__(self, names: dict):
        object.__setattr__(self, "names", names)

    def __getattr__(self, name):
        try:
            return self.names[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name, value):
        self.names[name] = value

    def __delattr__(self, name):
        del self.names[name]


def _imported_builtins(interpreter) -> None:
    """triton.language functions imported by name are patched as tl's own (fix_triton_interpreter, (4))."""
    patch = getattr(interpreter, "_patch_lang", None)
    if patch is None or getattr(patch, "imported", False):
        return
    import triton.language as tl

    def patch_lang(fn):
        imported = {}  # global name -> (module, attribute) of a builtin imported from triton.language
        for name, value in list(fn.__globals__.items()):
            attr = getattr(value, "__name__", "") if tl.core.is_builtin(value) else ""
            module = next((m for m in (tl, tl.math) if attr and getattr(m, attr, None) is value), None)
            if module is not None:
                imported[name] = module, attr
        scope = patch(fn)
        for name, (module, attr) in imported.items():
            scope.set_attr(_Globals(fn.__globals__), name, getattr(module, attr))  # restored with tl's
        return scope

    patch_lang.imported = True
    interpreter._patch_lang = patch_lang


def triton_mode() -> str:
    """'interpreter' when TRITON_INTERPRET=1 (set by `import helpers` on machines without CUDA), else 'compiled'."""
    return "interpreter" if os.environ.get("TRITON_INTERPRET") == "1" else "compiled"


def environment_table(profile: str | None = None) -> list[tuple[str, str]]:
    """(key, value) rows for the environment report notebook 00 shows."""
    facts = machine_facts()
    rows = [(k, str(v)) for k, v in facts.items()]
    rows.append(("distributed backends", ", ".join(k for k, ok in backends().items() if ok) or "none"))
    rows.append(("triton mode", triton_mode() if facts["triton"] else "not installed"))
    if profile is not None:
        rows.append(("profile", f"{profile}: {PROFILES[profile]}"))
    return rows


def seed_everything(seed: int = 0) -> None:
    """Seed Python, torch (CPU and CUDA) so runs repeat."""
    random.seed(seed)
    torch.manual_seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass
