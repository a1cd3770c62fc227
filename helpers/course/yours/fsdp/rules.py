"""The 2026 FSDP handout's rules that its test never exercises, judged in the parent from the watched steps
(helpers.course.yours.fsdp.probe.probe_step, per compute dtype and rank): the gathered weights freed after use in the
forward with a bounded prefetch, gathered again for backward rather than kept alive for it, none held after backward;
with a compute dtype, the weights cast before they are communicated and used, the master weights and the optimizer's
state fp32. Each is a check within the contract (it decides the exit status).

    checks = probe_checks("fsdp", {"fp32": [rank0, rank1], "fp16": [rank0, rank1]})
"""

from __future__ import annotations

import helpers.course.yours.student_calls as S
from helpers.course.yours.fsdp.probe import AHEAD, PROBE_STEPS, forward_window
from helpers.course.yours.report import FAIL, PASS, SKIPPED, Check
from helpers.experiments import fsdp as XF

WORLD = S.WORLD
PROBE_DTYPES = ("fp32", "fp16")  # the watched steps: without a compute dtype, and with the 2026 test's float16
FREEING = (
    "gathered weights in forward: the layer before, this one and the next at most",
    "gathered weights freed between forward and backward",
    "no gathered weight held after backward",
)
REDUCE = "gradients of sharded weights reduce-scattered, not all-reduced"


def _copies(copies: list, nbytes: int) -> str:
    """Where one full weight is held ('float16 held by autograd in a 16384 B storage', per copy), beside the bytes of
    the full fp32 weight and of one rank's fp32 shard of it, for scale."""
    held = ", ".join(f"{dt}{' held by autograd' if saved else ''} in a {size} B storage" for dt, size, saved in copies)
    shard = -(-(nbytes // 4) // WORLD) * 4  # ceil(numel / N) fp32 elements
    return f"{held}; the full fp32 weight is {nbytes} B, a shard {shard} B"


def _first(probes: dict, bad_of) -> tuple | None:
    """The first (dtype, rank, step, finding) where bad_of(result, step) finds something: fp32 before fp16, rank 0
    first, step 0 first."""
    for dtype, per_rank in probes.items():
        for rank, r in enumerate(per_rank):
            for step in range(len(r["between"])):
                found = bad_of(r, step)
                if found:
                    return dtype, rank, step, found
    return None


def _in_forward(r: dict, step: int) -> str:
    """When layer i uses its weight in the forward (a matmul or an embedding lookup), a gathered weight outside
    fsdp_probe.forward_window: one kept after its use (before layer i - 1), or one gathered too early (past i + 1)."""
    names = r["names"]
    for use in (u for u in r["uses"] if u["step"] == step and len(u["used"]) == 1):
        i = names.index(use["used"][0])
        for name, copies in use["alive"].items():
            if name in forward_window(names, i):
                continue
            k, held = names.index(name), _copies(copies, r["nbytes"][name])
            if k < i:
                return (
                    f"when {names[i]} is used in the forward, {name} is still gathered ({held}), {i - k} layers after "
                    "its own use: free each gathered weight once its layer's forward is done (a reference autograd "
                    "saved for backward keeps it too)"
                )
            return (
                f"when {names[i]} is used in the forward, {name} is already gathered ({held}): its gather may start "
                f"only once {names[k - 2]}, the layer two before it, has finished its forward (prefetch one layer "
                "ahead at most)"
            )
    return ""


def forward_check(impl: str, probes: dict, aside: str) -> Check:
    """2026 handout: gather a layer's weight before use, starting only once the layer two before it has finished its
    forward, and free it after use."""
    names = next(iter(probes.values()))[0]["names"]
    if not any(len(u["used"]) == 1 for per_rank in probes.values() for r in per_rank for u in r["uses"]):
        return Check(
            "fsdp",
            impl,
            FREEING[0],
            SKIPPED,
            "not observed: no matmul or embedding lookup of the forward used a full weight (in fp32 or a 16-bit "
            "cast) that could be recognised; the two checks below still judge what is gathered",
        )
    bad = _first(probes, _in_forward)
    detail = (
        f"{bad[0]}, rank {bad[1]}, step {bad[2]}: {bad[3]}"
        if bad
        else f"when each of the {len(names)} sharded weights is used in the forward ({', '.join(names)}), at most "
        "the layer before, the layer itself and the next were gathered"
    )
    return Check("fsdp", impl, FREEING[0], FAIL if bad else PASS, detail + aside)


def between_check(impl: str, probes: dict, aside: str) -> Check:
    """2026 handout: the gathered weight is freed after its use in the forward and gathered again for backward. Once
    the loss is computed, only the AHEAD layers backward starts with may be gathered (ahead of it)."""
    sample = next(iter(probes.values()))[0]
    ahead = sample["names"][-AHEAD:]
    bad = _first(probes, lambda r, step: {n: c for n, c in r["between"][step].items() if n not in ahead})
    if not bad:
        kept = sorted({n for per_rank in probes.values() for r in per_rank for b in r["between"] for n in b})
        detail = "before backward, " + (
            f"only {', '.join(kept)} gathered (backward starts with {', '.join(ahead)}: within the prefetch window)"
            if kept
            else "no full weight gathered"
        )
        return Check("fsdp", impl, FREEING[1], PASS, detail + aside)
    dtype, rank, step, found = bad
    autograd = any(saved for copies in found.values() for _, _, saved in copies)
    why = (
        " - autograd's graph holds the gathered weight until backward (a matmul saves its weight operand; a leaf that "
        "requires grad is held by its AccumulateGrad node): free its storage after the forward (e.g. "
        "untyped_storage().resize_(0)) or save only the shard in a custom autograd Function, and gather it again in "
        "backward"
        if autograd
        else " - a reference to the gathered weight outlives the layer's forward: drop it (or resize its storage to "
        "0) after use and gather again in backward"
    )
    detail = (
        f"{dtype}, rank {rank}, step {step}: once the loss is computed, before backward, "
        + "; ".join(f"{n} is gathered ({_copies(c, sample['nbytes'][n])})" for n, c in found.items())
        + f"; allowed then: the {AHEAD} layers backward starts with ({', '.join(ahead)}), gathered ahead{why}"
    )
    return Check("fsdp", impl, FREEING[1], FAIL, detail + aside)


def end_check(impl: str, probes: dict, aside: str) -> Check:
    """2026 handout: free the gathered weights after use, in backward too: none is left once backward and
    fsdp_on_after_backward are done (a gather for the next step would read weights the optimizer is about to
    change)."""
    nbytes = next(iter(probes.values()))[0]["nbytes"]
    bad = _first(probes, lambda r, step: r["end"][step])
    detail = (
        f"{bad[0]}, rank {bad[1]}, step {bad[2]}: after backward and fsdp_on_after_backward, "
        + "; ".join(f"{n} is still gathered ({_copies(c, nbytes[n])})" for n, c in bad[3].items())
        + " - free each gathered weight once its gradient is computed"
        if bad
        else "after backward and fsdp_on_after_backward, no full weight gathered"
    )
    return Check("fsdp", impl, FREEING[2], FAIL if bad else PASS, detail + aside)


def reduce_check(impl: str, probes: dict) -> Check:
    """2026 handout: 'when the gradients are available, they should be reduce-scattered to the appropriate ranks'.
    In backward and fsdp_on_after_backward, an all-reduce of a tensor as large as the smallest sharded weight or larger
    communicates sharded weights' full gradients (the replicated gains' are far smaller in the course's model)."""
    prop = REDUCE
    sample = next(iter(probes.values()))[0]
    if set(sample["unsharded"]) == set(sample["names"]):
        return Check(
            "fsdp",
            impl,
            prop,
            SKIPPED,
            f"not judged: none of {', '.join(sample['names'])} is sharded (the wrapper's parameters are the whole "
            "weights; see 'a shard per rank after get_fsdp')",
        )
    smallest = min(n for w, n in sample["nbytes"].items() if w not in sample["unsharded"]) // 4  # elements
    whole = {sample["nbytes"][w] // 4 for w in sample["unsharded"]}  # an unsharded weight's gradient may be all-reduced
    for dtype, per_rank in probes.items():
        rows = [c for c in per_rank[0]["others"] if c[0] == "backward"]
        big = [c for c in rows if "allreduce" in c[1].replace("_", "") and c[3] >= smallest and c[3] not in whole]
        if big:
            return Check(
                "fsdp",
                impl,
                prop,
                FAIL,
                f"{dtype}, rank 0: {len(big)} all-reduces in backward, the first of {big[0][3]} elements (the "
                f"smallest sharded weight has {smallest}): each rank receives the whole gradient of sharded weights; "
                "reduce-scatter it so that each rank receives the sum of its own shard",
            )
    scatters = sum("reducescatter" in c[1].replace("_", "") for c in probes[next(iter(probes))][0]["others"])
    return Check(
        "fsdp",
        impl,
        prop,
        PASS,
        f"{scatters} reduce-scatters in backward; no all-reduce of {smallest} elements or more (the smallest sharded "
        "weight)",
    )


def compute_check(impl: str, want: str, r: dict) -> Check:
    """2026 handout: with compute_dtype, cast the weights to it before communicating or using them for compute: the
    forward's matmuls run in it, and every all-gather of a weight's shard sends it (rank 0's steps). All-gathers of
    anything else are not judged."""
    prop = f"compute dtype {want}: forward matmuls and weight all-gathers in {want}"
    matmuls = [m for m in r["matmuls"] if m[0] == "forward"]
    weights = [g for g in r["gathers"] if g[4] is not None]  # (phase, op, dtypes, numel, weight)
    slow = [m for m in matmuls if m[2] != [want]]
    sent = [g for g in weights if g[2] != [want]]
    if not matmuls:
        return Check("fsdp", impl, prop, SKIPPED, "no matmul seen in the forward (the course's Linear uses one)")
    if not slow and not sent:
        return Check(
            "fsdp",
            impl,
            prop,
            PASS,
            f"all {len(matmuls)} forward matmuls in {want}; {len(weights)} all-gathers of weight shards in {want}",
        )
    parts = []
    if slow:
        parts.append(
            f"{len(slow)} of {len(matmuls)} forward matmuls ran in {', '.join(slow[0][2])} (first: {slow[0][1]} of "
            f"{slow[0][3]} elements)"
        )
    if sent:
        phase, op, dtypes, _, weight = sent[0]
        parts.append(
            f"{len(sent)} of {len(weights)} all-gathers of weight shards sent {', '.join(dtypes)} (first: {weight}'s, "
            f"{op} in the {phase}): cast the shards to {want} before communicating"
        )
    never = len(slow) == len(matmuls) and len(sent) == len(weights)  # no gather at all: nothing sharded?
    hint = f" - compute_dtype={want} accepted and never used?" if never else ""
    return Check("fsdp", impl, prop, FAIL, "rank 0: " + "; ".join(parts) + hint)


def master_check(impl: str, want: str, per_rank: list[dict]) -> Check:
    """2026 handout: master weights and optimizer updates stay fp32 with a compute dtype: the wrapper's parameters,
    their gradients after fsdp_on_after_backward and AdamW's state."""
    prop = f"compute dtype {want}: master weights, gradients and AdamW state in float32"
    bad = [
        (rank, what, dts)
        for rank, r in enumerate(per_rank)
        for what, dts in (("parameters", r["master"]), ("gradients", r["grads"]), ("AdamW state", r["state"]))
        if set(dts) - {"float32"}
    ]
    if bad:
        rank, what, dts = bad[0]
        return Check(
            "fsdp",
            impl,
            prop,
            FAIL,
            f"rank {rank}: the wrapped model's {what} are {', '.join(dts)}: keep the master weights fp32 (cast copies "
            f"to {want} for the gathers and the compute)",
        )
    r = per_rank[0]
    detail = (
        f"parameters {', '.join(r['master'])}, gradients {', '.join(r['grads'])}, AdamW state {', '.join(r['state'])}"
    )
    return Check("fsdp", impl, prop, PASS, detail)


def probe_checks(impl: str, probes: dict) -> list[Check]:
    """The rules above from the watched steps (probes[dtype] = per-rank phase results): an error row per dtype whose
    steps raised, else the freeing checks over every step and the dtype checks of each compute dtype."""
    errors = [
        S.phase_error("fsdp", impl, f"{PROBE_STEPS} watched AdamW steps ({d})", p, beyond=False)
        for d, p in probes.items()
    ]
    if any(errors):
        return [e for e in errors if e]
    before = next(iter(probes.values()))[0]["before"]
    aside = (
        f" ({before} storage(s) holding a full weight since get_fsdp returned are left to 'a shard per rank after "
        "get_fsdp')"
        if before
        else ""
    )
    checks = [forward_check(impl, probes, aside), between_check(impl, probes, aside), end_check(impl, probes, aside)]
    checks.append(reduce_check(impl, probes))
    for dtype, per_rank in probes.items():
        want = XF.DTYPES[dtype]
        if want is not None:
            name = str(want).removeprefix("torch.")
            checks += [compute_check(impl, name, per_rank[0]), master_check(impl, name, per_rank)]
    return checks
