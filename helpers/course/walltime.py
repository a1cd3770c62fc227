"""How long the two commands take here: each notebook as `make writeup` runs it, and the `make test` suite, with
wall and CPU time (user+sys of the processes it started), saved with provenance so a later change can be set beside
this one. A benchmark script, not a test (minutes, and the numbers depend on the machine's load).

    python -m helpers bench walltime                       # every notebook, executed and exported as make writeup does
    python -m helpers bench walltime --suite               # and the make test suite (pytest tests notebooks)
    python -m helpers bench walltime notebooks/01_*.ipynb --budget 120
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 python -m helpers bench walltime   # a CPU without fast bf16

Saved as data/local/<device>/walltime.jsonl: one row per notebook (wall_s, cpu_s, status), one for the writeup's
notebooks together and one for the suite; the provenance carries the budget, the load average before and after, and
the CPU-capability switches in effect.
"""

from __future__ import annotations

import argparse
import functools
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from helpers import results, writeup

SUITE = [
    "-m",
    "pytest",
    "-n",
    "auto-make",  # replaced in suite_row by make test's TEST_WORKERS default: 2 without a GPU, 1 with one
    "--dist",
    "loadfile",
    "--nbval-lax",
    "--nbval-current-env",
    "--nbval-cell-timeout=360",
    "tests",
    "notebooks",
]  # make test
SWITCHES = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "OMP_NUM_THREADS")


def children_cpu_s() -> float:
    """User+sys seconds of every finished child process (and theirs, once waited for) so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(fn):
    """(fn()'s result, wall seconds, CPU seconds of the child processes it ran)."""
    wall, cpu = time.perf_counter(), children_cpu_s()
    out = fn()
    return out, time.perf_counter() - wall, children_cpu_s() - cpu


def cell_seconds(nb) -> list[tuple[float, str]]:
    """(seconds, cell id) per executed code cell, slowest first, from the timestamps nbclient records."""
    from datetime import datetime

    out = []
    for cell in nb.cells:
        t = cell.get("metadata", {}).get("execution", {})
        start, end = t.get("iopub.execute_input"), t.get("shell.execute_reply")
        if start and end:
            seconds = (
                datetime.fromisoformat(end.replace("Z", "+00:00"))
                - datetime.fromisoformat(start.replace("Z", "+00:00"))
            ).total_seconds()
            out.append((seconds, cell.get("id", "?")))
    return sorted(out, reverse=True)


def notebook_rows(paths, params: dict, out_dir: Path, slowest: int = 4) -> list[dict]:
    """Execute and export each notebook as `make writeup` does (writeup.execute, export_html): one row each, with
    its `slowest` cells (seconds, id)."""
    rows = []
    for path in paths:
        print(f"{path.name} ...", flush=True)
        (nb, error), wall, cpu = timed(functools.partial(writeup.execute, path, params))
        writeup.export_html(
            nb, out_dir / f"{path.stem}.html", writeup.notebook_title(nb, path.stem), notebook_dir=path.parent
        )
        cells = cell_seconds(nb)[:slowest]
        rows.append(
            {
                "what": "notebook",
                "name": path.name,
                "wall_s": wall,
                "cpu_s": cpu,
                "status": "ok" if error is None else f"FAILED: {error}",
                "slowest_cells": [f"{cid} {sec:.1f} s" for sec, cid in cells],
            }
        )
        print(
            f"    {wall:.0f} s wall, {cpu:.0f} s CPU, {rows[-1]['status']}; slowest cells: "
            + ", ".join(rows[-1]["slowest_cells"]),
            flush=True,
        )
    return rows


def suite_row(extra: list[str]) -> dict:
    """Run make test's pytest command (plus `extra`, e.g. --durations=30) in the repository root: one row."""
    import torch

    workers = "1" if torch.cuda.is_available() else "2"
    cmd = [sys.executable, *(workers if a == "auto-make" else a for a in SUITE), *extra]
    print(" ".join(cmd[1:]), "...", flush=True)
    proc, wall, cpu = timed(lambda: subprocess.run(cmd, cwd=writeup.ROOT, capture_output=True, text=True))
    print("\n".join(proc.stdout.splitlines()[-40:]), flush=True)
    return {
        "what": "suite",
        "name": "make test (pytest tests notebooks)",
        "wall_s": wall,
        "cpu_s": cpu,
        "status": "ok" if proc.returncode == 0 else f"FAILED: pytest exit {proc.returncode}",
    }


def bench_main(argv: list[str]) -> int:
    """`python -m helpers bench walltime`: wall and CPU time per notebook and of the suite, printed and saved."""
    p = argparse.ArgumentParser(prog="python -m helpers bench walltime", description=__doc__.split("\n")[0])
    p.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/*.ipynb in order")
    p.add_argument("--profile", default="auto", help="auto | cpu | gpu (injected as PROFILE when not auto)")
    p.add_argument("--budget", default="auto", help="injected as BUDGET when not auto: seconds, or none")
    p.add_argument("--suite", action="store_true", help="also run the make test suite")
    p.add_argument("--suite-only", action="store_true", help="only the suite")
    p.add_argument("--out", type=Path, help="keep the notebooks' HTML pages here (default: a temporary folder)")
    p.add_argument("--pytest-args", default="--durations=30", help="extra pytest arguments for the suite")
    args = p.parse_args(argv)
    paths = [] if args.suite_only else (args.notebooks or sorted((writeup.ROOT / "notebooks").glob("[0-9]*.ipynb")))
    params = {k: v for k, v in (("PROFILE", args.profile), ("BUDGET", args.budget)) if v != "auto"}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="walltime-") as tmp:
        out = args.out or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        rows = notebook_rows(paths, params, out)
    if len(rows) > 1:
        rows.append(
            {
                "what": "writeup",
                "name": "notebooks together",
                "wall_s": sum(r["wall_s"] for r in rows),
                "cpu_s": sum(r["cpu_s"] for r in rows),
                "status": "ok" if all(r["status"] == "ok" for r in rows) else "FAILED",
            }
        )
    if args.suite or args.suite_only:
        rows.append(suite_row(args.pytest_args.split()))
    width = max(len(r["name"]) for r in rows) if rows else 10
    for r in rows:
        print(f"{r['name']:<{width}}  {r['wall_s']:7.0f} s wall  {r['cpu_s']:7.0f} s CPU  {r['status']}")
    path = results.save_results(
        rows,
        "walltime",
        profile=args.profile,
        budget=args.budget,
        load_before=load_before,
        load_after=os.getloadavg(),
        switches={k: os.environ.get(k) for k in SWITCHES},
    )
    print(f"saved {path.relative_to(results.ROOT)} (the load averages say how busy the machine was)")
    return 0 if all(r["status"] == "ok" for r in rows) else 1
