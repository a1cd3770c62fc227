"""`yours` for DDP (each flavour; helpers.course.yours.distributed): the course's test on its toy models and the
course's LM (helpers.course.yours.ddp.lm), beyond them our toy (tied, frozen and unused parameters, a per-rank buffer)
at several bucket sizes, then yours vs ours vs torch DDP."""

from __future__ import annotations

import functools

import torch
import torch.distributed as dist

import helpers.course.yours.adapters as A
import helpers.course.yours.ddp.contract as C
import helpers.course.yours.student_calls as S
from helpers import formulas as F
from helpers import memory as M
from helpers.comm import count_collectives
from helpers.course.yours.ddp.lm import LM_WORLD, lm_worker
from helpers.course.yours.ddp.lm_checks import lm_checks
from helpers.course.yours.dist_common import (
    PARTS,
    SPEED,
    TOY,
    WORLD,
    beyond_failed,
    environment_checks,
    launch_each,
    sent_bytes,
    status_checks,
    timing_rows,
)
from helpers.course.yours.options import Options
from helpers.course.yours.report import FAIL, PASS, Check, TopicResult
from helpers.ddp import wrap
from helpers.experiments import ddp as XD
from helpers.experiments import fsdp as XF
from helpers.experiments.common import make_batches, make_model, rank_share
from helpers.formulas import MiB


def _one_step_bytes_and_peak(model, grad_sync, opt, x, y, track=M.track) -> tuple[float, float]:
    """Bytes this rank sends in one training step (helpers.comm counting) and the step's peak above its start."""
    with count_collectives() as log:
        trace = track(lambda: XF.step(model, grad_sync, opt, x, y), existing=M.model_state(model, opt, x, y))
    return sent_bytes(log, dist.get_world_size()), float(trace.peak_bytes - trace.baseline_bytes)


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
    rows = timing_rows("ddp", impl, [s["samples"] for s in speed_per_rank], labels)
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
    (at the 2024 test's bucket sizes) and the course's LM on 3 ranks (bucketed: at the handout's 1 to 1000 MB and two
    sizes giving several buckets; helpers.course.yours.ddp.lm), then beyond the handout our toy (tied, frozen and
    unused parameters, a buffer) at several bucket sizes, then yours vs ours vs torch DDP."""
    result = TopicResult("ddp")
    got = launch_each(ddp_worker, str(adapters_path), list(A.ADAPTERS["ddp"]), opts)
    runnable = [impl for impl, per_rank in got.items() if not status_checks("ddp", impl, per_rank, "")]
    on_lm = {}  # the course's LM on LM_WORLD ranks, a launch of its own
    if runnable:
        on_lm = launch_each(lm_worker, str(adapters_path), runnable, opts, world=LM_WORLD, parts=("course",))
    for impl, per_rank in got.items():
        result.checks += environment_checks("ddp", impl, per_rank)
        early = status_checks("ddp", impl, per_rank, str(adapters_path))
        if early:
            result.checks += early
            continue
        for k, (model, mb) in enumerate(C.course_ddp_configs(impl)):
            label = model + (f", bucket {mb:g} MB" if mb is not None else "")
            runs = [r["course"][k] for r in per_rank]
            error = S.phase_error("ddp", impl, f"{label}: the course's DDP test runs", runs, beyond=False)
            result.checks += [error] if error else C.course_ddp_checks(impl, label, runs)
        result.checks += environment_checks("ddp", impl, on_lm[impl]) + lm_checks(impl, on_lm[impl], str(adapters_path))
        if beyond_failed("ddp", impl, per_rank):
            result.checks += beyond_failed("ddp", impl, per_rank)
            continue
        for configs in zip(*[r["configs"] for r in per_rank], strict=True):  # one per bucket size, each rank
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
