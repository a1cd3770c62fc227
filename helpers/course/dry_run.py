"""Every notebook's gpu profile run without a GPU: the experiment functions at the gpu sizes, contexts and batches,
with every tensor on the meta device (shapes and bytes, no data, no arithmetic), so a shape error surfaces here, the
peak of each run's largest launch is measured (helpers.memory.track) and set against an 80 GB card and against
gpu_plans' closed-form estimate of the same run, and each cell's and reference batch's time is estimated against
the limit it runs under. tests/test_dry_run.py runs it in `make test`.

    table = dry_run()              # one row per run: tracked peak of one rank, per GPU with gpu_plans' margins, plan
    check(table)                   # ValueError naming every run that would not fit, or that needs more than its plan
    check_time(time_table())       # ValueError naming every cell or batch the cost model puts over its limit

What it runs (helpers.course.dry_run_runs), each notebook's largest launch of each kind: 01's warm timing (the
"backward" pass's graph kept while the others build theirs) and its fp32 and autocast step peaks; 02's norms and
model; 03's message buffers; as rank 0 of two on torch's fake process group, 04's speed launch with every DDP
wrapper and its buckets, 05's memory launch with DDP + AdamW, ShardedOptimizer and ZeRO-1, 07's measure launch (our
FSDP's gathered weights and pending reduce-scatters, DDP, ZeRO-1); 06's naive attention at every shape with
pass_steps' kept graph, the leaderboard's, and §6's models side by side under autocast; 07's checkpoint sweep;
08's TP launch (a one-process reference step beside TP and TP+SP), its pipeline launch as the first and the last
stage of p, ring attention's reference on the whole sequence and the TP speed launch. The
meta device's gaps and their fills are in helpers.course.dry_run_meta (index asserts, addresses, placeholders,
collectives, autocast's casts); tests/test_dry_run.py runs each launch at the CPU preset on CPU tensors too and
finds the same bytes.

What it still cannot see, and what covers it instead:
- Triton kernels (no meta launch): FlashAttentionTriton and the Triton RMSNorm are not run; the PyTorch
  implementations' and naive attention's tensors bound theirs (gpu_plans counts a fused kernel's O and L).
- torch.compile (no meta compile): 02's compiled model runs eager (its tensors are eager's or fewer); compiled
  naive attention's kept graph is taken as naive's (gpu_plans).
- NCCL and gloo (the fake group moves nothing): no communication buffers of the backends themselves, no timing;
  the cost model's bytes over NCCL's and gloo's rates estimate the time.
- torch's fully_shard (it refuses meta parameters) and torch DDP (its C++ reducer reads values): gpu_plans' share
  for fully_shard is added to 07's launch; torch DDP runs as DDPBucketed at its 25 MB, whose bucket views hold the
  same 2Ψ as torch's with gradient_as_bucket_view=True. torch's ZeroRedundancyOptimizer runs on meta (the tests)
  but not here: 05 runs it alone at a context of 64, below the memory launch; gpu_plans counts it as ShardedOptimizer.
- Ring attention's tiles (notebook 08): hundreds of thousands of tiny meta ops (~50 s); its (BH, T/N, d) blocks
  sit under the T x T scores of the reference (naive attention on the whole sequence) that the launch runs first.
- Smaller launches of the same code (01's and 04's other sizes, 05's speed and equivalence launches, 06's compile
  comparison): not run; gpu_plans' table ranks them below the ones run here.
- SDPA's fused kernels (meta runs its math path): §6's models run naive attention, whose T x T bound SDPA's.
- The CUDA caching allocator's rounding and fragmentation, the CUDA context: gpu_plans' margins on top of every row.
- Data-dependent values: ids' bounds are tracked (dry_run_meta.IndexBounds); nothing else.
"""

from __future__ import annotations

import pandas as pd

from helpers.course.dry_run_meta import MetaMode, fake_group, on_meta  # noqa: F401  (the tests' names)
from helpers.course.dry_run_runs import RUNS
from helpers.course.dry_run_time import check_time, time_table  # noqa: F401  (this module's runbook)

PLAN_TOL = 0.01  # a run may need at most 1 % more than gpu_plans says (the plan is the notebooks' upper bound)


def dry_run(notebooks=None) -> pd.DataFrame:
    """RUNS (all, or those of `notebooks`) on the meta device: one row per run with its tracked peak, the bytes per
    GPU with gpu_plans' margins, the plan's own estimate of the same run, and whether it fits an 80 GB card."""
    rows = []
    with on_meta():
        for nb in notebooks or RUNS:
            rows += RUNS[nb]()
    table = pd.DataFrame(rows)
    table["over_plan"] = table["peak_GB"] + table["extra_GB"] > table["plan_GB"] * (1 + PLAN_TOL)
    return table


def check(table: pd.DataFrame) -> pd.DataFrame:
    """`table`, or a ValueError naming each run that would not fit the card (an OOM the notebook records as a row,
    by design, aside) and each run that needs more than gpu_plans says (its arithmetic missed something the run
    holds, e.g. a wrapper holding every gradient twice)."""
    lines = [
        f"  notebook {r.notebook}: {r.run} needs about {r.per_gpu_GB:.1f} GB per GPU of {r.budget_GB:.0f}: would run "
        "out of memory on the card"
        for r in table[~table["fits"] & ~table["oom_by_design"]].itertuples()
    ]
    lines += [
        f"  notebook {r.notebook}: {r.run} holds {r.peak_GB + r.extra_GB:.2f} GB per rank, over gpu_plans' "
        f"{r.plan_GB:.2f} GB by {(r.peak_GB + r.extra_GB) / r.plan_GB - 1:.1%} (tolerance {PLAN_TOL:.0%})"
        for r in table[table["over_plan"]].itertuples()
    ]
    if lines:
        raise ValueError("dry run:\n" + "\n".join(lines))
    return table
