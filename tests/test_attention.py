"""FlashAttention-2 (notebook 06): PyTorch spec and Triton kernels (interpreter on CPU) vs naive attention, saved
tensors, bad inputs, and the FLOP and byte closed forms vs measurements."""

import helpers  # noqa: F401  (first: sets TRITON_INTERPRET=1 without CUDA before anything imports triton)

# isort: split

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode  # imports triton

from helpers import attention as A
from helpers.attention import (
    FlashAttentionPyTorch,
    FlashAttentionTriton,
    attention_flops,
    attention_lse,
    naive_attention,
    score_matrix_bytes,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: Triton runs in its interpreter
needs_triton = pytest.mark.skipif(A.triton is None, reason="triton is not installed")
IMPLS = [FlashAttentionPyTorch, pytest.param(FlashAttentionTriton, marks=needs_triton)]


def _inputs(lead, Tq, Tk, d, dtype=torch.float32, seed=0):
    """q (*lead, Tq, d), k and v (*lead, Tk, d), dO like q: standard normal, rounded to dtype."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(*lead, Tq, d), (*lead, Tk, d), (*lead, Tk, d), (*lead, Tq, d)]
    return [torch.randn(s, generator=gen).to(DEVICE, dtype) for s in shapes]


def _run(fn, q, k, v, do, is_causal):
    """O, L (the saved logsumexp; from attention_lse for the naive reference), dq, dk, dv of fn."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    o = fn(q, k, v, is_causal)
    lse = o.grad_fn.saved_tensors[0] if fn is not naive_attention else attention_lse(q.detach(), k.detach(), is_causal)
    return (o, lse, *torch.autograd.grad(o, (q, k, v), do))


def _max_errors(got, want):
    """max |got - want| per output (O, L, dq, dk, dv), in float64; a nan counts as inf."""
    return [
        (a.double() - b.double()).abs().nan_to_num(nan=float("inf")).max().item()
        for a, b in zip(got, want, strict=True)
    ]


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("impl", IMPLS)
def test_fp32_matches_naive(impl, is_causal):
    q, k, v, do = _inputs((4,), 128, 128, 64)
    got = _run(impl.apply, q, k, v, do, is_causal)
    for name, a, b in zip(
        ["O", "L", "dq", "dk", "dv"], got, _run(naive_attention, q, k, v, do, is_causal), strict=True
    ):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2, msg=lambda m, name=name: f"{name}: {m}")
    # far tighter against fp64 on the same inputs: every output sums at most T = 128 fp32 terms of size O(1-10),
    # so accumulated rounding is below ~T * 2**-24 * 10 = 8e-5 even in the worst case (measured: <= 2e-6)
    errs = _max_errors(got, _run(naive_attention, q.double(), k.double(), v.double(), do.double(), is_causal))
    assert max(errs) < 1e-4, dict(zip(["O", "L", "dq", "dk", "dv"], errs, strict=True))


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("impl", IMPLS)
def test_low_precision_within_a_few_eps(impl, dtype, is_causal):
    q, k, v, do = _inputs((2,), 96, 96, 64, dtype)
    got = _run(impl.apply, q, k, v, do, is_causal)
    want = _run(naive_attention, q.double(), k.double(), v.double(), do.double(), is_causal)  # same rounded inputs
    # products of dtype values are exact in fp32 and sums run in fp32, so the error comes from rounding to dtype
    # (unit roundoff eps/2) a few times per output: P before P V, dS before dS K and dS^T Q, the stored result.
    # Hence |error| <= 4 eps * max|reference| per output (measured here: bf16 <= 0.8 eps, fp16 <= 0.5 eps); L is fp32.
    eps = torch.finfo(dtype).eps
    for name, a, b in zip(["O", "L", "dq", "dk", "dv"], got, want, strict=True):
        assert a.dtype == (torch.float32 if name == "L" else dtype), name
        tol = 4 * eps * b.abs().max().item() if name != "L" else 1e-4
        err = (a.double() - b).abs().max().item()
        assert err <= tol, f"{name} ({dtype}, causal={is_causal}): max error {err:.2e} > {tol:.2e}"


@pytest.mark.parametrize(
    "lead, Tq, Tk, d, is_causal",
    [
        ((), 37, 53, 32, False),  # no leading dim, ragged tiles on both sides
        ((3,), 53, 37, 128, False),
        ((2, 3), 45, 45, 16, True),  # ragged diagonal tile
        ((2, 3), 1, 1, 16, True),  # a single query
    ],
)
@pytest.mark.parametrize("impl", IMPLS)
def test_ragged_lengths_leading_dims_head_dims(impl, lead, Tq, Tk, d, is_causal):
    q, k, v, do = _inputs(lead, Tq, Tk, d)
    errs = _max_errors(
        _run(impl.apply, q, k, v, do, is_causal),
        _run(naive_attention, q.double(), k.double(), v.double(), do.double(), is_causal),
    )
    assert max(errs) < 1e-4, dict(zip(["O", "L", "dq", "dk", "dv"], errs, strict=True))


@pytest.mark.parametrize("impl", IMPLS)
def test_very_negative_scores_stay_finite(impl):
    """Every score shifted by -100 (q[..., 0] = 20, k[..., 0] = -20, d = 16): softmax does not change, L ~ -100, and
    exp(s - L) on a padded key (s = 0) would be exp(100) = inf in fp32: padding must be masked, not merely zero."""
    q, k, v, do = _inputs((2,), 37, 53, 16)
    q[..., 0], k[..., 0] = 20.0, -20.0
    got = _run(impl.apply, q, k, v, do, False)
    assert got[1].max() < -80  # the shift really reached L
    errs = _max_errors(got, _run(naive_attention, q.double(), k.double(), v.double(), do.double(), False))
    assert max(errs) < 1e-3, errs  # scores of size 100 carry fp32 rounding of ~100 * 2**-24 each


@pytest.mark.parametrize("impl", IMPLS)
def test_strided_head_layout(impl):
    """The (B, T, H, d).transpose(1, 2) layout of a model's heads: non-contiguous, read through its strides."""
    gen = torch.Generator().manual_seed(1)
    q, k, v, do = (torch.randn(2, 45, 3, 32, generator=gen).to(DEVICE).transpose(1, 2) for _ in range(4))
    assert not q.is_contiguous()
    errs = _max_errors(
        _run(impl.apply, q, k, v, do, True),
        _run(naive_attention, q.double(), k.double(), v.double(), do.double(), True),
    )
    assert max(errs) < 1e-4


def test_pytorch_spec_float64_any_head_dim():
    """The spec in fp64 (d = 24, not a Triton head dim) matches naive autograd to rounding: the maths is exact."""
    q, k, v, do = _inputs((2,), 50, 50, 24, torch.float64)
    for is_causal in (False, True):
        errs = _max_errors(
            _run(FlashAttentionPyTorch.apply, q, k, v, do, is_causal), _run(naive_attention, q, k, v, do, is_causal)
        )
        assert max(errs) < 1e-12, errs


@pytest.mark.parametrize("impl", IMPLS)
def test_saves_one_logsumexp_and_no_score_matrix(impl):
    q, k, v, _ = (x.requires_grad_() for x in _inputs((2, 3), 40, 24, 16))
    o = impl.apply(q, k, v)
    saved = o.grad_fn.saved_tensors
    assert [tuple(t.shape) for t in saved] == [(2, 3, 40), q.shape, k.shape, v.shape, o.shape]
    lse = saved[0]
    assert lse.dtype == torch.float32
    torch.testing.assert_close(lse, attention_lse(q.detach(), k.detach()), rtol=1e-5, atol=1e-5)
    assert all(t.numel() < 40 * 24 * 6 for t in saved)  # nothing as big as the (2, 3, 40, 24) scores


class _LargestTensor(TorchDispatchMode):
    """Records the largest tensor any op produces (bytes): what a computation materialises at its peak."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel() * t.element_size())
        return out


def test_score_matrix_bytes_is_naive_attentions_largest_tensor_and_flash_stays_below():
    q, k, v, do = _inputs((2, 2), 128, 96, 16)
    with _LargestTensor() as naive:
        naive_attention(q, k, v)
    assert naive.largest == score_matrix_bytes(4, 128, 96, torch.float32)  # 4 * 128 * 96 * 4 bytes
    with _LargestTensor() as flash:  # forward and backward: one tile of scores, or one (N, T, d) fp32 buffer (dq)
        _run(FlashAttentionPyTorch.apply, q, k, v, do, False)
    cfg = A._launch_config(16, torch.float32, DEVICE)
    tile_or_row_bytes = 4 * 4 * max(cfg.block_q * cfg.block_k, cfg.block_own * cfg.block_loop, 128 * 16)
    assert flash.largest <= tile_or_row_bytes < score_matrix_bytes(4, 128, 96, torch.float32)


@pytest.mark.parametrize("Tq, Tk, d", [(64, 48, 16), (33, 33, 32)])
def test_attention_flops_vs_flop_counter(Tq, Tk, d):
    q, k, v, do = _inputs((2, 3), Tq, Tk, d)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    with FlopCounterMode(display=False) as fwd:
        o = naive_attention(q, k, v)
    with FlopCounterMode(display=False) as bwd:
        o.backward(do)
    assert fwd.get_total_flops() == attention_flops(6, Tq, Tk, d)
    # naive backward = 4 matmuls; FA-2's 5 add the recomputation of S (2 d FLOPs per pair)
    assert bwd.get_total_flops() == attention_flops(6, Tq, Tk, d, backward=True) - 2 * 6 * Tq * Tk * d
    # causal: count the (query, key) pairs the mask keeps, from the probabilities naive attention produces
    probs = torch.softmax(A._scores(q[:1, :1].detach(), k[:1, :1].detach(), True), -1) if Tq == Tk else None
    if probs is not None:
        assert attention_flops(6, Tq, Tk, d, is_causal=True) == 6 * 4 * d * int((probs > 0).sum())


BAD = [  # (what is wrong, builder of (q, k, v), kwargs, words the message must hold, only Triton refuses it)
    ("head dim", lambda: _inputs((2,), 8, 8, 48)[:3], {}, ["head dims", "FlashAttentionPyTorch"], True),
    (
        "dtype mismatch",
        lambda: [*_inputs((2,), 8, 8, 16)[:2], _inputs((2,), 8, 8, 16, torch.bfloat16)[2]],
        {},
        ["one dtype", "cast"],
        False,
    ),
    (
        "device mismatch",
        lambda: [*_inputs((2,), 8, 8, 16)[:2], torch.empty(2, 8, 16, device="meta")],
        {},
        ["one device"],
        False,
    ),
    ("causal Tq != Tk", lambda: _inputs((2,), 8, 12, 16)[:3], {"is_causal": True}, ["Tq == Tk"], False),
    (
        "leading dims",
        lambda: [_inputs((2,), 8, 8, 16)[0], *_inputs((3,), 8, 8, 16)[1:3]],
        {},
        ["leading dims", "expand"],
        False,
    ),
    (
        "unsupported dtype",
        lambda: [x.to(torch.int32) for x in _inputs((2,), 8, 8, 16)[:3]],
        {},
        ["supports", "cast"],
        False,
    ),
    ("fp64 in Triton", lambda: _inputs((2,), 8, 8, 16, torch.float64)[:3], {}, ["supports"], True),
    ("empty", lambda: _inputs((2,), 0, 8, 16)[:3], {}, ["non-empty"], False),
]


@pytest.mark.parametrize("what, build, kwargs, words, triton_only", BAD, ids=[b[0] for b in BAD])
@pytest.mark.parametrize("impl", IMPLS)
def test_bad_inputs_raise_helpful_value_error(impl, what, build, kwargs, words, triton_only):
    qkv = build()
    if triton_only and impl is FlashAttentionPyTorch:
        impl.apply(*qkv, *kwargs.values())  # the PyTorch spec takes any d and fp64
        return
    with pytest.raises(ValueError) as err:
        impl.apply(*qkv, *kwargs.values())
    assert all(w in str(err.value) for w in words), str(err.value)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_launch_config_tiles_fit_the_kernels(device, dtype):
    for d in A.HEAD_DIMS:
        cfg = A._launch_config(d, dtype, device)
        for block in (cfg.block_q, cfg.block_k, cfg.block_own, cfg.block_loop):
            assert block >= 16 and block & (block - 1) == 0  # tl.dot: powers of two >= 16
        assert cfg.block_q % cfg.block_k == 0 and cfg.block_own % cfg.block_loop == 0  # causal bounds on tile borders
        assert cfg.dot_precision == ("ieee" if dtype == torch.float32 else "tf32")


def test_the_pytorch_tiles_keep_fp32_under_autocast():
    """Issue 31: inside an autocast region (the model's bf16 path) the Function's fp32 tile matmuls were recast to
    bf16; its accumulation is its own, so autocast is off inside it. Inputs fp32: fp32 agreement with the spec."""
    q, k, v = (
        torch.randn(1, 2, 64, 16, generator=torch.Generator().manual_seed(i), requires_grad=True) for i in range(3)
    )
    ref = A.naive_attention(q, k, v, is_causal=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = A.FlashAttentionPyTorch.apply(q, k, v, True)
        out.sum().backward()
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert q.grad.dtype == torch.float32
