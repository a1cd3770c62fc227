"""The checks within the handout's contract for the distributed topics: each edition's own tests (DDP 2024-2026,
the sharded optimizer 2025/2026, FSDP 2026) replayed on the course's models (course_models) with the tolerances the
tests assert, in a launched rank (the course_* functions) and judged in the parent (the *_checks functions). These
decide the exit status; helpers.course.yours.distributed adds the probes beyond the handout."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn as nn

from helpers import launch as L
from helpers import memory as M
from helpers.course.yours import adapters as A
from helpers.course.yours import course_models as CM
from helpers.course.yours import sharding_rules as R
from helpers.course.yours import student_calls as S
from helpers.course.yours.report import FAIL, PASS, Check
from helpers.experiments import fsdp as XF
from helpers.experiments.common import rank_rows

WORLD = S.WORLD
SHARD_MEMORY_TOL = 0.10  # a shard after get_fsdp (2026 handout: FSDP shards the Linear and Embedding weights):
#                          the tracker's drift on storages resized in place (XF.PEAK_TOL)


# ---- DDP within the handout's contract: the course's test (2025/2026 tests/test_ddp.py; 2024 test_ddp_*.py) ----

COURSE_BUCKETS_MB = (0.0016, 0.0001, 0.01)  # the 2024 bucketed test's sizes: two buckets, one per tensor, one bucket
ALLCLOSE = dict(rtol=1e-5, atol=1e-8)  # the DDP tests compare with torch.allclose's defaults after every step


def course_ddp_run(fns, impl: str, model: str, bucket_mb) -> dict:
    """The course's DDP test on this rank: the model seeded by the rank, a deepcopy wrapped (the broadcast must give
    rank 0's parameters), 5 SGD steps (lr 0.1, MSE) on this rank's 10 of 20 rows with the adapters' hooks, each step
    compared (allclose, the test's tolerance) with rank 0's model trained in one process on all 20 rows."""
    rank, cls = dist.get_rank(), CM.MODELS[model]
    torch.manual_seed(rank)
    local = cls()
    torch.manual_seed(0)
    ref = cls()  # rank 0's model: the one-process reference on every rank
    shim = S.StudentDDP(fns, impl, copy.deepcopy(local), bucket_mb)
    mine = S.by_position(ref, shim.ddp)
    start_diff = [n for n, p in ref.named_parameters() if not torch.equal(mine[n].detach(), p.detach())]
    shim.optimizer = opt = torch.optim.SGD(shim.ddp.parameters(), lr=CM.DDP_LR)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=CM.DDP_LR)
    x, y = CM.ddp_data()
    rows, steps = rank_rows(x.shape[0], rank, WORLD), []
    for i in range(CM.DDP_STEPS):
        ref_opt.zero_grad()
        nn.functional.mse_loss(ref(x), y).backward()
        g_ref = {n: p.grad.detach().clone() for n, p in ref.named_parameters() if p.grad is not None}
        ref_opt.step()
        shim.on_train_batch_start()  # before zero_grad(), as the 2024 and 2025 tests call them
        opt.zero_grad()
        nn.functional.mse_loss(shim(x[rows]), y[rows]).backward()
        shim.finish_gradient_synchronization()
        grads = {n: p.grad.detach().clone() for n, p in mine.items() if p.grad is not None}
        opt.step()
        ratios = {n: S.close_ratio(mine[n].detach(), p.detach(), **ALLCLOSE) for n, p in ref.named_parameters()}
        worst = max(ratios, key=lambda n: ratios[n][0])
        i_w = ratios[worst][1]
        steps.append(
            {
                "ratio": ratios[worst][0],
                "where": (
                    f"{worst}[{', '.join(map(str, i_w))}]: yours {float(mine[worst].detach()[i_w]):.6g}, one process "
                    f"{float(dict(ref.named_parameters())[worst].detach()[i_w]):.6g}"
                ),
                "finite": all(bool(torch.isfinite(g).all()) for g in grads.values()),
                "summed": bool(g_ref)
                and all(
                    n in grads
                    and torch.allclose(grads[n], WORLD * g, **ALLCLOSE)
                    and not torch.allclose(grads[n], g, **ALLCLOSE)
                    for n, g in g_ref.items()
                ),
                "zeros": sorted(
                    n for n, g in g_ref.items() if bool(g.any()) and (n not in grads or not grads[n].any())
                ),
                "grads": S.digest(grads),
            }
        )
        x, y = CM.shuffled(i, x, y)
    return {"start_diff": start_diff, "steps": steps}


def course_ddp_checks(impl: str, label: str, per_rank: list[dict]) -> list[Check]:
    """The course test's two assertions, on every rank: rank 0's parameters after construction; after each step the
    parameters allclose to one process's. A diagnosis only when its whole signature is there."""
    after = A.ADAPTERS["ddp"][impl][1]
    diff = sorted({n for r in per_rank for n in r["start_diff"]})
    ranks = [i for i, r in enumerate(per_rank) if r["start_diff"]]
    checks = [
        Check(
            "ddp",
            impl,
            f"{label}: rank 0's parameters after construction",
            FAIL if diff else PASS,
            f"rank(s) {ranks} still hold their own {', '.join(diff[:4])} after construction: not broadcast from rank 0"
            if diff
            else "every rank starts from rank 0's parameters",
        )
    ]
    bad = [(s, rank) for rank, r in enumerate(per_rank) for s, st in enumerate(r["steps"]) if not st["ratio"] <= 1]
    prop = f"{label}: {CM.DDP_STEPS} SGD steps vs one process (allclose)"
    if not bad:
        worst = max(st["ratio"] for r in per_rank for st in r["steps"])
        checks.append(
            Check("ddp", impl, prop, PASS, f"every step on every rank; worst |diff| / (atol + rtol |w|) {worst:.3g}")
        )
        return checks
    s, rank = min(bad)
    st = per_rank[rank]["steps"][s]
    digests = [r["steps"][s]["grads"] for r in per_rank]
    unsynced = sorted({n for d in digests[1:] for n in set(d) | set(digests[0]) if d.get(n) != digests[0].get(n)})
    why = ""
    if not st["finite"]:
        why = " - a gradient is not finite (NaN/inf) after " + after
    elif diff:
        why = " - the ranks did not start from rank 0's parameters (the check above)"
    elif all(r["steps"][s]["summed"] for r in per_rank):
        why = f" - every gradient is {WORLD}x one process's: summed over ranks, not averaged (divide by the world size)"
    elif unsynced:
        why = (
            f" - {', '.join(unsynced[:4])}'s gradient is not the same on every rank after {after}: not all-reduced "
            "before the optimizer step"
        )
    elif st["zeros"] and all(r["steps"][s]["zeros"] == st["zeros"] for r in per_rank):
        why = (
            f" - {', '.join(st['zeros'][:4])}'s gradient is all zeros after {after} on every rank, one process's is "
            "not: what was all-reduced and copied back was not this gradient (read before backward produced it?)"
        )
    checks.append(
        Check(
            "ddp",
            impl,
            prop,
            FAIL,
            f"step {s}, rank {rank}: {st['where']}; |diff| / (atol + rtol |w|) "
            f"{st['ratio']:.3g}, allclose's bound 1{why}",
        )
    )
    return checks


def course_ddp_configs(impl: str) -> list[tuple[str, float | None]]:
    """(model, bucket size) pairs the course's tests run a flavour on: both toy models, each bucket size for
    bucketed."""
    sizes = COURSE_BUCKETS_MB if impl == "bucketed" else (None,)
    return [(m, mb) for m in CM.MODELS for mb in sizes]


def course_sharding_run(make, model: str) -> dict:
    """The course's sharded-optimizer test (2025/2026 tests/test_sharded_optimizer.py) on this rank: one seed on every
    rank, the model deep-copied, AdamW (lr 0.1, weight decay 0.1) unsharded beside yours, 10 steps of a summed squared
    error on the same 32 rows on every rank; both models' final weights."""
    cls = CM.MODELS[model]
    torch.manual_seed(42)
    ref = cls()
    mine = copy.deepcopy(ref)
    ref_opt = torch.optim.AdamW(ref.parameters(), **CM.SHARDING_ADAMW)
    opt = make(mine.parameters(), torch.optim.AdamW, **CM.SHARDING_ADAMW)
    gen = torch.Generator().manual_seed(0)
    for _ in range(CM.SHARDING_STEPS):
        x, y = torch.rand(CM.SHARDING_ROWS, 10, generator=gen), torch.rand(CM.SHARDING_ROWS, 5, generator=gen)
        for net, o in ((ref, ref_opt), (mine, opt)):
            o.zero_grad()
            ((y - net(x)) ** 2).sum().backward()
            o.step()
    return {"ref": _cpu_params(ref), "mine": _cpu_params(mine)}


def _cpu_params(net: nn.Module) -> dict:
    return {n: p.detach().cpu().clone() for n, p in net.named_parameters()}


def course_state_growth(make) -> dict:
    """Bytes of optimizer state the first step creates on this rank (R.state_growth: read from the optimizers the
    wrapper holds), unsharded AdamW's and yours, on the course's ToyModel; and the smallest trainable tensor's state
    (2 moments, float32)."""
    out = {}
    for who, build in (
        ("unsharded", lambda ps: torch.optim.AdamW(ps, **CM.SHARDING_ADAMW)),
        ("yours", lambda ps: make(ps, torch.optim.AdamW, **CM.SHARDING_ADAMW)),
    ):
        torch.manual_seed(42)
        net = CM.ToyModel()
        opt = build(net.parameters())
        x = torch.rand(CM.SHARDING_ROWS, 10, generator=torch.Generator().manual_seed(0))
        net(x).pow(2).sum().backward()
        out[who] = R.state_growth(opt, dict(net.named_parameters()))
    out["smallest"] = 2 * 4 * min(p.numel() for p in CM.ToyModel().parameters() if p.requires_grad)
    return out


def course_sharding_checks(impl: str, model: str, per_rank: list[dict]) -> list[Check]:
    """Final weights vs unsharded AdamW's on every rank, with the test's numpy.testing.assert_allclose (rtol 1e-7)."""
    worst = None
    for rank, r in enumerate(per_rank):
        for n, ref in r["ref"].items():
            ratio, i = S.close_ratio(r["mine"][n], ref, rtol=1e-7, atol=0.0)
            if worst is None or ratio > worst[0]:
                worst = (ratio, rank, n, i, float(r["mine"][n][i]), float(ref[i]))
    ratio, rank, n, i, got, want = worst
    prop = f"{model}: {CM.SHARDING_STEPS} AdamW steps vs unsharded (allclose, rtol 1e-7)"
    detail = (
        f"worst rank {rank}, {n}[{', '.join(map(str, i))}]: yours {got:.8g}, unsharded {want:.8g}; |diff| / "
        f"(rtol |w|) {ratio:.3g}"
    )
    return [Check("sharding", impl, prop, PASS if ratio <= 1 else FAIL, detail)]


def partition_check(impl: str, per_rank: list[dict]) -> Check:
    """Each rank keeps state for only part of the parameters (the 2025/2026 handouts' sharded optimizer: each rank
    updates, and keeps the state of, the parameters it owns): the state the first step leaves on every rank is below
    unsharded AdamW's by at least the smallest tensor's two moments. The test itself checks only the weights."""
    full, least = per_rank[0]["unsharded"], per_rank[0]["smallest"]
    worst = max(range(len(per_rank)), key=lambda i: per_rank[i]["yours"])
    held = per_rank[worst]["yours"]
    ok = held <= full - least
    detail = (
        f"rank {worst} keeps {held} B of optimizer state after the first step, unsharded AdamW {full} B; "
        f"partitioned, no rank keeps the state of every parameter (bound {full} - {least} B, the smallest "
        "tensor's two moments)"
    )
    if not ok and held >= full:
        detail += " - every rank keeps the whole state: not partitioned (step only the parameters this rank owns)"
    return Check("sharding", impl, "ToyModel: optimizer state partitioned over ranks", PASS if ok else FAIL, detail)


# ---- FSDP within the handout's contract: the 2026 test (tests/test_fsdp.py) on the cs336_basics layers ----


class NotAsked(Exception):
    """The launch asked for the probes beyond the handout only."""


COURSE_FSDP_DTYPES = ("fp32", "fp16")  # the 2026 test: compute_dtype None and torch.float16
COURSE_FSDP_TOL = {"fp32": dict(atol=1e-6, rtol=1e-4), "fp16": dict(atol=1e-4, rtol=1e-4)}  # its allclose per dtype
COURSE_FSDP_GRAD_TOL = dict(atol=1e-4, rtol=1e-4)  # its replicated gradients across ranks


def course_layers():
    """The student's cs336_basics.model (the 2026 FSDP test builds its model from it) and its sharded layer types."""
    import importlib

    layers = importlib.import_module("cs336_basics.model")
    return layers, (layers.Linear, layers.Embedding)


def course_fsdp_run(impl: XF.FsdpImpl, dtype: str) -> dict:
    """The 2026 FSDP correctness test on this rank: one seed (42) on every rank, get_fsdp(deepcopy(model),
    compute_dtype), 3 SGD steps (lr 0.01, cross-entropy on the last position) on this rank's 10 of 20 rows, after each
    fsdp_gather_full_params vs one process on all rows (with the same mixed precision); max |diff| / (atol + rtol
    |w|)."""
    layers, shard_types = course_layers()
    rank, cdt = dist.get_rank(), XF.DTYPES[dtype]
    torch.manual_seed(42)
    base = CM.FSDPToyModel(layers)
    ref = copy.deepcopy(base)
    model = impl.wrap(copy.deepcopy(base), cdt)
    opt = torch.optim.SGD(model.parameters(), lr=CM.FSDP_LR)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=CM.FSDP_LR)
    ids, labels = CM.fsdp_data()
    rows, names, steps = rank_rows(ids.shape[0], rank, WORLD), [n for n, _ in ref.named_parameters()], []
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
    layers, shard_types = course_layers()
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
    layers, shard_types = course_layers()
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
        "share": 4 * (sum(-(-n // WORLD) for n in sharded) + sum(n for n, s in sizes.values() if not s)),
        "largest": 4 * max(sharded),
    }


def course_fsdp_checks(impl: str, course: dict) -> list[Check]:
    """The 2026 test's assertions from each rank's results (course[part] = per-rank phase results)."""
    checks = []
    for dtype in COURSE_FSDP_DTYPES:
        runs, prop = course[f"run {dtype}"], f"{CM.FSDP_STEPS} SGD steps vs one process ({dtype}, allclose)"
        error = S.phase_error("fsdp", impl, prop, runs, beyond=False)
        if error:
            checks.append(error)
        else:
            tol = COURSE_FSDP_TOL[dtype]
            (ratio, s, rank), where = max(
                ((st["ratio"], s, rank), st["where"]) for rank, r in enumerate(runs) for s, st in enumerate(r["steps"])
            )
            checks.append(
                Check(
                    "fsdp",
                    impl,
                    prop,
                    PASS if ratio <= 1 else FAIL,
                    f"worst: step {s}, rank {rank}, {where}; |diff| / (atol {tol['atol']:g} + rtol "
                    f"{tol['rtol']:g} |w|) {ratio:.3g}",
                )
            )
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
    mem = course["memory"]
    error = S.phase_error("fsdp", impl, "a shard per rank after get_fsdp", mem, beyond=False)
    if error:
        return checks + [error]
    rank = max(range(len(mem)), key=lambda i: mem[i]["live"])
    m = mem[rank]
    bound = (1 + SHARD_MEMORY_TOL) * m["share"] + m["largest"]  # + one full weight: a gathered or staging buffer a
    #                                                                sharded FSDP may keep (prefetch), not the model
    detail = (
        f"rank {rank} holds {m['live']} B after get_fsdp; its shard (1/{WORLD} of the Linear and Embedding "
        f"weights, norm gains whole) {m['share']} B, bound that + {SHARD_MEMORY_TOL:.0%} + the largest weight "
        f"{m['largest']} B = {bound:.0f} B; the full model {m['full']} B"
    )
    if m["live"] > bound and m["live"] >= m["full"]:
        detail += " - the full weights are still live: not sharded at init (keep only this rank's shard)"
    checks.append(Check("fsdp", impl, "a shard per rank after get_fsdp", PASS if m["live"] <= bound else FAIL, detail))
    return checks
