"""Where a training step's time goes: profiler tables, op classes, stacks -> flame graph, counted FLOPs.

    prof = run_profiler(lambda: train_step(lm, opt, x, y), steps=2, model=lm)   # any step function
    op_table(prof, steps=2)                # top ops by self device time (CPU time on CPU), share, calls/step
    class_shares(prof)                     # matmul vs elementwise/other
    stacks = module_stacks(prof)           # [(("TransformerLM", "blocks.0", "attn", "aten::mm"), µs), ...]
    plot_flame(stacks); module_share(stacks, "RMSNormTorch")
    write_collapsed(stacks, "data/local/step.collapsed")   # for speedscope / flamegraph.pl; parse_collapsed reads it
    counted_flops(fn)                      # what FlopCounterMode counts (the closed forms are in helpers.formulas)

Stacks come from the profiler's op tree, with each module's forward wrapped in a
`record_function` labelled by its name and class; backward ops are attributed to
the module whose forward op created them (the profiler's sequence numbers link the two).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import torch
import torch.nn as nn
from torch.profiler import ProfilerActivity, profile, record_function

from helpers.timing import sync

MATMUL_OPS = {
    "aten::mm",
    "aten::bmm",
    "aten::addmm",
    "aten::baddbmm",
    "aten::matmul",
    "aten::linear",
    "aten::_scaled_mm",
    "aten::addbmm",
}
MATMUL_KERNEL_HINTS = ("gemm", "xmma", "cutlass", "cublas", "matmul", "wgmma")


# --- running the profiler ------------------------------------------------------------------------


@contextlib.contextmanager
def label_modules(model: nn.Module, nvtx: bool | None = None):
    """Wrap every submodule's forward in record_function("name (Class)") so the profiler sees modules; with nvtx
    (default: where CUDA is available) also in an NVTX range of that name, which `nsys profile --trace=cuda,nvtx`
    shows above the kernels."""
    handles, open_ranges = [], {}
    nvtx = torch.cuda.is_available() if nvtx is None else nvtx

    def enter(mod, _inputs, name):
        label = f"{name or 'model'} ({type(mod).__name__})"
        rf = record_function(label)
        rf.__enter__()
        open_ranges.setdefault(id(mod), []).append(rf)
        if nvtx:
            torch.cuda.nvtx.range_push(label)

    def leave(mod, _inputs, _output):
        open_ranges[id(mod)].pop().__exit__(None, None, None)
        if nvtx:
            torch.cuda.nvtx.range_pop()

    for name, mod in model.named_modules():
        handles.append(mod.register_forward_pre_hook(lambda m, i, n=name: enter(m, i, n)))
        handles.append(mod.register_forward_hook(leave))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def run_profiler(fn, steps: int = 2, warmup: int = 1, model: nn.Module | None = None, device=None):
    """Profile `steps` calls of fn() after `warmup` untimed calls; CUDA activity too when on a GPU."""
    dev = torch.device(device) if device is not None else torch.device("cpu")
    for _ in range(warmup):
        fn()
    sync(dev)
    labels = label_modules(model) if model is not None else contextlib.nullcontext()
    with labels, quiet_profiler(dev) as prof:
        for _ in range(steps):
            fn()
        sync(dev)
    prof.device_type = dev.type
    return prof


@contextlib.contextmanager
def quiet_profiler(device: torch.device, **kwargs):
    """torch.profiler.profile (CPU, plus CUDA on a GPU), without the lines Kineto's C++ prints to stderr as the
    profiler starts and stops ("USDT: ... profiler_start"); errors inside the profiled code still show."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    prof = profile(activities=activities, **kwargs)
    with _native_stderr_silenced():
        prof.start()
    try:
        yield prof
    finally:
        with _native_stderr_silenced():
            prof.stop()


@contextlib.contextmanager
def _native_stderr_silenced():
    """Point file descriptor 2 at /dev/null (C++ writes there directly), then restore it."""
    import os
    import sys

    sys.stderr.flush()
    saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def _is_label(name: str) -> bool:
    """True for record_function ranges (module labels, ProfilerStep) and autograd wrappers, not ops."""
    return name.endswith(")") and " (" in name or name.startswith(("ProfilerStep", "autograd::", "Optimizer."))


def is_host_event(e) -> bool:
    """The host's own event (an op, or a record_function range as the host saw it), not a device-side one: on CUDA the
    profiler also adds a device copy of every labelled range that launched kernels (gpu_user_annotation, PyTorch
    #130730), spanning those kernels, under the same name."""
    return e.device_type == torch.autograd.DeviceType.CPU


DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation")  # a Chrome trace's GPU-side events


def trace_ranges(path, keep) -> list[SimpleNamespace]:
    """The complete events of a Chrome trace (prof.export_chrome_trace's, written by the profiler's C++) whose name
    `keep` accepts, shaped like prof.events()'s for what is_host_event and step_spans read: name, device_type and
    time_range (µs). Reading the file beats prof.events(), which builds a Python object per op (0.5-1.6 s for two
    steps of notebook 04's large/cpu on one core, against 0.03 s to write the trace)."""
    import json

    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU
    return [
        SimpleNamespace(
            name=e["name"],
            device_type=cuda if e.get("cat") in DEVICE_CATEGORIES else cpu,
            time_range=SimpleNamespace(start=e["ts"], end=e["ts"] + e.get("dur", 0)),
        )
        for e in json.loads(Path(path).read_text())["traceEvents"]
        if e.get("ph") == "X" and keep(e.get("name", ""))
    ]


def _is_annotation(e, host_names: set) -> bool:
    """A device-side copy of a labelled range (is_user_annotation; on a torch without the flag, a device event named
    like a host event: kernel names never are)."""
    flag = getattr(e, "is_user_annotation", None)
    return bool(flag) if flag is not None else e.key in host_names


def _leaf_times(prof) -> list[tuple[str, float, int]]:
    """(name, self time µs, count) per op/kernel: device kernels on CUDA (not the device copies of labelled ranges,
    whose 'self' time is their whole span), CPU ops on CPU."""
    rows, averages = [], list(prof.key_averages())
    host_names = {e.key for e in averages if is_host_event(e)}
    for e in averages:
        if getattr(prof, "device_type", "cpu") == "cuda":
            t = getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
            if e.device_type == torch.autograd.DeviceType.CUDA and t > 0 and not _is_annotation(e, host_names):
                rows.append((e.key, t, e.count))
        elif not _is_label(e.key) and e.self_cpu_time_total > 0:
            rows.append((e.key, e.self_cpu_time_total, e.count))
    return rows


def _launched_by(prof) -> tuple[list[tuple[str, float]], dict[str, str]]:
    """On CUDA: (aten op, device µs of the kernels it launched) per op event, and kernel name -> the class of the op
    that launched it. The profiler ties each kernel to its launching op by correlation id, so a GEMM counts as a
    matmul whatever cuBLAS calls its kernel (sm_90's nvjet_*, cutlass_*, ...)."""
    ops, kernels = [], {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CPU or _is_label(e.name):
            continue
        t = getattr(e, "self_device_time_total", 0)
        if t > 0:
            ops.append((e.name, t))
        for k in getattr(e, "kernels", []):
            kernels.setdefault(k.name, op_class(e.name))
    return ops, kernels


def op_table(prof, steps: int, top: int = 10) -> pd.DataFrame:
    """Top ops (kernels on CUDA) by self time: ms per step, share of the total, calls per step, class (on CUDA the
    class of the aten op that launched the kernel)."""
    rows = _leaf_times(prof)
    total = sum(t for _, t, _ in rows)
    launched = _launched_by(prof)[1] if getattr(prof, "device_type", "cpu") == "cuda" else {}
    df = pd.DataFrame(
        [
            {
                "op": n,
                "ms/step": t / 1e3 / steps,
                "share": t / total,
                "calls/step": c / steps,
                "class": launched.get(n) or op_class(n),
            }
            for n, t, c in rows
        ]
    )
    return df.sort_values("ms/step", ascending=False).head(top).reset_index(drop=True)


def op_class(name: str) -> str:
    """'matmul' for matrix multiplies (aten ops or GEMM kernels), else 'elementwise/other'."""
    low = name.lower()
    if name in MATMUL_OPS or (not name.startswith("aten::") and any(h in low for h in MATMUL_KERNEL_HINTS)):
        return "matmul"
    return "elementwise/other"


def class_shares(prof) -> dict[str, float]:
    """Share of self time per op class; sums to 1. On CUDA: each aten op's kernels' device time, by that op."""
    if getattr(prof, "device_type", "cpu") == "cuda":
        rows = [(n, t, 1) for n, t in _launched_by(prof)[0]]
    else:
        rows = _leaf_times(prof)
    total = sum(t for _, t, _ in rows)
    shares = {"matmul": 0.0, "elementwise/other": 0.0}
    for n, t, _ in rows:
        shares[op_class(n)] += t / total
    return shares


# --- stacks and the flame graph ------------------------------------------------------------------


def module_stacks(prof) -> list[tuple[tuple[str, ...], float]]:
    """(stack of module labels ending in the op, self µs) per op event; backward ops under their forward's module.

    The time is the op's self CPU time on CPU, and the device time of the kernels it launched on CUDA.
    """
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU]
    on_cuda = getattr(prof, "device_type", "cpu") == "cuda"
    self_time = (lambda e: e.self_device_time_total) if on_cuda else (lambda e: e.self_cpu_time_total)

    def chain(e):
        names = []
        while e is not None:
            if not e.name.startswith("ProfilerStep"):
                names.append(e.name)
            e = e.cpu_parent
        return names[::-1]

    forward_of = {}  # sequence_nr -> module labels of the forward op that recorded it
    for e in events:
        if e.sequence_nr >= 0 and not e.name.startswith("autograd::") and e.sequence_nr not in forward_of:
            labels = [n for n in chain(e) if _is_label(n)]
            if labels:
                forward_of[e.sequence_nr] = labels
    out = []
    for e in events:
        if _is_label(e.name) or self_time(e) <= 0:
            continue
        names = chain(e)
        bw = next((p for p in _ancestors(e) if p.name.startswith("autograd::engine::evaluate_function")), None)
        if bw is not None:
            node = bw.name.split(": ")[-1]
            names = ["backward"] + forward_of.get(bw.sequence_nr, []) + [node] + ([e.name] if e.name != node else [])
        elif any(n.startswith("Optimizer.") for n in names):
            names = ["optimizer step", e.name]
        else:
            names = ["forward"] + [n for n in names if _is_label(n)] + [e.name]
        out.append((tuple(names), self_time(e)))
    return out


def _ancestors(e):
    """The profiler event's parents, innermost first."""
    e = e.cpu_parent
    while e is not None:
        yield e
        e = e.cpu_parent


def module_share(stacks, module_class: str) -> float:
    """Share of the stacks' time spent inside modules of class `module_class` (forward and backward)."""
    tag = f"({module_class})"
    total = sum(v for _, v in stacks)
    return sum(v for s, v in stacks if any(f.endswith(tag) for f in s[:-1])) / total


def op_share(stacks, *names: str) -> float:
    """Share of the stacks' time whose innermost frame (op or backward node) is one of `names`."""
    total = sum(v for _, v in stacks)
    return sum(v for s, v in stacks if any(f in names for f in s[-2:])) / total


def parse_collapsed(lines) -> list[tuple[tuple[str, ...], float]]:
    """Read collapsed stacks ("a;b;c 123" per line, as profiler.export_stacks writes) into (stack, value)."""
    out = []
    for line in lines:
        line = line.strip()
        if line:
            frames, value = line.rsplit(" ", 1)
            out.append((tuple(frames.split(";")), float(value)))
    return out


def write_collapsed(stacks, path) -> Path:
    """Save stacks as a collapsed-stacks file ("a;b;c 123" per line), what speedscope and flamegraph.pl read.

    Equal stacks are merged (first appearance kept in order) and values rounded to integers (µs for
    module_stacks), since speedscope reads whole counts; a stack that rounds to 0 is left out.
    parse_collapsed reads the file back.
    """
    merged: dict[tuple[str, ...], float] = {}
    for frames, value in stacks:
        bad = next((f for f in frames if ";" in f or "\n" in f or not f), None)
        if bad is not None:
            raise ValueError(
                f"frame {bad!r} of stack {frames} cannot be written: frames must be non-empty, without ';' or newlines"
            )
        merged[tuple(frames)] = merged.get(tuple(frames), 0.0) + value
    lines = [f"{';'.join(frames)} {round(value)}" for frames, value in merged.items() if round(value) > 0]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def flame_rects(stacks) -> list[dict]:
    """Flame-graph boxes: merge equal prefixes; each box has depth, start, width (same units as values), name."""
    tree: dict = {}
    for frames, value in stacks:
        node = tree
        for f in frames:
            node = node.setdefault(f, {"_v": 0.0, "_kids": {}})
            node["_v"] += value
            node = node["_kids"]
    rects = []

    def walk(children, depth, start):
        for name, node in children.items():
            rects.append({"name": name, "depth": depth, "start": start, "width": node["_v"]})
            walk(node["_kids"], depth + 1, start)
            start += node["_v"]

    walk(tree, 0, 0.0)
    return rects


def plot_flame(stacks, ax=None, title: str = "", min_label_share: float = 0.03, fontsize: float = 7):
    """Draw a flame graph (root at the bottom) with matplotlib (notebook 01); boxes wider than `min_label_share`
    are labelled, whole where the name fits, else shortened (flame_label) and numbered in a key of full names."""
    import matplotlib.pyplot as plt

    rects = flame_rects(stacks)
    total = sum(r["width"] for r in rects if r["depth"] == 0) or 1.0
    depth = max(r["depth"] for r in rects)
    own_figure = ax is None
    if own_figure:
        _, ax = plt.subplots(figsize=(12, 0.35 * (1 + depth) + 1))
    box_pt = ax.get_position().width * ax.figure.get_figwidth() * 72  # points per unit share, before any relayout
    cmap, key = plt.get_cmap("YlOrRd"), {}  # key: full name -> (number, colour)
    for r in rects:
        x, w = r["start"] / total, r["width"] / total
        colour = cmap(0.2 + 0.6 * (sum(map(ord, r["name"])) % 97) / 97)
        (box,) = ax.barh(r["depth"], w, left=x, height=0.9, color=colour, edgecolor="white", linewidth=0.3)
        if w < min_label_share:
            continue
        number = key.get(r["name"], (len(key) + 1,))[0]
        label = flame_label(r["name"], w * box_pt - 3, fontsize, number)
        if label is None:
            continue
        if label != r["name"]:
            key.setdefault(r["name"], (number, colour))
        ax.text(x + 1.5 / box_pt, r["depth"], label, va="center", fontsize=fontsize, clip_path=box)
    ax.set(xlim=(0, 1), ylim=(-0.5, depth + 0.5), xlabel="share of profiled time", ylabel="stack depth", title=title)
    if key:
        _flame_key(ax, key, fontsize, grow_figure=own_figure)
    return ax


def flame_label(name: str, room_pt: float, fontsize: float, number: int) -> str | None:
    """The longest label for a flame box that fits `room_pt` points: the name, else a shorter form with " [number]"
    (class dropped, then module path or op namespace, then cut with "…"); None when not even 3 letters fit."""
    if _text_pt(name, fontsize) <= room_pt:
        return name
    suffix = f" [{number}]"
    room_pt -= _text_pt(suffix, fontsize)
    module = name.split(" (")[0]  # "blocks.1.attn (CausalMultiHeadSelfAttention)" -> "blocks.1.attn"
    shorter = [module, module.rsplit(".", 1)[-1].split("::")[-1]]  # "attn"; "aten::mm" -> "mm"
    fits = next((s for s in shorter if _text_pt(s, fontsize) <= room_pt), None)
    if fits is not None:
        return fits + suffix
    cut = shorter[-1]
    while len(cut) > 3 and _text_pt(cut + "…", fontsize) > room_pt:
        cut = cut[:-1]
    return cut + "…" + suffix if _text_pt(cut + "…", fontsize) <= room_pt else None


def _text_pt(text: str, fontsize: float) -> float:
    """Width of `text` in points in matplotlib's default font."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextPath

    return TextPath((0, 0), text, prop=FontProperties(size=fontsize)).get_extents().width


def _flame_key(ax, key: dict, fontsize: float, grow_figure: bool) -> None:
    """The full names of shortened flame labels, numbered and coloured as their boxes, below the graph
    (the figure made taller to hold them when plot_flame made it)."""
    from matplotlib.patches import Patch
    from matplotlib.transforms import ScaledTranslation

    entries = sorted(key.items(), key=lambda item: item[1][0])
    fig = ax.figure
    below = ax.transAxes + ScaledTranslation(0, -0.45, fig.dpi_scale_trans)  # under the x label, whatever the height
    columns = 3 if len(entries) > 8 else 2
    if grow_figure:
        fig.set_figheight(fig.get_figheight() + 0.16 * -(-len(entries) // columns) + 0.2)
    ax.legend(
        [Patch(color=colour) for _, (_, colour) in entries],
        [f"[{number}] {name}" for name, (number, _) in entries],
        loc="upper left",
        bbox_to_anchor=(0, 0),
        bbox_transform=below,
        ncol=columns,
        fontsize=fontsize,
        frameon=False,
        handlelength=1,
        title="shortened labels",
        title_fontsize=fontsize,
        alignment="left",
    )


# --- FLOPs as torch counts them -----------------------------------------------------------------


def counted_flops(fn) -> int:
    """FLOPs torch.utils.flop_counter.FlopCounterMode counts while fn() runs (matmuls and convolutions)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()
