"""Every notebook's gpu profile run without a GPU: the experiment functions at the gpu sizes, contexts and batches,
with every tensor on the meta device (shapes and bytes, no data, no arithmetic), so a shape error surfaces here and
the peak of each run's largest step is measured (helpers.memory.track) and set against an 80 GB card and against
gpu_plans' closed-form estimate. tests/test_dry_run.py runs it in `make test`.

    table = dry_run()              # one row per run: tracked peak, per GPU with gpu_plans' margins, plan, fits
    check(table)                   # ValueError naming every run that would not fit the card

What a meta run cannot see, and what covers it instead: index values (a token or position id past an embedding's
rows is a device-side assert on a GPU): IndexBounds keeps the bound of ids made by arange/randint and checks it at
every embedding lookup; collectives (meta tensors cannot be sent): the multi-rank notebooks' runs are one rank's
share of the batch (04, 05; their copies per rank are gpu_plans' arithmetic; 03, each rank's message buffers);
autocast (no meta autocast): fp32 only, the larger peak of 01's; Triton kernels and torch.compile (no meta
launches): the PyTorch implementations, whose tensors bound the kernels'.
"""

from __future__ import annotations

import contextlib
import functools
import weakref

import pandas as pd
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from helpers import launch as L
from helpers import memory as M
from helpers.attention import naive_attention
from helpers.experiments import attention as XA
from helpers.experiments import benchmarking as XB
from helpers.experiments import collectives as XC
from helpers.experiments import ddp as XD
from helpers.experiments import fsdp as XF
from helpers.experiments import gpu_plans as G
from helpers.experiments import rmsnorm as XR
from helpers.experiments import sharding as XS
from helpers.experiments.common import make_batches, train_step
from helpers.model import build_model, lm_loss, random_batch, sizes_for
from helpers.rmsnorm import RMSNormPyTorchFunction

META = torch.device("meta")
aten = torch.ops.aten
_ARANGE = {aten.arange.default: 0, aten.arange.start: 1, aten.arange.start_step: 1}  # op -> position of `end`
_RANDINT = {aten.randint.default: 0, aten.randint.generator: 0, aten.randint.low: 1, aten.randint.low_generator: 1}


class IndexBounds(TorchDispatchMode):
    """Index checks a meta tensor cannot make: ids made by arange or randint keep their bound (every value < bound,
    through copies and views), and an embedding lookup whose bound exceeds its rows raises, as a GPU's device-side
    assert would (then the CUDA context is lost)."""

    def __init__(self):
        super().__init__()
        self.bounds = {}  # storage key -> bound

    def _set(self, t: torch.Tensor, bound: int) -> None:
        key = M.storage_key(t)
        self.bounds[key] = bound
        weakref.finalize(t.untyped_storage(), self.bounds.pop, key, None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (aten.embedding.default, aten.index_select.default):
            weight, ids = (args[0], args[1]) if func is aten.embedding.default else (args[0], args[2])
            bound = self.bounds.get(M.storage_key(ids))
            if bound is not None and bound > weight.shape[0]:
                raise IndexError(
                    f"dry run: ids up to {bound - 1} index an embedding of {weight.shape[0]} rows "
                    f"(ids {tuple(ids.shape)}); on a GPU: a device-side assert"
                )
        out = func(*args, **kwargs)
        bound = None
        if func in _ARANGE:
            bound = int(args[_ARANGE[func]])
        elif func in _RANDINT:
            bound = int(args[_RANDINT[func]])
        elif func is aten._to_copy.default and isinstance(args[0], torch.Tensor):
            bound = self.bounds.get(M.storage_key(args[0]))
        if bound is not None and isinstance(out, torch.Tensor):
            self._set(out, bound)
        return out


@contextlib.contextmanager
def on_meta():
    """Experiment functions inside run as on a GPU rank with every tensor on the meta device: helpers.launch.device()
    is meta, factories default to it, the memory tracker counts meta bytes, ids are bound-checked."""
    with L.using_device(META), META, M.counting_meta(), IndexBounds():
        yield


def _row(
    notebook: str,
    run: str,
    peak_bytes: float,
    plan_bytes: float | None = None,
    ranks_per_gpu: int = 1,
    gpu_bytes: float = G.H100_BYTES,
) -> dict:
    per_gpu = G.peak_per_gpu(peak_bytes, ranks_per_gpu)
    return {
        "notebook": notebook,
        "run": run,
        "peak_GB": peak_bytes / G.GB,
        "ranks_per_gpu": ranks_per_gpu,
        "per_gpu_GB": per_gpu / G.GB,
        "plan_GB": None if plan_bytes is None else plan_bytes / G.GB,
        "budget_GB": gpu_bytes / G.GB,
        "fits": per_gpu <= gpu_bytes,
    }


def _fwd_bwd_peak(fn, *inputs) -> int:
    """Tracked peak bytes of fn(*inputs).sum().backward() above the inputs."""
    trace = M.track(lambda: fn(*inputs).sum().backward(), existing=inputs)
    return trace.peak_bytes - trace.baseline_bytes


def run_00(batch_size: int = 4) -> list[dict]:
    """Notebook 00: the warm-up demo, the gpu profile's first size's forward on a batch of 4 at its own context."""
    size = sizes_for("gpu")[0]
    lm = build_model(size, device=META)
    inputs, _ = random_batch(lm.cfg, batch_size=batch_size, device=META)
    with torch.no_grad():
        trace = M.track(lambda: lm(inputs), existing=[inputs])
    return [_row("00", f"warm-up demo {size} forward, batch {batch_size}", trace.peak_bytes - trace.baseline_bytes)]


def run_01(c=None, sizes=None) -> list[dict]:
    """Notebook 01 §5: the full AdamW step's peak (benchmarking.step_peaks, fp32) of the size with the largest
    planned peak (default; the others are the same code at smaller shapes, and the plan's arithmetic equals the
    tracker's bytes for small to xl), or of `sizes`."""
    c = c or XB.PROFILES["gpu"]
    B, T = c["batch"], c["context"]
    sizes = sizes or [max(sizes_for("gpu"), key=lambda s: G.step_peak_bytes(s, B, T))]
    return [
        _row(
            "01",
            f"memory peaks {size}, fp32 step",
            XB.step_peaks(size, B, T, None, META)["full step"].peak_bytes,
            G.step_peak_bytes(size, B, T),
        )
        for size in sizes
    ]


def run_02(c=None) -> list[dict]:
    """Notebook 02: the PyTorch RMSNorm fwd+bwd on (rows, H) per width; the largest model's fwd+bwd at its batch."""
    c = c or XR.PROFILES["gpu"]
    rows = []
    for H in c["hidden"]:
        x = torch.empty(c["rows"], H, requires_grad=True)  # (rows, H)
        g = torch.empty(H, requires_grad=True)
        rows.append(
            _row(
                "02",
                f"norm {c['rows']} x {H} fwd+bwd",
                _fwd_bwd_peak(RMSNormPyTorchFunction.apply, x, g),
                G.norm_peak_bytes(c["rows"], H),
            )
        )
    size = c["compile_model_sizes"][-1]
    lm = build_model(size)
    x, y = make_batches(size, 1, c["batch"], lm.cfg.context_length, 0)[0]
    trace = M.track(lambda: lm_loss(lm(x.to(META)), y.to(META)).backward(), existing=list(lm.parameters()))
    rows.append(
        _row(
            "02",
            f"model {size} fwd+bwd, batch {c['batch']}",
            trace.peak_bytes,
            G.retained_graph_bytes(size, c["batch"], lm.cfg.context_length),
        )
    )
    return rows


def run_03(c=None, gpus: int = 1) -> list[dict]:
    """Notebook 03: one rank's message buffers (source, output, expected, the work copy timed) for every op at the
    largest message, per CUDA backend and world size; gloo puts every rank on the `gpus` GPUs, NCCL one per rank."""
    c = c or XC.PROFILE_GRID["gpu"]
    size, rows = max(c["sizes"]), []
    for backend, device in c["combos"]:
        for n in c["world_sizes"] if device == "cuda" else ():
            peak, numel = 0, max(n, size // 4 // n * n)  # as bench_worker: float32, n equal chunks
            for op in XC.OPS:
                trace = M.track(
                    lambda op=op, numel=numel, n=n: [
                        t.clone() if i == 0 else t
                        for i, t in enumerate(XC._buffers(op, numel, 0, n, META))  # the work copy of the source
                        if t is not None
                    ]
                )
                peak = max(peak, trace.peak_bytes)
            rows.append(
                _row(
                    "03",
                    f"{backend}+cuda, {n} ranks, {XC.format_size(size)} messages",
                    peak,
                    G.collective_bytes(size),
                    1 if backend == "nccl" else -(-n // gpus),
                )
            )
    return rows


def run_04(c=None, world: int = 2) -> list[dict]:
    """Notebook 04: one rank's share of a training step per speed size (the wrappers' copies: gpu_plans)."""
    c = c or XD.PROFILES["gpu"]
    rows = []
    for size in c["sizes"]:
        lm = build_model(size)
        opt = torch.optim.SGD(lm.parameters(), lr=0.1)
        x, y = make_batches(size, 1, c["batch"] // world, c["context"], 0)[0]
        trace = M.track(
            lambda lm=lm, opt=opt, x=x, y=y: train_step(lm, opt, x.to(META), y.to(META)), existing=list(lm.parameters())
        )
        rows.append(_row("04", f"{size} step on a rank's {c['batch'] // world} rows", trace.peak_bytes))
    return rows


def run_05(c=None, world: int = 2) -> list[dict]:
    """Notebook 05 §2: the unsharded AdamW step of each memory model on a rank's share (the largest kind), two
    ranks on one GPU."""
    c = c or XS.PROFILES["gpu"]
    rows = []
    for size in c["memory_models"]:
        lm = build_model(size)
        opt = torch.optim.AdamW(lm.parameters())
        x, y = (t.to(META) for t in make_batches(size, 1, c["batch"] // world, c["context"], 0)[0])
        train_step(lm, opt, x, y)  # AdamW's state
        trace = M.track(functools.partial(train_step, lm, opt, x, y), existing=M.model_state(lm, opt, x, y))
        plan = G.kind_peak_bytes("unsharded", size, c["batch"] // world, c["context"], world)
        rows.append(_row("05", f"memory {size}, unsharded step", trace.peak_bytes, plan, ranks_per_gpu=world))
    return rows


def run_06(c=None) -> list[dict]:
    """Notebook 06: naive attention's fwd+bwd at the memory section's longest sequence and at the benchmark's
    largest shape (the T x T matrices are what runs out)."""
    c = c or XA.PROFILES["gpu"]
    B, H, d = c["memory_shape"]
    shapes = [(B, H, max(c["memory_seq_lens"]), d), max(c["bench_shapes"], key=lambda s: s[2] * s[0] * s[1])]
    rows = []
    for shape in shapes:
        q, k, v = (torch.empty(shape, requires_grad=True) for _ in range(3))  # (B, H, T, d)
        peak = _fwd_bwd_peak(lambda q, k, v: naive_attention(q, k, v, is_causal=True), q, k, v)
        rows.append(_row("06", f"naive attention fwd+bwd {shape}", peak))
    return rows


def run_07(c=None) -> list[dict]:
    """Notebook 07 §5: the checkpoint sweep's model at its context, without checkpointing (its largest step)."""
    c = c or XF.PROFILES["gpu"]
    sweep = XF.checkpoint_sweep(
        c["ckpt_model"],
        n_layers=c["ckpt_layers"],
        batch_size=c["ckpt_batch"],
        context_length=c["ckpt_context"],
        segments=[0],
        steps=1,
        warmup=0,
    )
    peak = sweep.loc[0, "peak_MiB"] * M.MiB
    return [_row("07", f"checkpoint sweep {c['ckpt_model']}, context {c['ckpt_context']}, no checkpointing", peak)]


RUNS = {"00": run_00, "01": run_01, "02": run_02, "03": run_03, "04": run_04, "05": run_05, "06": run_06, "07": run_07}


def dry_run(notebooks=None) -> pd.DataFrame:
    """RUNS (all, or those of `notebooks`) on the meta device: one row per run with its tracked peak, the bytes per
    GPU with gpu_plans' margins, the plan's own estimate where it has one, and whether it fits an 80 GB card."""
    rows = []
    with on_meta():
        for nb in notebooks or RUNS:
            rows += RUNS[nb]()
    return pd.DataFrame(rows)


def check(table: pd.DataFrame) -> pd.DataFrame:
    """`table`, or a ValueError naming each run that would not fit the card."""
    over = table[~table["fits"]]
    if len(over):
        raise ValueError(
            "dry run: would run out of memory on the card:\n"
            + "\n".join(
                f"  notebook {r.notebook}: {r.run} needs about {r.per_gpu_GB:.1f} GB per GPU of {r.budget_GB:.0f}"
                for r in over.itertuples()
            )
        )
    return table
