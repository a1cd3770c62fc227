"""The one timing helper every notebook uses: warm up, time each step, keep every sample.

    t = benchmark(lambda: model(x), warmup=3, steps=10, label="fwd")
    print(t)            # fwd: median 12.3 ms (mean 12.5 ± 0.4 ms, n=10, warm-up 3, cpu)
    rows.append(t.as_row(batch=8))

    c = compare({"layernorm": f, "rmsnorm": g}, steps=20)   # interleaved in one loop, each call synced
    c.verdict("rmsnorm")   # "rmsnorm takes 0.81x layernorm's time (0.812x (95% CI ...))" or "no measurable difference"

On CUDA each step is timed by a CUDA event pair on the current stream and the host
synchronizes once at the end, so steps overlap as in a training loop; on CPU, whose
ops are synchronous, `time.perf_counter()` around each call is enough.
"""

from __future__ import annotations

import contextlib
import itertools
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

PROGRESS_AFTER_S = 2.0  # auto progress: show a bar when the timed steps are expected to take longer


def _resolve_device(device=None) -> torch.device:
    """The device to synchronize on: the given one, else CUDA when it is in use (initialized), else CPU."""
    if device is not None:
        return torch.device(device)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.device("cuda")
    return torch.device("cpu")


def sync(device: torch.device) -> None:
    """Wait for queued work on `device` (a no-op on CPU, whose ops are synchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps" and hasattr(torch, "mps") and hasattr(torch.mps, "synchronize"):
        torch.mps.synchronize()


class WaitClock:
    """Seconds spent waiting for collectives (the DDP and FSDP wrappers' comm_s). On the CPU: host time around the
    waits. On CUDA: the time the current stream stood still across them, from a CUDA event pair, read once the events
    are done: an NCCL Work.wait() only makes the stream wait and returns at once (gloo's blocks the host, which the
    events see too)."""

    def __init__(self):
        self._seconds, self._pending = 0.0, []

    @contextlib.contextmanager
    def waiting(self, device: torch.device):
        if torch.device(device).type != "cuda":
            start = time.perf_counter()
            yield
            self._seconds += time.perf_counter() - start
            return
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        yield
        end.record()
        self._pending.append((start, end))
        if len(self._pending) > 1024:  # a long run nobody reads: fold what the device has done
            self._fold(wait=False)

    def _fold(self, wait: bool) -> None:
        """Add the pending pairs the device has reached (all of them, waiting for it, when `wait`)."""
        keep = []
        for start, end in self._pending:
            if wait:
                end.synchronize()
            if wait or end.query():
                self._seconds += start.elapsed_time(end) / 1e3
            else:
                keep.append((start, end))
        self._pending = keep

    @property
    def seconds(self) -> float:
        """The total so far (waits for the device to reach the pending events)."""
        self._fold(wait=True)
        return self._seconds


def _format_seconds(*values: float) -> tuple[list[str], str]:
    """Format values in one unit (s, ms or µs) picked from the first of them."""
    lead = abs(values[0])
    scale, unit = (1.0, "s") if lead >= 1 else (1e3, "ms") if lead >= 1e-3 else (1e6, "µs")
    return [f"{v * scale:.1f}" if abs(v * scale) >= 10 else f"{v * scale:.2f}" for v in values], unit


@dataclass
class Timing:
    """Every timed sample of a benchmark (seconds) and how it was made."""

    samples: list[float]
    warmup: int
    device: str
    label: str = ""

    @property
    def steps(self) -> int:
        return len(self.samples)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.samples)

    @property
    def std(self) -> float:
        return statistics.stdev(self.samples) if len(self.samples) > 1 else 0.0

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def max(self) -> float:
        return max(self.samples)

    @property
    def iqr(self) -> float:
        """Spread of the middle half of the samples (q75 - q25, numpy's default 'linear' quantiles)."""
        if len(self.samples) < 2:
            return 0.0
        q25, _, q75 = statistics.quantiles(self.samples, n=4, method="inclusive")
        return q75 - q25

    def as_row(self, **extra) -> dict:
        """One tidy-table row: label, device, counts and the summary statistics in seconds, plus `extra`."""
        row = {
            "label": self.label,
            "device": self.device,
            "warmup": self.warmup,
            "steps": self.steps,
            "mean_s": self.mean,
            "std_s": self.std,
            "median_s": self.median,
            "min_s": self.min,
            "max_s": self.max,
        }
        row.update(extra)
        return row

    def __str__(self) -> str:
        (median, mean, std), unit = _format_seconds(self.median, self.mean, self.std)
        head = f"{self.label}: " if self.label else ""
        return (
            f"{head}median {median} {unit} (mean {mean} ± {std} {unit}, "
            f"n={self.steps}, warm-up {self.warmup}, {self.device})"
        )


def time_call(fn, device=None) -> tuple[object, float]:
    """Run `fn()` once between device syncs: (its result, seconds). For first-step costs (compile, autotune, caches)."""
    dev = _resolve_device(device)
    sync(dev)
    start = time.perf_counter()
    result = fn()
    sync(dev)
    return result, time.perf_counter() - start


# A spin kernel queued ahead of a start event: while the GPU spins, the host runs the call's Python, autograd, checks,
# allocations and launcher, so the event pair holds the device's work and not the host's pre-launch gap (the way
# triton.testing.do_bench keeps its stream busy). 10^6 SM cycles: 0.5 ms at 1.98 GHz, 3 ms at an idle 345 MHz.
COVER_CYCLES = 1_000_000


def _cover_host_launch() -> None:
    """Queue COVER_CYCLES of device spin on the current stream (CUDA only)."""
    torch.cuda._sleep(COVER_CYCLES)


def time_one(fn, device=None) -> float:
    """Seconds of one `fn()` alone on the device (the queue drained before it, its work done after): a CUDA event
    pair on CUDA, recorded behind a spin kernel, so neither the host's pre-launch work nor its synchronize latency
    (tens of µs, 15-25 % of a 50,000 x 1024 norm) lands inside it; time_call's perf_counter elsewhere."""
    dev = _resolve_device(device)
    if dev.type != "cuda":
        return time_call(fn, dev)[1]
    sync(dev)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.device(dev) if dev.index is not None else contextlib.nullcontext():
        _cover_host_launch()
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3  # ms -> s


def _time_steps_cuda(fn, steps: int, dev: torch.device, on_step) -> list[float]:
    """Time each step with a CUDA event pair on the current stream; synchronize once at the end."""
    switch = torch.cuda.device(dev) if dev.index is not None else contextlib.nullcontext()
    with switch:  # so the events go on `dev`'s current stream
        pairs = []
        _cover_host_launch()  # the first step's launch too; later ones are queued while earlier steps run
        for _ in range(steps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            pairs.append((start, end))
            on_step()
        torch.cuda.synchronize(dev)
    return [start.elapsed_time(end) / 1e3 for start, end in pairs]  # ms -> s


def _time_steps_host(fn, steps: int, dev: torch.device, on_step) -> list[float]:
    """Time each step with perf_counter between syncs (CPU is synchronous; MPS is synced by sync)."""
    samples = []
    for _ in range(steps):
        samples.append(time_call(fn, dev)[1])
        on_step()
    return samples


def benchmark(
    fn, warmup: int = 3, steps: int = 10, device=None, progress: bool | None = None, label: str = ""
) -> Timing:
    """Call `fn()` `warmup` times untimed, then `steps` times timed; return every sample in seconds."""
    if warmup < 0 or steps < 1:
        raise ValueError(f"need warmup >= 0 and steps >= 1, got warmup={warmup}, steps={steps}")
    dev = _resolve_device(device)
    timer = _time_steps_cuda if dev.type == "cuda" else _time_steps_host
    sync(dev)
    start = time.perf_counter()
    for _ in range(warmup):
        fn()
    sync(dev)
    first, estimate = [], None
    if warmup:
        estimate = (time.perf_counter() - start) / warmup * steps
    elif progress is None:  # nothing to estimate from: time the first step on its own
        first = timer(fn, 1, dev, lambda: None)
        estimate = first[0] * steps
    show = bool(progress) if progress is not None else estimate is not None and estimate > PROGRESS_AFTER_S
    with tqdm(total=steps, initial=len(first), desc=label or None, disable=not show) as bar:
        samples = first + timer(fn, steps - len(first), dev, lambda: bar.update(1))
    return Timing(samples=samples, warmup=warmup, device=str(dev), label=label)


# ---- comparisons: interleaved, reported as a ratio with its spread --------------------------------------------


def interleaved(steps_by_label: dict, steps: int, warmup: int) -> dict[str, list]:
    """Call every label's step(i) once per round, the order reversed every other round (A B, B A, ...), so drift and
    caches hit all alike; keep what each returns from the `steps` rounds after `warmup` untimed ones."""
    labels, kept = list(steps_by_label), {label: [] for label in steps_by_label}
    for i in range(warmup + steps):
        for label in labels if i % 2 == 0 else labels[::-1]:
            out = steps_by_label[label](i)
            if i >= warmup:
                kept[label].append(out)
    return kept


MIN_PAIRS = 6  # fewer pairs cannot tell: all k ratios on one side of 1 by chance alone has probability 2 / 2**k,
# 1 in 8 at k = 4 and 1 in 32 at k = 6 (a sign test), and a bootstrap interval of so few would exclude 1 as often


@dataclass(frozen=True)
class Ratio:
    """The median of paired ratios a_i / b_i with a bootstrap confidence interval: is a measurably slower/faster?"""

    median: float
    low: float
    high: float
    pairs: int
    confidence: float = 0.95

    @property
    def enough(self) -> bool:
        """At least MIN_PAIRS pairs: enough for the interval to mean something."""
        return self.pairs >= MIN_PAIRS

    @property
    def differs(self) -> bool:
        """True when there are enough pairs and the interval excludes 1: a difference this machine can measure."""
        return self.enough and not self.low <= 1.0 <= self.high

    def beyond(self, noise: float = 0.0) -> bool:
        """The project's one rule for naming a difference: enough pairs (MIN_PAIRS) and an interval outside
        [1/(1 + noise), 1 + noise], where noise is how far apart identical configurations time (0: the interval
        excludes 1, as `differs`)."""
        return self.enough and (self.low > 1 + noise or self.high < 1 / (1 + noise))

    def __str__(self) -> str:
        return f"{self.median:.3f}x ({self.confidence:.0%} CI {self.low:.3f}-{self.high:.3f}, {self.pairs} pairs)"


def identical_noise(ratios) -> float:
    """How far apart configurations that are the same thing timed (the largest of max(r, 1/r) - 1 over their paired
    ratios' medians; 0 when there are none): the noise a ranking of the others must beat (`Ratio.beyond`)."""
    return max((max(r.median, 1 / r.median) - 1 for r in ratios), default=0.0)


def paired_ratio(a, b, confidence: float = 0.95, resamples: int = 2000, seed: int = 0) -> Ratio:
    """Median of a_i / b_i over pairs measured together, with a percentile-bootstrap interval of that median."""
    ratios = np.asarray(a, dtype=float) / np.asarray(b, dtype=float)  # (pairs,)
    if ratios.size == 0:
        raise ValueError("paired_ratio needs at least one pair of samples")
    draws = np.random.default_rng(seed).choice(ratios, size=(resamples, ratios.size))  # (resamples, pairs)
    low, high = np.quantile(np.median(draws, axis=1), [(1 - confidence) / 2, (1 + confidence) / 2])
    return Ratio(float(np.median(ratios)), float(low), float(high), int(ratios.size), confidence)


def verdict(a: str, b: str, ratio: Ratio, what: str = "time") -> str:
    """One sentence that names a winner only outside the noise."""
    if not ratio.enough:
        return f"too few paired samples to tell {a} from {b} ({what} ratio {ratio}; at least {MIN_PAIRS} needed)"
    if not ratio.differs:
        return f"no measurable difference between {a} and {b} on this machine ({what} ratio {ratio})"
    return f"{a} takes {ratio.median:.2f}x {b}'s {what} ({ratio})"


@dataclass
class Comparison:
    """Samples of several callables timed in one interleaved loop; ratios against a baseline with their spread."""

    samples: dict[str, list[float]]
    baseline: str
    device: str

    def ratio(self, label: str, baseline: str | None = None) -> Ratio:
        """label's time over the baseline's, paired round by round."""
        return paired_ratio(self.samples[label], self.samples[baseline or self.baseline])

    def verdict(self, label: str, baseline: str | None = None) -> str:
        return verdict(label, baseline or self.baseline, self.ratio(label, baseline))

    def table(self):
        """One row per label: median and quartiles (s), the ratio to the baseline with its interval, measurable?"""
        import pandas as pd

        rows = []
        for label, s in self.samples.items():
            r = self.ratio(label)
            p25, p50, p75 = np.percentile(s, [25, 50, 75])
            rows.append(
                {
                    "label": label,
                    "median_s": p50,
                    "p25_s": p25,
                    "p75_s": p75,
                    "ratio": r.median,
                    "ratio_low": r.low,
                    "ratio_high": r.high,
                    "measurable": r.differs or label == self.baseline,
                }
            )
        return pd.DataFrame(rows).set_index("label")


def compare(fns: dict, steps: int = 20, warmup: int = 3, device=None, baseline: str | None = None) -> Comparison:
    """Time every callable of `fns` once per round, interleaved (A B, B A, ...), each call alone (time_one: CUDA
    events on a GPU)."""
    if warmup < 0 or steps < 1:
        raise ValueError(f"need warmup >= 0 and steps >= 1, got warmup={warmup}, steps={steps}")
    dev = _resolve_device(device)
    samples = interleaved({k: (lambda i, fn=fn: time_one(fn, dev)) for k, fn in fns.items()}, steps, warmup)
    return Comparison(samples, baseline or next(iter(fns)), str(dev))


# ---- ratios as saved rows (results files; the answers page reads them back) ----


def pairwise_ratios(samples: dict, **keys) -> list[dict]:
    """Every ordered pair (a, b) of samples timed in ONE interleaved loop: a's time over b's, paired round by round,
    with its bootstrap interval (the rows the answers page reads; `keys` say which loop)."""
    return [
        {**keys, "a": a, "b": b, **ratio_columns(paired_ratio(samples[a], samples[b]))}
        for a, b in itertools.permutations(samples, 2)
    ]


def ratio_columns(r: Ratio) -> dict:
    """A Ratio as the columns of a saved row (the names Comparison.table uses, plus the pair count)."""
    return {"ratio": r.median, "ratio_low": r.low, "ratio_high": r.high, "pairs": r.pairs}


def ratio_of(row) -> Ratio:
    """The Ratio a saved row carries (ratio_columns)."""
    return Ratio(float(row["ratio"]), float(row["ratio_low"]), float(row["ratio_high"]), int(row["pairs"]))
