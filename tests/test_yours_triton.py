"""`python -m helpers yours`' Triton runtime: what the interpreter is given and refuses, and what a GPU would do.
Part of the kernel tests (CI runs them again under the newest Triton, make test-newest-triton, whose interpreter they
are about); the rest of the kernel topics' checks are tests/test_yours.py's."""

import pytest
import torch

from helpers.course.yours.kernels import rmsnorm as N
from helpers.env import import_triton

needs_triton = pytest.mark.skipif(import_triton()[0] is None, reason="no Triton here")


def _kernels():
    """Two tiny kernels without block pointers (they run under every Triton): a row copy that may run past its
    tensor, and a bf16 tile product."""
    import triton
    import triton.language as tl

    @triton.jit
    def copy_rows(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n, other=0.0), mask=offs < n + 8)

    @triton.jit
    def square(x_ptr, y_ptr, N: tl.constexpr):
        rows, cols = tl.arange(0, N)[:, None], tl.arange(0, N)[None, :]
        x = tl.load(x_ptr + rows * N + cols)
        tl.store(y_ptr + rows * N + cols, tl.dot(x, tl.trans(x)))

    return copy_rows, square


@needs_triton
def test_the_interpreter_refuses_a_store_past_a_tensor_and_names_it():
    """A store 8 elements past y's end is an error naming y and the byte, not a corrupted heap."""
    from helpers.course.yours.kernels.triton_runtime import OutOfBounds, out_of_bounds

    copy_rows, _ = _kernels()
    x, y = torch.arange(16.0), torch.zeros(16)
    copy_rows[(1,)](x, y, 8, BLOCK=16)  # within y: 16 elements stored of 16
    assert torch.equal(y[:8], x[:8])
    with pytest.raises(Exception) as raised:
        copy_rows[(1,)](x, y, 16, BLOCK=32)  # stores 24 of 16
    oob = out_of_bounds(raised.value)
    assert isinstance(oob, OutOfBounds) and "tl.store reaches 8 elements" in str(oob) and "of y_ptr" in str(oob)


@needs_triton
def test_what_tritons_front_end_refuses_in_bf16_counts_in_the_interpreter():
    """tl.dot of an fp32 and a bf16 tile is refused by Triton's front end, on a GPU as here: not 'needs a GPU'."""
    import triton
    import triton.language as tl

    from helpers.course.yours.kernels.triton_runtime import interpreted

    @triton.jit
    def mixed(x_ptr, y_ptr, N: tl.constexpr):
        rows, cols = tl.arange(0, N)[:, None], tl.arange(0, N)[None, :]
        x = tl.load(x_ptr + rows * N + cols)
        tl.store(y_ptr + rows * N + cols, tl.dot(x.to(tl.float32), x))

    def apply(case):
        mixed[(1,)](torch.zeros(16, 16, dtype=torch.bfloat16), torch.empty(16, 16), N=16)

    check = interpreted(lambda apply, case, device="cpu": apply(case))
    with pytest.raises(Exception, match="same dtype"):
        check(apply, N.NormCase((2, 8), torch.bfloat16))


@needs_triton
@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the autotuner times its configs")
def test_an_autotuned_kernel_runs_its_first_config_without_a_gpu():
    """The autotuner asks a GPU driver to time its configs ("0 active drivers" here): every config ties instead."""
    import triton
    import triton.language as tl

    @triton.autotune(configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 8})], key=["n"])
    @triton.jit
    def block_ids(y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.zeros((BLOCK,), tl.float32) + BLOCK, mask=offs < n)

    y = torch.zeros(16)
    block_ids[lambda meta: (triton.cdiv(16, meta["BLOCK"]),)](y, 16)
    assert torch.equal(y, torch.full((16,), 16.0))


@needs_triton
def test_the_interpreter_multiplies_bf16_tiles_as_numbers():
    """tl.dot on bf16 tiles: the interpreter multiplied their bit patterns; fixed, it matches fp32 up to bf16."""
    _, square = _kernels()
    x = torch.randn(16, 16, generator=torch.Generator().manual_seed(0)).bfloat16()
    y = torch.empty(16, 16)
    square[(1,)](x, y, N=16)
    want = x.double() @ x.double().T
    assert torch.allclose(y.double(), want, rtol=1e-5, atol=1e-4)


def test_pretend_cuda_lets_an_is_cuda_assertion_pass_and_restores_it():
    from helpers.course.yours.kernels.triton_runtime import asserts_is_cuda, pretend_cuda

    x = torch.zeros(2)
    try:
        assert x.is_cuda, "expected CUDA tensors"
    except AssertionError as exc:
        assert asserts_is_cuda(exc) or torch.cuda.is_available()
    with pretend_cuda():
        assert x.is_cuda
    assert x.is_cuda == (x.device.type == "cuda") and "is_cuda" not in torch.Tensor.__dict__


def test_bf16_in_the_interpreter_counts_for_its_dtype_and_only_right_values():
    """In the CPU's interpreter a bf16 case's wrong values, and an operation the interpreter lacks, are 'needs a
    GPU'; a wrong output dtype, an exception in the student's own Python, Triton's front end refusing the kernel and
    an out-of-bounds access still count; fp32 is judged as always."""
    from helpers.course.yours.kernels.triton_runtime import NotHere, OutOfBounds, interpreted

    bf16, fp32 = N.NormCase((2, 8), torch.bfloat16), N.NormCase((2, 8))
    check = interpreted(lambda apply, case, device="cpu": apply(case))
    assert check(lambda c: "y[0] = 3, float64 says 1", fp32) == "y[0] = 3, float64 says 1"
    with pytest.raises(NotHere, match="interpreter does not compute in bf16"):
        check(lambda c: "y[0] = 3, float64 says 1", bf16)
    dtype = f"y is torch.float32, {N.DTYPE_MISMATCH} torch.bfloat16"
    assert check(lambda c: dtype, bf16) == dtype

    def raising(exc):
        def apply(case):
            raise exc

        return apply

    with pytest.raises(RuntimeError):  # the student's PyTorch backward
        check(raising(RuntimeError("expected m1 and m2 to have the same dtype")), bf16)
    for cause in (OutOfBounds("tl.load reaches 4 elements outside"), AssertionError("Both operands must be same")):
        err = RuntimeError("InterpreterError")  # what a GPU refuses too: counts
        err.__cause__ = cause
        with pytest.raises(RuntimeError):
            check(raising(err), bf16)
    err.__cause__ = AttributeError("'InterpreterBuilder' object has no attribute 'get_bf16'")
    with pytest.raises(NotHere):  # what only the interpreter lacks
        check(raising(err), bf16)
