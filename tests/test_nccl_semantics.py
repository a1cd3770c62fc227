"""Ring attention, the DDP wrappers and FSDP under NCCL's semantics on a CPU (tests/nccl_stub.py, issue 47 item 2):
2 gloo ranks whose receives, waits and collectives return before the data lands, the data landing at the first use
after the wait() or at the device sync. Each run must give what the same code gives on plain gloo (ring attention:
one process's attention within the fp32 bound notebook 08 checks it with; the wrappers: the same gradients, bitwise),
use no communication's tensor before its wait() (stub.races) and post nothing NCCL's pairing rule would hang on
(NcclDeadlock on leaving the stub). Mutants show the stub catches what NCCL would expose: the ring's K, V read before
the group's wait; its sends and receives posted ungrouped; DDP's buckets and FSDP's gathered weights and gradient
shards read before their wait. DDP's launch -> done spans: the overlapped wrappers launch from backward's hooks,
the naive one after it, and every span ends when its data landed, not when wait() returned.

Not modelled: ring attention reports no timings (bytes and chunk pairs only), so it has no stamp to check; notebook
04's profiler-trace overlap and 07's gather timeliness read profiler events the stub cannot move (gloo's own host
events, or NCCL's kernels on the GPU), and on NCCL the wrappers time spans and waits with CUDA events (test_ddp's
fake-event test covers that arithmetic)."""

import bisect

import pytest
import torch

from helpers.launch import launch
from helpers.model import ModelConfig

DELAY_S = 0.002  # the stub's landing delay: short, the tests check orders and values, not times
RING = dict(batch_heads=2, context_length=16, head_dim=8)
LM = ModelConfig("nccl/test", d_model=16, d_ff=32, n_layers=2, n_heads=2, vocab_size=32, context_length=8)


def _stubbed(fn) -> dict:
    """fn() under the stub: its value, the races, the landings, and NCCL's verdict on the posts."""
    from nccl_stub import NcclDeadlock, NcclStub

    try:
        with NcclStub(delay_s=DELAY_S) as stub:
            value = fn()
        return {"value": value, "races": stub.races, "landed": stub.landed, "deadlock": None}
    except NcclDeadlock as e:
        return {"value": None, "races": stub.races, "landed": stub.landed, "deadlock": str(e)}


# ---- ring attention (helpers.context_parallel, notebook 08) ----


def _ring_worker(batch_heads: int, context_length: int, head_dim: int) -> dict:
    """context_parallel_worker (every variant, forward and backward, against naive attention) under the stub; then
    the two mutants, the causal balanced forward only."""
    import torch.distributed as dist

    from helpers import context_parallel as CP
    from helpers.experiments import model_parallel_context as C

    out = {"correct": _stubbed(lambda: C.context_parallel_worker(batch_heads, context_length, head_dim))}
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    q, k, v = (CP.local_chunks(torch.randn(batch_heads, context_length, head_dim, generator=g), rank, world, True)
               for _ in range(3))  # fmt: skip
    wait_all, pass_on = CP.wait_all, CP._pass_on
    try:
        CP.wait_all = lambda handles: None  # the received K, V read with the group never waited on
        out["unwaited"] = _stubbed(lambda: bool(CP.ring_attention(q, k, v, True)[0].isnan().any()))
        CP.wait_all, CP._pass_on = wait_all, _ungrouped
        out["ungrouped"] = _stubbed(lambda: CP.ring_attention(q, k, v, True)[0])
    finally:
        CP.wait_all, CP._pass_on = wait_all, pass_on
    return out


def _ungrouped(blocks, group=None):
    """_pass_on's mutant: every send posted alone, then every receive (gloo buffers them; NCCL would hang)."""
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    received = [torch.empty_like(b) for b in blocks]
    works = [dist.isend(b.contiguous(), (rank + 1) % world) for b in blocks]
    works += [dist.irecv(r, (rank - 1) % world) for r in received]
    for w in works:
        w.wait()
    return received


@pytest.fixture(scope="module")
def ring():
    return launch(_ring_worker, 2, *RING.values(), backend="gloo", device="cpu")


def test_ring_attention_is_exact_and_race_free_under_nccl_semantics(ring):
    """Every variant's o, lse and gradients within notebook 08's bound of naive attention on one process, with each
    received K, V (and dK, dV) landing only at its first use after the group's wait(); no use before the wait; every
    step's sends and receives in one group, so NCCL's pairing rule completes."""
    from helpers.experiments import model_parallel_context as C
    from helpers.formulas import model_parallel as FM

    u = FM.UNIT_ROUNDOFF[torch.float32]
    n = {b: C.reduction_terms(RING, 2, b) for b in (False, True)}
    for r in ring:
        run = r["correct"]
        assert run["deadlock"] is None and run["races"] == [], run
        assert len(run["landed"]) == 3 * (2 + 4 + 2)  # per variant: K, V forward; K, V, dK, dV back; dK, dV home
        for name in C.VARIANTS:
            for what in ("o", "lse", "dq", "dk", "dv"):
                diff, scale = run["value"][name][what]
                assert diff <= 2 * n[what.startswith("d")] * u * scale, (name, what, diff, scale)


def test_ring_mutants_are_caught_by_the_stub(ring):
    """Reading the received K, V without waiting on the group is a race (and NaN out); posting each send alone ahead
    of the receives would hang NCCL (both ranks send first; a send completes only once its receive runs)."""
    for r in ring:
        assert r["unwaited"]["races"] and r["unwaited"]["value"] is True, r["unwaited"]
        assert "NCCL would hang" in r["ungrouped"]["deadlock"], r["ungrouped"]


# ---- DDP (helpers.ddp, notebook 04) ----

DDP_KINDS = [("naive", None), ("flat", None), ("per_parameter", None), ("bucketed", 2)]  # bucketed: 2 buckets
DDP_STEPS, DDP_BATCH, DDP_CONTEXT = 2, 4, 6


def _ddp_run(kind: str, buckets, timeline: bool = False) -> dict:
    """DDP_STEPS steps of the toy model through wrap(kind): per step the gradients, read right after
    finish_gradient_synchronization (no device sync between: the wait() must order the reads). `timeline`: also the
    backward's host interval and the all-reduces' [launch, done] spans (train_step then syncs after the wait)."""
    from helpers import ddp as D
    from helpers.experiments import common
    from helpers.experiments import ddp as R

    model = common.make_model("toy", 0)
    ddp = D.wrap(kind, model, R.bucket_mb_for(buckets) if buckets else None)
    opt = common.make_optimizer(ddp.parameters(), "sgd")
    out = {"grads": [], "backward": [], "spans": []}
    for x, y in common.make_batches("toy", DDP_STEPS, DDP_BATCH, DDP_CONTEXT, 0):
        x, y = common.rank_share((x, y))
        times, ddp.timeline = ({}, []) if timeline else (None, None)
        common.train_step(model, opt, x, y, grad_sync=ddp, times=times, optimizer_step=False)
        out["grads"].append([p.grad.clone() for p in ddp.params])
        if timeline:
            out["backward"].append(times["backward"])
            out["spans"].append([list(s) for s in ddp.timeline])
        opt.step()
    ddp.close()
    return out


def _ddp_worker() -> dict:
    """Each wrapper on plain gloo, then under the stub (built inside it: the broadcast too), once as is and once
    with its timeline recorded; the bucketed wrapper once more under the stub with finish_gradient_synchronization's
    wait on the buckets left out."""
    from helpers import ddp as D

    out = {}
    for kind, buckets in DDP_KINDS:
        out[kind] = {
            "gloo": _ddp_run(kind, buckets),
            "nccl": _stubbed(lambda k=kind, b=buckets: _ddp_run(k, b)),
            "timeline": _stubbed(lambda k=kind, b=buckets: _ddp_run(k, b, timeline=True)),
        }
    wait_all = D.wait_all
    D.wait_all = lambda handles: None
    try:
        out["unwaited"] = _stubbed(lambda: _ddp_run("bucketed", 2))
    finally:
        D.wait_all = wait_all
    return out


@pytest.fixture(scope="module")
def ddp():
    return launch(_ddp_worker, 2, backend="gloo", device="cpu")


@pytest.mark.parametrize("kind", [k for k, _ in DDP_KINDS])
def test_ddp_gradients_under_nccl_semantics_are_gloos(ddp, kind):
    """finish_gradient_synchronization's wait() returns before the all-reduced data lands: the gradients read after
    it must still be the synced ones (bitwise: gloo does the same sums on the stub's copies), with no read of a
    bucket before its wait and the collectives in the same order on both ranks."""
    for r in ddp:
        run = r[kind]["nccl"]
        assert run["deadlock"] is None and run["races"] == [], run["races"]
        for step, (ours, gloo) in enumerate(zip(run["value"]["grads"], r[kind]["gloo"]["grads"], strict=True)):
            assert all(torch.equal(a, b) for a, b in zip(ours, gloo, strict=True)), (kind, step)


def test_ddp_spans_launch_in_backward_only_when_overlapped_and_end_when_the_data_lands(ddp):
    """The launch -> done spans notebook 04 §3 measures overlap from, with done set by the work's future: naive
    launches after backward (overlap 0); per-parameter and bucketed launch from the gradient hooks while backward
    runs, and their data lands only at the sync after finish_gradient_synchronization, so each span ends at its
    landing, after backward: overlap strictly between 0 and 1, not the 100 % a done stamped at wait() would claim.
    "Ends at its landing" is an order, not a time: the stub stamps a landing, then completes its future (the done
    stamp, in the same thread), then sleeps before the next landing; so a done lies at or after a landing of its own
    step and before the next one. (Within 1 ms of a landing, as this read before, failed once on a loaded 2-core
    machine: the process was preempted between the two stamps.) A done stamped at wait() lies before its step's
    first landing (waits precede the sync that lands the data)."""
    from helpers.experiments.ddp_overlap import overlap_fraction

    for r in ddp:
        for kind, _ in DDP_KINDS:
            run = r[kind]["timeline"]
            assert run["deadlock"] is None and run["races"] == [], run["races"]
            ends = [t for op, _, t in run["landed"] if op == "all_reduce"]  # in landing order: increasing
            for (b0, b1), spans in zip(run["value"]["backward"], run["value"]["spans"], strict=True):
                assert spans, kind
                for _, b in spans:  # the last landing at or before the done, then the next one
                    i = bisect.bisect_right(ends, b)
                    landed, after = (ends[i - 1] if i else None), (ends[i] if i < len(ends) else None)
                    assert landed is not None and landed >= b0 and (after is None or b < after), (kind, b, ends)
                inside = [b0 <= a <= b1 for a, _ in spans]
                fraction = overlap_fraction((b0, b1), spans)
                if kind in ("naive", "flat"):
                    assert not any(inside) and fraction == 0.0, (kind, spans, (b0, b1))
                else:
                    assert any(inside) and 0.0 < fraction < 1.0, (kind, spans, (b0, b1), fraction)


def test_ddp_reading_buckets_before_their_wait_is_caught(ddp):
    """The planted bug: finish_gradient_synchronization without waiting on the buckets' all-reduces. On gloo it can
    pass by luck; under NCCL's semantics the gradients are read before the data landed: races, and NaN gradients."""
    for r in ddp:
        run = r["unwaited"]
        assert run["races"], run
        assert any(not g.isfinite().all() for step in run["value"]["grads"] for g in step)


# ---- FSDP (helpers.fsdp, notebook 07) ----

FSDP_STEPS, FSDP_BATCH = 2, 4


def _fsdp_run(everything: bool = False) -> dict:
    """FSDP_STEPS SGD steps of a 2-layer TransformerLM (fp32), each rank on half the batch: per step the full
    gradients (gather_full_grads, after the step), and at the end the full weights (gather_full_params).
    `everything`: the norms' gains sharded too, so that no replicated all-reduce follows the reduce-scatters."""
    import torch.nn as nn

    from helpers.experiments import common
    from helpers.experiments.fsdp_common import step
    from helpers.fsdp import FSDP
    from helpers.model import RMSNormTorch, build_model, random_batch

    torch.manual_seed(0)
    fsdp = FSDP(build_model(LM), shard_types=(nn.Linear, nn.Embedding) + ((RMSNormTorch,) if everything else ()))
    opt = torch.optim.SGD(fsdp.parameters(), lr=0.1)
    gen, out = torch.Generator().manual_seed(1), {"grads": []}
    for _ in range(FSDP_STEPS):
        x, y = common.rank_share(random_batch(LM, FSDP_BATCH, generator=gen))
        step(fsdp.module, fsdp, opt, x, y, optimizer_step=False)
        opt.step()  # first: a collective reading the gradients would order them on NCCL's stream
        out["grads"].append(fsdp.gather_full_grads())
    out["weights"] = fsdp.gather_full_params()
    out["prefetched"] = fsdp.prefetched
    return out


def _fsdp_worker() -> dict:
    """FSDP on plain gloo and under the stub; then two mutants under the stub: the hooks use a gathered weight
    without waiting on its all-gather; finish_gradient_synchronization takes the shards' gradients without waiting
    on their reduce-scatters (every parameter sharded: a replicated all-reduce waited on after them would order them
    too, one process group being one NCCL stream, and the mutant would be as harmless on NCCL)."""
    from helpers import fsdp_hooks, fsdp_storage

    out = {"gloo": _fsdp_run(), "nccl": _stubbed(_fsdp_run)}
    for name, module, everything in (("gather", fsdp_hooks, False), ("reduce_scatter", fsdp_storage, True)):
        wait_all = module.wait_all
        module.wait_all = lambda handles: None
        try:
            out[name] = _stubbed(lambda e=everything: _fsdp_run(e))
        finally:
            module.wait_all = wait_all
    return out


@pytest.fixture(scope="module")
def fsdp():
    return launch(_fsdp_worker, 2, backend="gloo", device="cpu")


def test_fsdp_under_nccl_semantics_is_gloos(fsdp):
    """All-gathers (prefetched ones too) and reduce-scatters return before their data lands: every gathered weight
    is used after its wait(), every gradient shard read after its reduce-scatter's; gradients and weights bitwise
    gloo's; the collectives pair on both ranks; a freed prefetch's late data lands nowhere."""
    for r in fsdp:
        run = r["nccl"]
        assert run["deadlock"] is None and run["races"] == [], run["races"]
        assert run["value"]["prefetched"] == r["gloo"]["prefetched"] > 0
        for ours, gloo in zip(run["value"]["grads"], r["gloo"]["grads"], strict=True):
            assert all(torch.equal(ours[n], gloo[n]) for n in gloo), [
                n for n in gloo if not torch.equal(ours[n], gloo[n])
            ]
        assert all(torch.equal(run["value"]["weights"][n], w) for n, w in r["gloo"]["weights"].items())


@pytest.mark.parametrize("mutant", ["gather", "reduce_scatter"])
def test_fsdp_use_before_wait_is_caught(fsdp, mutant):
    """The planted bugs: a gathered weight computed with before its all-gather's wait() (and the shard it reads
    updated by the optimizer meanwhile); a gradient shard stepped with before its reduce-scatter's wait(): races on
    NCCL, and the weights trained from what the stub leaves undefined (NaN) are not finite."""
    for r in fsdp:
        run = r[mutant]
        assert run["races"], run
        values = [g for s in run["value"]["grads"] for g in s.values()] + list(run["value"]["weights"].values())
        assert any(not v.isfinite().all() for v in values), mutant
