"""`yours` for the sharded optimizer: the course's test, a partitioned state and the handout's rules its test never
tries (helpers.course.yours.sharding.rules: groups, add_param_group, zero_grad); beyond it bitwise equality with
unsharded AdamW, state per rank vs the formula and the timing beside torch's ZeRO (helpers.course.yours.distributed).
All in one launch, and the partition's rules again on R.WIDE ranks in a second (R.wide_run); judge_sharding turns
one implementation's per-rank results into checks and rows."""

from __future__ import annotations

import functools

import numpy as np
import torch
import torch.distributed as dist

import helpers.course.yours.adapters as A
import helpers.course.yours.course_models as CM
import helpers.course.yours.sharding.contract as C
import helpers.course.yours.sharding.rule_checks as RC
import helpers.course.yours.sharding.rules as R
import helpers.course.yours.student_calls as S
from helpers import formulas as F
from helpers.course.yours.dist_common import (
    PARTS,
    SPEED,
    TOY,
    WORLD,
    beyond_failed,
    environment_checks,
    launch_each,
    ran_everywhere,
    sent_bytes,
    status_checks,
    timing_rows,
    wider_checks,
)
from helpers.course.yours.options import Options
from helpers.course.yours.report import FAIL, PASS, Check, TopicResult
from helpers.experiments import sharding as XS
from helpers.formulas import MiB

SHARDING_MEMORY = dict(model="small/cpu", batch_size=2, context_length=16)  # state bytes: a model with a formula


def sharding_worker(path: str, impls: list[str], opts: Options, parts=PARTS) -> dict:
    """In each rank, per implementation, each phase apart: the course's test on its two models, the state each
    rank keeps and the handout's rules (rules_worker), all within the handout; beyond it, unsharded AdamW, ours and
    yours on our toy model (bitwise), the state after one step of small/cpu vs the formula, and the three timed
    interleaved with torch's ZeRO."""
    out = {}
    for impl in impls:

        def run(impl=impl):
            make = _student(path, impl)
            course = partition = rules = None
            if "course" in parts:
                course = [S.phase(path, functools.partial(C.course_sharding_run, make, m)) for m in CM.MODELS]
                partition = S.phase(path, lambda: C.course_state_growth(make))
                rules = rules_worker(path, make)

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

            within = {"course": course, "partition": partition, "rules": rules}
            if "beyond" not in parts:
                return {**within, "beyond": None, "memory": None, "speed": None}
            return {
                **within,
                "beyond": S.phase(path, beyond),
                "memory": S.phase(path, memory),
                "speed": S.phase(path, timed) if opts.timed and opts.steps else None,
            }

        out[impl] = S.outcome(run)
    return out


def rules_worker(path: str, make) -> dict:
    """The handout's rules beyond the course's test (helpers.course.yours.sharding.rules), each phase apart: groups
    with their own hyperparameters (AdamW, SGD), add_param_group during training, zero_grad() over every
    parameter."""
    out = {p.name: S.phase(path, functools.partial(R.groups_run, make, p)) for p in R.PROBES}
    out["add"] = S.phase(path, lambda: R.add_run(make))
    out["zero_grad"] = S.phase(path, lambda: R.zero_grad_run(make))
    return out


def rules_checks(impl: str, per_rank: list[dict]) -> list[Check]:
    """The checks of rules_worker's phases (an error row for a phase that raised; a crash on dict groups says the
    course's list of tensors ran)."""
    checks, rules = [], [r["rules"] for r in per_rank]
    course_ran = all(run["status"] == "ok" for r in per_rank for run in r["course"])
    for probe in R.PROBES:
        runs = [r[probe.name] for r in rules]
        error = S.phase_error("sharding", impl, R.groups_prop(probe), runs, False)
        if error and course_ran:
            error.detail += (
                " - the same optimizer runs on the course's list of tensors: parameter groups (dicts), which the "
                "handout allows for params, break it"
            )
        checks.append(error or RC.groups_check(impl, probe, runs))
    runs = [r["add"] for r in rules]
    error = S.phase_error("sharding", impl, R.ADD_PROP.format("added parameters stepped"), runs, False)
    checks += [error] if error else RC.add_checks(impl, runs)
    runs = [r["zero_grad"] for r in rules]
    error = S.phase_error("sharding", impl, R.ZERO_GRAD_PROP, runs, False)
    checks.append(error or RC.zero_grad_check(impl, runs))
    return checks


def _after(run, point: str) -> int:
    return next(p.live for p in run.points if p.point == point and p.step == 1)


def run_sharding(adapters_path: str, opts: Options) -> TopicResult:
    """The sharded optimizer: within the handout, the course's test (allclose to unsharded AdamW on ToyModel and
    ToyModelWithTiedWeights), each rank keeping only part of the state, and the handout's rules the test never tries
    (groups with their own hyperparameters, add_param_group during training, zero_grad() of every parameter); beyond
    it, bitwise equality on our toy, each rank's state at most 1/N of the total plus its largest tensor on small/cpu,
    and yours vs ours vs torch's ZeroRedundancyOptimizer. One launch (launch_each), and one on R.WIDE ranks for the
    weights and the state per rank again (R.wide_run)."""
    result, path = TopicResult("sharding"), str(adapters_path)
    got = launch_each(sharding_worker, path, list(A.ADAPTERS["sharding"]), opts)
    runnable = [  # the course's test ran on 2 ranks, else R.WIDE ranks add nothing
        impl
        for impl, per_rank in got.items()
        if ran_everywhere("sharding", per_rank, lambda r: (r.get("course") or [{}])[0])
    ]
    wide = launch_each(wide_worker, path, runnable, opts, world=R.WIDE, parts=("course",)) if runnable else {}
    for impl, per_rank in got.items():
        judge_sharding(result, impl, per_rank, path, wide.get(impl))
    return result


def wide_worker(path: str, impls: list[str], opts: Options, parts=("course",)) -> dict:
    """In each of R.WIDE ranks, per implementation: weights and state vs one process's (R.wide_run)."""
    return {impl: S.outcome(functools.partial(_wide, path, impl)) for impl in impls}


def _wide(path: str, impl: str) -> dict:
    make = _student(path, impl)
    return {"wide": S.phase(path, lambda: R.wide_run(make))}


def wide_checks(impl: str, got, path: str) -> list[Check]:
    """wide_worker's checks from its per-rank outcomes, or the exception that stopped its launch."""

    def judge(per_rank):
        runs = [r["wide"] for r in per_rank]
        error = S.phase_error("sharding", impl, R.WIDE_PROP, runs, False)
        return [error] if error else [RC.wide_check(impl, runs), RC.wide_state_check(impl, runs)]

    return wider_checks("sharding", impl, got, path, R.WIDE, judge)


def _student(path: str, impl: str):
    return S.student_optimizer(S.adapter_fns(path, "sharding", impl))


def judge_sharding(result: TopicResult, impl: str, per_rank, path: str, wide=None) -> None:
    """The checks and side-by-side rows of one implementation, from its ranks' sharding_worker results (or the
    exception that stopped its launch) and, where given, wide_worker's on R.WIDE ranks; the probes beyond the handout
    only where the worker ran them."""
    result.checks += environment_checks("sharding", impl, per_rank)
    early = status_checks("sharding", impl, per_rank, path)
    if early:
        result.checks += early
        return
    for k, model in enumerate(CM.MODELS):
        runs = [r["course"][k] for r in per_rank]
        error = S.phase_error("sharding", impl, f"{model}: the course's sharded-optimizer test runs", runs, False)
        result.checks += [error] if error else C.course_sharding_checks(impl, model, runs)
    parts = [r["partition"] for r in per_rank]
    error = S.phase_error("sharding", impl, "ToyModel: optimizer state partitioned over ranks", parts, False)
    result.checks += [error] if error else [C.partition_check(impl, parts)]
    if wide is not None:
        result.checks += wide_checks(impl, wide, path)
    result.checks += rules_checks(impl, per_rank)
    if beyond_failed("sharding", impl, per_rank):
        result.checks += beyond_failed("sharding", impl, per_rank)
        return
    if per_rank[0]["beyond"] is None:  # the contract's part alone was asked
        return
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
                "value": sent_bytes(log, WORLD) / MiB,
                "unit": "MiB",
            }
        )
    if speed:
        rows += timing_rows("sharding", impl, [r["samples"] for r in speed], labels)
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
