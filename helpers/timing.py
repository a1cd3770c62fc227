"""The one timing helper every notebook uses: warm up, time each step, keep every sample.

    t = benchmark(lambda: model(x), warmup=3, steps=10, label="fwd")
    print(t)            # fwd: median 12.3 ms (mean 12.5 ± 0.4 ms, n=10, warm-up 3, cpu)
    rows.append(t.as_row(batch=8))

On CUDA each step is timed by a CUDA event pair on the current stream and the host
synchronizes once at the end, so steps overlap as in a training loop; on CPU, whose
ops are synchronous, `time.perf_counter()` around each call is enough.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass

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
        row = {"label": self.label, "device": self.device, "warmup": self.warmup, "steps": self.steps,
               "mean_s": self.mean, "std_s": self.std, "median_s": self.median,
               "min_s": self.min, "max_s": self.max}
        row.update(extra)
        return row

    def __str__(self) -> str:
        (median, mean, std), unit = _format_seconds(self.median, self.mean, self.std)
        head = f"{self.label}: " if self.label else ""
        return (f"{head}median {median} {unit} (mean {mean} ± {std} {unit}, "
                f"n={self.steps}, warm-up {self.warmup}, {self.device})")


def time_call(fn, device=None) -> tuple[object, float]:
    """Run `fn()` once between device syncs: (its result, seconds). For first-step costs (compile, autotune, caches)."""
    dev = _resolve_device(device)
    sync(dev)
    start = time.perf_counter()
    result = fn()
    sync(dev)
    return result, time.perf_counter() - start


def _time_steps_cuda(fn, steps: int, dev: torch.device, on_step) -> list[float]:
    """Time each step with a CUDA event pair on the current stream; synchronize once at the end."""
    switch = torch.cuda.device(dev) if dev.index is not None else contextlib.nullcontext()
    with switch:  # so the events go on `dev`'s current stream
        pairs = []
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


def benchmark(fn, warmup: int = 3, steps: int = 10, device=None, progress: bool | None = None,
              label: str = "") -> Timing:
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
