"""What the distributed topics of `yours` share (helpers.course.yours.distributed): the shapes, launches that never
crash the driver (a failed launch is retried per implementation, then per part), the one check for an implementation
that could not run, and the timing rows (yours / ours / PyTorch's as paired ratios)."""

from __future__ import annotations

import functools
import re

import numpy as np

import helpers.course.yours.student_calls as S
from helpers import formulas as F
from helpers import launch as L
from helpers.course.yours.options import Options
from helpers.course.yours.report import ERROR, SKIPPED, Check, TopicResult
from helpers.experiments.common import slowest_rank
from helpers.launch.core import start_forkserver
from helpers.timing import paired_ratio, ratio_columns, verdict

WORLD = S.WORLD
TOY = dict(
    steps=3, batch_size=8, context_length=6
)  # DDP and sharding equivalence: the toy model (tied, frozen, unused)
SPEED = dict(model="small/cpu", batch_size=8, context_length=32)  # side-by-side timing, small CPU shapes
PARTS = ("course", "beyond")  # a worker's two parts: the checks within the handout's contract, and the probes beyond it


def sent_bytes(log, world: int) -> float:
    return sum(F.wire_factor(op, world) * b for op, b in log)


# ---- in the parent: launches that never crash the driver ----

CHECKS = "helpers.course.yours.distributed"  # the checks' modules, which every rank imports


def warm_launches() -> None:
    """Start helpers.launch's forkserver (its start method without CUDA) with the distributed checks' modules
    imported once, when none is running yet: each launched rank then forks with them instead of importing them
    itself (on a 2-core CPU about 0.7 s a rank for the checks' modules, pandas and matplotlib among them, and 1 s
    for torch._dynamo, which torch.optim's first optimizer imports, and 1 s for torch.distributed.optim, which the
    sharding checks' torch ZeRO row needs, where this process has imported it: launch.preload; a topic's launches
    start 2 or 3 ranks each).
    A forkserver already running keeps its modules (no change). Returns at once (launch.core.start_forkserver)."""
    start_forkserver((CHECKS,))


def where_in(text: str, path: str) -> str:
    """file:line of the deepest frame of the student's files in a traceback's text (S.student_frame)."""
    return S.student_frame(re.findall(r'File "([^"]+)", line (\d+)', text or ""), path)


def failure_detail(exc: BaseException, path: str) -> str:
    """One paragraph for a launch that failed: the rank and its error (signal, timeout) and where in the student's
    code."""
    if isinstance(exc, TimeoutError):
        return (
            f"hung: {str(exc).split(' and was stopped')[0]} - a rank is waiting in a collective another rank never "
            "entered (same calls, same order, on every rank?)"
        )
    first = str(exc).split("\n")[0]
    if " before or outside the worker's Python code" in first:  # no Python traceback: a signal or os._exit
        return (
            first.split(" before or outside")[0] + " while running the student's adapters: a crash outside Python "
            "(a segfault in native code, out of memory, os._exit), not an exception"
        )
    tb = getattr(exc, "remote_traceback", None)
    return f"{first} (at {where_in(tb, path)})" if tb else first


def launch_each(worker, path: str, impls: list[str], opts: Options, world: int = WORLD, parts=PARTS) -> dict:
    """impl -> the worker's per-rank results (on `world` ranks), or the exception that stopped its launch. All
    implementations in one launch; if it fails, each in a launch of its own, so a crash or hang is pinned on the
    implementation that caused it; if that fails too and the worker has both parts, the course's checks alone, then
    the probes beyond them alone: a crash or hang beyond the handout keeps the contract's results (each rank's dict
    then has "beyond_failed", what stopped the probes)."""

    warm_launches()

    def fresh(names, parts):
        return L.launch(
            functools.partial(worker, path, names, opts, parts),
            world,
            backend="gloo",
            device="cpu",
            timeout_s=opts.timeout_s,
        )

    def launch(names, parts=parts):
        try:
            return fresh(names, parts)
        except L.RankError as exc:
            killed = SIGNAL.search(str(exc))
            if not killed:
                raise
            per_rank = fresh(names, parts)  # once more in a fresh launch: a recurrence propagates, the student's
            note = environment_note(killed.group(1), worker, names, parts)
            for r in per_rank:
                for n in names:
                    if isinstance(r.get(n), dict):
                        r[n]["environment"] = note
            return per_rank

    try:
        per_rank = launch(impls)
        return {impl: [r[impl] for r in per_rank] for impl in impls}
    except (L.RankError, TimeoutError) as exc:
        first = exc
    out = {}
    for impl in impls:
        try:
            if len(impls) > 1:
                out[impl] = [r[impl] for r in launch([impl])]
                continue
        except (L.RankError, TimeoutError) as exc:
            first = exc
        if len(parts) < 2:
            out[impl] = first
            continue
        try:
            course = [r[impl] for r in launch([impl], ("course",))]
        except (L.RankError, TimeoutError):
            out[impl] = first  # the contract's part fails alone too: the implementation's error
            continue
        try:
            beyond = [r[impl] for r in launch([impl], ("beyond",))]
            out[impl] = [
                {**b, **{k: v for k, v in c.items() if v is not None}} for c, b in zip(course, beyond, strict=True)
            ]
        except (L.RankError, TimeoutError) as exc:
            out[impl] = [{**c, "beyond_failed": failure_detail(exc, path)} for c in course]
    return out


def beyond_failed(topic: str, impl: str, per_rank: list[dict]) -> list[Check]:
    """The ERROR row for probes beyond the handout whose launch crashed or hung (the contract's checks stand)."""
    if not isinstance(per_rank[0], dict) or "beyond_failed" not in per_rank[0]:
        return []
    return [
        Check(
            topic,
            impl,
            "beyond the handout: the probes run on 2 ranks",
            ERROR,
            per_rank[0]["beyond_failed"],
            beyond=True,
        )
    ]


SIGNAL = re.compile(r"was killed by (SIG\w+|signal \d+)")


def environment_note(signal: str, worker, names: list[str], parts) -> str:
    """What a crash outside Python that a fresh launch did not repeat says: the signal and the phase it came in."""
    what = getattr(worker, "__name__", "the worker")
    return (
        f"a rank was killed by {signal} in {what} ({', '.join(names)}; {' and '.join(parts)} part) once, and not "
        "when rerun in a fresh launch: the environment's (e.g. gloo's teardown), not your code; the results are the "
        "rerun's"
    )


def environment_checks(topic: str, impl: str, got) -> list[Check]:
    """The environment's crash, rerun away (launch_each), as information beside the checks; none otherwise."""
    if isinstance(got, BaseException) or not got or not isinstance(got[0], dict) or "environment" not in got[0]:
        return []
    return [Check(topic, impl, "the environment: a crash outside Python, rerun", SKIPPED, got[0]["environment"], True)]


def status_checks(topic: str, impl: str, got, path: str, world: int = WORLD) -> list[Check] | None:
    """The one check for an implementation that could not run (launch failure, not implemented, skipped, wrong kind),
    else None."""
    if isinstance(got, BaseException):
        return [Check(topic, impl, f"runs on {world} ranks", ERROR, failure_detail(got, path))]
    first = got[0]
    if first["status"] != "ok":
        return [Check(topic, impl, "adapters", first["status"], first["detail"])]
    return None


def ran_everywhere(topic: str, per_rank, phase_of) -> bool:
    """Whether a launch went through and phase_of(a rank's result), one phase's outcome, is "ok" on every rank: where
    the course's test ran on 2 ranks, so that a launch on more can add something."""
    if status_checks(topic, "", per_rank, ""):
        return False
    return all((phase_of(r) or {}).get("status") == "ok" for r in per_rank)


def wider_checks(topic: str, impl: str, got, path: str, world: int, judge) -> list[Check]:
    """The checks of a second launch on `world` ranks (a rule the 2-rank launch cannot see): judge(per-rank outcomes)
    after the environment's note, or the ERROR of a launch that failed; none where the adapters could not run, which
    the first launch reported."""
    early = status_checks(topic, impl, got, path, world)
    if early:
        return early if isinstance(got, BaseException) else []
    return environment_checks(topic, impl, got) + judge(got)


def timing_rows(topic: str, impl: str, samples_per_rank: list[dict], labels: dict, unit_scale=1e3) -> list[dict]:
    """Median step time per label (slowest rank), and yours / each other label as a paired ratio with its interval."""
    slow = {k: slowest_rank([r[k] for r in samples_per_rank]) for k in samples_per_rank[0]}
    rows = [
        {
            "topic": topic,
            "impl": impl,
            "measure": "step time",
            "who": labels.get(k, k),
            "label": k,
            "value": float(np.median(v)) * unit_scale,
            "unit": "ms",
        }
        for k, v in slow.items()
    ]
    for k in slow:
        if k != "yours" and "yours" in slow:
            r = paired_ratio(slow["yours"], slow[k])
            rows.append(
                {
                    "topic": topic,
                    "impl": impl,
                    "measure": f"step time, yours / {labels.get(k, k)}",
                    "who": "yours",
                    "label": k,
                    "value": r.median,
                    "unit": "x",
                    **ratio_columns(r),
                    "verdict": verdict("yours", labels.get(k, k), r, "step time"),
                }
            )
    return rows


def rows_into(result: TopicResult, checks_rows: tuple[list[Check], list[dict]]) -> list[Check]:
    checks, rows = checks_rows
    result.rows += rows
    return checks


class NotAsked(Exception):
    """The launch asked for the probes beyond the handout only."""
