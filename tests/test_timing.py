"""benchmark/time_call: warm-up, sample counts, statistics, units, progress bar, device choice."""

import time

import pytest
import torch

from helpers import timing
from helpers.timing import Timing, benchmark, time_call


def _counter():
    calls = []
    return calls, lambda: calls.append(1)


def _sleeper(seconds):
    return lambda: time.sleep(seconds)


@pytest.mark.parametrize("warmup, steps", [(0, 1), (3, 10), (2, 5)])
def test_warmup_calls_happen_and_every_step_is_sampled(warmup, steps):
    calls, fn = _counter()
    t = benchmark(fn, warmup=warmup, steps=steps, progress=False)
    assert len(calls) == warmup + steps
    assert len(t.samples) == t.steps == steps
    assert t.warmup == warmup and t.device == "cpu"
    assert all(s >= 0 for s in t.samples)


def test_warmup_is_not_timed():
    slow_first = iter([0.2])  # only the first call is slow: it must land in warm-up
    t = benchmark(lambda: time.sleep(next(slow_first, 0.0)), warmup=1, steps=3, progress=False)
    assert t.max < 0.1


def test_known_sleeps_are_timed_at_least_as_long_as_they_sleep():
    t = benchmark(_sleeper(0.010), warmup=1, steps=5, progress=False, label="sleep")
    assert 0.009 <= t.min <= t.median <= t.max  # a sleep never ends early; the upper end depends on the scheduler
    assert t.steps == 5 and t.label == "sleep"


def test_statistics_on_fixed_samples():
    t = Timing(samples=[1.0, 2.0, 3.0, 4.0, 10.0], warmup=0, device="cpu")
    assert (t.mean, t.median, t.min, t.max) == (4.0, 3.0, 1.0, 10.0)
    assert t.std == pytest.approx(12.5**0.5)  # deviations -3 -2 -1 0 6: squares sum to 50, / (n - 1) = 12.5
    assert t.iqr == pytest.approx(2.0)  # numpy.percentile([1,2,3,4,10], [25, 75]) -> 2, 4
    even = Timing(samples=[4.0, 1.0, 3.0, 2.0], warmup=0, device="cpu")
    assert (even.median, even.mean, even.iqr) == (2.5, 2.5, pytest.approx(1.5))  # quartiles 1.75 and 3.25
    one = Timing(samples=[0.5], warmup=0, device="cpu")
    assert (one.std, one.iqr, one.median) == (0.0, 0.0, 0.5)


@pytest.mark.parametrize("warmup, steps", [(-1, 10), (3, 0), (0, -2)])
def test_bad_arguments_raise(warmup, steps):
    calls, fn = _counter()
    with pytest.raises(ValueError, match="warmup"):
        benchmark(fn, warmup=warmup, steps=steps)
    assert calls == []


def test_as_row_is_a_tidy_row():
    t = Timing(samples=[0.001, 0.003], warmup=2, device="cpu", label="fwd")
    row = t.as_row(batch=8)
    assert list(row) == ["label", "device", "warmup", "steps", "mean_s", "std_s", "median_s", "min_s", "max_s", "batch"]
    assert row["steps"] == 2 and row["mean_s"] == pytest.approx(0.002) and row["batch"] == 8


@pytest.mark.parametrize("seconds, unit", [(2.5, " s "), (0.0123, " ms "), (4.2e-5, " µs ")])
def test_str_picks_units(seconds, unit):
    text = str(Timing(samples=[seconds] * 3, warmup=3, device="cpu", label="fwd"))
    assert text.startswith("fwd: median ") and unit in text
    assert "n=3" in text and "warm-up 3" in text and text.endswith("cpu)")


def test_str_reads_like_the_example():
    t = Timing(samples=[0.0123, 0.0123, 0.0129, 0.0121], warmup=3, device="cpu", label="fwd")
    assert str(t) == "fwd: median 12.3 ms (mean 12.4 ± 0.35 ms, n=4, warm-up 3, cpu)"
    assert not str(Timing([0.01], 0, "cpu")).startswith(":")


class _SpyBar:
    """Stands in for tqdm: records how it was built and how far it got."""

    made = []

    def __init__(self, total=None, initial=0, desc=None, disable=False, **kw):
        self.total, self.n, self.desc, self.disable = total, initial, desc, disable
        _SpyBar.made.append(self)

    def update(self, n=1):
        self.n += n

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@pytest.fixture
def spy_bar(monkeypatch):
    _SpyBar.made = []
    monkeypatch.setattr(timing, "tqdm", _SpyBar)
    return _SpyBar.made


@pytest.mark.parametrize("progress", [True, False])
def test_forced_progress(spy_bar, progress):
    t = benchmark(_counter()[1], warmup=1, steps=4, progress=progress, label="fwd")
    assert len(t.samples) == 4
    (bar,) = spy_bar
    assert bar.disable is (not progress) and bar.desc == "fwd" and bar.n == bar.total == 4


def test_forced_progress_draws_a_real_bar(capsys):
    benchmark(_counter()[1], warmup=0, steps=3, progress=True, label="real")
    assert "real" in capsys.readouterr().err


@pytest.mark.parametrize("warmup", [0, 2])
def test_auto_progress_hides_the_bar_for_a_fast_fn(spy_bar, warmup):
    benchmark(_counter()[1], warmup=warmup, steps=5)
    (bar,) = spy_bar
    assert bar.disable is True and bar.n == 5


@pytest.mark.parametrize("warmup", [0, 2])
def test_auto_progress_shows_the_bar_for_a_long_run(spy_bar, monkeypatch, warmup):
    monkeypatch.setattr(timing, "PROGRESS_AFTER_S", 0.01)  # 4 steps x 5 ms is "long"
    calls, count = _counter()
    t = benchmark(lambda: (count(), time.sleep(0.005)), warmup=warmup, steps=4)
    (bar,) = spy_bar
    assert bar.disable is False and bar.n == bar.total == 4
    assert len(t.samples) == 4 and len(calls) == warmup + 4


def test_device_inference(monkeypatch):
    assert timing._resolve_device("cuda:1") == torch.device("cuda", 1)
    assert timing._resolve_device(torch.device("cpu")) == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert timing._resolve_device(None) == torch.device("cpu")  # CUDA present but unused
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert timing._resolve_device(None) == torch.device("cuda")


class _FakeEvent:
    """A CUDA event that reads the host clock, to run the CUDA code path without a GPU."""

    def __init__(self, enable_timing=False):
        assert enable_timing
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter()

    def elapsed_time(self, end):
        assert _FakeEvent.synced, "elapsed_time read before synchronize"
        return (end.t - self.t) * 1e3  # ms, like CUDA


def test_cuda_path_uses_event_pairs_and_converts_ms(monkeypatch):
    syncs = []
    _FakeEvent.synced = False

    def synchronize(device=None):
        syncs.append(device)
        _FakeEvent.synced = True

    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None)
    t = benchmark(_sleeper(0.010), warmup=1, steps=3, device="cuda", progress=False)
    assert t.device == "cuda" and len(t.samples) == 3
    assert all(0.009 <= s <= 0.05 for s in t.samples)  # seconds, not ms
    assert len(syncs) == 3  # before and after warm-up, once at the end


def test_time_call_returns_result_and_seconds():
    result, seconds = time_call(lambda: (time.sleep(0.01), 42)[1])
    assert result == 42 and 0.009 <= seconds <= 0.1


def test_interleaved_alternates_the_order_and_drops_warmup():
    order = []
    kept = timing.interleaved(
        {"a": lambda i: order.append(("a", i)) or i, "b": lambda i: order.append(("b", i)) or -i}, steps=3, warmup=1
    )
    assert order == [("a", 0), ("b", 0), ("b", 1), ("a", 1), ("a", 2), ("b", 2), ("b", 3), ("a", 3)]
    assert kept == {"a": [1, 2, 3], "b": [-1, -2, -3]}


def test_paired_ratio_of_known_pairs():
    r = timing.paired_ratio([2.0, 4.0, 6.0, 8.0, 10.0, 12.0], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    assert (r.median, r.low, r.high, r.pairs) == (2.0, 2.0, 2.0, 6)  # every pair is exactly 2: no spread
    assert r.differs and "2.00x" in timing.verdict("a", "b", r)
    noisy = timing.paired_ratio([0.9, 1.1, 1.0, 0.95, 1.05, 1.0], [1.0] * 6)
    assert noisy.low <= 1.0 <= noisy.high and not noisy.differs
    assert timing.verdict("a", "b", noisy).startswith("no measurable difference between a and b")
    few = timing.paired_ratio([2.0] * 5, [1.0] * 5)  # exactly 2 each time, but 5 pairs: a sign test cannot tell
    assert not few.differs and timing.verdict("a", "b", few).startswith("too few paired samples to tell a from b")
    with pytest.raises(ValueError):
        timing.paired_ratio([], [])


def test_compare_tells_a_slower_callable_apart_and_a_twin_not():
    slow, fast = _sleeper(0.004), _sleeper(0.001)
    c = timing.compare({"fast": fast, "slow": slow, "twin": fast}, steps=9, warmup=1)
    assert c.baseline == "fast" and all(len(s) == 9 for s in c.samples.values())
    assert c.ratio("slow").low > 1.5  # sleeps never end early: slow/fast >= 4 ms / (1 ms + scheduler delay)
    table = c.table()
    assert table.loc["slow", "measurable"] and table.loc["fast", "ratio"] == 1.0


class _DeviceClockEvent:
    """A CUDA event on a simulated device clock: the kernels a call queues advance it, the host does not wait."""

    now_ms = 0.0

    def __init__(self, enable_timing=False):
        self.ms = None

    def record(self, stream=None):
        self.ms = _DeviceClockEvent.now_ms

    def synchronize(self):
        pass

    def query(self):
        return True

    def elapsed_time(self, end):
        return end.ms - self.ms


def test_compare_times_each_call_on_the_device_clock(monkeypatch):
    """Issue 31 item 11: on a GPU each compared call is timed by a CUDA event pair, not by the host around a sync
    (its launch and sync latency inflated a 50,000 x 1024 norm by 15-25 %). Each call here queues 2 ms of device work
    and returns at once."""
    monkeypatch.setattr(torch.cuda, "Event", _DeviceClockEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: None)

    def kernel():
        _DeviceClockEvent.now_ms += 2.0

    comp = timing.compare({"a": kernel}, steps=6, warmup=1, device="cuda")
    assert comp.samples["a"] == [pytest.approx(0.002)] * 6


def test_wait_clock_reads_the_stream_wait_on_cuda(monkeypatch):
    """Issue 31 item 8: an NCCL Work.wait() returns at once and makes the stream wait; the clock reads the stream's
    time across it (2 ms of queued waiting here), also after folding a long run's pending events."""
    monkeypatch.setattr(torch.cuda, "Event", _DeviceClockEvent)
    clock = timing.WaitClock()
    for _ in range(1100):
        with clock.waiting(torch.device("cuda")):
            _DeviceClockEvent.now_ms += 2.0  # the stream stands still until the collective ends
    assert clock.seconds == pytest.approx(1100 * 0.002)


class _Stream:
    """One CUDA stream against the host clock (ms): the host queues work and runs on; the device runs queued work in
    order, idling until it is queued. `free` is when the device finishes what is queued so far."""

    def __init__(self):
        self.host = self.free = 0.0

    def kernel(self, ms):
        self.free = max(self.free, self.host) + ms

    def sync(self, device=None):
        self.host = max(self.host, self.free)

    def event(self, enable_timing=False):
        stream = self

        class Event:
            def record(self, s=None):
                self.ms = stream.free = max(stream.free, stream.host)

            def synchronize(self):
                stream.sync()

            def elapsed_time(self, end):
                return end.ms - self.ms

        return Event()


@pytest.mark.parametrize("steps", [1, 4])
def test_cuda_timing_leaves_the_hosts_pre_launch_work_out(monkeypatch, steps):
    """Issue 39 item 4: a call that spends 0.3 ms on the host (autograd, checks, Triton's launcher) before queuing a
    1 ms kernel measures 1 ms, not 1.3: device work is queued ahead of the start event, so the gap lands before it."""
    stream = _Stream()
    monkeypatch.setattr(torch.cuda, "Event", stream.event)
    monkeypatch.setattr(torch.cuda, "synchronize", stream.sync)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: stream.kernel(cycles / 2e6))  # 2 GHz: 0.5 ms

    def call():
        stream.host += 0.3  # pre-launch work on the host
        stream.kernel(1.0)

    assert timing.time_one(call, "cuda") == pytest.approx(1e-3)
    samples = benchmark(call, warmup=0, steps=steps, device="cuda", progress=False).samples
    assert samples == [pytest.approx(1e-3)] * steps
