"""helpers: the code behind the course companion's notebooks.

Importing it sets up the environment, so neither a notebook nor a test has to know (the launcher's ranks and the
subprocesses it starts inherit it):
- Triton runs on machines without CUDA: TRITON_INTERPRET=1 must be set before triton is first imported. Set
  TRITON_INTERPRET yourself to override.
- torch.compile's on-disk cache is kept apart per CPU capability (compile_cache_dir).
"""

import os
import re
import sys

CPU_SWITCHES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")  # what lowers the instructions torch uses (laptop runs)
CACHE_PREFIX = "cpu-capability-"


def compile_cache_dir(environ=os.environ) -> str | None:
    """The TORCHINDUCTOR_CACHE_DIR this process should use, or None to leave inductor's default alone.

    Inductor's cache key leaves out the CPU capability, so a kernel compiled under ATEN_CPU_CAPABILITY=avx2 and
    loaded by a later native run on an AVX-512 machine corrupts the heap (torch 2.13, issue 34). With a switch set,
    the cache is a subfolder named for the settings (cpu-capability-aten_avx2-onednn_avx2) of the one torch.compile
    would use: the TORCHINDUCTOR_CACHE_DIR you set, else inductor's default. Without one it is that cache itself.
    torch.backends.cpu.get_cpu_capability() differs from the native one only when ATEN_CPU_CAPABILITY lowers it, so
    the switches decide without importing torch. Triton's kernels are not affected (GPU code; TRITON_CACHE_DIR, when
    unset, already lies inside this folder)."""
    base = environ.get("TORCHINDUCTOR_CACHE_DIR") or None
    if base and os.path.basename(os.path.normpath(base)).startswith(CACHE_PREFIX):
        base = os.path.dirname(os.path.normpath(base))  # inherited from a process that imported helpers
    setting = "-".join(
        f"{name.split('_')[0].lower()}_{re.sub(r'[^A-Za-z0-9_.]', '_', environ[name]).lower()}"
        for name in CPU_SWITCHES
        if environ.get(name)
    )
    if not setting:
        return base
    if base is None:
        import getpass
        import tempfile

        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = f"uid_{os.getuid()}"
        base = os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))  # inductor's
    return os.path.join(base, CACHE_PREFIX + setting)


_cache = compile_cache_dir()
if _cache is not None:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _cache

if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        if "triton" in sys.modules:
            import warnings

            warnings.warn(
                "triton was imported before helpers on a machine without CUDA, so its "
                "interpreter could not be switched on; import helpers first or set TRITON_INTERPRET=1",
                stacklevel=1,  # module-level code: this line (a higher level is an importlib frame)
            )
        os.environ["TRITON_INTERPRET"] = "1"

__version__ = "0.1.0"
