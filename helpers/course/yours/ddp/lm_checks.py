"""The parent's side of `yours` for DDP on the course's LM (helpers.course.yours.ddp.lm runs it in the ranks): per
flavour, rank 0's parameters after construction, each bucket size's gradients against one process with the likely
mistake, each bucket's all-reduce against bucket_size_mb, and how the calls are made
(helpers.course.yours.ddp.rules: overlap, a bucket as one call).

    checks = lm_checks("bucketed", per_rank_outcomes, adapters_path)
"""

from __future__ import annotations

import helpers.course.yours.course_models as CM
import helpers.course.yours.student_calls as S
from helpers.course.yours.ddp.lm import HANDOUT_BUCKETS_MB, LM_WORLD, SLACK_BYTES
from helpers.course.yours.ddp.rules import call_count_checks, overlap_check
from helpers.course.yours.dist_common import failure_detail
from helpers.course.yours.report import ERROR, FAIL, PASS, SKIPPED, Check
from helpers.formulas import MiB


def lm_checks(impl: str, got, path: str) -> list[Check]:
    """The course LM's checks of one flavour from its per-rank outcomes (or the exception that stopped the launch):
    rank 0's parameters after construction; per bucket size, every step's synced gradient vs one process and the same
    weights on every rank; for bucketed, each all-reduce at most bucket_size_mb."""
    if isinstance(got, BaseException):
        return [Check("ddp", impl, f"course LM on {LM_WORLD} ranks: runs", ERROR, failure_detail(got, path))]
    first = got[0]
    if first["status"] != "ok":
        return [Check("ddp", impl, "course LM: adapters", first["status"], first["detail"])]
    checks, done = [], []
    for k, mb in enumerate(first["sizes"]):
        runs = [r["runs"][k] for r in got]
        prop = f"course LM{_bucket(mb)}, {LM_WORLD} ranks: {CM.LM_STEPS} SGD steps, gradients vs one process"
        error = S.phase_error("ddp", impl, prop, runs, beyond=False)
        if error:
            if mb in HANDOUT_BUCKETS_MB:
                error.detail += " - the 2024/2025 handouts run bucketed DDP on this model at 1, 10, 100 and 1000 MB"
            checks.append(error)
        else:
            checks.append(_gradient_check(impl, prop, runs, first["source"]))
            done.append(runs)
    if done:
        checks.insert(0, _start_check(impl, done))
    if done and impl == "bucketed":
        checks += [_bucket_size_check(impl, done), *call_count_checks(impl, done)]
    elif done:
        checks.append(overlap_check(impl, done))
    return [c for c in checks if c is not None]


def _bucket(mb) -> str:
    return "" if mb is None else f", bucket {mb:.3g} MB" if mb < 1 else f", bucket {mb:g} MB"


def _start_check(impl: str, done: list[list[dict]]) -> Check:
    """Every rank holds rank 0's parameters right after construction (all editions: the class broadcasts them)."""
    bad = sorted({(rank, n) for runs in done for rank, r in enumerate(runs) for n in r["start_diff"]})
    names = sorted({n for _, n in bad})
    return Check(
        "ddp",
        impl,
        "course LM: rank 0's parameters after construction",
        FAIL if bad else PASS,
        f"rank(s) {sorted({r for r, _ in bad})} still hold their own {', '.join(names[:3])}"
        f"{' ...' if len(names) > 3 else ''}: not broadcast from rank 0"
        if bad
        else f"every rank of {LM_WORLD} starts from rank 0's parameters",
    )


def _gradient_check(impl: str, prop: str, runs: list[dict], source: str) -> Check:
    """Every step's synced gradient within the float32 bound of one process's on every rank (all editions: every
    rank ends backward with the average of the ranks' gradients), and the same final weights on every rank; the
    likely mistake when its signature is there."""
    bad = [(s, rank) for rank, r in enumerate(runs) for s, st in enumerate(r["steps"]) if not st["ratio"] <= 1]
    if not bad:
        worst = max(st["ratio"] for r in runs for st in r["steps"])
        split = [rank for rank, r in enumerate(runs) if r["state"] != runs[0]["state"]]
        if split:
            return Check("ddp", impl, prop, FAIL, f"gradients in bound, but rank(s) {split} end with other weights")
        return Check(
            "ddp",
            impl,
            prop,
            PASS,
            f"{source}; every step on every rank within the float32 bound of one process averaging the ranks' "
            f"gradients (worst |diff| / bound {worst:.3g}; bound: {BOUND_TEXT}); the same weights on every rank",
        )
    s, rank = min(bad)
    st = runs[rank]["steps"][s]
    detail = f"step {s}, rank {rank}: {st['where']}; |diff| / bound {st['ratio']:.3g} - {_why(runs, s, rank)}"
    return Check("ddp", impl, prop, FAIL, f"{detail} ({source}; bound: {BOUND_TEXT})")


BOUND_TEXT = (
    "per tensor 2 (n + 1) eps32 max Σ_b |∂(loss_b / B)| over its elements (sums over the B sequences), n the "
    "batch's tokens plus the ranks: two float32 evaluations of the same sums"
)


def _why(runs: list[dict], s: int, rank: int) -> str:
    """The likely mistake behind the first step that failed, from its whole signature on every rank."""
    st, r = runs[rank]["steps"][s], runs[rank]
    digests = [x["steps"][s]["digest"] for x in runs]
    unsynced = sorted({n for d in digests[1:] for n in set(d) | set(digests[0]) if d.get(n) != digests[0].get(n)})
    if not st["finite"]:
        return "a synced gradient is not finite (NaN/inf)"
    if any(x["start_diff"] for x in runs):
        return "the ranks did not start from rank 0's parameters (the check above)"
    factors = [x["steps"][s]["factor"] for x in runs]
    if all(f is not None for f in factors) and max(factors) - min(factors) < 1e-3:  # the same c on every rank
        c, head = factors[0], f"every gradient is {factors[0]:.4g}x one process's"
        if abs(c - LM_WORLD) < 1e-3:
            return f"{head}: summed over ranks, not averaged (divide by the world size)"
        if abs(c - LM_WORLD / 2) < 1e-3:
            return f"{head}: divided by 2, not by the world size ({LM_WORLD})"
        return f"{head}: averaged with the wrong divisor"
    late = [n for n in st["wrong"] if n in r["late"]]
    if st["wrong"] and len(late) == len(st["wrong"]):
        n = late[0]
        return (
            f"only {', '.join(late[:3])}{' ...' if len(late) > 3 else ''} off, each a tensor whose gradient "
            f"comes after that of a tensor registered before it ({n} after {r['late'][n]}; the course's LM "
            "registers its norms after the attention and feed-forward weights): a bucket was all-reduced before all "
            "its gradients were ready (fired from one member's hook, assuming reverse registration order?); the "
            "handout all-reduces a bucket once every gradient in it is ready, in whatever order backward produces "
            "them"
        )
    if unsynced:
        return f"{', '.join(unsynced[:3])}'s gradient differs between ranks: not all-reduced before the optimizer step"
    if st["zeros"]:
        return f"{', '.join(st['zeros'][:3])}'s gradient is all zeros, one process's is not"
    return "the synced gradient is not the mean of the ranks' gradients"


def _oversize_why(nbytes: int, limit: float, sizes: list[int]) -> str:
    """The likely mistake behind an all-reduce of `nbytes` over `limit`, from the model's tensor sizes."""
    if nbytes >= sum(sizes):
        return "every gradient in one all-reduce: the buckets never split (is the bucket's running size updated?)"
    if nbytes <= limit + max(sizes):
        return "over by at most one tensor: a bucket closed only once past the limit?"
    return "more than one tensor over the limit"


def _bucket_size_check(impl: str, done: list[list[dict]]) -> Check:
    """Each all-reduce of a step carries at most bucket_size_mb (binary MB, the larger reading), or one tensor's
    gradient bigger than that (2024/2025: each bucket holds at most bucket_size_mb of parameters)."""
    prop = "course LM: each bucket's all-reduce at most bucket_size_mb"
    seen = 0
    for runs in done:
        for rank, r in enumerate(runs):
            limit, alone = r["bucket_mb"] * MiB + SLACK_BYTES, {b for b in r["sizes"].values()}
            for s, st in enumerate(r["steps"]):
                seen += len(st["messages"])
                over = [b for b in st["messages"] if b > limit and b not in alone]
                if over:
                    detail = (
                        f"bucket {r['bucket_mb']:.4g} MB, step {s}, rank {rank}: an all-reduce of {over[0]} bytes, "
                        f"over {r['bucket_mb'] * MiB:.0f} bytes (MB read as 2**20 bytes, the larger reading) and not "
                        f"one tensor's gradient: a bucket holds more than bucket_size_mb of parameters - "
                        + _oversize_why(over[0], limit, list(r["sizes"].values()))
                    )
                    return Check("ddp", impl, prop, FAIL, detail)
    if not seen:
        return Check(
            "ddp",
            impl,
            prop,
            SKIPPED,
            "not measured: no all-reduce went through torch.distributed.all_reduce (the counter sees only that name)",
        )
    return Check(
        "ddp",
        impl,
        prop,
        PASS,
        f"{seen} all-reduces over {len(done)} bucket sizes, every one within bucket_size_mb or a single tensor",
    )
