"""`yours` for the distributed topics: a student's DDP (each flavour), sharded optimizer and FSDP, checked against one
process, accounted (memory, bytes) against the formulas, and timed beside ours and PyTorch's.

    result = run_ddp("path/to/tests/adapters.py", Options())       # TopicResult: checks + side-by-side rows
    result = run_sharding(path, Options()); result = run_fsdp(path, Options(repeat=3))

The student's code runs only in ranks started by helpers.launch (2 ranks, gloo, CPU); each rank imports the adapters
file itself. A crashed rank (signal named), a hung collective (after Options.timeout_s) or an exception in the
student's code becomes an "error" check naming file:line, and the topic's other implementations are then run in
launches of their own, so one broken flavour never hides the others. Two kinds of check (report.Check.beyond):
- within the handout's contract (they decide the exit status; helpers.course.yours.ddp.contract, contract_fsdp): the
  course's own test models and procedures (course_models: ToyModel and ToyModelWithTiedWeights built with a seed per
  rank for DDP, one seed for the sharded optimizer, the cs336_basics layers with one seed for FSDP), with the
  tolerances its tests assert; for DDP also the course's language model on 3 ranks at the handout's bucket sizes
  (ddp_lm, ddp_lm_checks); for FSDP the handout's rules watched on the same model (fsdp_probe, fsdp_rules);
- beyond it (reported, never in the exit status): our toy with tied, frozen and unused parameters and a per-rank
  buffer, torch.nn layers seeded per rank, memory and bytes against the formulas, the timings; these are the
  experiments' own checks (helpers.experiments.ddp / sharding / fsdp) with the student's implementation in place of
  ours.
Each phase (a check, the timing, the memory and bytes) runs apart: an exception in one is its own error row, located at
the deepest frame in the student's files (helpers.course.yours.student_calls calls the adapters).

One module per topic (dist_ddp, dist_sharding, dist_fsdp with dist_fsdp_checks) over what they share (dist_common);
this module keeps the names the CLI (helpers.course.yours.RUNNERS), the notebooks and the tests import from here.
"""

from __future__ import annotations

import helpers.course.yours.adapters as A
from helpers.course.yours.ddp.runner import ddp_bucket_sizes, ddp_worker, run_ddp
from helpers.course.yours.dist_common import PARTS, SPEED, TOY, WORLD
from helpers.course.yours.fsdp.checks import FSDP_CHECK, FSDP_DTYPES
from helpers.course.yours.fsdp.runner import fsdp_worker, run_fsdp
from helpers.course.yours.options import Options
from helpers.course.yours.report import CHECK_COLUMNS
from helpers.course.yours.sharding.runner import SHARDING_MEMORY, run_sharding, sharding_worker

__all__ = [  # re-exported: importers of helpers.course.yours.distributed need no change
    "A",
    "FSDP_CHECK",
    "FSDP_DTYPES",
    "PARTS",
    "SHARDING_MEMORY",
    "SPEED",
    "TOY",
    "WORLD",
    "ddp_bucket_sizes",
    "ddp_worker",
    "fsdp_worker",
    "notebook_tables",
    "run_ddp",
    "run_fsdp",
    "run_sharding",
    "sharding_worker",
]

# ======================================= notebooks 04, 05, 07 =======================================

RUNS = {"ddp": run_ddp, "sharding": run_sharding, "fsdp": run_fsdp}


def notebook_tables(topic: str, adapters_path: str, opts: Options | None = None):
    """A notebook's "yours" section (when its ADAPTERS parameter is set): (checks, side_by_side, ratios) DataFrames
    (checks with a "beyond" column: True for the probes past the handout, which never count);
    side_by_side has one column per who (yours, ours, pytorch, formula) for each measure, ratios the paired step-time
    ratios of yours to the others with their intervals and verdicts."""
    import pandas as pd

    result = RUNS[topic](str(adapters_path), opts or Options())
    checks = pd.DataFrame(result.as_rows(), columns=CHECK_COLUMNS)  # "beyond": a probe past the handout
    rows = pd.DataFrame(result.rows, columns=sorted({k for r in result.rows for k in r} | {"measure", "who", "value"}))
    is_ratio = rows["measure"].astype(str).str.contains(" / ")
    side = (
        rows[~is_ratio]
        .assign(value=lambda d: d["value"].astype(object))
        .pivot_table(index=["impl", "measure", "unit"], columns="who", values="value", aggfunc="first", sort=False)
        if (~is_ratio).any()
        else pd.DataFrame()
    )
    ratios = rows[is_ratio].reindex(columns=["impl", "measure", "ratio", "ratio_low", "ratio_high", "pairs", "verdict"])
    return checks, side, ratios
