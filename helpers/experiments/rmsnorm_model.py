"""Notebook 02's norms inside the model: a TransformerLM timed with one norm, every norm swapped into one model and
timed in one interleaved loop, eager vs torch.compile, and the sentences built from the paired ratios.

    rows, comp = compare_model_norms("small/cpu", ["layernorm", "rmsnorm", "rmsnorm_triton"])   # "norm|pass" labels
    print(model_lines({"small/cpu": comp}, ["layernorm", "rmsnorm", "rmsnorm_triton"]))
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from helpers import formulas
from helpers.experiments.common import make_optimizer
from helpers.experiments.rmsnorm_compare import PASSES
from helpers.model import build_model, get_config, lm_loss, make_norm, random_batch
from helpers.timing import benchmark, compare, verdict

STEP = "fwd+bwd+opt"  # a whole training step: forward, backward and AdamW's step (2025/2026 torch_compile(b))
COMPILE_PASSES = (*PASSES.values(), STEP)  # what compare_compiled times, eager against compiled


def bench_model(
    size: str,
    norm: str = "rmsnorm",
    device="cpu",
    batch_size: int = 4,
    warmup: int = 3,
    steps: int = 10,
    compile: bool = False,
) -> list[dict]:
    """Time a TransformerLM with `norm` (notebook 02): forward and forward+backward rows; compile=True uses
    torch.compile."""
    torch.manual_seed(0)
    model = build_model(size, norm=norm, device=device)
    if compile:
        torch._dynamo.reset()  # every size shares TransformerLM.forward's code: keep under the recompile limit
    run = torch.compile(model) if compile else model
    x, y = random_batch(model.cfg, batch_size, device=device, generator=torch.Generator().manual_seed(0))

    def both():
        model.zero_grad(set_to_none=True)
        lm_loss(run(x), y).backward()

    rows = []
    for name, step in (("fwd", lambda: run(x)), ("fwd+bwd", both)):
        t = benchmark(step, warmup=warmup, steps=steps, device=device, label=f"{size} {norm} {name}")
        rows.append(t.as_row(size=size, norm=norm, compiled=compile, **{"pass": name}))
    return rows


def plan_model_norms(budget, sizes, norms, batch_size: int, warmup: int, steps: int, run=None):
    """Section 2's model sizes within the budget (the smallest always): per size `warmup + steps` rounds of every
    norm's forward (a third of a step) and forward+backward, at the model's own context length."""

    def cost(size):
        cfg = get_config(size)
        t = budget.calibration.step_s(formulas.train_flops(cfg, batch_size, cfg.context_length))
        return (warmup + steps) * len(norms) * (t / 3 + t)

    return budget.fit(sizes, cost, what="the whole model's norms at", keep_first=True, run=run)


def compare_model_norms(size: str, norms, device="cpu", batch_size: int = 4, warmup: int = 3, steps: int = 10):
    """One model of `size` whose norm layers are swapped before each call, so every norm's forward and
    forward+backward run in ONE interleaved loop on the same weights and batch (one model in memory, not one per norm):
    rows (size, norm, pass, median_s, p25_s) and the Comparison (labels "norm|pass")."""
    torch.manual_seed(0)
    model = build_model(size, device=device)
    x, y = random_batch(model.cfg, batch_size, device=device, generator=torch.Generator().manual_seed(0))
    slots = [(b, "norm1") for b in model.blocks] + [(b, "norm2") for b in model.blocks] + [(model, "norm_f")]
    layers = {n: [make_norm(n, model.cfg.d_model).to(device) for _ in slots] for n in norms}

    def use(norm):
        for (owner, attr), layer in zip(slots, layers[norm], strict=True):
            setattr(owner, attr, layer)

    def both():
        model.zero_grad(set_to_none=True)
        lm_loss(model(x), y).backward()

    calls = {}
    for n in norms:
        calls[f"{n}|fwd"] = lambda n=n: (use(n), model(x))
        calls[f"{n}|fwd+bwd"] = lambda n=n: (use(n), both())
    comp = compare(calls, steps=steps, warmup=warmup, device=device)
    rows = [
        {
            "size": size,
            "norm": label.split("|")[0],
            "pass": label.split("|")[1],
            "compiled": False,
            "median_s": float(np.median(s)),
            "p25_s": float(np.percentile(s, 25)),
            "steps": len(s),
        }
        for label, s in comp.samples.items()
    ]
    return rows, comp


def model_lines(comps, norms) -> str:
    """Per size and pass: RMSNorm (PyTorch ops) vs LayerNorm, and the fastest norm only outside the noise."""
    lines = []
    for size, comp in comps.items():
        for pass_ in PASSES.values():
            med = {n: float(np.median(comp.samples[f"{n}|{pass_}"])) for n in norms}
            first, second = sorted(med, key=med.get)[:2]
            r = comp.ratio(f"{first}|{pass_}", f"{second}|{pass_}")
            best = f"fastest {first} ({r})" if r.differs else "no measurable fastest"
            lines.append(
                f"{size:>9} {pass_:>7}: {best}; "
                + verdict("RMSNorm (PyTorch ops)", "LayerNorm", comp.ratio(f"rmsnorm|{pass_}", f"layernorm|{pass_}"))
            )
    return "\n".join(lines)


def compare_compiled(size: str, device="cpu", batch_size: int = 4, warmup: int = 3, steps: int = 10):
    """The rmsnorm model eager and under torch.compile (sharing its weights), forward, forward+backward and a whole
    training step with AdamW (COMPILE_PASSES; the optimizer is eager in both, as compiling the model leaves it), in ONE
    interleaved loop: rows as compare_model_norms' (norm "rmsnorm", compiled True/False) and the Comparison."""
    torch.manual_seed(0)
    model = build_model(size, device=device)
    torch._dynamo.reset()  # every size shares TransformerLM.forward's code: keep under the recompile limit
    runs = {False: model, True: torch.compile(model)}
    opt = make_optimizer(model.parameters(), "adamw")  # one AdamW on the shared weights (lr 1e-3)
    x, y = random_batch(model.cfg, batch_size, device=device, generator=torch.Generator().manual_seed(0))

    def both(run):
        model.zero_grad(set_to_none=True)
        lm_loss(run(x), y).backward()

    def step(run):
        both(run)
        opt.step()

    passes = {"fwd": lambda run: run(x), "fwd+bwd": both, STEP: step}
    calls = {f"{c}|{p}": functools.partial(passes[p], run) for c, run in runs.items() for p in COMPILE_PASSES}
    comp = compare(calls, steps=steps, warmup=warmup, device=device)
    rows = [
        {
            "size": size,
            "norm": "rmsnorm",
            "compiled": label.startswith("True"),
            "pass": label.split("|")[1],
            "median_s": float(np.median(s)),
            "p25_s": float(np.percentile(s, 25)),
            "steps": len(s),
        }
        for label, s in comp.samples.items()
    ]
    return rows, comp


def compiled_lines(comps) -> str:
    """Per size and pass timed (COMPILE_PASSES): compiled vs eager, paired per round, named only outside the noise."""
    return "\n".join(
        f"{size:>9} {p:>11}: " + verdict("compiled", "eager", comp.ratio(f"True|{p}", f"False|{p}"))
        for size, comp in comps.items()
        for p in COMPILE_PASSES
        if f"True|{p}" in comp.samples
    )
