"""Every notebook's gpu profile run without a GPU: the experiment functions at the gpu sizes, contexts and batches,
with every tensor on the meta device (shapes and bytes, no data, no arithmetic), so a shape error surfaces here, the
peak of each run's largest launch is measured (helpers.memory.track) and set against the card (40, 80, 141 GB: CARDS)
and against gpu_plans' closed-form estimate of the same run, and each cell's and reference batch's time is estimated
against the limit it runs under. Notebooks 01, 04 and 05 are walked at every edition their EDITION can choose, 07 at
2026's (gpu_configs: the models each notebook's own setup builds), and each at the sizes its setup picks for the card
(01's profiled size, 02's compiled and 06's side-by-side models, 04's speed sizes, 05's models, 07's checkpointed
model: what the card present holds, by gpu_plans_bytes' estimates). tests/test_dry_run.py runs it in `make test`.

    table = dry_run(cards=tuple(CARDS.values()))   # one row per run, edition and card: tracked peak, per GPU, plan
    dry_run(full=("2026", 80e9))   # only 2026 on an H100 at full depth, the rest one block deep (the tests: faster)
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

import math

import pandas as pd

from helpers.course.dry_run_meta import MetaMode, fake_group, on_meta  # noqa: F401  (the tests' names)
from helpers.course.dry_run_runs import BY_CARD, BY_EDITION, FIXED, NOTEBOOKS, one_layer_models
from helpers.course.dry_run_time import check_time, time_table  # noqa: F401  (this module's runbook)
from helpers.experiments.gpu_configs import EDITIONS, NOTEBOOK_EDITIONS
from helpers.experiments.gpu_plans_bytes import GB, H100_BYTES, peak_per_gpu

PLAN_TOL = 0.01  # a run may need at most 1 % more than gpu_plans says (the plan is the notebooks' upper bound)
CARDS = {"A100 40GB": 40e9, "H100 80GB": H100_BYTES, "H200": 141e9}  # the cards the tests judge every run against


def dry_run(notebooks=None, editions=EDITIONS, cards=(H100_BYTES,), full=None) -> pd.DataFrame:
    """Every notebook (or those of `notebooks`) on the meta device at each of `editions` it builds and on each card
    of `cards` (bytes): one row per run, edition and card with its tracked peak, the bytes per GPU with gpu_plans'
    margins, the plan's estimate of the same run and whether it fits the card. A launch whose key (shapes, batch,
    context) two editions or cards share is walked once; notebooks without an edition once for all. full=(edition,
    card): only that one's launches (and, of the notebooks whose sizes follow the card, that card's) are walked at
    full depth, the others one block deep (one_layer_models: every shape, the bytes left to the plan) unless a full
    walk shares their key; so is a run whose OOM is recorded as a row and whose plan no card of `cards` holds."""
    rows, walked, by_card = [], {}, {}
    with on_meta():
        for nb in notebooks or NOTEBOOKS:
            if nb in FIXED:
                fixed = FIXED[nb]()
                rows += [{**r, "edition": "", "walk": "full", "budget_GB": card / GB} for r in fixed for card in cards]
                continue
            if nb in BY_CARD:  # the sizes the card holds: each key walked once, full's card at full depth
                for card in sorted(cards, key=lambda c: full is not None and c != full[1]):  # the full walk first
                    for run in BY_CARD[nb](card):
                        row = _walk(run, by_card, full is None or card == full[1], max(cards))
                        rows.append({**row, "edition": "", "budget_GB": card / GB})
                continue
            for edition in [e for e in editions if e in NOTEBOOK_EDITIONS[nb]]:
                for card in sorted(cards, key=lambda c, e=edition: (e, c) != full):  # the full walk first
                    for run in BY_EDITION[nb](edition, card):
                        rows.append(_walk(run, walked, (edition, card) == full or full is None, max(cards)))
                        rows[-1].update(edition=edition, budget_GB=card / GB)
    table = pd.DataFrame(rows)
    table["fits"] = table["per_gpu_GB"] <= table["budget_GB"]
    table["over_plan"] = table["peak_GB"] + table["extra_GB"] > table["plan_GB"] * (1 + PLAN_TOL)
    table.attrs["walked"] = len(walked)  # launches of the editioned notebooks walked, either depth (the rest shared)
    return table


def _walk(run, walked: dict, deep: bool, largest_card: float) -> dict:
    """`run`'s row: its tracked peak (walked once per key), or, walked one block deep, its plan's bytes."""
    if run.key in walked:
        return {**run.row(walked[run.key]), "walk": "full"}
    if deep and not (run.oom_by_design and peak_per_gpu(run.plan_bytes + run.extra_bytes, 1) > largest_card):
        walked[run.key] = run.walk()
        return {**run.row(walked[run.key]), "walk": "full"}
    if ("one block", run.key) not in walked:
        with one_layer_models():
            run.walk()  # every shape the launch meets, one block deep
        walked["one block", run.key] = None
    row = run.row(run.plan_bytes)  # bytes per GPU from the plan; the tracked peak is not compared
    return {**row, "peak_GB": math.nan, "walk": "one block"}


def check(table: pd.DataFrame) -> pd.DataFrame:
    """`table`, or a ValueError naming each run that would not fit its card (an OOM the notebook records as a row,
    by design, aside) and each run that needs more than gpu_plans says (its arithmetic missed something the run
    holds, e.g. a wrapper holding every gradient twice)."""

    def at(r) -> str:
        return f"notebook {r.notebook}" + (f" ({r.edition} models)" if r.edition else "")

    lines = [
        f"  {at(r)}: {r.run} needs about {r.per_gpu_GB:.1f} GB per GPU of {r.budget_GB:.0f}: would run out of "
        "memory on the card"
        for r in table[~table["fits"] & ~table["oom_by_design"]].drop_duplicates(["run", "budget_GB"]).itertuples()
    ]
    lines += [
        f"  {at(r)}: {r.run} holds {r.peak_GB + r.extra_GB:.2f} GB per rank, over gpu_plans' "
        f"{r.plan_GB:.2f} GB by {(r.peak_GB + r.extra_GB) / r.plan_GB - 1:.1%} (tolerance {PLAN_TOL:.0%})"
        for r in table[table["over_plan"]].drop_duplicates(["run"]).itertuples()
    ]
    if lines:
        raise ValueError("dry run:\n" + "\n".join(lines))
    return table
