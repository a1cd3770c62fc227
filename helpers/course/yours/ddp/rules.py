"""The DDP handouts' rules about how the code communicates, judged from the calls helpers.course.yours.collectives
watched on the course's LM (helpers.course.yours.ddp.lm records each step's all-reduces: bytes, async_op, the phase
of backward they were launched in). The handouts' words:

- individual parameters (2024/2025 `ddp_overlap_individual_parameters`; 2026 `get_ddp`): the class "should overlap
  gradient communication and the computation of the backward pass"; the 2026 adapter: "asynchronously
  communicating gradients as they are ready in the backward pass. The gradient for each parameter tensor is
  individually communicated."
- bucketed (2024/2025 `ddp_overlap_bucketed`): buckets exist for "reducing the number of total communication calls",
  each bucket holding at most `bucket_size_mb`: a bucket is one call, not a gate in front of one call per tensor.
"""

from __future__ import annotations

import collections

from helpers.course.yours.report import FAIL, PASS, SKIPPED, Check

OVERLAP_HANDOUT = (
    'the handout: the class "should overlap gradient communication and the computation of the backward pass" '
    "(all-reduces launched asynchronously from the gradients' hooks; finish_gradient_synchronization waits)"
)
FEWER_HANDOUT = 'the handout buckets gradients for "reducing the number of total communication calls"'


def overlap_check(impl: str, done: list[list[dict]]) -> Check:
    """Every gradient all-reduce of every step launched during backward (from a hook) with async_op=True: a blocking
    call inside a hook serializes communication with backward, and calls after backward overlap nothing."""
    prop = "course LM: gradients' all-reduces launched asynchronously during backward (overlap)"
    calls = [c for runs in done for r in runs for st in r["steps"] for c in st.get("calls", [])]
    if not calls:
        return Check("ddp", impl, prop, SKIPPED, "not measured: no call went through torch.distributed.all_reduce")
    during = [a for a, phase in calls if phase == "backward"]
    blocking = [a for a in during if not a]
    n = len(calls)
    if not during:
        where = "after backward" if {phase for _, phase in calls} == {"after"} else "outside backward"
        return Check(
            "ddp",
            impl,
            prop,
            FAIL,
            f"every one of {n} all-reduces was launched {where}"
            f" (in finish_gradient_synchronization?): nothing overlaps the backward pass - {OVERLAP_HANDOUT}",
        )
    if blocking:
        return Check(
            "ddp",
            impl,
            prop,
            FAIL,
            f"{len(blocking)} of {n} all-reduces were blocking calls inside backward's hooks (async_op=False): each "
            f"waits for its communication before backward goes on, so nothing overlaps - {OVERLAP_HANDOUT}",
        )
    late = n - len(during)
    return Check(
        "ddp",
        impl,
        prop,
        PASS,
        f"{len(during)} of {n} all-reduces launched from backward with async_op=True"
        + (f" ({late} after it, e.g. gradients backward never reached)" if late else ""),
    )


def call_count_checks(impl: str, done: list[list[dict]]) -> list[Check]:
    """Per bucket size, the all-reduces of a step at most the buckets a greedy fill makes in whichever order
    (registration, readiness or their reverses; lm.Readiness.most_buckets): fewer calls than tensors where a bucket
    holds several, one call where a bucket holds the whole model."""
    checks = []
    for runs in done:
        r0 = runs[0]
        if r0.get("buckets") is None:
            continue
        mb, most, tensors = r0["bucket_mb"], r0["buckets"], len(r0["sizes"])
        whole = most == 1
        prop = (
            f"course LM, bucket {mb:.3g} MB (holds the model): one all-reduce a step"
            if whole
            else f"course LM, bucket {mb:.3g} MB: fewer all-reduces than tensors ({tensors})"
        )
        counts = [(len(st["messages"]), s, rank) for rank, r in enumerate(runs) for s, st in enumerate(r["steps"])]
        if not any(n for n, _, _ in counts):
            checks.append(Check("ddp", impl, prop, SKIPPED, "not measured: no call went through all_reduce"))
            continue
        n, s, rank = max(counts)
        if n <= most:
            detail = f"at most {n} all-reduce{'s' if n > 1 else ''} a step for {tensors} tensors"
            checks.append(Check("ddp", impl, prop, PASS, detail + f" (a greedy fill makes at most {most} buckets)"))
            continue
        why = _why_more_calls(n, tensors, runs[rank]["steps"][s].get("ready"))
        detail = (
            f"step {s}, rank {rank}: {n} all-reduces for {tensors} tensors, where buckets of {mb:.3g} MB filled "
            f"greedily in any order make at most {most} - {why}; {FEWER_HANDOUT}"
        )
        checks.append(Check("ddp", impl, prop, FAIL, detail))
    return checks


def _why_more_calls(n: int, tensors: int, ready: list | None) -> str:
    """The likely mistake behind more all-reduces than buckets, from when they were launched (`ready`: gradients
    accumulated at each call): several calls at one moment are a ready bucket sent one member per call; calls each
    at a moment of its own are buckets sent as they filled, far smaller than bucket_size_mb."""
    burst = max(collections.Counter(ready).values()) if ready else 0
    if burst > 1:
        return (
            f"up to {burst} all-reduces launched at one moment: a ready bucket sent one member per call, not as one "
            "call (flatten its gradients into one buffer)"
        )
    if ready:
        return (
            f"{'one all-reduce per tensor, ' if n >= tensors else ''}each launched at a gradient of its own: buckets "
            "sent as they filled, far smaller than bucket_size_mb (is it compared with sizes in another unit, bytes "
            "against MB?)"
        )
    return "one all-reduce per tensor" if n >= tensors else "more calls than buckets: a bucket sent in several calls"
