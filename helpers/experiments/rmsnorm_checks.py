"""Notebook 02's correctness checks: the tolerances of every comparison with the PyTorch spec, the spec's inputs, one
checker for any f(x, g) (forward and both gradients), and the norms swapped into a tiny model.

    check_against_spec(RMSNormTritonFunction.apply, (2, 3, 37), torch.bfloat16)  # y, dx, dg within TOL[dtype]
    check_model_norms(tiny_model_runs(["rmsnorm", "rmsnorm_triton"]))            # loss and every gradient
"""

from __future__ import annotations

import torch
from torch import Tensor

from helpers.experiments.common import variant_runs
from helpers.model import ModelConfig
from helpers.rmsnorm import rmsnorm_reference

# tolerances of every check against the spec (notebook 02 and tests/test_rmsnorm.py)
TOL = {
    torch.float32: dict(rtol=1e-4, atol=1e-5),  # fp32: a few ulps of the O(1) outputs
    torch.float16: dict(rtol=1e-3, atol=1e-3),  # about 1 fp16 ulp on O(1) values
    torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2),
}  # about 2 bf16 ulps (8 mantissa bits)
DERIVED_TOL = dict(rtol=1e-10, atol=1e-12)  # hand-derived gradients vs autograd, float64: rounding error
GRADCHECK = dict(eps=1e-6, atol=1e-6)  # torch.autograd.gradcheck of RMSNormPyTorchFunction, float64
RRMS_TOL = dict(rtol=1e-5, atol=1e-6)  # the saved 1/rms (fp32)
LOSS_TOL = dict(rtol=1e-5, atol=0.0)  # the tiny model's loss with another norm implementation
TINY = ModelConfig("tiny", 32, 64, 2, 4, vocab_size=50, context_length=16)  # the model the norms are swapped into


def spec_inputs(shape, dtype=torch.float32, device="cpu", seed=0):
    """x (shape), g (H,), dy (shape), drawn in fp32 on the CPU and cast; x and g require grad."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=gen).to(device, dtype).requires_grad_()
    g = (1 + 0.5 * torch.randn(shape[-1], generator=gen)).to(device, dtype).requires_grad_()
    dy = torch.randn(*shape, generator=gen).to(device, dtype)
    return x, g, dy


def fwd_bwd(fn, x, g, dy) -> tuple[Tensor, Tensor, Tensor]:
    """y, dx, dg of fn(x, g) with upstream gradient dy."""
    y = fn(x, g)
    return (y, *torch.autograd.grad(y, (x, g), dy))


def check_against_spec(fn, shape, dtype=torch.float32, device="cpu", seed=0) -> float:
    """Assert fn's y, dx, dg equal rmsnorm_reference's within TOL[dtype] (same dtype and shape); the largest error."""
    x, g, dy = spec_inputs(shape, dtype, device, seed)
    worst = 0.0
    for name, a, b in zip(("y", "dx", "dg"), fwd_bwd(fn, x, g, dy), fwd_bwd(rmsnorm_reference, x, g, dy), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        torch.testing.assert_close(a, b, **TOL[dtype], msg=lambda m, name=name: f"{name} ({dtype}, {shape}): {m}")
        worst = max(worst, float((a.detach().float() - b.detach().float()).abs().max()) if a.numel() else 0.0)
    return worst


def tiny_model_runs(norms, device="cpu", batch_size: int = 2) -> dict:
    """norm -> (loss, {name: grad}) of the TINY model with that norm, same seed and batch for all."""
    return {
        norm: (loss, grads) for norm, (_, loss, grads) in variant_runs(TINY, "norm", norms, device, batch_size).items()
    }


def check_model_norms(runs: dict, ref: str = "rmsnorm") -> None:
    """Assert every run's loss within LOSS_TOL and every gradient within TOL[float32] of the `ref` norm's run."""
    ref_loss, ref_grads = runs[ref]
    for norm, (loss, grads) in runs.items():
        torch.testing.assert_close(loss, ref_loss, **LOSS_TOL, msg=lambda m, norm=norm: f"{norm} loss: {m}")
        for name, grad in grads.items():
            torch.testing.assert_close(
                grad, ref_grads[name], **TOL[torch.float32], msg=lambda m, norm=norm, name=name: f"{norm} {name}: {m}"
            )
