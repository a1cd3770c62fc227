"""Notebook 04's experiments with helpers.ddp: the workers launched on N ranks (equivalence with one process, speed,
profiler traces), their summaries, the overlap measure, and `python -m helpers bench ddp`. The tests use them too.

    per_rank = launch(equivalence_worker, 2, "toy", [("bucketed", "bucketed", 1.0)], 3, 8, 6)  # final state_dicts
    reference_training("toy", 3, 8, 6)                                 # what every one of them must equal
    per_rank = launch(speed_worker, 2, "small/8", variants, 10, 3, 8, 64)   # interleaved step times, traces
    summarize_speed(per_rank)                                          # one row per variant, slowest rank per step

    python -m helpers bench ddp [--model small/8 --bucket-mb 1 --steps 30]   # DDPBucketed vs torch DDP, gloo, 2 ranks
"""
from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

from helpers import launch as L
from helpers.ddp import _DataParallel, wrap
from helpers.experiments.common import (BACKWARD_RANGE, bench_parser, cpu_state, make_batches, make_model, quartiles,
                                        rank_share, run_interleaved, slowest_rank, train_step)
from helpers.model import lm_loss
from helpers.profiling import quiet_profiler
from helpers.timing import sync, time_call


def make_optimizer(params, name: str):
    """SGD (lr 0.1) or AdamW (lr 1e-3): what the equivalence and speed runs train with."""
    return torch.optim.SGD(params, lr=0.1) if name == "sgd" else torch.optim.AdamW(params, lr=1e-3)


def reference_training(name, steps, batch_size, context_length, seed=0, optimizer="sgd") -> dict:
    """Single-process training on the full batches: the state_dict every data-parallel run must reproduce."""
    model = make_model(name, seed)
    opt = make_optimizer(model.parameters(), optimizer)
    for x, y in make_batches(name, steps, batch_size, context_length, seed):
        opt.zero_grad(set_to_none=True)
        lm_loss(model(x), y).backward()
        opt.step()
    return cpu_state(model)


def equivalence_worker(name, variants, steps, batch_size, context_length, seed=0, optimizer="sgd") -> dict:
    """Train each (label, kind, bucket_size_mb) on this rank's half batch from a rank-seeded model; return the
    final state_dicts (which must equal reference_training's) and each wrapper's bucket count."""
    rank = dist.get_rank()
    out = {}
    for label, kind, mb in variants:
        model = make_model(name, seed + rank)  # differs per rank: the broadcast must fix it
        ddp = wrap(kind, model, mb, **({"find_unused_parameters": True} if kind == "torch_ddp" and name == "toy" else {}))
        opt = make_optimizer(ddp.parameters(), optimizer)
        for batch in make_batches(name, steps, batch_size, context_length, seed):
            train_step(model, opt, *rank_share(batch), grad_sync=ddp)
        out[label] = {"state": cpu_state(model),
                      "buckets": len(getattr(ddp, "buckets", [])) or None}
    return out


def uneven_worker(kinds) -> dict:
    """Rank 1 skips a layer that rank 0 uses: each kind's synced gradients vs the mean of both ranks' own (max diff)."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 1)).to(L.device())
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(rank)).to(L.device())  # (4, 8) per rank
    forward = (lambda m: m[2](m[1](m[0](x)))) if rank == 0 else (lambda m: m[2](m[0](x)))
    forward(base).pow(2).mean().backward()
    own = [p.grad if p.grad is not None else torch.zeros_like(p) for p in base.parameters()]
    mean = [torch.stack(_gather(g)).mean(0) for g in own]
    out = {}
    for kind, mb in kinds:
        ddp = wrap(kind, copy.deepcopy(base), mb)
        ddp.on_train_batch_start()
        ddp.module.zero_grad(set_to_none=True)  # after it, on purpose: the hooks must copy into the buckets
        forward(ddp.module).pow(2).mean().backward()
        ddp.finish_gradient_synchronization()
        out[f"{kind} {mb}"] = max(float((p.grad - m).abs().max()) for p, m in zip(ddp.module.parameters(), mean))
    return out


def _gather(t: torch.Tensor) -> list[torch.Tensor]:
    parts = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, t.contiguous())
    return parts


def traced_steps(ddp, optimizer, batches, trace_path=None) -> list[dict]:
    """Train one step per (x, y) under torch.profiler. Per step: the backward interval (its record_function range)
    and each all-reduce's execution interval as gloo's worker threads record it ("gloo:all_reduce"), in µs of the
    host clock. `trace_path`: also save the rank's Chrome trace (open it in Perfetto or chrome://tracing)."""
    dev = L.device()
    with quiet_profiler(dev) as prof:
        for x, y in batches:
            train_step(ddp.module, optimizer, x, y, grad_sync=ddp)
        sync(dev)
    if trace_path is not None:
        prof.export_chrome_trace(str(trace_path))
    events = prof.events()
    backward = sorted((e.time_range.start, e.time_range.end) for e in events if e.name == BACKWARD_RANGE)
    comm = sorted((e.time_range.start, e.time_range.end) for e in events if e.name.startswith("gloo:all_reduce"))
    ends = [b0 for b0, _ in backward[1:]] + [float("inf")]
    return [{"backward": (b0, b1), "comm": [[a, b] for a, b in comm if b0 <= a < end]}
            for (b0, b1), end in zip(backward, ends)]


def speed_worker(name, variants, steps, warmup, batch_size, context_length, seed=0, timeline_steps=3,
                 traced=2, trace_dir=None) -> dict:
    """Time one step of every (label, kind, bucket_size_mb), interleaved step by step so drift hits all alike.

    kind None = this rank's compute alone (no wrapper, no communication). Returns per label: step samples (s), comm
    samples (s in finish), backward durations, for the last `timeline_steps` steps the backward interval and every
    all-reduce's [launch, done] times, and under "traced" `traced` more steps profiled (traced_steps; not timed),
    whose Chrome traces go to trace_dir/<label>.rank<r>.json when trace_dir is given.
    """
    rank, dev = dist.get_rank(), L.device()
    if trace_dir is not None:
        Path(trace_dir).mkdir(parents=True, exist_ok=True)
    base = make_model(name, seed)
    batches = [rank_share(b) for b in make_batches(name, 4, batch_size, context_length, seed)]
    runs = {}
    for label, kind, mb in variants:
        ddp = wrap(kind, copy.deepcopy(base), mb) if kind else _Local(copy.deepcopy(base))
        runs[label] = dict(ddp=ddp, opt=make_optimizer(ddp.parameters(), "sgd"), timeline=[],
                           buckets=len(getattr(ddp, "buckets", [])) or None)

    def step(label):
        def one(i):
            r, record = runs[label], i >= warmup + steps - timeline_steps
            ddp = r["ddp"]
            ddp.timeline = [] if record else None
            comm0, times = ddp.comm_s, {}
            _, seconds = time_call(lambda: train_step(ddp.module, r["opt"], *batches[i % len(batches)],
                                                      grad_sync=ddp, times=times), dev)
            if record:
                r["timeline"].append({"backward": times["backward"], "comm": [list(s) for s in ddp.timeline]})
            return seconds, ddp.comm_s - comm0, times["backward"][1] - times["backward"][0]
        return one

    samples = run_interleaved({label: step(label) for label in runs}, steps, warmup)
    out = {}
    for label, r in runs.items():
        out[label] = {"step": [s[0] for s in samples[label]], "comm": [s[1] for s in samples[label]],
                      "backward": [s[2] for s in samples[label]], "timeline": r["timeline"], "buckets": r["buckets"]}
        if traced and not isinstance(r["ddp"], _Local):  # after the timed steps: profiler overhead stays out
            path = None if trace_dir is None else Path(trace_dir) / f"{label.replace(' ', '_')}.rank{rank}.json"
            out[label]["traced"] = traced_steps(r["ddp"], r["opt"], [batches[i % len(batches)] for i in range(traced)],
                                                path)
    return out


class _Local(_DataParallel):
    """No data parallelism: this rank's compute alone (the speed baseline); no broadcast, no all-reduce."""

    def __init__(self, module):
        nn.Module.__init__(self)
        self.module, self.params, self.comm_s, self.timeline = module, [], 0.0, None

    def finish_gradient_synchronization(self) -> None:
        pass


def summarize_speed(per_rank: list[dict]) -> list[dict]:
    """One row per label: medians over steps of the slowest rank's step, comm and backward times (each step waits
    for its slowest rank), and the step time's quartiles."""
    rows = []
    for label, first in per_rank[0].items():
        med = {k: float(np.median(slowest_rank([r[label][k] for r in per_rank]))) for k in ("step", "comm", "backward")}
        p25, _, p75 = quartiles(slowest_rank([r[label]["step"] for r in per_rank]))
        rows.append({"variant": label, "step_s": med["step"], "step_p25_s": p25, "step_p75_s": p75,
                     "comm_s": med["comm"], "backward_s": med["backward"], "buckets": first["buckets"],
                     "steps": len(first["step"])})
    return rows


def overlap_fraction(backward: tuple[float, float], spans: list) -> float:
    """Share of the time with an all-reduce in flight (union of [launch, done]) that falls inside backward."""
    spans = sorted((a, b) for a, b in spans if b is not None)
    merged = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    total = sum(b - a for a, b in merged)
    inside = sum(max(0.0, min(b, backward[1]) - max(a, backward[0])) for a, b in merged)
    return inside / total if total > 0 else 0.0


# ---- python -m helpers bench ddp ----

def bench_worker(name, bucket_mb, steps, warmup, batch_size, context_length) -> dict:
    """DDPBucketed and torch DDP from the same weights on the same data, interleaved: step samples per wrapper, and
    whether both ended with the same weights (same start, same data, same means)."""
    base = make_model(name, 0)
    ddps = {k: wrap(k, copy.deepcopy(base), bucket_mb) for k in ("bucketed", "torch_ddp")}
    opts = {k: make_optimizer(d.parameters(), "sgd") for k, d in ddps.items()}
    batches = [rank_share(b) for b in make_batches(name, 4, batch_size, context_length, 0)]
    step = {k: (lambda i, k=k: time_call(lambda: train_step(ddps[k].module, opts[k], *batches[i % len(batches)],
                                                               grad_sync=ddps[k]), L.device())[1]) for k in ddps}
    samples = run_interleaved(step, steps, warmup)
    same = all(torch.equal(a, b) for a, b in zip(ddps["bucketed"].module.parameters(),
                                                  ddps["torch_ddp"].module.parameters()))
    return {"step": samples, "buckets": len(ddps["bucketed"].buckets), "same_weights": same}


def bench_main(argv: list[str]) -> int:
    """`python -m helpers bench ddp`: DDPBucketed vs torch DDP step time (gloo, 2 ranks, CPU), same run."""
    parser = bench_parser("python -m helpers bench ddp", bench_main.__doc__)
    parser.add_argument("--bucket-mb", type=float, default=1.0)
    args = parser.parse_args(argv)
    if not args.bucket_mb > 0:
        parser.error(f"--bucket-mb must be > 0, got {args.bucket_mb}")
    per_rank = L.launch(bench_worker, 2, args.model, args.bucket_mb, args.steps, args.warmup, args.batch_size,
                        args.context_length, backend="gloo", device=args.device)
    slowest = {k: slowest_rank([p["step"][k] for p in per_rank]) for k in ("bucketed", "torch_ddp")}
    ours, theirs = np.median(slowest["bucketed"]), np.median(slowest["torch_ddp"])
    paired = quartiles(slowest["bucketed"] / slowest["torch_ddp"])  # step i vs step i
    same = all(p["same_weights"] for p in per_rank)
    print(f"{args.model}, bucket {args.bucket_mb:g} MB, gloo on {args.device}, 2 ranks, {args.steps} interleaved steps "
          f"(slowest rank): DDPBucketed median {ours * 1e3:.2f} ms ({per_rank[0]['buckets']} buckets), "
          f"torch DDP {theirs * 1e3:.2f} ms, ratio of medians {ours / theirs:.3f}; median of the per-step ratios "
          f"{paired[1]:.3f} (IQR {paired[0]:.3f}-{paired[2]:.3f}; target <= 1.05); identical weights after training: {same}")
    return 0 if same else 1
