"""`yours` for the distributed topics: a student's DDP (each flavour), sharded optimizer and FSDP, checked against one
process, accounted (memory, bytes) against the formulas, and timed beside ours and PyTorch's.

    result = run_ddp("path/to/tests/adapters.py", Options())       # TopicResult: checks + side-by-side rows
    result = run_sharding(path, Options()); result = run_fsdp(path, Options(repeat=3))

The student's code runs only in ranks started by helpers.launch (2 ranks, gloo, CPU); each rank imports the adapters
file itself. A crashed rank (signal named), a hung collective (after Options.timeout_s) or an exception in the
student's code becomes an "error" check naming file:line, and the topic's other implementations are then run in
launches of their own, so one broken flavour never hides the others. Two kinds of check (report.Check.beyond):
- within the handout's contract (they decide the exit status; helpers.course.yours.contract): the course's own test
  models and procedures (course_models: ToyModel and ToyModelWithTiedWeights built with a seed per rank for DDP, one
  seed for the sharded optimizer, the cs336_basics layers with one seed for FSDP), with the tolerances its tests assert;
- beyond it (reported, never in the exit status): our toy with tied, frozen and unused parameters and a per-rank
  buffer, torch.nn layers seeded per rank, memory and bytes against the formulas, the timings; these are the
  experiments' own checks (helpers.experiments.ddp / sharding / fsdp) with the student's implementation in place of ours.
Each phase (a check, the timing, the memory and bytes) runs apart: an exception in one is its own error row, located at
the deepest frame in the student's files (helpers.course.yours.student_calls calls the adapters).
"""

from __future__ import annotations

import functools
import re

import numpy as np
import torch
import torch.distributed as dist

from helpers import formulas as F
from helpers import launch as L
from helpers import memory as M
from helpers.comm import count_collectives
from helpers.course.yours import Options
from helpers.course.yours import adapters as A
from helpers.course.yours import contract as C
from helpers.course.yours import course_models as CM
from helpers.course.yours import student_calls as S
from helpers.course.yours.report import CHECK_COLUMNS, ERROR, FAIL, PASS, SKIPPED, Check, TopicResult
from helpers.ddp import wrap
from helpers.experiments import ddp as XD
from helpers.experiments import fsdp as XF
from helpers.experiments import sharding as XS
from helpers.experiments.common import make_batches, make_model, rank_rows, rank_share, slowest_rank
from helpers.formulas import MiB
from helpers.fsdp import bytes_sent, fsdp_bytes_per_step
from helpers.timing import paired_ratio, ratio_columns, verdict

WORLD = S.WORLD
TOY = dict(
    steps=3, batch_size=8, context_length=6
)  # DDP and sharding equivalence: the toy model (tied, frozen, unused)
SPEED = dict(model="small/cpu", batch_size=8, context_length=32)  # side-by-side timing, small CPU shapes
FSDP_CHECK = dict(model="small/cpu", n_layers=None, steps=2, batch_size=4, context_length=16)
FSDP_DTYPES = ("fp32", "bf16")  # without and with a compute dtype
FSDP_BYTES_TOL = 0.02  # bytes per step vs the formula, relative: another padding or sharded norm gains move ~0.1 %
FSDP_MEMORY_TOL = 0.10  # after init and the forward/backward peak vs the formulas (XF.PEAK_TOL: the tracker's drift)


def _sent(log, world: int) -> float:
    return sum(F.wire_factor(op, world) * b for op, b in log)


def _one_step_bytes_and_peak(model, grad_sync, opt, x, y, track=M.track) -> tuple[float, float]:
    """Bytes this rank sends in one training step (helpers.comm counting) and the step's peak above its start."""
    with count_collectives() as log:
        trace = track(lambda: XF.step(model, grad_sync, opt, x, y), existing=M.model_state(model, opt, x, y))
    return _sent(log, dist.get_world_size()), float(trace.peak_bytes - trace.baseline_bytes)


# ---- in the parent: launches that never crash the driver ----


def _where_in(text: str, path: str) -> str:
    """file:line of the deepest frame of the student's files in a traceback's text (S.student_frame)."""
    return S.student_frame(re.findall(r'File "([^"]+)", line (\d+)', text or ""), path)


def _failure_detail(exc: BaseException, path: str) -> str:
    """One paragraph for a launch that failed: the rank and its error (signal, timeout) and where in the student's code."""
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
    return f"{first} (at {_where_in(tb, path)})" if tb else first


PARTS = ("course", "beyond")  # a worker's two parts: the checks within the handout's contract, and the probes beyond it


def _launch_each(worker, path: str, impls: list[str], opts: Options) -> dict:
    """impl -> the worker's per-rank results, or the exception that stopped its launch. All implementations in one
    launch; if it fails, each in a launch of its own, so a crash or hang is pinned on the implementation that caused
    it; if that fails too, the course's checks alone, then the probes beyond them alone: a crash or hang beyond the
    handout keeps the contract's results (each rank's dict then has "beyond_failed", what stopped the probes)."""

    def launch(names, parts=PARTS):
        return L.launch(
            functools.partial(worker, path, names, opts, parts),
            WORLD,
            backend="gloo",
            device="cpu",
            timeout_s=opts.timeout_s,
        )

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
        try:
            course = [r[impl] for r in launch([impl], ("course",))]
        except (L.RankError, TimeoutError):
            out[impl] = first  # the contract's part fails alone too: the implementation's error
            continue
        try:
            beyond = [r[impl] for r in launch([impl], ("beyond",))]
            out[impl] = [{**b, **{k: v for k, v in c.items() if v is not None}} for c, b in zip(course, beyond)]
        except (L.RankError, TimeoutError) as exc:
            out[impl] = [{**c, "beyond_failed": _failure_detail(exc, path)} for c in course]
    return out


def _beyond_failed(topic: str, impl: str, per_rank: list[dict]) -> list[Check]:
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


def _status_checks(topic: str, impl: str, got, path: str) -> list[Check] | None:
    """The one check for an implementation that could not run (launch failure, not implemented, skipped, wrong kind),
    else None."""
    if isinstance(got, BaseException):
        return [Check(topic, impl, "runs on 2 ranks", ERROR, _failure_detail(got, path))]
    first = got[0]
    if first["status"] != "ok":
        return [Check(topic, impl, "adapters", first["status"], first["detail"])]
    return None


def _timing_rows(topic: str, impl: str, samples_per_rank: list[dict], labels: dict, unit_scale=1e3) -> list[dict]:
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


# ======================================= DDP =======================================

DDP_OURS = {"individual": ("per_parameter", None), "bucketed": ("bucketed", 1.0), "ddp": ("bucketed", 1.0)}
SPEED_BUCKET_MB = 1.0


def ddp_bucket_sizes() -> list[float]:
    """Bucket sizes (MB) the bucketed flavour is checked at on the toy model: one tensor per bucket, two buckets (ours'
    plan), everything in one bucket."""
    return [1e-5, XD.bucket_mb_for(2), 100.0]


# ---- DDP beyond the handout: our toy (tied, frozen, unused parameters, a per-rank buffer), gradients vs float64 ----
# Beyond: the course's toy models have no unused parameter that requires a gradient and no buffer, and the handout
# asks for the parameters to be broadcast (2024-2026 DDP problems); a float64-derived bound is ours, not the tests'.


def _ddp_config(fns, impl: str, bucket_mb) -> dict:
    """One equivalence run of the student's flavour on the toy model (rank-seeded: the broadcast must fix it)."""
    rank = dist.get_rank()
    net = make_model("toy", rank)
    shim = S.StudentDDP(fns, impl, net, bucket_mb)
    start = make_model("toy", 0).state_dict()
    start_diff = [k for k, v in net.state_dict().items() if not torch.equal(v, start[k])]
    shim.optimizer = opt = XD.make_optimizer(shim.parameters(), "sgd")
    got = XD.gradient_checks("toy", shim, opt, make_batches("toy", **TOY), 0, "sgd")
    return {
        "bucket_mb": bucket_mb,
        "start_diff": start_diff,
        "steps": got["steps"],
        "weight_ratio": got["weight_ratio"],
        "state": got["state"],
        "synced": shim.synced,
    }


def _ddp_speed(fns, impl: str, opts: Options) -> dict:
    """Yours, ours (the same flavour) and torch DDP from the same weights, timed interleaved; then one more step each
    for bytes sent and the step's peak."""
    kind, mb = DDP_OURS[impl]
    wrappers = {
        "yours": lambda m: _untracked(S.StudentDDP(fns, impl, m, SPEED_BUCKET_MB)),
        "ours": lambda m: wrap(kind, m, mb),
        "pytorch": lambda m: wrap("torch_ddp", m, SPEED_BUCKET_MB),
    }
    built = {}

    def keep(label):
        def make(m):
            built[label] = w = wrappers[label](m)
            return w

        return make

    run = XD.bench_worker(
        model=SPEED["model"],
        bucket_mb=SPEED_BUCKET_MB,
        steps=opts.steps,
        warmup=opts.warmup,
        batch_size=SPEED["batch_size"],
        context_length=SPEED["context_length"],
        wrappers={k: keep(k) for k in wrappers},
    )
    x, y = rank_share(make_batches(SPEED["model"], 1, SPEED["batch_size"], SPEED["context_length"], 1)[0])
    sent, peak = {}, {}
    for label, w in built.items():
        opt = w.optimizer if isinstance(w, S.StudentDDP) else XD.make_optimizer(w.parameters(), "sgd")
        sent[label], peak[label] = _one_step_bytes_and_peak(w.module, w, opt, x, y)
    for w in built.values():
        w.close()
    return {
        "samples": run.step,
        "same_weights": run.same_weights,
        "sent": sent,
        "peak": peak,
        "grad_bytes": 4 * sum(p.numel() for p in make_model(SPEED["model"], 0).parameters() if p.requires_grad),
    }


def _untracked(shim: S.StudentDDP) -> S.StudentDDP:
    shim.keep = False
    return shim


def ddp_worker(path: str, impls: list[str], opts: Options, parts=PARTS) -> dict:
    """In each rank, per DDP flavour: the course's test on its models (each bucket size for the bucketed one), then
    beyond the handout our toy model at several bucket sizes, then the side-by-side timing; each in a phase of its
    own (an exception in one is its error, the others still run). {impl: outcome}."""
    out = {}
    for impl in impls:

        def run(impl=impl):
            fns = S.adapter_fns(path, "ddp", impl)
            course = beyond = speed = None
            if "course" in parts:
                course = [
                    S.phase(path, functools.partial(C.course_ddp_run, fns, impl, m, mb))
                    for m, mb in C.course_ddp_configs(impl)
                ]
            if "beyond" in parts:
                sizes = ddp_bucket_sizes() if impl == "bucketed" else [None]
                beyond = [S.phase(path, functools.partial(_ddp_config, fns, impl, mb)) for mb in sizes]
                speed = S.phase(path, lambda: _ddp_speed(fns, impl, opts)) if opts.timed and opts.steps else None
            return {"course": course, "configs": beyond, "speed": speed}

        out[impl] = S.outcome(run)
    return out


def _ddp_config_checks(impl: str, label: str, per_rank: list[dict]) -> list[Check]:
    """Broadcast at construction, gradients vs one process (with the likely mistake), same weights on every rank."""
    checks = []
    diff = sorted({k for r in per_rank for k in r["start_diff"]})
    buffers = {n for n, _ in make_model("toy", 0).named_buffers()}
    checks.append(
        Check(
            "ddp",
            impl,
            f"rank 0's weights at construction, {label}",
            FAIL if diff else PASS,
            f"after construction, rank(s) {[i for i, r in enumerate(per_rank) if r['start_diff']]} still "
            f"hold their own {', '.join(diff[:4])}{' ...' if len(diff) > 4 else ''} ("
            + (
                "buffers only: the parameters were broadcast, the buffers not; the handout asks for the "
                "parameters, and the course's models have no buffer)"
                if set(diff) <= buffers
                else "not broadcast from rank 0)"
            )
            if diff
            else "every rank starts from rank 0's weights",
        )
    )
    steps = [(rank, s) for rank, r in enumerate(per_rank) for s in r["steps"]]
    bad = [(rank, s) for rank, s in steps if not s.finite or not s.max_ratio <= 1]
    if not bad:
        worst = max(steps, key=lambda t: t[1].max_ratio)[1]
        checks.append(
            Check(
                "ddp",
                impl,
                f"gradients vs one process, {label}",
                PASS,
                f"{len(per_rank[0]['steps'])} steps, worst |diff| / float32 bound {worst.max_ratio:.3g} "
                f"at {worst.worst}",
            )
        )
    else:
        rank, s = min(bad, key=lambda t: (t[1].step, t[0]))
        unsynced = _unsynced(per_rank, s.step)
        if not s.finite:
            why = "non-finite (NaN/inf) gradient"
        elif diff:
            why = "the ranks did not start from rank 0's weights (the check above)"
        elif s.summed_ratio <= 1:
            why = (
                f"gradients exactly {WORLD}x one process's: summed over ranks, not averaged (divide by the world size)"
            )
        elif unsynced:
            why = (
                f"{', '.join(unsynced[:4])}'s gradient differs between ranks: not synchronized (a frozen, unused or "
                "tied parameter's handling, or a bucket never all-reduced)"
            )
        else:
            why = "the synced gradient is not the mean of the ranks' gradients"
        checks.append(
            Check(
                "ddp",
                impl,
                f"gradients vs one process, {label}",
                FAIL,
                f"step {s.step}, rank {rank}: {s.where}; |diff| / float32 bound {s.max_ratio:.3g} - {why}",
            )
        )
    states = [r["state"] for r in per_rank]
    differ = [k for k in states[0] if not all(torch.equal(states[0][k], st[k]) for st in states[1:])]
    checks.append(
        Check(
            "ddp",
            impl,
            f"same weights on every rank after {len(per_rank[0]['steps'])} steps, {label}",
            FAIL if differ else PASS,
            f"ranks end with different {', '.join(differ[:4])}" if differ else "bitwise equal",
        )
    )
    return checks


def _unsynced(per_rank: list[dict], step: int) -> list[str]:
    """Parameters whose synced gradient at `step` is not bitwise the same on every rank."""
    grads = [r["synced"][step] for r in per_rank if len(r["synced"]) > step]
    if len(grads) < 2:
        return []
    same = lambda a, b: (a is None and b is None) or (a is not None and b is not None and torch.equal(a, b))  # noqa: E731
    return [n for n in grads[0] if not all(same(grads[0][n], g.get(n)) for g in grads[1:])]


def _ddp_rows(impl: str, speed_per_rank: list[dict]) -> list[dict]:
    labels = {"yours": "yours", "ours": "ours", "pytorch": "pytorch"}
    rows = _timing_rows("ddp", impl, [s["samples"] for s in speed_per_rank], labels)
    first = speed_per_rank[0]
    for label in first["sent"]:
        hidden = label == "pytorch"  # torch DDP's C++ reducer calls the process group directly: nothing to count
        rows.append(
            {
                "topic": "ddp",
                "impl": impl,
                "measure": "bytes sent per step (rank 0)",
                "who": label,
                "value": float("nan") if hidden else first["sent"][label] / MiB,
                "unit": "MiB",
                **({"note": "not counted: torch DDP's reducer calls the process group from C++"} if hidden else {}),
            }
        )
        rows.append(
            {
                "topic": "ddp",
                "impl": impl,
                "measure": "peak of a step, worst rank",
                "who": label,
                "value": max(s["peak"][label] for s in speed_per_rank) / MiB,
                "unit": "MiB",
            }
        )
    rows.append(
        {
            "topic": "ddp",
            "impl": impl,
            "measure": "bytes sent per step (rank 0)",
            "who": "formula",
            "value": F.wire_factor("all_reduce", WORLD) * first["grad_bytes"] / MiB,
            "unit": "MiB",
        }
    )
    return rows


def run_ddp(adapters_path: str, opts: Options) -> TopicResult:
    """Every DDP flavour the file has (individual, bucketed, 2026's get_ddp): the course's test on its two toy models
    (at the 2024 test's bucket sizes), then beyond the handout our toy (tied, frozen and unused parameters, a buffer)
    at several bucket sizes, then yours vs ours vs torch DDP."""
    result = TopicResult("ddp")
    got = _launch_each(ddp_worker, str(adapters_path), list(A.ADAPTERS["ddp"]), opts)
    for impl, per_rank in got.items():
        early = _status_checks("ddp", impl, per_rank, str(adapters_path))
        if early:
            result.checks += early
            continue
        for k, (model, mb) in enumerate(C.course_ddp_configs(impl)):
            label = model + (f", bucket {mb:g} MB" if mb is not None else "")
            runs = [r["course"][k] for r in per_rank]
            error = S.phase_error("ddp", impl, f"{label}: the course's DDP test runs", runs, beyond=False)
            result.checks += [error] if error else C.course_ddp_checks(impl, label, runs)
        if _beyond_failed("ddp", impl, per_rank):
            result.checks += _beyond_failed("ddp", impl, per_rank)
            continue
        for configs in zip(*[r["configs"] for r in per_rank]):
            configs = list(configs)
            error = S.phase_error(
                "ddp",
                impl,
                "beyond the handout: our toy model (tied, frozen, unused, buffer) runs",
                configs,
                beyond=True,
            )
            if error:
                result.checks.append(error)
                continue
            mb = configs[0]["bucket_mb"]
            label = "our toy model (tied, frozen, unused, buffer)" + (f", bucket {mb:.3g} MB" if mb is not None else "")
            for c in _ddp_config_checks(impl, label, configs):
                c.beyond, c.prop = True, f"beyond the handout: {c.prop}"
                result.checks.append(c)
        speed = [r["speed"] for r in per_rank]
        if speed[0] is not None:
            error = S.phase_error("ddp", impl, "beyond the handout: timing, bytes and peak on small/cpu", speed, True)
            if error:
                result.checks.append(error)
                continue
            result.rows += _ddp_rows(impl, speed)
            same = all(r["same_weights"] for r in speed)
            result.rows.append(
                {
                    "topic": "ddp",
                    "impl": impl,
                    "measure": "same weights as ours and torch DDP after the timed steps",
                    "who": "yours",
                    "value": same,
                    "unit": "",
                }
            )
    return result


# ======================================= sharded optimizer =======================================

SHARDING_MEMORY = dict(model="small/cpu", batch_size=2, context_length=16)  # state bytes: a model with a formula


def sharding_worker(path: str, impls: list[str], opts: Options, parts=PARTS) -> dict:
    """In each rank, per implementation, each phase apart: the course's test on its two models and the state each
    rank keeps (within the handout); beyond it, unsharded AdamW, ours and yours on our toy model (bitwise), the state
    after one step of small/cpu vs the formula, and the three timed interleaved with torch's ZeRO."""
    out = {}
    for impl in impls:

        def run():
            make = S.student_optimizer(S.adapter_fns(path, "sharding", impl))
            course = partition = None
            if "course" in parts:
                course = [S.phase(path, functools.partial(C.course_sharding_run, make, m)) for m in CM.MODELS]
                partition = S.phase(path, lambda: C.course_state_growth(make))

            def beyond():  # bitwise (ours), on our toy (buffer, unused parameter): past the test's allclose
                runs = XS.equivalence_worker(
                    model="toy",
                    kinds=["unsharded", "sharded", "yours"],
                    optimizer="adamw",
                    impls={"yours": make},
                    **TOY,
                )
                return {
                    "runs": {
                        k: {
                            "weights": S.digest(r.weights) if dist.get_rank() else r.weights,
                            "same_grads": r.same_grads,
                            "collectives": r.collectives[-1],
                        }
                        for k, r in runs.items()
                    }
                }

            def memory():  # a balanced partition (1/N + a tensor) on small/cpu: the handout asks for a partition
                mem = XS.memory_worker(
                    kinds=["unsharded", "sharded", "torch_zero", "yours"],
                    impls={"yours": make},
                    steps=1,
                    **SHARDING_MEMORY,
                )
                return {
                    "growth": {k: _after(r, "after step") - _after(r, "before step") for k, r in mem.items()},
                    "peak": {k: max(p.peak for p in r.points) for k, r in mem.items()},
                }

            def timed():
                speed = XS.speed_worker(
                    kinds=["unsharded", "sharded", "torch_zero", "yours"],
                    steps=opts.steps,
                    warmup=opts.warmup,
                    impls={"yours": make},
                    **SPEED,
                )
                return {
                    "samples": {k: [s["fwd_bwd"] + s["step"] for s in v] for k, v in speed.samples.items()},
                    "same_weights": speed.same_weights,
                }

            if "beyond" not in parts:
                return {"course": course, "partition": partition, "beyond": None, "memory": None, "speed": None}
            return {
                "course": course,
                "partition": partition,
                "beyond": S.phase(path, beyond),
                "memory": S.phase(path, memory),
                "speed": S.phase(path, timed) if opts.timed and opts.steps else None,
            }

        out[impl] = S.outcome(run)
    return out


def _after(run, point: str) -> int:
    return next(p.live for p in run.points if p.point == point and p.step == 1)


def run_sharding(adapters_path: str, opts: Options) -> TopicResult:
    """The sharded optimizer: within the handout, the course's test (allclose to unsharded AdamW on ToyModel and
    ToyModelWithTiedWeights) and each rank keeping only part of the state; beyond it, bitwise equality on our toy,
    each rank's state at most 1/N of the total plus its largest tensor on small/cpu, and yours vs ours vs torch's
    ZeroRedundancyOptimizer."""
    result = TopicResult("sharding")
    for impl, per_rank in _launch_each(sharding_worker, str(adapters_path), list(A.ADAPTERS["sharding"]), opts).items():
        early = _status_checks("sharding", impl, per_rank, str(adapters_path))
        if early:
            result.checks += early
            continue
        for k, model in enumerate(CM.MODELS):
            runs = [r["course"][k] for r in per_rank]
            error = S.phase_error("sharding", impl, f"{model}: the course's sharded-optimizer test runs", runs, False)
            result.checks += [error] if error else C.course_sharding_checks(impl, model, runs)
        parts = [r["partition"] for r in per_rank]
        error = S.phase_error("sharding", impl, "ToyModel: optimizer state partitioned over ranks", parts, False)
        result.checks += [error] if error else [C.partition_check(impl, parts)]
        if _beyond_failed("sharding", impl, per_rank):
            result.checks += _beyond_failed("sharding", impl, per_rank)
            continue
        beyond = [r["beyond"] for r in per_rank]
        error = S.phase_error("sharding", impl, "beyond the handout: our toy model runs", beyond, True)
        result.checks += [error] if error else _sharding_checks(impl, beyond)
        memory = [r["memory"] for r in per_rank]
        error = S.phase_error("sharding", impl, "beyond the handout: state per rank on small/cpu runs", memory, True)
        result.checks += [error] if error else [_state_check(impl, memory)]
        speed = [r["speed"] for r in per_rank] if per_rank[0]["speed"] is not None else None
        error = speed and S.phase_error("sharding", impl, "beyond the handout: timing on small/cpu", speed, True)
        if error:
            result.checks.append(error)
        result.rows += _sharding_rows(impl, beyond, memory, None if error else speed)
    return result


def _sharding_checks(impl: str, per_rank: list[dict]) -> list[Check]:
    checks, steps = [], TOY["steps"]
    ref, mine = per_rank[0]["runs"]["unsharded"]["weights"], per_rank[0]["runs"]["yours"]["weights"]
    differ = [k for k in ref if not torch.equal(ref[k], mine[k])]
    if differ:
        k = max(differ, key=lambda k: float((ref[k] - mine[k]).abs().max()))
        d = (mine[k] - ref[k]).abs()
        index = tuple(int(i) for i in np.unravel_index(int(torch.nan_to_num(d, nan=float("inf")).argmax()), d.shape))
        why = (
            ""
            if all(per_rank[0]["runs"]["yours"]["same_grads"])
            else "; the averaged gradients it read already differed (does it change .grad?)"
        )
        checks.append(
            Check(
                "sharding",
                impl,
                f"bitwise equal to unsharded AdamW after {steps} steps (toy model)",
                FAIL,
                f"{len(differ)} of {len(ref)} tensors differ on rank 0, most {k}[{', '.join(map(str, index))}]"
                f": yours {float(mine[k][index]):.6g}, unsharded {float(ref[k][index]):.6g} (|diff| "
                f"{float(d[index]):.3g}, bound 0: the same arithmetic in the same order){why}",
            )
        )
    else:
        checks.append(
            Check(
                "sharding",
                impl,
                f"bitwise equal to unsharded AdamW after {steps} steps (toy model)",
                PASS,
                f"all {len(ref)} tensors bitwise equal on rank 0",
            )
        )
    digests = [S.digest(mine)] + [r["runs"]["yours"]["weights"] for r in per_rank[1:]]
    split = [k for k in digests[0] if any(d[k] != digests[0][k] for d in digests[1:])]
    checks.append(
        Check(
            "sharding",
            impl,
            "same weights on every rank",
            FAIL if split else PASS,
            f"ranks hold different {', '.join(split[:4])}: an owner's update not broadcast"
            if split
            else "bitwise equal on every rank",
        )
    )
    return [Check(c.topic, c.impl, "beyond the handout: " + c.prop, c.status, c.detail, beyond=True) for c in checks]


def _state_check(impl: str, per_rank: list[dict]) -> Check:
    """Beyond the handout: each rank's state after one step of small/cpu at most 1/N of the whole + its largest
    tensor (a balanced partition by whole tensors)."""
    full = max(r["growth"]["unsharded"] for r in per_rank)
    slack = XS.whole_tensor_slack(SHARDING_MEMORY["model"])
    limit = full / WORLD + slack
    worst = max(range(len(per_rank)), key=lambda i: per_rank[i]["growth"]["yours"])
    held = per_rank[worst]["growth"]["yours"]
    detail = (
        f"rank {worst} holds {held / MiB:.3f} MiB of optimizer state after the first step ({held / full:.0%} of "
        f"unsharded AdamW's {full / MiB:.3f} MiB); bound 1/{WORLD} + its largest tensor = {limit / MiB:.3f} MiB"
    )
    if held > limit:
        detail += (
            " - each rank holds all the state: sharded state not partitioned (step only the parameters this rank owns)"
            if held >= 0.9 * full
            else " - the partition is unbalanced"
        )
    return Check(
        "sharding",
        impl,
        f"beyond the handout: state per rank <= 1/{WORLD} + largest tensor (small/cpu)",
        FAIL if held > limit else PASS,
        detail,
        beyond=True,
    )


def _sharding_rows(impl: str, beyond: list[dict], memory: list[dict], speed: list[dict] | None) -> list[dict]:
    labels = {"yours": "yours", "sharded": "ours", "torch_zero": "pytorch", "unsharded": "unsharded AdamW"}
    rows = []
    per_rank = memory
    for kind in ("yours", "sharded", "torch_zero", "unsharded") if memory[0]["status"] == "ok" else ():
        rows.append(
            {
                "topic": "sharding",
                "impl": impl,
                "measure": "optimizer state per rank, worst rank",
                "who": labels[kind],
                "value": max(r["growth"][kind] for r in per_rank) / MiB,
                "unit": "MiB",
            }
        )
        rows.append(
            {
                "topic": "sharding",
                "impl": impl,
                "measure": "peak over a step, worst rank",
                "who": labels[kind],
                "value": max(r["peak"][kind] for r in per_rank) / MiB,
                "unit": "MiB",
            }
        )
    rows.append(
        {
            "topic": "sharding",
            "impl": impl,
            "measure": "optimizer state per rank, worst rank",
            "who": "formula",
            "value": max(F.state_bytes("sharded", SHARDING_MEMORY["model"], WORLD, r) for r in range(WORLD)) / MiB,
            "unit": "MiB",
        }
    )
    # the optimizer's own collectives: the all-reduce is the shared DDPBucketed's
    for kind in ("yours", "sharded") if beyond[0]["status"] == "ok" else ():
        log = [(op, b) for op, b in beyond[0]["runs"][kind]["collectives"] if op != "all_reduce"]
        rows.append(
            {
                "topic": "sharding",
                "impl": impl,
                "measure": "bytes sent by step() (rank 0, toy model)",
                "who": labels[kind],
                "value": _sent(log, WORLD) / MiB,
                "unit": "MiB",
            }
        )
    if speed:
        rows += _timing_rows("sharding", impl, [r["samples"] for r in speed], labels)
        rows.append(
            {
                "topic": "sharding",
                "impl": impl,
                "measure": "same weights as unsharded after the timed steps",
                "who": "yours",
                "value": all(r["same_weights"]["yours"] for r in speed),
                "unit": "",
            }
        )
    return rows


# ======================================= FSDP =======================================


def _fsdp_step_bytes(kind: str, impl) -> tuple[list, float]:
    """One fp32 AdamW step of a fresh model (yours or ours): the collectives it called and its peak above its start."""
    cfg = FSDP_CHECK
    net, grad_sync, opt = XF.build_kind(kind, cfg["model"], impl=impl)
    x, y = rank_share(make_batches(cfg["model"], 1, cfg["batch_size"], cfg["context_length"], 0)[0])
    XF.step(net, grad_sync, opt, x, y)  # the first step records call orders, makes optimizer state
    with count_collectives() as log:
        XF.step(net, grad_sync, opt, x, y)
    return list(log)


def fsdp_worker(path: str, impls: list[str], opts: Options, parts=PARTS) -> dict:
    """In each rank, each phase apart: the 2026 test on the cs336_basics model (fp32 and fp16; when the student's
    cs336_basics imports) and the memory after get_fsdp; beyond the handout, our TransformerLM seeded per rank with SGD
    without and with bf16 compute (opts.repeat times), memory and bytes vs the formulas, and the timing."""
    out, cfg, rank = {}, FSDP_CHECK, dist.get_rank()
    for impl_name in impls:

        def run():
            impl = S.student_fsdp(S.adapter_fns(path, "fsdp", impl_name))
            course = None
            try:
                if "course" not in parts:
                    raise C.NotAsked
                C.course_layers()
                course = {}
                for dtype in C.COURSE_FSDP_DTYPES:
                    course[f"run {dtype}"] = S.phase(path, functools.partial(C.course_fsdp_run, impl, dtype))
                    course[f"grads {dtype}"] = S.phase(path, functools.partial(C.course_fsdp_grads, impl, dtype))
                course["memory"] = S.phase(path, functools.partial(C.course_fsdp_memory, impl))
            except C.NotAsked:
                pass
            except Exception as exc:  # noqa: BLE001 - no cs336_basics: the course's test cannot run either
                course = {"missing": f"{type(exc).__name__}: {exc}"}

            # Beyond the 2026 handout: torch.nn layers seeded per rank (the test uses cs336_basics with one seed),
            # bf16, exact peaks and bytes against the formulas (it promises shards, not a peak), races over repeats.
            def equivalence():
                repeats = []
                for r in range(max(1, opts.repeat)):
                    runs = XF.equivalence_worker(
                        model=cfg["model"],
                        n_layers=cfg["n_layers"],
                        dtypes=list(FSDP_DTYPES),
                        steps=cfg["steps"],
                        batch_size=cfg["batch_size"],
                        context_length=cfg["context_length"],
                        impl=impl,
                    )
                    full = rank == 0 and r == 0
                    repeats.append({d: [w if full else S.digest(w) for w in run.weights] for d, run in runs.items()})
                return {"repeats": repeats}

            def memory():
                return {
                    "memory": {
                        k: XF.fsdp_memory(
                            model=cfg["model"],
                            batch_size=cfg["batch_size"],
                            context_length=cfg["context_length"],
                            steps=1,
                            impl=i,
                        )
                        for k, i in (("yours", impl), ("ours", None))
                    }
                }

            def logs():
                return {"logs": {"yours": _fsdp_step_bytes("yours", impl), "ours": _fsdp_step_bytes("fsdp", None)}}

            def timed():
                return {
                    "samples": XF.measure_worker(
                        kinds=("yours", "fsdp", "torch_fsdp"),
                        steps=opts.steps,
                        warmup=opts.warmup,
                        memory=False,
                        trace=False,
                        impls={"yours": impl},
                        **SPEED,
                    ).samples
                }

            if "beyond" not in parts:
                return {"course": course, "equivalence": None, "memory": None, "logs": None, "speed": None}
            return {
                "course": course,
                "equivalence": S.phase(path, equivalence),
                "memory": S.phase(path, memory),
                "logs": S.phase(path, logs),
                "speed": S.phase(path, timed) if opts.timed and opts.steps else None,
            }

        out[impl_name] = S.outcome(run)
    return out


def _update_check(before: dict, after: dict, x, y, dtype: str) -> tuple[float, float, str]:
    """One SGD step from `before` vs one process's: max |w_after - (w - lr g_ref)| / bound, the same against N x g_ref
    (a sum, not a mean), and the worst element. Bound: lr x the gradient bound (XF.bound) + one rounding of each of
    w and lr g (float32)."""
    cfg, eps = FSDP_CHECK, torch.finfo(torch.float32).eps
    load = functools.partial(XF.loaded, cfg["model"], cfg["n_layers"], before)
    if dtype == "fp32":
        ref = XF.reference_grads(load(), x, y, dtype)
    else:
        shares = [(x[r], y[r]) for r in (rank_rows(x.shape[0], k, WORLD) for k in range(WORLD))]
        ref = XF.ranks_reference(load, shares, dtype)
    lim = {n: v.detach() for n, v in XF.bound(load(), x, y, dtype).items()}
    worst, summed, where = 0.0, 0.0, ""
    for n, w in before.items():
        g = ref[n].detach()
        round_ = 2 * eps * (w.abs() + XF.LR * g.abs())
        diff = (after[n] - (w - XF.LR * g)).abs()
        ratio = torch.nan_to_num(diff / (XF.LR * lim[n] + round_).clamp_min(1e-30), nan=float("inf"))
        s = (after[n] - (w - WORLD * XF.LR * g)).abs() / (WORLD * XF.LR * lim[n] + round_).clamp_min(1e-30)
        summed = max(summed, float(torch.nan_to_num(s, nan=float("inf")).max()))
        if float(ratio.max()) > worst or not where:
            i = tuple(int(k) for k in np.unravel_index(int(ratio.argmax()), tuple(w.shape)))
            worst = float(ratio.max())
            where = (
                "non-finite weights after the step (NaN/inf); " if not bool(torch.isfinite(after[n]).all()) else ""
            ) + (
                f"{n}[{', '.join(map(str, i))}]: yours {float(after[n][i]):.6g}, one process "
                f"{float(w[i] - XF.LR * g[i]):.6g} (|diff| {float(diff[i]):.3g}, bound "
                f"{float(XF.LR * lim[n][i] + round_[i]):.3g})"
            )
    return worst, summed, where


def _fsdp_equivalence_checks(impl: str, per_rank: list[dict], repeat: int) -> list[Check]:
    cfg, checks = FSDP_CHECK, []
    names = [n for n, _ in XF.build(cfg["model"], cfg["n_layers"], seed=0).named_parameters()]
    first = per_rank[0]["repeats"][0]
    try:
        full = {d: [S.aligned(w, names) for w in ws] for d, ws in first.items()}
    except ValueError as exc:
        return [Check("fsdp", impl, "fsdp_gather_full_params returns the full weights", FAIL, str(exc))]
    start = {n: p.detach().cpu() for n, p in XF.build(cfg["model"], cfg["n_layers"], seed=0).named_parameters()}
    w0 = full["fp32"][0]
    bad = [n for n in names if w0[n].shape != start[n].shape or not torch.equal(w0[n], start[n])]
    checks.append(
        Check(
            "fsdp",
            impl,
            "fsdp_gather_full_params after construction is rank 0's model",
            FAIL if bad else PASS,
            f"{len(bad)} of {len(names)} parameters differ from rank 0's, e.g. {bad[0]} (shape "
            f"{tuple(w0[bad[0]].shape)} vs {tuple(start[bad[0]].shape)}): not broadcast from rank 0, or not "
            "the full weights"
            if bad
            else f"all {len(names)} parameters, full shapes, rank 0's values",
        )
    )
    batches = make_batches(cfg["model"], cfg["steps"], cfg["batch_size"], cfg["context_length"], 0)
    for dtype, ws in full.items():
        label = "fp32" if dtype == "fp32" else f"compute dtype {dtype}"
        results = [(s, *_update_check(ws[s], ws[s + 1], *batches[s], dtype)) for s in range(cfg["steps"])]
        fails = [r for r in results if not r[1] <= 1]
        if fails:
            s, ratio, summed, where = fails[0]
            why = f" - gradients exactly {WORLD}x one process's: summed over ranks, not averaged" if summed <= 1 else ""
            checks.append(
                Check(
                    "fsdp",
                    impl,
                    f"SGD steps vs one process ({label})",
                    FAIL,
                    f"step {s}: {where}; |diff| / bound {ratio:.3g}{why}",
                )
            )
        else:
            checks.append(
                Check(
                    "fsdp",
                    impl,
                    f"SGD steps vs one process ({label})",
                    PASS,
                    f"{cfg['steps']} steps, worst |diff| / bound {max(r[1] for r in results):.3g}",
                )
            )
    digests = {d: [S.digest(w) for w in ws] for d, ws in first.items()}
    split = [
        (d, s, k)
        for r in per_rank[1:]
        for d, ws in r["repeats"][0].items()
        for s, w in enumerate(ws)
        for k in w
        if w[k] != digests[d][s].get(k)
    ]
    checks.append(
        Check(
            "fsdp",
            impl,
            "every rank gathers the same weights",
            FAIL if split else PASS,
            f"{split[0][0]}, step {split[0][1]}: rank 1's {split[0][2]} differs from rank 0's"
            if split
            else "bitwise equal on every rank",
        )
    )
    races = [
        (i, d, s, k)
        for rank, r in enumerate(per_rank)
        for i, rep in enumerate(r["repeats"][1:], 1)
        for d, ws in rep.items()
        for s, w in enumerate(ws)
        for k in w
        if w[k] != (digests if rank == 0 else r["repeats"][0])[d][s].get(k)
    ]
    if repeat > 1:
        checks.append(
            Check(
                "fsdp",
                impl,
                f"{repeat} repeats bitwise equal (no races)",
                FAIL if races else PASS,
                f"repeat {races[0][0]} ({races[0][1]}, step {races[0][2]}) differs at {races[0][3]}: a race "
                "(a buffer read before its async collective finished?)"
                if races
                else f"all {repeat} repeats bitwise equal",
            )
        )
    return checks


def _fsdp_memory_checks(impl: str, per_rank: list[dict]) -> tuple[list[Check], list[dict]]:
    cfg, checks, rows = FSDP_CHECK, [], []
    model, b, t = cfg["model"], cfg["batch_size"] // WORLD, cfg["context_length"]
    init_formula = sum(F.fsdp_live_bytes(model, WORLD, b, t, "after init").values())
    full_params = 4 * F.meta_numel(model) + F.buffer_bytes(model)
    rank, mem = max(enumerate(per_rank), key=lambda r: r[1]["memory"]["yours"].points[0].live)
    live = mem["memory"]["yours"].points[0].live
    ok = live <= (1 + FSDP_MEMORY_TOL) * init_formula
    detail = (
        f"rank {rank} holds {live / MiB:.3f} MiB after get_fsdp; formula (1/{WORLD} of the weights, padded, "
        f"norm gains whole) {init_formula / MiB:.3f} MiB, tolerance {FSDP_MEMORY_TOL:.0%}"
    )
    if not ok:
        detail += (
            " - the full weights are still live: not sharded at init (keep only this rank's shard)"
            if live >= 0.9 * full_params
            else " - more than a shard per rank"
        )
    checks.append(Check("fsdp", impl, "memory per rank after init vs formula", PASS if ok else FAIL, detail))
    acts = sum(F.activation_bytes(model, b, t).values()) + F.loss_grad_bytes(model, b, t)
    gathered_all = F.fsdp_shard_elements(model, WORLD)["sharded"] * WORLD * 4
    own = F.fsdp_shard_elements(model, WORLD)
    # + this rank's fp32 gradient shards and gains, made in this first backward, and the full-size fp32 inputs of the
    # reduce-scatters still in flight (an async reduce-scatter keeps its input until it is done: all of them, at most)
    formula = (
        acts
        + F.fsdp_gathered_peak_bytes(model, WORLD, modules=2)
        + 4 * (own["sharded"] + own["replicated"])
        + gathered_all
    )
    worst = max(range(len(per_rank)), key=lambda i: _fb_peak(per_rank[i]["memory"]["yours"]))
    peak = _fb_peak(per_rank[worst]["memory"]["yours"])
    ok = peak <= (1 + FSDP_MEMORY_TOL) * formula
    detail = (
        f"rank {worst}: forward/backward peak {peak / MiB:.3f} MiB above the step's start; formula "
        f"(activations + loss gradients + 2 modules' gathered weights + gradient shards + reduce-scatter inputs "
        f"in flight) {formula / MiB:.3f} MiB, tolerance "
        f"{FSDP_MEMORY_TOL:.0%}"
    )
    if not ok:
        detail += (
            f" - {(peak - formula) / MiB:.3f} MiB more, {(peak - formula) / gathered_all:.0%} of all gathered "
            f"weights ({gathered_all / MiB:.3f} MiB): gathered weights never freed (the peak grows by a "
            "layer's weights per layer)"
        )
    checks.append(
        Check("fsdp", impl, "forward/backward peak vs formula (gathered weights freed)", PASS if ok else FAIL, detail)
    )
    for who in ("yours", "ours"):
        rows.append(
            {
                "topic": "fsdp",
                "impl": impl,
                "measure": "live after init, worst rank",
                "who": who,
                "value": max(r["memory"][who].points[0].live for r in per_rank) / MiB,
                "unit": "MiB",
            }
        )
        rows.append(
            {
                "topic": "fsdp",
                "impl": impl,
                "measure": "forward/backward peak, worst rank",
                "who": who,
                "value": max(_fb_peak(r["memory"][who]) for r in per_rank) / MiB,
                "unit": "MiB",
            }
        )
    rows.append(
        {
            "topic": "fsdp",
            "impl": impl,
            "measure": "live after init, worst rank",
            "who": "formula",
            "value": init_formula / MiB,
            "unit": "MiB",
        }
    )
    for measure in ("live after init, worst rank", "forward/backward peak, worst rank"):
        rows.append(
            {
                "topic": "fsdp",
                "impl": impl,
                "measure": measure,
                "who": "pytorch",
                "value": float("nan"),
                "unit": "MiB",
                "note": "not measured: fully_shard's DTensor storages are opaque to helpers.memory's "
                "tracker on CPU (on a GPU the allocator's peak would do)",
            }
        )
    rows.append(
        {
            "topic": "fsdp",
            "impl": impl,
            "measure": "forward/backward peak, worst rank",
            "who": "formula",
            "value": formula / MiB,
            "unit": "MiB",
        }
    )
    return checks, rows


def _fb_peak(run) -> int:
    p = next(p for p in run.points if p.point == "before step")
    return p.phase_peak - p.phase_start


def _fsdp_bytes_checks(impl: str, per_rank: list[dict]) -> tuple[list[Check], list[dict]]:
    e = F.fsdp_shard_elements(FSDP_CHECK["model"], WORLD)
    formula = fsdp_bytes_per_step(e["sharded"] * WORLD, WORLD, 4, 4, e["replicated"])
    sent = {who: bytes_sent(per_rank[0]["logs"][who], WORLD) for who in ("yours", "ours")}
    rows = [
        {
            "topic": "fsdp",
            "impl": impl,
            "measure": "bytes sent per step (rank 0)",
            "who": who,
            "value": v / MiB,
            "unit": "MiB",
        }
        for who, v in {**sent, "formula": formula}.items()
    ]
    if not sent["yours"]:
        return [
            Check(
                "fsdp",
                impl,
                "bytes per step vs formula",
                SKIPPED,
                "no collective seen: calls must go through torch.distributed's functions to be counted",
            )
        ], rows
    ok = abs(sent["yours"] - formula) <= FSDP_BYTES_TOL * formula
    ops = {}
    for op, nbytes in per_rank[0]["logs"]["yours"]:
        ops[op] = ops.get(op, 0) + nbytes
    detail = (
        f"{sent['yours'] / MiB:.3f} MiB sent per step by rank 0 vs formula 3(N-1)/N x Psi x 4 B + the norm gains' "
        f"all-reduce = {formula / MiB:.3f} MiB (tolerance {FSDP_BYTES_TOL:.0%}); by collective: "
        + ", ".join(f"{op} {b / MiB:.3f} MiB" for op, b in ops.items())
    )
    if not ok:
        detail += (
            " - more than the formula: gradients all-reduced instead of reduce-scattered, or weights gathered "
            "more than twice"
            if sent["yours"] > formula
            else " - less than the formula: weights not gathered again for backward (kept from forward?)"
        )
    return [Check("fsdp", impl, "bytes per step vs formula (fp32)", PASS if ok else FAIL, detail)], rows


def run_fsdp(adapters_path: str, opts: Options) -> TopicResult:
    """FSDP: within the handout, the 2026 test on the cs336_basics model (fp32 and fp16 steps vs one process,
    gradients' shapes and dtypes, replicated gradients equal) and a shard per rank after get_fsdp; beyond it, our
    TransformerLM seeded per rank (rank 0's weights, fp32 and bf16 steps within the derived bound, opts.repeat
    times), memory and bytes vs the formulas, and yours vs ours vs torch's fully_shard."""
    result = TopicResult("fsdp")
    for impl, per_rank in _launch_each(fsdp_worker, str(adapters_path), list(A.ADAPTERS["fsdp"]), opts).items():
        early = _status_checks("fsdp", impl, per_rank, str(adapters_path))
        if early:
            result.checks += early
            continue
        if "missing" in per_rank[0]["course"]:  # the course's test cannot run without it either
            result.checks.append(
                Check(
                    "fsdp",
                    impl,
                    "the 2026 test's model (cs336_basics.model)",
                    SKIPPED,
                    f"cs336_basics.model does not import ({per_rank[0]['course']['missing']}): the "
                    "course's FSDP test builds its model from it; put your cs336-basics on the path",
                )
            )
        else:
            result.checks += C.course_fsdp_checks(
                impl, {k: [r["course"][k] for r in per_rank] for k in per_rank[0]["course"]}
            )
        if _beyond_failed("fsdp", impl, per_rank):
            result.checks += _beyond_failed("fsdp", impl, per_rank)
            continue
        beyond = []
        phases = (
            ("equivalence", lambda ph: _fsdp_equivalence_checks(impl, ph, max(1, opts.repeat)), "runs"),
            ("memory", lambda ph: _rows_into(result, _fsdp_memory_checks(impl, ph)), "memory"),
            ("logs", lambda ph: _rows_into(result, _fsdp_bytes_checks(impl, ph)), "bytes per step"),
        )
        for key, checks_of, what in phases:
            ph = [r[key] for r in per_rank]
            error = S.phase_error("fsdp", impl, f"our TransformerLM ({what})", ph, beyond=True)
            beyond += [error] if error else checks_of(ph)
        speed = [r["speed"] for r in per_rank] if per_rank[0]["speed"] is not None else None
        error = speed and S.phase_error("fsdp", impl, "timing on small/cpu", speed, beyond=True)
        if error:
            beyond.append(error)
        elif speed:
            labels = {"yours": "yours", "fsdp": "ours", "torch_fsdp": "pytorch"}
            result.rows += _timing_rows("fsdp", impl, [r["samples"] for r in speed], labels)
        for c in beyond:
            c.beyond, c.prop = True, c.prop if c.prop.startswith("beyond") else f"beyond the handout: {c.prop}"
        result.checks += beyond
    return result


def _rows_into(result: TopicResult, checks_rows: tuple[list[Check], list[dict]]) -> list[Check]:
    checks, rows = checks_rows
    result.rows += rows
    return checks


# ======================================= notebooks 04, 05, 07 =======================================

RUNS = {"ddp": run_ddp, "sharding": run_sharding, "fsdp": run_fsdp}


def notebook_tables(topic: str, adapters_path: str, opts: Options | None = None):
    """A notebook's "yours" section (when its ADAPTERS parameter is set): (checks, side_by_side, ratios) DataFrames
    (checks with a "beyond" column: True for the probes past the handout, which never count);
    side_by_side has one column per who (yours, ours, pytorch, formula) for each measure, ratios the paired step-time
    ratios of yours to the others with their intervals and verdicts."""
    import pandas as pd

    result = RUNS[topic](str(adapters_path), opts or Options())
    checks = pd.DataFrame(result.as_rows(), columns=CHECK_COLUMNS)  # "beyond": a probe past the handout
    rows = pd.DataFrame(result.rows, columns=sorted({k for r in result.rows for k in r} | {"measure", "who", "value"}))
    is_ratio = rows["measure"].astype(str).str.contains(" / ")
    side = (
        rows[~is_ratio]
        .assign(value=lambda d: d["value"].astype(object))
        .pivot_table(index=["impl", "measure", "unit"], columns="who", values="value", aggfunc="first", sort=False)
        if (~is_ratio).any()
        else pd.DataFrame()
    )
    ratios = rows[is_ratio].reindex(columns=["impl", "measure", "ratio", "ratio_low", "ratio_high", "pairs", "verdict"])
    return checks, side, ratios
