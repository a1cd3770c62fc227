"""Where a student's Triton can be judged: the device Triton runs on here, whether block pointers work, and the
companion's own kernel as the proof that a case can run; a kernel that cannot run here is "needs a GPU" or "needs
another Triton", never a failure.

Without a GPU, Triton's interpreter runs a kernel on CPU tensors. The handouts' example wrapper asserts `x.is_cuda`;
such a wrapper is run again with `is_cuda` answering True (pretend_cuda), so its kernel is judged rather than skipped.
On a GPU, a CUDA error in a student's kernel (an illegal address, a device-side assert) leaves the process's CUDA
context unusable: the check raises Poisoned, and the caller reruns what is left in a fresh process.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch

from helpers.course.yours.kernels.numerics import DTYPE_MISMATCH
from helpers.course.yours.report import NEEDS_GPU, NEEDS_TRITON
from helpers.env import import_triton

triton, tl = import_triton()  # None e.g. on macOS: no Triton, so no Triton implementation can be judged here


def fix_bf16_dot() -> bool:
    """Triton's interpreter (3.6 to 3.9 at least) keeps bf16 tiles as their raw 16-bit patterns and tl.dot multiplies
    those integers: give it the tiles in fp32 (exact for bf16), accumulated in fp32 as a GPU's tensor cores do, so a
    kernel in the handout's style (bf16 tiles into tl.dot) computes here what it computes on a GPU. True when the
    patch is in place."""
    if triton is None:
        return False
    import numpy as np
    from triton.runtime import interpreter

    builder = type(interpreter.interpreter_builder)
    dot = builder.create_dot
    if getattr(dot, "widens_bf16", False):
        return True

    def widen(t):
        if t.dtype != tl.bfloat16:
            return t
        return interpreter.TensorHandle((t.data.astype(np.uint32) << 16).view(np.float32), tl.float32)

    def create_dot(self, a, b, *args, **kwargs):
        return dot(self, widen(a), widen(b), *args, **kwargs)

    create_dot.widens_bf16 = True
    builder.create_dot = create_dot
    return True


_PATCHES = {}  # which of the interpreter's fixes are in place (a Triton that lacks what one patches keeps its own)


class OutOfBounds(Exception):
    """A kernel in the interpreter reached memory outside every tensor it was given."""


_ARGUMENTS: list = []  # (name, first byte, one past the last byte) of the running kernel's tensor arguments


def guard_memory() -> bool:
    """Make the interpreter refuse a load or store outside the tensors a kernel was given (OutOfBounds, naming the
    tensor and how far past its end), as compute-sanitizer would on a GPU: without it such an access reads garbage
    or corrupts this process's heap (a crash, or a hang, later and elsewhere). True when the guard is in place."""
    if triton is None:
        return False
    import numpy as np
    from triton.runtime import interpreter

    executor, builder = interpreter.GridExecutor, type(interpreter.interpreter_builder)
    if getattr(builder.create_masked_load, "guarded", False):
        return True
    init_args = executor._init_args_hst

    def _init_args_hst(self, args_dev, kwargs):
        args_hst, kwargs_hst = init_args(self, args_dev, kwargs)
        named = list(zip(self.arg_names, args_hst, strict=False)) + list(kwargs_hst.items())
        _ARGUMENTS[:] = [
            (name, t.untyped_storage().data_ptr(), t.untyped_storage().data_ptr() + t.untyped_storage().nbytes())
            for name, t in named
            if isinstance(t, torch.Tensor)
        ]
        return args_hst, kwargs_hst

    def check(ptrs, mask, what: str):
        if not _ARGUMENTS:
            return
        size = ptrs.get_element_ty().primitive_bitwidth // 8
        addrs = ptrs.data[np.broadcast_to(mask.data, ptrs.data.shape)].astype(np.int64)
        inside = np.zeros(addrs.shape, dtype=bool)
        for _, start, end in _ARGUMENTS:
            inside |= (addrs >= start) & (addrs + size <= end)
        if inside.all():
            return
        bad = int(addrs[~inside][0])
        below = [(name, start, end) for name, start, end in _ARGUMENTS if start <= bad] or _ARGUMENTS
        name, start, end = max(below, key=lambda a: a[1])
        where = f"byte {bad - start} of {name}, a tensor of {end - start} bytes" if bad >= start else "before them"
        raise OutOfBounds(
            f"tl.{what} reaches {int((~inside).sum())} elements outside every tensor the kernel was given (the "
            f"first at {where}): an offset or a grid axis beyond the tensor, or a {what} without a mask or "
            "boundary check"
        )

    def create_masked_load(self, ptrs, mask, *args, **kwargs):
        check(ptrs, mask, "load")
        return load(self, ptrs, mask, *args, **kwargs)

    def create_masked_store(self, ptrs, value, mask, *args, **kwargs):
        check(ptrs, mask, "store")
        return store(self, ptrs, value, mask, *args, **kwargs)

    load, store = builder.create_masked_load, builder.create_masked_store
    create_masked_load.guarded = True
    executor._init_args_hst = _init_args_hst
    builder.create_masked_load, builder.create_masked_store = create_masked_load, create_masked_store
    return True


def autotune_without_timing() -> bool:
    """Without a GPU, Triton's autotuner cannot time its configs (it asks for a GPU driver: "0 active drivers"): in
    the interpreter every config ties and the first is used, so an autotuned kernel is judged on its first config
    (the one the list puts first, often the largest tiles) rather than not at all. True when the patch is in place."""
    if triton is None or torch.cuda.is_available():
        return False
    from triton.runtime.autotuner import Autotuner

    if getattr(Autotuner, "untimed", False):
        return True
    init = Autotuner.__init__

    def untimed(kernel_call, quantiles):
        return [0.0 for _ in quantiles]

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.__dict__["do_bench"] = untimed  # over a cached_property (3.6) or the attribute __init__ set (older)

    if isinstance(Autotuner.__dict__.get("do_bench"), property):  # a plain property cannot be shadowed
        Autotuner.do_bench = property(lambda self: untimed)
    Autotuner.__init__ = __init__
    Autotuner.untimed = True
    return True


for _patch in (fix_bf16_dot, guard_memory, autotune_without_timing):
    try:
        _PATCHES[_patch.__name__] = _patch()
    except (AttributeError, TypeError, ImportError) as _exc:  # another Triton's internals: judged without it
        _PATCHES[_patch.__name__] = f"not applied: {type(_exc).__name__}: {_exc}"

if triton is not None:

    @triton.jit
    def _block_pointer_row_sums(x_ptr, y_ptr, n_rows, D: tl.constexpr, TILE: tl.constexpr):
        """The handout's style: a (TILE, D) tile through tl.make_block_ptr and tl.advance, summed along D."""
        pid = tl.program_id(0)
        x_block = tl.make_block_ptr(
            x_ptr, shape=(n_rows, D), strides=(D, 1), offsets=(pid * TILE, 0), block_shape=(TILE, D), order=(1, 0)
        )
        y_block = tl.make_block_ptr(
            y_ptr, shape=(n_rows,), strides=(1,), offsets=(pid * TILE,), block_shape=(TILE,), order=(0,)
        )
        x = tl.load(x_block, boundary_check=(0, 1), padding_option="zero")  # (TILE, D)
        tl.store(y_block, tl.sum(x, axis=1), boundary_check=(0,))
        x_block = tl.advance(x_block, (TILE, 0))  # what a key loop does; unused after


def block_pointer_probe(device: str) -> str:
    """'' when this Triton runs a kernel written in the handout's block-pointer style on `device`, else why not."""
    if triton is None:
        return "no Triton installed"
    try:
        x = torch.arange(40 * 16, dtype=torch.float32, device=device).reshape(40, 16)  # (40, 16)
        y = torch.empty(40, device=device)  # (40,)
        _block_pointer_row_sums[(3,)](x, y, 40, D=16, TILE=16)
        return "" if torch.allclose(y.cpu(), x.sum(1).cpu()) else "a block-pointer kernel gives wrong sums here"
    except Exception as exc:  # noqa: BLE001 - whatever this Triton says is the reason
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'block pointers unsupported'}"


@dataclass
class TritonRuntime:
    """What this environment's Triton can run: the device its kernels take inputs on, whether block pointers work,
    and, per case, whether the companion's own kernel passes it here (the proof a student's kernel is judged by)."""

    device: str
    block_pointers: str  # '' when they work, else why not
    ours: object  # the companion's Function.apply for this topic
    check: object  # check(apply, case, device) -> '' | what differed
    seen: dict = None
    pretend_cuda: bool = False  # the student's wrapper asserted is_cuda: run it with is_cuda answering True

    def cannot_run(self, case) -> str:
        """'' when our kernel passes `case` here, else why this environment cannot judge a kernel on it. Only the
        CPU's interpreter can fall short: on a GPU every case in the contract runs, so this is always ''."""
        if self.device != "cpu":
            return ""
        if self.seen is None:
            self.seen = {}
        if case not in self.seen:
            try:
                detail = self.check(self.ours, case, self.device)
            except Exception as exc:  # noqa: BLE001
                detail = f"{type(exc).__name__}: {exc}"
            self.seen[case] = detail
        return self.seen[case]

    @contextlib.contextmanager
    def running(self):
        """The context a student's Triton call runs in: is_cuda answering True once pretend_cuda is set; NumPy's
        warnings about the interpreter's overflows silenced (a wrong kernel's values are judged, not its noise)."""
        import numpy as np

        with pretend_cuda() if self.pretend_cuda else contextlib.nullcontext(), np.errstate(all="ignore"):
            yield


@contextlib.contextmanager
def pretend_cuda():
    """Tensors answer True to `is_cuda` inside: a wrapper that asserts it (the handouts' example does) runs its
    kernel in the interpreter, on the CPU tensors it was given. Only where there is no GPU."""
    if torch.cuda.is_available():
        yield
        return
    torch.Tensor.is_cuda = property(lambda self: True)  # shadows the C property of torch._C.TensorBase
    try:
        yield
    finally:
        del torch.Tensor.is_cuda


def asserts_is_cuda(exc: BaseException) -> bool:
    """The student's code stopped at a check of is_cuda (an assert, or an `if not x.is_cuda: raise` a line or two
    above), and could run in the interpreter without it."""
    import linecache
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return False
    last = frames[-1]
    if isinstance(exc, AssertionError):
        return "is_cuda" in (last.line or "")
    above = "".join(linecache.getline(last.filename, n) for n in range(max(1, last.lineno - 3), last.lineno + 1))
    return "is_cuda" in above and "cuda" in f"{exc} {last.line}".lower()


class NotHere(Exception):
    """A case this environment cannot judge (the message says why): NEEDS_GPU, not a failure."""


INTERPRETED_BF16 = (
    "needs a GPU: Triton's interpreter does not compute in bf16 (it keeps bf16 tiles as raw 16-bit patterns and "
    "does arithmetic on those), so a bf16 case's values are judged on a GPU; its output dtype was checked here"
)


def interpreted(check):
    """check(apply, case, device) for a Triton implementation: in the CPU's interpreter a bf16 case counts for its
    output's dtype and for what Triton's front end refuses (as it would on a GPU), and for its values only when they
    are right; wrong values, and an operation the interpreter lacks for bf16, are NotHere."""

    def run(apply, case, device="cpu"):
        if device != "cpu" or case.dtype != torch.bfloat16:
            return check(apply, case, device)
        try:
            detail = check(apply, case, device)
        except Exception as exc:
            if not _interpreter_gap(exc):
                raise
            raise NotHere(f"{case}: {INTERPRETED_BF16} ({type(exc).__name__}: {str(exc)[:200]})") from None
        if detail and DTYPE_MISMATCH not in detail:
            raise NotHere(f"{INTERPRETED_BF16} ({detail[:300]})")
        return detail

    return run


def causes(exc: BaseException | None):
    """`exc`, then what caused it (__cause__), and so on: the interpreter and autograd wrap what student code raised."""
    while exc is not None:
        yield exc
        exc = exc.__cause__


def _interpreter_gap(exc: BaseException) -> bool:
    """The interpreter lacks what the kernel asked for in bf16 (an operation its builder does not have, or its
    execution refuses, e.g. an atomic add "Unsupported data type"); not a check of Triton's front end, which a GPU
    makes too."""
    import traceback

    chain = list(causes(exc))
    frames = traceback.extract_tb(chain[-1].__traceback__)  # where the first error was raised
    inner = frames[-1].filename if frames else ""
    return any("InterpreterBuilder" in str(e) for e in chain) or inner.endswith(f"runtime{os.sep}interpreter.py")


def out_of_bounds(exc: BaseException) -> OutOfBounds | None:
    """The OutOfBounds behind an exception (the interpreter wraps what a kernel raises), or None."""
    return next((e for e in causes(exc) if isinstance(e, OutOfBounds)), None)


class Poisoned(Exception):
    """A CUDA error in the student's code: this process's CUDA context is unusable, what is left of the checks must
    run in a fresh process. Carries the checks made so far (the last one names the error)."""

    def __init__(self, checks: list):
        super().__init__("a CUDA error left this process's CUDA context unusable")
        self.checks = checks


CUDA_ERROR_WORDS = (
    "cuda error",
    "illegal memory access",
    "illegal address",
    "device-side assert",
    "unspecified launch failure",
    "misaligned address",
    "cudaerror",
)


def is_cuda_error(exc: BaseException) -> bool:
    """An error of the CUDA context (sticky: every later CUDA call in this process fails too)."""
    text = f"{type(exc).__name__} {exc}".lower()
    return type(exc).__name__ == "AcceleratorError" or any(w in text for w in CUDA_ERROR_WORDS)


def cuda_broken() -> bool:
    """True when this process has a GPU and its CUDA context no longer works (a synchronize raises)."""
    if not torch.cuda.is_available():
        return False
    try:
        torch.cuda.synchronize()
        return False
    except Exception:  # noqa: BLE001 - any error here means the context is gone
        return True


def triton_runtime(topic: str) -> TritonRuntime:
    """The proof for a kernel topic: our Triton Function and its check, on the device Triton runs on here."""
    from helpers.attention import FlashAttentionTriton
    from helpers.course.yours.kernels.attention import check_attn_function
    from helpers.course.yours.kernels.rmsnorm import check_norm_function
    from helpers.rmsnorm import RMSNormTritonFunction

    device = "cuda" if torch.cuda.is_available() else "cpu"
    ours, check = (
        (RMSNormTritonFunction.apply, check_norm_function)
        if topic == "rmsnorm"
        else (FlashAttentionTriton.apply, check_attn_function)
    )
    return TritonRuntime(device, block_pointer_probe(device), ours, check)


GPU_WORDS = ("cuda", "gpu", "cannot be accessed from triton")  # "Pointer argument cannot be accessed from Triton"
BLOCK_POINTER_WORDS = ("make_block_ptr", "block_ptr", "tl.advance", "tensor descriptor", "tensor_descriptor")


def unrunnable(exc: BaseException, runtime: TritonRuntime) -> tuple[str, str] | None:
    """(NEEDS_GPU | NEEDS_TRITON, why) when a student's Triton code raised because this environment cannot run it:
    a wrapper that asks for CUDA tensors on a machine without one, or block pointers this Triton lacks."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    text = (f"{type(exc).__name__} {exc} " + " ".join(f.line or "" for f in frames)).lower()
    if runtime.block_pointers and (isinstance(exc, NotImplementedError) or any(w in text for w in BLOCK_POINTER_WORDS)):
        import triton as _triton

        return NEEDS_TRITON, (
            f"needs a Triton with block pointers: this environment's Triton {_triton.__version__} "
            f"cannot run them ({runtime.block_pointers}); run with --python your assignment's "
            ".venv/bin/python, where `uv sync` installs the course's Triton"
        )
    if not torch.cuda.is_available():
        line = (frames[-1].line or "").lower() if frames else ""
        if any(w in str(exc).lower() for w in GPU_WORDS) or (
            isinstance(exc, AssertionError) and any(w in line for w in ("cuda", "device", "gpu"))
        ):
            return NEEDS_GPU, (
                f"needs a GPU: your code asks for CUDA tensors ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else line.strip()}), as the course's Triton "
                "tests run on one; nothing is wrong with that"
            )
    return None
