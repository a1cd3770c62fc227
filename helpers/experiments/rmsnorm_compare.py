"""Notebook 02's comparisons on (rows, H): every norm's forward and forward+backward and the copy yardstick timed in
ONE interleaved loop, the forward <= forward+backward check, and the sentences and answer rows built from the paired
ratios.

    rows, comps = compare_shapes(lambda H: ["layernorm", "torchfn"], rows=4096, hidden=[256, 1024],
                                 dtypes=[torch.float32], device="cpu", warmup=2, steps=6)
    check_forward_le_both(comps); print(fastest_lines(rows, comps))
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from helpers.experiments.rmsnorm_bench import norm_function
from helpers.formulas import norm_bytes
from helpers.timing import Comparison, compare, paired_ratio, pairwise_ratios, verdict

PASSES = {False: "fwd", True: "fwd+bwd"}
PASS_NAMES = tuple(PASSES.values())  # ratio_rows' passes unless told others
COPY = "copy|into a preallocated buffer"  # timed with the norms, then set apart as their yardstick


def compare_shape(
    names,
    n_rows: int,
    H: int,
    dtype=torch.float32,
    device="cpu",
    warmup: int = 3,
    steps: int = 10,
    fns: dict | None = None,
) -> tuple[list[dict], object]:
    """Every norm of `names`, forward and forward+backward, timed in ONE interleaved loop on (n_rows, H): rows as
    bench_norm's (plus p25_s) and the Comparison, labels "impl|pass" (baseline: the first name's forward). A name of
    `fns` ({label: f(x, g)}, e.g. a student's apply) is timed as that function."""
    gen = torch.Generator(device=device).manual_seed(0)
    x = torch.randn(n_rows, H, generator=gen, device=device).to(dtype).requires_grad_()  # (N, H)
    g = (1 + 0.1 * torch.randn(H, generator=gen, device=device)).to(dtype).requires_grad_()  # (H,)
    dy = torch.randn(n_rows, H, generator=gen, device=device).to(dtype)  # (N, H)
    fns, calls = {name: (fns or {}).get(name) or norm_function(name) for name in names}, {}
    for name, fn in fns.items():
        calls[f"{name}|fwd"] = lambda fn=fn: fn(x.detach(), g.detach())
        calls[f"{name}|fwd+bwd"] = lambda fn=fn: torch.autograd.grad(fn(x, g), (x, g), dy)
    out = torch.empty_like(x.detach())  # the yardstick, in the same loop: load slows it as much as the norms
    copies = [f"{COPY} {i}" for i in range(len(fns))]  # as many copies per round as norms: the fastest copy is the
    # bound, so more chances at a quiet moment only tighten it (6 rounds of one copy, on a core shared with
    # another busy process, let a norm's median beat the copy's best by 10%)
    for label in copies:
        calls[label] = lambda: out.copy_(x.detach())
    timed = compare(calls, steps=steps, warmup=warmup, device=device)
    copy_s = [t for label in copies for t in timed.samples.pop(label)]
    comp = Comparison(timed.samples, timed.baseline, timed.device)
    copy_gbps, rows = 2 * x.numel() * x.element_size() / min(copy_s) / 1e9, []  # fastest copy vs each norm's median
    for label, samples in comp.samples.items():
        name, pass_ = label.split("|")
        moved = norm_bytes(n_rows, H, dtype, pass_ == "fwd+bwd")
        q25, med = (float(v) for v in np.percentile(samples, [25, 50]))
        rows.append(
            {
                "label": label,
                "device": str(device),
                "warmup": warmup,
                "steps": len(samples),
                "median_s": med,
                "p25_s": q25,
                "impl": name,
                "rows": n_rows,
                "H": H,
                "dtype": str(dtype).replace("torch.", ""),
                "bytes": moved,
                "GBps": moved / med / 1e9,
                "copy_GBps": copy_gbps,
                "frac_of_copy": moved / med / 1e9 / copy_gbps,
                "pass": pass_,
            }
        )
    return rows, comp


def compare_shapes(names_for, *, rows, hidden, dtypes, device, warmup, steps, fns: dict | None = None):
    """compare_shape for every dtype and H (names_for(H): the implementations timed at that width; fns as
    compare_shape takes them): (rows, {(dtype, H): Comparison})."""
    out, comps = [], {}
    for dtype in dtypes:
        for H in hidden:
            r, comps[(str(dtype).replace("torch.", ""), H)] = compare_shape(
                names_for(H), rows, H, dtype, device, warmup, steps, fns
            )
            out += r
    return out, comps


def check_forward_le_both(comps) -> float:
    """Assert forward <= forward+backward for every implementation and shape, on the paired ratios of one
    interleaved loop (forward and forward+backward alternate, so load hits both alike): it fails when forward is
    measurably slower (the ratio's 95% interval above 1, from at least timing.MIN_PAIRS pairs), not when a median
    inside the noise lands above 1, nor on fewer pairs (3 ratios all above 1 happen by chance 1 time in 8).
    Returns the largest lower bound of forward / forward+backward seen (nan when nothing was timed)."""
    largest = float("nan")
    for key, comp in comps.items():
        for impl in {label.split("|")[0] for label in comp.samples}:
            r = paired_ratio(comp.samples[f"{impl}|fwd"], comp.samples[f"{impl}|fwd+bwd"])
            assert not (r.enough and r.low > 1.0), (
                f"{key} {impl}: forward takes {r} of forward+backward, measurably more"
            )
            largest = r.low if not largest >= r.low else largest
    return largest


def ratio_lines(comps, names, baseline: str = "layernorm", dtype: str = "float32") -> str:
    """Per pass and H: each of `names` against `baseline`, paired per round, named only outside the noise."""
    lines = []
    for (dt, H), comp in comps.items():
        for pass_ in PASSES.values():
            if dt == dtype:
                lines += [
                    f"{pass_:>7}, H={H}: "
                    + "; ".join(verdict(n, baseline, comp.ratio(f"{n}|{pass_}", f"{baseline}|{pass_}")) for n in names)
                ]
    return "\n".join(lines)


def ratio_rows(comps: dict, keys: tuple[str, ...], passes=PASS_NAMES, **extra) -> list[dict]:
    """Every pair of implementations per Comparison ("impl|pass" labels) and pass (of `passes`, where timed), paired
    per round: the rows the answers page reads (keys name the parts of each comps key, e.g. ("dtype", "H"))."""
    rows = []
    for key, comp in comps.items():
        ids = dict(zip(keys, key if isinstance(key, tuple) else (key,), strict=True))
        for pass_ in passes:
            samples = {label.split("|")[0]: s for label, s in comp.samples.items() if label.endswith(f"|{pass_}")}
            rows += pairwise_ratios(samples, **extra, **ids, **{"pass": pass_}) if samples else []
    return rows


def fastest_lines(rows, comps) -> str:
    """Per (dtype, pass, H): the implementation with the lowest median, named fastest only when measurably faster
    than the runner-up in the same interleaved loop; else the two are within the noise."""
    df, lines = pd.DataFrame(rows), []
    for (dt, pass_, H), part in df.groupby(["dtype", "pass", "H"], sort=False):
        first, second = part.sort_values("median_s").iloc[:2].itertuples()
        r = comps[(dt, H)].ratio(f"{first.impl}|{pass_}", f"{second.impl}|{pass_}")
        head = (
            f"fastest is {first.impl} ({r.median:.2f}x {second.impl}'s time, {r})"
            if r.differs
            else f"no measurable fastest: {verdict(first.impl, second.impl, r)}"
        )
        lines.append(
            f"{dt:>8} {pass_:>7} H={H:<5}: {head}; {first.impl} at {first.median_s * 1e3:.3f} ms, "
            f"{first.GBps:.0f} GB/s = {first.frac_of_copy:.0%} of copy"
        )
    return "\n".join(lines)
