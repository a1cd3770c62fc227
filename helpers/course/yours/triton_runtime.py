"""Where a student's Triton can be judged: the device Triton runs on here, whether block pointers work, and the
companion's own kernel as the proof that a case can run; a kernel that cannot run here is "needs a GPU" or "needs
another Triton", never a failure.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from helpers.course.yours.report import NEEDS_GPU, NEEDS_TRITON
from helpers.env import import_triton

triton, tl = import_triton()  # None e.g. on macOS: no Triton, so no Triton implementation can be judged here

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

    def cannot_run(self, case) -> str:
        """'' when our kernel passes `case` here, else why this environment cannot judge a kernel on it."""
        if self.seen is None:
            self.seen = {}
        if case not in self.seen:
            try:
                detail = self.check(self.ours, case, self.device)
            except Exception as exc:  # noqa: BLE001
                detail = f"{type(exc).__name__}: {exc}"
            self.seen[case] = detail
        return self.seen[case]


def triton_runtime(topic: str) -> TritonRuntime:
    """The proof for a kernel topic: our Triton Function and its check, on the device Triton runs on here."""
    from helpers.attention import FlashAttentionTriton
    from helpers.course.yours.attn_checks import check_attn_function
    from helpers.course.yours.norm_checks import check_norm_function
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
