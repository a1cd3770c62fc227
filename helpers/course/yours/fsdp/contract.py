"""The checks within the 2026 handout's contract for FSDP: its test (tests/test_fsdp.py) replayed on the course's model
built from the student's cs336_basics layers with the tolerances the test asserts, and a shard per rank after
get_fsdp; the course_* functions run in a launched rank, course_fsdp_checks judges their results in the parent, with
the rules the handout states in words that the test never exercises (helpers.course.yours.fsdp.rules, from the
watched steps of helpers.course.yours.fsdp.probe). All of them decide the exit status."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist

import helpers.course.yours.course_models as CM
import helpers.course.yours.student_calls as S
from helpers import launch as L
from helpers import memory as M
from helpers.course.yours.fsdp.rules import PROBE_DTYPES, probe_checks
from helpers.course.yours.report import FAIL, PASS, Check
from helpers.experiments import fsdp as XF
from helpers.experiments.common import rank_rows

WORLD = S.WORLD
WIDE = 4  # ranks of the test's fp32 run and the shard again: the handout shards over the world size, and 4 divides
#           each dimension of the test's model (vocab 100, d_model 64, d_ff 128) and its 20 rows, so no padding is asked
SHARD_MEMORY_TOL = 0.10  # a shard after get_fsdp (2026 handout: FSDP shards the Linear and Embedding weights):
#                          the tracker's drift on storages resized in place (XF.PEAK_TOL)
COURSE_FSDP_DTYPES = ("fp32", "fp16")  # the 2026 test: compute_dtype None and torch.float16
COURSE_FSDP_TOL = {"fp32": dict(atol=1e-6, rtol=1e-4), "fp16": dict(atol=1e-4, rtol=1e-4)}  # its allclose per dtype
COURSE_FSDP_GRAD_TOL = dict(atol=1e-4, rtol=1e-4)  # its replicated gradients across ranks


def course_fsdp_run(impl: XF.FsdpImpl, dtype: str) -> dict:
    """The 2026 FSDP correctness test on this rank: one seed (42) on every rank, get_fsdp(deepcopy(model),
    compute_dtype), 3 SGD steps (lr 0.01, cross-entropy on the last position) on this rank's 10 of 20 rows, after each
    fsdp_gather_full_params vs one process on all rows (with the same mixed precision); max |diff| / (atol + rtol
    |w|)."""
    layers, shard_types = CM.course_layers()
    rank, cdt = dist.get_rank(), XF.DTYPES[dtype]
    torch.manual_seed(42)
    base = CM.FSDPToyModel(layers)
    ref = copy.deepcopy(base)
    model = impl.wrap(copy.deepcopy(base), cdt)
    opt = torch.optim.SGD(model.parameters(), lr=CM.FSDP_LR)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=CM.FSDP_LR)
    ids, labels = CM.fsdp_data()
    world, names, steps = dist.get_world_size(), [n for n, _ in ref.named_parameters()], []
    rows = rank_rows(ids.shape[0], rank, world)
    for s in range(CM.FSDP_STEPS):
        ref_opt.zero_grad(set_to_none=True)
        CM.reference_loss(ref, ids, labels, cdt, shard_types).backward()
        ref_opt.step()
        opt.zero_grad(set_to_none=True)
        CM.last_position_loss(model(ids[rows]), labels[rows]).backward()
        impl.on_after_backward(model, opt)
        opt.step()
        full = S.aligned(impl.gather_full_params(model), names)
        ratios = {
            n: S.close_ratio(full[n], p.detach().cpu(), **COURSE_FSDP_TOL[dtype]) for n, p in ref.named_parameters()
        }
        n = max(ratios, key=lambda k: ratios[k][0])
        i = ratios[n][1]
        want = float(dict(ref.named_parameters())[n].detach()[i])
        steps.append(
            {
                "ratio": ratios[n][0],
                "where": f"{n}[{', '.join(map(str, i))}]: yours {float(full[n][i]):.6g}, one process {want:.6g}",
            }
        )
        ids, labels = CM.shuffled(s, ids, labels)
    return {"steps": steps}


def course_fsdp_grads(impl: XF.FsdpImpl, dtype: str) -> dict:
    """The 2026 gradient test on this rank: one seed, each rank its own 4 x 8 ids, loss = logits.sum(); after
    fsdp_on_after_backward, .module's parameters that need one have a gradient of their data's shape and dtype; the
    replicated ones' gradients (not Linear/Embedding) are returned for the cross-rank comparison."""
    layers, shard_types = CM.course_layers()
    torch.manual_seed(42)
    model = impl.wrap(CM.FSDPToyModel(layers), XF.DTYPES[dtype])
    ids = torch.randint(0, CM.FSDP_VOCAB, (4, CM.FSDP_SEQ), generator=torch.Generator().manual_seed(dist.get_rank()))
    opt = torch.optim.SGD(model.parameters(), lr=CM.FSDP_LR)
    model(ids).sum().backward()
    impl.on_after_backward(model, opt)
    inner = getattr(model, "module", model)
    modules, bad, replicated = dict(inner.named_modules()), [], {}
    for name, p in inner.named_parameters():
        if not p.requires_grad:
            continue
        g = p.grad
        if g is None or g.shape != p.data.shape or g.dtype != p.data.dtype:
            bad.append(
                f"{name}: "
                + (
                    "no gradient"
                    if g is None
                    else f"gradient {tuple(g.shape)} {g.dtype}, data {tuple(p.data.shape)} {p.data.dtype}"
                )
            )
        elif not isinstance(modules[name.rsplit(".", 1)[0]] if "." in name else inner, shard_types):
            replicated[name] = g.detach().float().cpu().clone()
    return {"bad": bad, "replicated": replicated}


def course_fsdp_memory(impl: XF.FsdpImpl) -> dict:
    """Bytes live on this rank once get_fsdp has returned (the model built inside the tracked call), beside the
    model's full bytes, this rank's share of the sharded ones and the largest sharded tensor."""
    layers, shard_types = CM.course_layers()
    world = dist.get_world_size()
    torch.manual_seed(42)
    trace = M.track_resizing(lambda: (impl.wrap(CM.FSDPToyModel(layers), None), dist.barrier()), device=L.device())
    trace.result = None
    sizes = {
        id(p): (p.numel(), isinstance(m, shard_types))
        for m in CM.FSDPToyModel(layers).modules()
        for p in m.parameters(recurse=False)
    }
    sharded = [n for n, s in sizes.values() if s]
    return {
        "live": trace.current_bytes,
        "full": 4 * sum(n for n, _ in sizes.values()),
        "share": 4 * (sum(-(-n // world) for n in sharded) + sum(n for n, s in sizes.values() if not s)),
        "world": world,
        "largest": 4 * max(sharded),
    }


def course_fsdp_checks(impl: str, course: dict) -> list[Check]:
    """The 2026 test's assertions from each rank's results (course[part] = per-rank phase results)."""
    checks = []
    for dtype in COURSE_FSDP_DTYPES:
        runs, prop = course[f"run {dtype}"], f"{CM.FSDP_STEPS} SGD steps vs one process ({dtype}, allclose)"
        checks.append(run_check(impl, runs, dtype, prop))
        grads, prop = course[f"grads {dtype}"], f"gradients after fsdp_on_after_backward ({dtype})"
        error = S.phase_error("fsdp", impl, prop, grads, beyond=False)
        if error:
            checks.append(error)
            continue
        bad = [(rank, b) for rank, r in enumerate(grads) for b in r["bad"]]
        first = grads[0]["replicated"]
        split = [
            n
            for r in grads[1:]
            for n in first
            if n not in r["replicated"] or not torch.allclose(first[n], r["replicated"][n], **COURSE_FSDP_GRAD_TOL)
        ]
        detail = (
            f"rank {bad[0][0]}: {bad[0][1]} (every parameter that requires a gradient needs one of its data's "
            "shape and dtype)"
            if bad
            else f"replicated {', '.join(split[:3])}'s gradient differs between ranks: not all-reduced"
            if split
            else f"shapes and dtypes of the data; {len(first)} replicated gradients equal on every rank"
        )
        checks.append(Check("fsdp", impl, prop, FAIL if bad or split else PASS, detail))
    checks.append(shard_check(impl, course["memory"], "a shard per rank after get_fsdp"))
    return checks + probe_checks(impl, {d: course[f"probe {d}"] for d in PROBE_DTYPES})


def run_check(impl: str, runs: list[dict], dtype: str, prop: str) -> Check:
    """course_fsdp_run's steps on every rank against the test's tolerance (the worst element of any step)."""
    error = S.phase_error("fsdp", impl, prop, runs, beyond=False)
    if error:
        return error
    tol = COURSE_FSDP_TOL[dtype]
    (ratio, s, rank), where = max(
        ((st["ratio"], s, rank), st["where"]) for rank, r in enumerate(runs) for s, st in enumerate(r["steps"])
    )
    detail = f"worst: step {s}, rank {rank}, {where}; |diff| / (atol {tol['atol']:g} + rtol {tol['rtol']:g} |w|)"
    return Check("fsdp", impl, prop, PASS if ratio <= 1 else FAIL, f"{detail} {ratio:.3g}")


def shard_check(impl: str, mem: list[dict], prop: str) -> Check:
    """course_fsdp_memory on every rank: the bytes live after get_fsdp within a shard of 1/world + a full weight."""
    error = S.phase_error("fsdp", impl, prop, mem, beyond=False)
    if error:
        return error
    rank = max(range(len(mem)), key=lambda i: mem[i]["live"])
    m = mem[rank]
    bound = (1 + SHARD_MEMORY_TOL) * m["share"] + m["largest"]  # + one full weight: a gathered or staging buffer a
    #                                                                sharded FSDP may keep (prefetch), not the model
    detail = (
        f"rank {rank} holds {m['live']} B after get_fsdp; its shard (1/{m['world']} of the Linear and Embedding "
        f"weights, norm gains whole) {m['share']} B, bound that + {SHARD_MEMORY_TOL:.0%} + the largest weight "
        f"{m['largest']} B = {bound:.0f} B; the full model {m['full']} B"
    )
    if m["live"] > bound and m["live"] >= m["full"]:
        detail += " - the full weights are still live: not sharded at init (keep only this rank's shard)"
    return Check("fsdp", impl, prop, PASS if m["live"] <= bound else FAIL, detail)


def wide_run(path: str, impl: XF.FsdpImpl) -> dict:
    """In each of WIDE ranks, each phase apart: the test's fp32 run and the bytes after get_fsdp."""
    return {
        "run": S.phase(path, lambda: course_fsdp_run(impl, "fp32")),
        "memory": S.phase(path, lambda: course_fsdp_memory(impl)),
    }


def wide_checks(impl: str, per_rank: list[dict], on_two: list[Check]) -> list[Check]:
    """wide_run's checks; where the same check passed on 2 ranks (on_two), a failure says the sharding must follow
    the world size."""
    where = f"{WIDE} ranks: "
    run = f"{where}{CM.FSDP_STEPS} SGD steps vs one process (fp32, allclose)"
    checks = [
        run_check(impl, [r["run"] for r in per_rank], "fp32", run),
        shard_check(impl, [r["memory"] for r in per_rank], f"{where}a shard per rank after get_fsdp"),
    ]
    passed = {c.prop for c in on_two if c.status == PASS}
    for c in checks:
        if c.status != PASS and c.prop.removeprefix(where) in passed:
            c.detail += (
                " - the same check passes on the test's 2 ranks: the handout shards over the world size "
                f"(dist.get_world_size()), and a split into halves, or rank 1 taken as 'the other', leaves out a rank "
                f"of {WIDE}"
            )
    return checks
