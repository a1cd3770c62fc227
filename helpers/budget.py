"""A time budget for the cpu profile: measure this machine in about a second, then plan each notebook's runs
(sizes, steps, grid points) to fit, and say what was left out and how to run it.

    cal = calibrate()             # fp32 and bf16 matmul FLOP/s, one all-reduce between two gloo ranks (threads)
    print(cal.bf16_sentence())    # "this CPU multiplies bf16 84x slower than fp32 (...)"
    budget = Budget.resolve(BUDGET, "01", profile, cal)   # BUDGET: "auto" | seconds | "none"; none on gpu
    plan = budget.fit(SIZES, lambda size: 8 * step_s(size), what="mixed precision at")  # longest prefix that fits
    plan = budget.fit(SIZES, cost, what="...", keep_first=True, run=time_one_size)  # runs them, stops if slower
    plan.kept, plan.dropped, plan.results   # what ran here, what the budget left out, run(item) per kept item
    print(plan.note)              # "" when nothing was left out, else what and the command that runs it

A budget is the seconds a notebook's budgeted runs may take (its fixed work, imports and checks, is not counted):
DEFAULT_SECONDS per notebook for BUDGET="auto". Each fit takes its estimate from what is left, so a notebook's first
plans have priority; a fit given `run` runs its items and stops early when the measured pace says the rest would not
fit (a busy machine). The estimates are the experiments' own cost models (FLOPs over the calibrated rate, an
all-reduce per step, rounds); the budget only cuts, never changes a statistic: a comparison that cannot get
timing.MIN_PAIRS pairs is left out ("not timed here (budget)"), not reported from fewer.
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from helpers.env import usable_cores

DEFAULT_SECONDS = {"01": 28.0, "02": 10.0, "04": 14.0, "05": 12.0}  # the notebooks that plan their cpu runs;
# with their fixed work, make writeup took 318 s of the laptop's 300 on a 2-core EPYC with the AVX2 switches at
# 35/15/20/15 once notebook 08 joined (2026-11-27): each gives up a share for it and a margin
NOTEBOOKS = {  # notebook number -> file, for the command a note prints
    "01": "01_benchmarking_and_profiling.ipynb",
    "02": "02_rmsnorm_triton.ipynb",
    "04": "04_ddp.ipynb",
    "05": "05_optimizer_state_sharding.ipynb",
}
MATMUL_N = 256  # calibration matmuls are n x n: big enough for the BLAS kernels, 20 ms where bf16 is slow, so the
# fastest of ~0.25 s of calls finds a quiet moment on a loaded machine (512 gave 13-200 GFLOP/s fp32 under load)
ALLREDUCE_BYTES = 2**20
STEP_OVERHEAD = 2.0  # a CPU fp32 forward+backward takes about twice its matmul FLOPs at the calibrated rate (the
# elementwise ops; issue 26's 2-core runs: small/cpu 18-36 ms against 15 ms of matmul): a planning estimate only
FAST_BF16 = 0.5  # bf16 counts as fast when it multiplies at least half as fast as fp32 (2.4x faster than fp32 on
# the course machine's avx512_bf16, 512x512, measured; 84x slower with ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2)


@dataclass(frozen=True)
class Calibration:
    """This machine's matmul throughput per dtype and one all-reduce's time: what the budget's estimates divide by."""

    fp32_flops: float  # FLOP/s of n x n fp32 matmuls on all of torch's threads (one thread's rate x threads)
    bf16_flops: float  # the same in bf16
    allreduce_s: float  # one all-reduce of allreduce_bytes between two gloo ranks
    allreduce_bytes: int = ALLREDUCE_BYTES
    matmul_n: int = MATMUL_N
    threads: int = 1  # torch's intra-op threads, by which one thread's rate was multiplied
    seconds: float = 0.0  # what calibrating took

    @property
    def bf16_slowdown(self) -> float:
        """How many times longer a bf16 matmul takes than an fp32 one here (below 1: bf16 is faster)."""
        return self.fp32_flops / self.bf16_flops

    @property
    def fast_bf16(self) -> bool:
        return self.bf16_flops >= FAST_BF16 * self.fp32_flops

    def matmul_s(self, flops: float, bf16: bool = False) -> float:
        """Seconds for `flops` of matmul at the calibrated rate."""
        return flops / (self.bf16_flops if bf16 else self.fp32_flops)

    def per_thread(self) -> Calibration:
        """The rates of one thread: what each of several ranks sharing the cores gets (one thread each)."""
        return dataclasses.replace(
            self, fp32_flops=self.fp32_flops / self.threads, bf16_flops=self.bf16_flops / self.threads, threads=1
        )

    def per_rank(self, world: int, cores: int | None = None) -> Calibration:
        """The rates each of `world` launched ranks gets (launch gives each cores // world threads, at least one):
        one thread's, or a share of it where there are more ranks than cores (`cores`: this process's, from its
        affinity). Under make test each worker has one core and 2 ranks took twice per_thread()'s estimate."""
        one = self.per_thread()
        share = min(1.0, (cores or usable_cores()) / world)
        return dataclasses.replace(one, fp32_flops=one.fp32_flops * share, bf16_flops=one.bf16_flops * share)

    def step_s(self, flops: float, bf16: bool = False, fp32_s: float | None = None) -> float:
        """Seconds of a training step (or any model pass) whose matmuls do `flops`: fp32_s when it was measured, else
        the matmul time x STEP_OVERHEAD; under bf16 autocast the matmuls take the bf16 rate, the rest as in fp32."""
        mm = self.matmul_s(flops)
        fp32 = STEP_OVERHEAD * mm if fp32_s is None or math.isnan(fp32_s) else fp32_s
        return max(0.0, fp32 - mm) + self.matmul_s(flops, bf16=True) if bf16 else fp32

    def allreduce_time(self, nbytes: float, calls: int = 1) -> float:
        """Seconds for `calls` all-reduces of `nbytes`, scaled from the calibrated one by bytes (at least its time)."""
        return calls * self.allreduce_s * max(1.0, nbytes / self.allreduce_bytes)

    def bf16_sentence(self) -> str:
        """What the calibration says about bf16 here, in words (the notebooks print it beside mixed precision)."""
        rates = (
            f"fp32 {self.fp32_flops / self.threads / 1e9:.0f} GFLOP/s, bf16 "
            f"{self.bf16_flops / self.threads / 1e9:.1f} GFLOP/s per thread, {self.matmul_n}x{self.matmul_n} "
            "matmuls, calibrated here"
        )
        if self.bf16_slowdown >= 1:
            return (
                f"this CPU multiplies bf16 {self.bf16_slowdown:.0f}x slower than fp32 ({rates})"
                if self.bf16_slowdown >= 2
                else f"this CPU multiplies bf16 about as fast as fp32 ({rates})"
            )
        return f"this CPU multiplies bf16 {1 / self.bf16_slowdown:.1f}x faster than fp32 ({rates})"

    def as_row(self) -> dict:
        return {
            "fp32_GFLOPs": self.fp32_flops / 1e9,
            "bf16_GFLOPs": self.bf16_flops / 1e9,
            "bf16_slowdown": self.bf16_slowdown,
            "allreduce_s": self.allreduce_s,
            "allreduce_bytes": self.allreduce_bytes,
            "calibration_s": self.seconds,
        }

    def __str__(self) -> str:
        return (
            f"calibration ({self.seconds:.1f} s): {self.bf16_sentence()}; all-reduce of "
            f"{self.allreduce_bytes / 2**20:g} MiB between 2 gloo ranks {self.allreduce_s * 1e3:.2f} ms"
        )


def matmul_flops(dtype=torch.float32, n: int = MATMUL_N, min_s: float = 0.25) -> float:
    """FLOP/s of n x n matmuls in `dtype` on the CPU: the fastest of repeated calls (one untimed) over about min_s."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b  # first call: allocation, kernel choice
    best, start = math.inf, time.perf_counter()
    while True:
        t = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t)
        if time.perf_counter() - start >= min_s:
            break
    return 2 * n**3 / best


def allreduce_seconds(nbytes: int = ALLREDUCE_BYTES, calls: int = 5) -> float:
    """Median time of one all-reduce of `nbytes` fp32 between two gloo ranks, run as two threads of this process."""
    store, times, errors = dist.HashStore(), {}, []

    def rank(r):
        try:
            group = dist.ProcessGroupGloo(dist.PrefixStore("calibrate", store), r, 2)
            x = torch.ones(nbytes // 4)
            group.allreduce([x]).wait()  # warm-up: connects the pair
            samples = []
            for _ in range(calls):
                t = time.perf_counter()
                group.allreduce([x]).wait()
                samples.append(time.perf_counter() - t)
            times[r] = sorted(samples)[calls // 2]
        except Exception as exc:  # reported below, in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    if errors or len(times) != 2:
        raise RuntimeError(f"calibration all-reduce failed: {errors or 'timed out'}")
    return max(times.values())


_CACHE: dict[str, Calibration] = {}


def calibrate(refresh: bool = False) -> Calibration:
    """Measure this machine once per process (about a second): fp32 and bf16 matmul FLOP/s and one all-reduce.

    The matmuls run on ONE thread and the rate is multiplied by torch's thread count: on a shared 2-core machine a
    two-thread matmul collapses whenever another process holds a core (1 GFLOP/s against 100 on one thread, measured
    at load 8), so one moment's load would decide the whole plan; one thread's rate does not swing so."""
    if "cpu" not in _CACHE or refresh:
        start, threads = time.perf_counter(), torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            fp32, bf16 = matmul_flops(torch.float32), matmul_flops(torch.bfloat16)
        finally:
            torch.set_num_threads(threads)
        _CACHE["cpu"] = Calibration(
            fp32 * threads, bf16 * threads, allreduce_seconds(), threads=threads, seconds=time.perf_counter() - start
        )
    return _CACHE["cpu"]


def auto_scale() -> float:
    """$HELPERS_BUDGET_SCALE (default 1): what BUDGET="auto" multiplies DEFAULT_SECONDS by. make test sets 0.5: its
    notebooks check that every cell runs and its claims hold, two at a time on one core each, where the writeup's
    plans would take twice the time of a writeup's; the plans then name what they left out, as on a slow machine."""
    value = os.environ.get("HELPERS_BUDGET_SCALE", "1")
    try:
        scale = float(value)
    except ValueError:
        scale = math.nan
    if not 0 < scale <= 1:
        raise ValueError(f"HELPERS_BUDGET_SCALE={value!r}: use a number above 0 and at most 1 (make test uses 0.5)")
    return scale


def parse_budget(value) -> float | None:
    """BUDGET as seconds: a number (or its text), or None for "none"/"off" (no budget); "auto" is resolved by
    Budget.resolve. A one-line ValueError otherwise."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "off", "inf", "")):
        return None
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"BUDGET={value!r}: use 'auto', a number of seconds (e.g. 120) or 'none'") from None
    if not seconds > 0:
        raise ValueError(f"BUDGET={value!r}: the seconds must be positive (or 'none' for no budget)")
    return None if math.isinf(seconds) else seconds


@dataclass
class Plan:
    """What one fit keeps and leaves out, with the estimates and the note that says so."""

    what: str
    kept: list
    dropped: list
    seconds: float  # estimate for what is kept (when the plan ran its items: the seconds they took)
    needed: float  # estimate for everything asked
    command: str = ""  # what runs the dropped items
    results: list = field(default_factory=list)  # run(item) per kept item, when fit was given run
    pace: float = 1.0  # seconds taken / seconds estimated, for the items it ran

    @property
    def note(self) -> str:
        """ "" when nothing was left out; else which items, their estimate and the command that runs them."""
        if not self.dropped:
            return ""
        busy = (
            f"; the runs took {self.pace:.1f}x their estimate, so this machine is slower now than calibrated (busy?)"
            if self.pace > 1.5
            else ""
        )
        return (
            f"not timed here (budget): {self.what} {', '.join(map(str, self.dropped))} (about "
            f"{self.needed - self.seconds:.0f} s more on this machine{busy}); run them with {self.command}"
        )


@dataclass
class Budget:
    """Seconds a notebook's budgeted runs may take (None: no budget) and what its plans have taken so far."""

    seconds: float | None
    notebook: str = ""
    calibration: Calibration | None = None
    label: str = "auto"  # how it was asked for, for the notes
    used: float = 0.0
    plans: list = field(default_factory=list)

    @classmethod
    def resolve(cls, value, notebook: str, profile: str, calibration: Calibration | None = None) -> Budget:
        """The notebook's budget: BUDGET="auto" is DEFAULT_SECONDS[notebook] (times auto_scale()) on the cpu profile
        and none on gpu. The cpu profile is calibrated even without a budget (the notebooks quote the calibration)."""
        if notebook not in DEFAULT_SECONDS:
            raise ValueError(f"no budget for notebook {notebook!r}; known: {', '.join(DEFAULT_SECONDS)}")
        auto = isinstance(value, str) and value.strip().lower() == "auto"
        default = DEFAULT_SECONDS[notebook] * auto_scale() if profile == "cpu" else None  # BUDGET="auto" here
        seconds = default if auto else parse_budget(value)
        if calibration is None and (seconds is not None or profile == "cpu"):  # cpu: the notebooks cite it too
            calibration = calibrate()
        return cls(seconds, notebook, calibration, "auto" if auto else str(value))

    @property
    def left(self) -> float:
        return math.inf if self.seconds is None else self.seconds - self.used

    def command(self, needed: float) -> str:
        """The two ways to run with at least `needed` seconds: make for every notebook, the parameter for this one."""
        n = int(math.ceil(needed / 10) * 10)
        nb = NOTEBOOKS.get(self.notebook, "")
        return (
            f"`make writeup BUDGET={n}` (or `python -m helpers writeup notebooks/{nb} --budget {n}`, or "
            f"BUDGET = {n} in the parameters cell)"
        )

    def fit(
        self,
        items: Sequence,
        cost: Callable[[object], float],
        what: str,
        keep_first: bool = False,
        run: Callable | None = None,
    ) -> Plan:
        """The longest prefix of `items` whose estimated seconds (cost(item) each) fit what is left, taken from the
        budget. keep_first: the first item runs whatever its cost (the one a notebook's checks need). Without a
        budget everything is kept and nothing estimated.

        run: call run(item) for the kept items in order (plan.results) and stop early once the next item, at the
        pace measured so far (seconds taken / estimated), would not fit what was left: a busy machine shortens the
        plan instead of overrunning the budget; the budget is charged the seconds taken."""
        items = list(items)
        if self.seconds is None:
            plan = Plan(what, items, [], 0.0, 0.0, results=[run(item) for item in items] if run else [])
            self.plans.append(plan)
            return plan
        costs = [float(cost(item)) for item in items]
        kept, total = [], 0.0
        for item, c in zip(items, costs, strict=True):
            if total + c > self.left and not (keep_first and not kept):
                break
            kept.append(item)
            total += c
        results, pace = [], 1.0
        if run is not None:
            allowed, taken, estimated = max(self.left, total), 0.0, 0.0
            for i, item in enumerate(kept):
                if results and taken + costs[i] * pace > allowed:
                    break
                start = time.perf_counter()
                results.append(run(item))
                taken += time.perf_counter() - start
                estimated += costs[i]
                pace = taken / estimated if estimated > 0 else 1.0
            kept, total = kept[: len(results)], taken
        needed = total + pace * sum(costs[len(kept) :])
        everything = sum(p.needed for p in self.plans) + needed  # this plan and the earlier ones, all items each
        plan = Plan(
            what,
            kept,
            items[len(kept) :],
            total,
            needed,
            self.command(everything) if len(kept) < len(items) else "",
            results,
            pace,
        )
        self.used += total
        self.plans.append(plan)
        return plan

    def summary(self) -> str:
        """One line: the budget, what the plans were estimated to take, and how many items were left out."""
        if self.seconds is None:
            return "no time budget: every planned run is made"
        dropped = sum(len(p.dropped) for p in self.plans)
        everything = sum(p.needed for p in self.plans)
        return (
            f"time budget {self.seconds:.0f} s (BUDGET={self.label}) for this notebook's timed runs; they took "
            f"{self.used:.0f} s (the first size of a section runs whatever it costs); {dropped} item(s) left out"
            + (f" (named below); all of them: {self.command(everything)}" if dropped else "")
        )
