"""`yours` for FSDP: the worker (the 2026 test on the cs336_basics model and the watched steps that judge the
handout's rules on it, then our TransformerLM's equivalence, memory, bytes and timing, each phase apart) and run_fsdp,
which reads them into checks (helpers.course.yours.fsdp.contract within the handout, dist_fsdp_checks beyond it) and
rows."""

from __future__ import annotations

import functools

import torch.distributed as dist

import helpers.course.yours.adapters as A
import helpers.course.yours.course_models as CM
import helpers.course.yours.fsdp.contract as CF
import helpers.course.yours.fsdp.rules as FR
import helpers.course.yours.student_calls as S
from helpers.comm import count_collectives
from helpers.course.yours.dist_common import (
    PARTS,
    SPEED,
    NotAsked,
    beyond_failed,
    environment_checks,
    launch_each,
    ran_everywhere,
    rows_into,
    status_checks,
    timing_rows,
    wider_checks,
)
from helpers.course.yours.fsdp.checks import (
    FSDP_CHECK,
    FSDP_DTYPES,
    fsdp_bytes_checks,
    fsdp_equivalence_checks,
    fsdp_memory_checks,
)
from helpers.course.yours.fsdp.probe import probe_step
from helpers.course.yours.options import Options
from helpers.course.yours.report import PASS, SKIPPED, Check, TopicResult
from helpers.experiments import fsdp as XF
from helpers.experiments.common import make_batches, rank_share


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
    cs336_basics imports), the memory after get_fsdp and the watched steps (fsdp_probe: what is gathered when, the
    dtypes); beyond the handout, our TransformerLM seeded per rank with SGD without and with bf16 compute (opts.repeat
    times), memory and bytes vs the formulas, and the timing."""
    out, cfg, rank = {}, FSDP_CHECK, dist.get_rank()
    for impl_name in impls:

        def run(impl_name=impl_name):
            impl = S.student_fsdp(S.adapter_fns(path, "fsdp", impl_name))
            course = None
            try:
                if "course" not in parts:
                    raise NotAsked
                course = {"source": CM.course_layers_source()}
                for dtype in CF.COURSE_FSDP_DTYPES:
                    course[f"run {dtype}"] = S.phase(path, functools.partial(CF.course_fsdp_run, impl, dtype))
                    course[f"grads {dtype}"] = S.phase(path, functools.partial(CF.course_fsdp_grads, impl, dtype))
                course["memory"] = S.phase(path, functools.partial(CF.course_fsdp_memory, impl))
                for dtype in CF.PROBE_DTYPES:  # the handout's words: freeing, prefetch, compute dtype
                    course[f"probe {dtype}"] = S.phase(path, functools.partial(probe_step, impl, dtype))
            except NotAsked:
                pass
            except Exception as exc:  # noqa: BLE001 - no cs336_basics: the course's test cannot run either
                course = {"missing": f"{type(exc).__name__}: {exc}"}

            # Beyond the 2026 handout: torch.nn layers seeded per rank (the test uses cs336_basics with one seed),
            # bf16, exact peaks and bytes against the formulas (it bounds what is gathered, not the peak's bytes),
            # races over repeats.
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


def wide_worker(path: str, impls: list[str], opts: Options, parts=("course",)) -> dict:
    """In each of CF.WIDE ranks, per implementation: the test's fp32 run and the shard after get_fsdp."""

    def run(impl_name):
        return CF.wide_run(path, S.student_fsdp(S.adapter_fns(path, "fsdp", impl_name)))

    return {impl: S.outcome(functools.partial(run, impl)) for impl in impls}


def wide_checks(impl: str, got, path: str, on_two: list[Check]) -> list[Check]:
    """wide_worker's checks from its per-rank outcomes, or the exception that stopped its launch."""
    return wider_checks("fsdp", impl, got, path, CF.WIDE, lambda per_rank: CF.wide_checks(impl, per_rank, on_two))


def _freed(checks: list[Check], impl: str) -> bool:
    """Whether the handout's freeing rules, watched within it, all passed for `impl`."""
    rules = [c for c in checks if c.impl == impl and c.prop in FR.FREEING]
    return len(rules) == len(FR.FREEING) and all(c.status == PASS for c in rules)


def run_fsdp(adapters_path: str, opts: Options) -> TopicResult:
    """FSDP: within the handout, the 2026 test on the cs336_basics model (fp32 and fp16 steps vs one process,
    gradients' shapes and dtypes, replicated gradients equal), a shard per rank after get_fsdp and the handout's rules
    on the same model (gathered weights freed after use, bounded prefetch, the compute dtype), the fp32 test and the
    shard again on CF.WIDE ranks (a launch of its own: the handout shards over the world size); beyond it, our
    TransformerLM seeded per rank (rank 0's weights, fp32 and bf16 steps within the derived bound, opts.repeat
    times), memory and bytes vs the formulas, and yours vs ours vs torch's fully_shard."""
    result, path = TopicResult("fsdp"), str(adapters_path)
    got = launch_each(fsdp_worker, path, list(A.ADAPTERS["fsdp"]), opts)
    runnable = [  # the test's fp32 run went through on 2 ranks, else CF.WIDE ranks add nothing
        impl
        for impl, per_rank in got.items()
        if ran_everywhere("fsdp", per_rank, lambda r: (r["course"] or {}).get("run fp32"))
    ]
    wide = launch_each(wide_worker, path, runnable, opts, world=CF.WIDE, parts=("course",)) if runnable else {}
    for impl, per_rank in got.items():
        result.checks += environment_checks("fsdp", impl, per_rank)
        early = status_checks("fsdp", impl, per_rank, str(adapters_path))
        if early:
            result.checks += early
            continue
        first = per_rank[0]["course"] or {}
        course = {k: [r["course"][k] for r in per_rank] for k in first if k != "source"}
        source = first.get("source", "")
        if "missing" in course:  # our own layers failed to build: an error of ours, said as such
            result.checks.append(
                Check("fsdp", impl, "the 2026 test's model", SKIPPED, f"not built: {course['missing'][0]}")
            )
        else:
            result.checks.append(Check("fsdp", impl, f"the 2026 test's model, from {source}", PASS, source))
            result.checks += CF.course_fsdp_checks(impl, course)
            if impl in wide:
                result.checks += wide_checks(impl, wide[impl], path, result.checks)
        if beyond_failed("fsdp", impl, per_rank):
            result.checks += beyond_failed("fsdp", impl, per_rank)
            continue
        beyond = []

        freed = _freed(result.checks, impl)  # the freeing rules within the handout, judged above
        phases = (
            ("equivalence", functools.partial(fsdp_equivalence_checks, impl, repeat=max(1, opts.repeat)), "runs"),
            (
                "memory",
                lambda ph, impl=impl, freed=freed: rows_into(result, fsdp_memory_checks(impl, ph, freed)),
                "memory",
            ),
            ("logs", lambda ph, impl=impl: rows_into(result, fsdp_bytes_checks(impl, ph)), "bytes per step"),
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
            result.rows += timing_rows("fsdp", impl, [r["samples"] for r in speed], labels)
        for c in beyond:
            c.beyond, c.prop = True, c.prop if c.prop.startswith("beyond") else f"beyond the handout: {c.prop}"
        result.checks += beyond
    return result
