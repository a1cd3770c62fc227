"""A kernel topic of `yours` in launched processes (the driver's side): every implementation in one launch; after
a crash, a hang or a CUDA error (which leaves its process unusable), each implementation in a launch of its own, and
within one, the checks not yet judged in a fresh process, the one that broke it named (kernels.read_progress).
"""

from __future__ import annotations

import importlib
import re
import tempfile
from dataclasses import replace
from pathlib import Path

from helpers.course.yours.kernels import read_progress
from helpers.course.yours.kernels.suites import property_names
from helpers.course.yours.options import RUNNERS, Options
from helpers.course.yours.report import ERROR, Check, TopicResult, failure_summary, passed


def _in_rank(fn, path: str, opts: Options, *args):
    """fn(path, opts, *args) in one launched rank: its TopicResult, or the launch failure (crash, hang)."""
    from helpers.launch import RankError, launch

    try:
        return launch(fn, 1, path, opts, *args, timeout_s=opts.timeout_s)[0]
    except (RankError, TimeoutError) as exc:
        return exc


def run_kernel_topic(adapters_path: str, topic: str, opts: Options, impls: list[str]):
    """A kernel topic: every implementation checked and (those that passed) timed in one launch; if that launch
    crashes, hangs or meets a CUDA error (which leaves its process unusable), each implementation again in a launch
    of its own, then the timing in another, so the failure is pinned on one implementation and hides nothing else."""
    module, name = RUNNERS[topic]
    fn = getattr(importlib.import_module(module), name)
    got = _in_rank(fn, adapters_path, opts, impls)
    if not isinstance(got, BaseException) and not got.poisoned:
        return _timing_again(fn, adapters_path, opts, got, None) if got.timing_fault else got
    result, timed = TopicResult(topic), []
    for impl in impls:
        checks = _impl_checks(fn, adapters_path, topic, replace(opts, timed=False), impl)
        result.checks += checks
        if passed(checks, impl):
            timed.append(impl)
    if opts.timed:
        got = _in_rank(fn, adapters_path, opts, [], timed)
        if isinstance(got, BaseException):
            result.checks.append(Check(topic, "-", "timing runs", ERROR, failure_summary(got), beyond=True))
        else:
            result.checks += got.checks
            result.rows += got.rows
            if got.timing_fault:
                result = _timing_again(fn, adapters_path, opts, result, timed)
    return result


def _timing_again(fn, adapters_path: str, opts: Options, result: TopicResult, timed) -> TopicResult:
    """A timing row met a CUDA error (result.timing_fault; its process timed nothing else): the other rows timed in
    a fresh process, then the failed one once more alone beside the baseline; a row that fails again keeps its
    error, one that does not is the environment's (said in its row's check)."""
    label, skip = result.timing_fault, (*opts.timing_skip, result.timing_fault)
    result.timing_fault = None
    faulted = [c for c in result.checks if c.prop == "timing runs" and c.impl == label]
    rest = _in_rank(fn, adapters_path, replace(opts, timing_skip=skip), [], timed)
    if isinstance(rest, BaseException):
        result.checks.append(Check(result.topic, "-", "timing runs", ERROR, failure_summary(rest), beyond=True))
        return result
    result.rows += rest.rows
    result.checks += [c for c in rest.checks if c.prop == "timing runs"]
    alone = _in_rank(fn, adapters_path, replace(opts, timing_only=(label,)), [], timed)
    if isinstance(alone, BaseException) or alone.timing_fault:
        for c in faulted:
            c.detail += "; again when rerun alone in a fresh process"
        return result
    mine = [r for r in alone.rows if f"{r['who']}:{r['impl']}" == label]
    if mine:
        result.rows += mine
        for c in faulted:
            c.detail += "; not when rerun alone in a fresh process (its row is from that run): the environment's?"
    return result


def _impl_checks(fn, adapters_path: str, topic: str, opts: Options, impl: str) -> list:
    """One implementation's checks in a launch of its own. When that process dies (a crash, a hang) or meets a CUDA
    error, the property it was in is named as the cause and the properties not yet judged run in a fresh one."""
    props, done, remaining, crashes = property_names(topic, impl, opts), [], None, []  # crashes: (property, why)
    with tempfile.TemporaryDirectory(prefix="yours-progress-") as tmp:
        for attempt in range(len(props) + 1):
            progress = str(Path(tmp) / f"{attempt}.jsonl")
            got = _in_rank(fn, adapters_path, opts, [impl], None, remaining, progress)
            if not isinstance(got, BaseException):
                done += got.checks
                if not got.poisoned:
                    break
            else:
                finished, started = read_progress(progress)
                done += finished
                if started is not None:
                    crashes.append((started, died_in_check(got)))
                if (started is None and not finished) or (len(crashes) == 2 and not done):
                    tried = ", ".join(p for p, _ in crashes)  # nothing ran to its end: it dies whatever it is asked
                    where = f" (in {tried}; the other checks were not run)" if tried else ""
                    return done + [Check(topic, impl, "runs to the end", ERROR, failure_summary(got) + where)]
            judged = {c.prop for c in done} | {p for p, _ in crashes}
            remaining = [p for p, _ in props if p not in judged]
            if not remaining:
                break
    beyond, order = dict(props), {p: i for i, (p, _) in enumerate(props)}
    done += [Check(topic, impl, p, ERROR, why, beyond=beyond.get(p, False)) for p, why in crashes]
    return sorted(done, key=lambda c: order.get(c.prop, -1))  # in the order the properties are checked


def died_in_check(exc: BaseException) -> str:
    """What a process that died inside one property's check tells: the signal and its likely cause, or the hang."""
    if isinstance(exc, TimeoutError):
        return f"the check hung: {failure_summary(exc)}"
    signal = re.search(r"killed by (SIG\w+|signal \d+)", str(exc))
    if signal:
        return (
            f"the process died in this check ({signal.group(1)}): native code read or wrote memory it does not own; "
            "in a Triton kernel, a load or a store past a tensor's end (a grid axis or an offset beyond the tensor, "
            "a load or store without a boundary check)"
        )
    return f"the process died in this check: {failure_summary(exc)}"
