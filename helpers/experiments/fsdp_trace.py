"""Notebook 07 §3's trace: did each prefetched all-gather end before its module needed it? One FSDP step under the
profiler (traced_forward), each forward all-gather matched to its module's labelled range, on the host (gloo) or
on the GPU (NCCL's kernels), and the table of what arrived in time (gather_timeliness)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
import torch.distributed as dist

from helpers import launch as L
from helpers.experiments.fsdp_common import step
from helpers.fsdp import FSDP
from helpers.profiling import is_host_event, label_modules, quiet_profiler
from helpers.timing import sync


@dataclass
class Traced:
    """One traced FSDP step's forward on one rank (profiler µs): per sharded module call, its gathers' end, the
    previous module's forward end (when a prefetched gather should be done), its own start."""

    rows: list  # [{"module", "gather_end", "needed_at", "start"}]
    forward_us: float


def traced_forward(fsdp: FSDP, opt, x, y) -> Traced:
    """Profile one step (after a first one recorded the call order); match each forward all-gather, in issue order,
    to its module's labelled forward range: gloo's own host event against the range (host time); under NCCL the
    all-gather kernel against the kernels the range's ops launched (device time: the host runs ahead of the GPU)."""
    with label_modules(fsdp.module), quiet_profiler(L.device()) as prof:
        step(fsdp.module, fsdp, opt, x, y)
        sync(L.device())
    events = sorted(prof.events(), key=lambda e: e.time_range.start)
    names = {m: n for n, m in fsdp.module.named_modules()}
    ranges = forward_ranges(events, {names[m] for m in fsdp.call_order}, len(fsdp.call_order))
    spans = (
        [(r.time_range.start, r.time_range.end) for r in ranges]
        if dist.get_backend() != "nccl"
        else [kernel_span(events, r) for r in ranges]
    )
    return gather_rows(
        [names[m] for m in fsdp.call_order][: len(ranges)],
        [len(fsdp.units[m]) for m in fsdp.call_order],
        spans,
        [e.time_range.end for e in events if is_gather(e)],
    )


def forward_ranges(events, modules: set, calls: int) -> list:
    """The first `calls` labelled module ranges ("name (Class)") of `modules` as the host saw them, in time order: the
    forward calls. Device-side copies of the ranges (CUDA) are left out: they start later and would take a slot."""
    labelled = [e for e in events if is_host_event(e) and " (" in e.name and e.name.split(" (")[0] in modules]
    return labelled[:calls]


def is_gather(e) -> bool:
    """An all-gather's own event: gloo's host event, or NCCL's kernel on the GPU (ncclDevKernel_AllGather_...)."""
    device = e.device_type == torch.autograd.DeviceType.CUDA
    return (e.name.startswith("gloo:") and "gather" in e.name) or (
        device and "allgather" in e.name.lower() and "nccl" in e.name.lower()
    )


def kernel_span(events, r) -> tuple[float, float]:
    """(first start, last end) on the GPU of the kernels launched by the ops inside the host range `r`, NCCL's
    aside (the profiler links each kernel to its op: linked_correlation_id); r's own times when it launched none."""
    cpu = torch.autograd.DeviceType.CPU
    ops = {
        e.id
        for e in events
        if e.device_type == cpu
        and e.thread == r.thread
        and r.time_range.start <= e.time_range.start
        and e.time_range.end <= r.time_range.end
    }
    kernels = [
        e.time_range
        for e in events
        if e.device_type != cpu and e.linked_correlation_id in ops and "nccl" not in e.name.lower()
    ]
    if not kernels:
        return r.time_range.start, r.time_range.end
    return min(k.start for k in kernels), max(k.end for k in kernels)


def gather_rows(modules: list, gathers_per_call: list, spans: list, gather_ends: list) -> Traced:
    """Traced rows from each call's (start, end) on one clock and the all-gathers' ends in issue order: a call's
    gathers should end by the time the previous call ends (when its prefetch is needed)."""
    rows, g = [], 0
    # strict=False: gathers_per_call has every call, modules and spans only the calls the profiler has a range for
    for i, (name, k, (start, _)) in enumerate(zip(modules, gathers_per_call, spans, strict=False)):
        ends = gather_ends[g : g + k]
        g += k
        rows.append(
            {
                "module": name,
                "gather_end": max(ends) if ends else float("nan"),
                "needed_at": spans[i - 1][1] if i else start,
                "start": start,
            }
        )
    return Traced(rows, spans[-1][1] - spans[0][0] if spans else 0.0)


def gather_timeliness(per_rank: list) -> pd.DataFrame:
    """Per rank and forward module call: did its all-gather end before the previous module's forward ended
    (prefetch in time), and the stall (µs) it caused otherwise."""
    rows = []
    for rank, r in enumerate(per_rank):
        for i, row in enumerate(r.traced.rows):
            stall = max(0.0, row["gather_end"] - row["needed_at"]) if i else row["start"] - row["needed_at"]
            rows.append(
                {
                    "rank": rank,
                    "call": i,
                    "module": row["module"],
                    "prefetched": i > 0,
                    "in_time": i > 0 and row["gather_end"] <= row["needed_at"],
                    "stall_us": stall,
                }
            )
    return pd.DataFrame(rows)
