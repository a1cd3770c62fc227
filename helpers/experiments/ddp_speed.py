"""Notebook 04 §2: every wrapper's step timed in one interleaved loop per model size (speed_worker, speed_table), the
all-reduces' intervals recorded for §3, and the sentences comparing wrappers as paired ratios with their intervals.

    raw, speed = speed_table(["small/cpu"], sweep_model="small/cpu", buckets_mb=[1, 25], steps=10, warmup=3,
                             batch_size=8, context_length=64, backend="gloo", device="cpu")
    print(speed_lines(speed, raw, ["small/cpu"]))
"""

from __future__ import annotations

import copy
import functools
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch.distributed as dist
import torch.nn as nn

from helpers import launch as L
from helpers.ddp import MB, _DataParallel, wrap
from helpers.experiments.common import (
    BACKWARD_RANGE,
    make_batches,
    make_model,
    make_optimizer,
    quartiles,
    rank_share,
    slowest_rank,
    train_step,
)
from helpers.model import count_parameters
from helpers.profiling import is_host_event, quiet_profiler, trace_ranges
from helpers.timing import WaitClock, interleaved, paired_ratio, pairwise_ratios, sync, time_call, verdict


@dataclass
class StepIntervals:
    """One step on one rank: the backward's (start, end) and each all-reduce's [start, end] (None: not done)."""

    backward: tuple[float, float]
    comm: list[list]


@dataclass
class SpeedRun:
    """One variant's timed steps on one rank (seconds), with the last steps' intervals and the profiled steps."""

    step: list[float]
    comm: list[float]  # in finish_gradient_synchronization
    backward: list[float]
    timeline: list[StepIntervals]  # perf_counter seconds, launch -> done
    buckets: int | None
    traced: list[StepIntervals] | None = None  # profiler µs (gloo's own all-reduce events)


SPEED_VARIANTS = [
    ("local", None, None),
    ("naive", "naive", None),
    ("flat", "flat", None),
    ("per_parameter", "per_parameter", None),
    ("bucketed 25 MB", "bucketed", 25),
    ("torch_ddp 25 MB", "torch_ddp", 25),
]


def shown_labels(buckets: dict) -> list[str]:
    """The variants §3 shows and traces, from each label's bucket count: naive, per-parameter, the largest swept
    bucket size that still gives more than one bucket, 25 MB, torch DDP (25 MB once when it is that largest size)."""
    several = sorted(
        (float(label.split()[1]), label)
        for label, n in buckets.items()
        if re.fullmatch(r"bucketed [\d.]+ MB", label) and (n or 0) > 1
    )
    return list(
        dict.fromkeys(["naive", "per_parameter", *[v for _, v in several[-1:]], "bucketed 25 MB", "torch_ddp 25 MB"])
    )


def sweep_variants(buckets_mb) -> list[tuple]:
    """The bucket-size sweep: DDPBucketed at every size, and torch DDP at its default 25 MB."""
    return [(f"bucketed {mb:g} MB", "bucketed", mb) for mb in buckets_mb] + [("torch_ddp 25 MB", "torch_ddp", 25)]


def traced_steps(ddp, optimizer, batches, trace_path=None) -> list[StepIntervals]:
    """Train one step per (x, y) under torch.profiler. Per step: the backward interval (its record_function range)
    and each all-reduce's execution interval as gloo's worker threads record it ("gloo:all_reduce"), in µs of the
    host clock. `trace_path`: also save the rank's Chrome trace (open it in Perfetto or chrome://tracing)."""
    with quiet_profiler(L.device()) as prof:
        for x, y in batches:
            train_step(ddp.module, optimizer, x, y, grad_sync=ddp)
        sync(L.device())
    with tempfile.TemporaryDirectory() as scratch:
        path = trace_path or Path(scratch) / "trace.json"
        prof.export_chrome_trace(str(path))
        return step_spans(trace_ranges(path, lambda name: name == BACKWARD_RANGE or name.startswith("gloo:all_reduce")))


def step_spans(events) -> list[StepIntervals]:
    """Per profiled step: the host's backward range (not its device-side copy on CUDA) and gloo's all-reduce spans
    that start inside it or before the next step's backward."""
    host = [e for e in events if is_host_event(e)]
    backward = sorted((e.time_range.start, e.time_range.end) for e in host if e.name == BACKWARD_RANGE)
    comm = sorted((e.time_range.start, e.time_range.end) for e in host if e.name.startswith("gloo:all_reduce"))
    ends = [b0 for b0, _ in backward[1:]] + [float("inf")]
    return [
        StepIntervals((b0, b1), [[a, b] for a, b in comm if b0 <= a < end])
        for (b0, b1), end in zip(backward, ends, strict=True)
    ]


def step_intervals(times: dict, spans: list) -> StepIntervals:
    """One step's backward interval and all-reduce spans in seconds on one clock: perf_counter where the spans are
    host times (gloo); CUDA events where they are events (NCCL: train_step's backward events, seconds from its
    start), since the host returns from backward() long before the GPU ends it."""
    if not any(hasattr(x, "elapsed_time") for span in spans for x in span):
        return StepIntervals(times["backward"], [list(s) for s in spans])
    b0, b1 = times["backward_events"]
    return StepIntervals(
        (0.0, b0.elapsed_time(b1) / 1e3), [[b0.elapsed_time(a) / 1e3, b0.elapsed_time(b) / 1e3] for a, b in spans]
    )


class _Local(_DataParallel):
    """No data parallelism: this rank's compute alone (the speed baseline); no broadcast, no all-reduce."""

    def __init__(self, module):
        nn.Module.__init__(self)
        self.module, self.params, self.clock, self.timeline = module, [], WaitClock(), None

    def finish_gradient_synchronization(self) -> None:
        pass


def speed_worker(
    *,
    model: str,
    variants,
    steps: int,
    warmup: int,
    batch_size: int,
    context_length: int,
    seed: int = 0,
    timeline_steps: int = 3,
    traced: int = 2,
    trace_dir=None,
    trace_shown: bool = False,
) -> dict[str, SpeedRun]:
    """Time one step of every (label, kind, bucket_size_mb), interleaved step by step so drift hits all alike (kind
    None: compute alone). After the timed steps, `traced` profiled ones per wrapper (traces to trace_dir if given);
    trace_shown: only for the wrappers §3 shows (shown_labels), the others' traced stays None."""
    rank, dev = dist.get_rank(), L.device()
    base = make_model(model, seed)
    batches = [rank_share(b) for b in make_batches(model, 4, batch_size, context_length, seed)]
    ddps = {
        label: wrap(kind, copy.deepcopy(base), mb) if kind else _Local(copy.deepcopy(base))
        for label, kind, mb in variants
    }
    opts = {label: make_optimizer(d.parameters(), "sgd") for label, d in ddps.items()}
    timelines = {label: [] for label in ddps}

    host_spans = dist.get_backend() != "nccl"  # gloo's spans are host times, on CUDA tensors too (ddp._host_span)

    def step(label, i):
        ddp, record = ddps[label], i >= warmup + steps - timeline_steps
        ddp.timeline, comm0, times = ([] if record else None), ddp.comm_s, {}
        on_host = record and host_spans and dev.type == "cuda"  # the backward on the host clock as the GPU ran it
        _, seconds = time_call(
            lambda: train_step(
                ddp.module, opts[label], *batches[i % len(batches)], grad_sync=ddp, times=times, device_backward=on_host
            ),
            dev,
        )
        if record:
            timelines[label].append(step_intervals(times, ddp.timeline))
        return seconds, ddp.comm_s - comm0, times["backward"][1] - times["backward"][0]

    samples = interleaved({label: functools.partial(step, label) for label in ddps}, steps, warmup)
    if trace_dir is not None:
        Path(trace_dir).mkdir(parents=True, exist_ok=True)
    counts = {label: len(getattr(ddp, "buckets", [])) or None for label, ddp in ddps.items()}
    to_trace = set(shown_labels(counts) if trace_shown else ddps)
    out = {}
    for label, ddp in ddps.items():
        s = np.asarray(samples[label])  # (steps, 3): step, comm, backward
        out[label] = SpeedRun(
            step=list(s[:, 0]),
            comm=list(s[:, 1]),
            backward=list(s[:, 2]),
            timeline=timelines[label],
            buckets=counts[label],
        )
        if (
            traced and label in to_trace and not isinstance(ddp, _Local)
        ):  # after the timed steps: profiler overhead stays out
            path = None if trace_dir is None else Path(trace_dir) / f"{label.replace(' ', '_')}.rank{rank}.json"
            out[label].traced = traced_steps(ddp, opts[label], [batches[i % len(batches)] for i in range(traced)], path)
    return out


def summarize_speed(per_rank: list[dict[str, SpeedRun]]) -> list[dict]:
    """One row per label: medians over steps of the slowest rank's step, comm and backward times (each step waits
    for its slowest rank), and the step time's quartiles."""
    rows = []
    for label, first in per_rank[0].items():
        med = {
            k: float(np.median(slowest_rank([getattr(r[label], k) for r in per_rank])))
            for k in ("step", "comm", "backward")
        }
        p25, _, p75 = quartiles(slowest_rank([r[label].step for r in per_rank]))
        rows.append(
            {
                "variant": label,
                "step_s": med["step"],
                "step_p25_s": p25,
                "step_p75_s": p75,
                "comm_s": med["comm"],
                "backward_s": med["backward"],
                "buckets": first.buckets,
                "steps": len(first.step),
            }
        )
    return rows


def speed_table(
    sizes,
    *,
    sweep_model: str,
    buckets_mb,
    steps: int,
    warmup: int,
    batch_size: int,
    context_length: int,
    backend: str,
    device: str,
    trace_dir=None,
) -> tuple[dict, pd.DataFrame]:
    """One speed_worker launch per model size (the sweep model also runs the bucket sweep and 2 profiled steps of
    each variant §3 shows):
    the per-rank SpeedRuns by model, and one row per (model, variant); torch DDP's comm is not observable (NaN)."""
    from tqdm.auto import tqdm

    raw, rows = {}, []
    for name in tqdm(sizes, desc="launches (one per model size)"):
        variants = SPEED_VARIANTS + (
            [v for v in sweep_variants(buckets_mb) if v not in SPEED_VARIANTS] if name == sweep_model else []
        )
        worker = functools.partial(
            speed_worker,
            model=name,
            variants=variants,
            steps=steps,
            warmup=warmup,
            batch_size=batch_size,
            context_length=context_length,
            traced=2 if name == sweep_model else 0,
            trace_dir=None if trace_dir is None else str(Path(trace_dir) / name.replace("/", "_")),
            trace_shown=True,  # §3 reads the shown variants' traces only; profiling the rest took 17 s of 60 on a core
        )
        raw[name] = L.launch(worker, 2, backend=backend, device=device)
        rows += [{"model": name, "grad_MB": count_parameters(name) * 4 / MB, **r} for r in summarize_speed(raw[name])]
    speed = pd.DataFrame(rows)
    speed.loc[speed["variant"].str.startswith("torch_ddp"), "comm_s"] = np.nan
    return raw, speed


def speed_pivot(speed: pd.DataFrame) -> pd.DataFrame:
    """§2's table: ms per step and in finish for SPEED_VARIANTS (rows) by model (columns)."""
    rows = speed[speed["variant"].isin([v[0] for v in SPEED_VARIANTS])]
    return rows.pivot_table(index="variant", columns="model", values=["step_s", "comm_s"], sort=False) * 1e3


def paired_variants(per_rank: list[dict[str, SpeedRun]], a: str, b: str, field: str = "step"):
    """a's time over b's (field: step, comm or backward), paired step by step: the slowest rank's seconds of the same
    interleaved round (speed_worker times every variant once per round)."""
    per = lambda label: slowest_rank([getattr(r[label], field) for r in per_rank])  # noqa: E731
    return paired_ratio(per(a), per(b))


def ratio_rows(raw: dict) -> list[dict]:
    """Per model, every pair of variants' step and backward times, and naive vs flat's communication time (all of it
    after backward, never zero), paired per step: 04_ddp_ratios, read by the answers page."""
    rows = []
    for name, per_rank in raw.items():
        for timed in ("step", "backward", "comm"):
            labels = ["naive", "flat"] if timed == "comm" else list(per_rank[0])
            samples = {v: slowest_rank([getattr(r[v], timed) for r in per_rank]) for v in labels}
            rows += pairwise_ratios(samples, model=name, field=timed)
    return rows


def fastest_text(per_rank, labels, field: str = "step") -> str:
    """The fastest of `labels` by median, named only when it is measurably faster than the runner-up."""
    med = {k: float(np.median(slowest_rank([getattr(r[k], field) for r in per_rank]))) for k in labels}
    first, second = sorted(med, key=med.get)[:2]
    r = paired_variants(per_rank, first, second, field)
    if r.differs:
        return f"fastest {first} ({first} takes {r.median:.2f}x {second}'s time, {r})"
    return f"no measurable fastest: {verdict(first, second, r)}"


def speed_lines(speed: pd.DataFrame, raw: dict, sizes) -> str:
    """Per model: naive's share communicating, flat vs naive, the fastest wrapper, ours vs torch DDP at 25 MB, each
    ratio paired per step with its 95% interval (notebook 04 §2)."""
    lines = []
    for name in sizes:
        s, runs = speed[speed["model"] == name].set_index("variant"), raw[name]
        naive = s.loc["naive", "step_s"]
        wrappers = [v for v in s.index if v != "local"]
        ours_vs_torch = paired_variants(runs, "bucketed 25 MB", "torch_ddp 25 MB")
        lines.append(
            f"{name} ({s['grad_MB'].iloc[0]:.1f} MB of gradients): naive {naive * 1e3:.1f} ms/step, of which "
            f"{s.loc['naive', 'comm_s'] / naive:.0%} communicating; flat vs naive: "
            f"{verdict('flat', 'naive', paired_variants(runs, 'flat', 'naive'))}; "
            f"{fastest_text(runs, wrappers)}; ours vs torch DDP at 25 MB: "
            f"{verdict('bucketed 25 MB', 'torch_ddp 25 MB', ours_vs_torch)}"
        )
    return "\n".join(lines)


def backward_lines(speed: pd.DataFrame, raw: dict, sizes) -> str:
    """Per model: backward's median alone and under naive, per-parameter and bucketed 25 MB; the overlapped variants'
    backward against compute alone paired per step (notebook 04 §3)."""
    b = speed.pivot_table(index="variant", columns="model", values="backward_s", sort=False)
    lines = []
    for name in sizes:
        r = paired_variants(raw[name], "per_parameter", "local", "backward")
        lines.append(
            f"{name}: backward {b.loc['local', name] * 1e3:.1f} ms alone, {b.loc['naive', name] * 1e3:.1f} ms "
            f"under naive, {b.loc['per_parameter', name] * 1e3:.1f} ms under per-parameter, "
            f"{b.loc['bucketed 25 MB', name] * 1e3:.1f} ms under bucketed 25 MB; "
            f"{verdict('per-parameter', 'compute alone', r, 'backward time')}"
        )
    return "\n".join(lines)
