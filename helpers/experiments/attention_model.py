"""Notebook 06's attention inside the model: a tiny model's logits and gradients with each implementation against
naive attention's, and one training step per implementation timed in one interleaved loop.

    check_model_outputs(tiny_model_outputs(["naive", "sdpa", "flash_pytorch"]))       # within MODEL_TOL
    compare_models("small/cpu", ["naive", "sdpa", "flash_pytorch"])   # model fwd+bwd, interleaved
"""

from __future__ import annotations

import torch

from helpers.experiments.common import variant_runs
from helpers.model import ModelConfig, build_model, lm_loss, random_batch
from helpers.timing import compare

MODEL_TOL = dict(rtol=1e-4, atol=1e-5)  # tiny model: logits and every gradient, fp32, any attention vs naive
TINY = ModelConfig("tiny", 64, 128, 2, 4, vocab_size=50, context_length=48)  # head dim 16: Triton's smallest


def tiny_model_outputs(impls, device="cpu") -> dict:
    """impl -> (logits, {name: grad}) of the TINY model built with that attention, same seed and batch for all."""
    return {
        impl: (logits, grads) for impl, (logits, _, grads) in variant_runs(TINY, "attention", impls, device).items()
    }


def check_model_outputs(outputs: dict, ref: str = "naive") -> None:
    """Assert every impl's logits and gradients equal the `ref` run's within MODEL_TOL."""
    ref_logits, ref_grads = outputs[ref]
    for impl, (logits, grads) in outputs.items():
        torch.testing.assert_close(logits, ref_logits, **MODEL_TOL, msg=lambda m, impl=impl: f"{impl} logits: {m}")
        for name, g in grads.items():
            torch.testing.assert_close(
                g, ref_grads[name], **MODEL_TOL, msg=lambda m, impl=impl, name=name: f"{impl} {name}: {m}"
            )


def compare_models(size: str, impls, device="cpu", batch_size: int = 4, dtype=None, warmup: int = 2, steps: int = 10):
    """One forward+backward step of the model per attention impl, interleaved in one loop (timing.compare); under
    autocast to `dtype` when given (notebook 06 section 6). Baseline: the first impl."""
    x, y = random_batch(size, batch_size, device=device, generator=torch.Generator().manual_seed(0))
    steps_by_impl = {}
    for impl in impls:
        torch.manual_seed(0)
        model = build_model(size, attention=impl, device=device)

        def step(model=model):
            model.zero_grad(set_to_none=True)
            with torch.autocast(torch.device(device).type, dtype, enabled=dtype is not None):
                loss = lm_loss(model(x), y)
            loss.backward()

        steps_by_impl[impl] = step
    return compare(steps_by_impl, steps=steps, warmup=warmup, device=device)
