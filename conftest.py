"""pytest, for tests/ and notebooks/ alike: under pytest-xdist (`make test` runs `-n 2`), each worker gets its own
share of the cores, so the two never oversubscribe them.

Why: torch sizes its thread pool by the cores it may use (helpers.env.usable_cores, the affinity mask), and OpenMP
threads spin while they wait. Two workers that each think they own both cores made one notebook cell 14x slower
(notebook 07's checkpointing sweep: 8 s alone, 118 s beside another worker, on a 2-core EPYC). Pinned, each worker
and everything it starts (launched ranks, notebook kernels, which inherit the mask) runs on its own cores with as
many threads as it has cores, and a worker waiting on a launch or a timeout leaves the other one its core.
"""

import os
import sys


def pytest_configure(config):
    worker, workers = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not (worker and workers and hasattr(os, "sched_setaffinity")):
        return
    from helpers.env import share_of_cores

    mine = share_of_cores(sorted(os.sched_getaffinity(0)), int(worker.removeprefix("gw")), int(workers))
    os.sched_setaffinity(0, mine)
    if "torch" in sys.modules:  # imported already (by helpers' pytest plugin): its pool was sized for every core
        sys.modules["torch"].set_num_threads(len(mine))


LONGEST_FIRST = (  # make test's longest files and notebooks, longest first (build/test_times.jsonl on a 2-core EPYC
    # with the AVX2 switches, 2026-11-29): each worker starts on one, and short ones fill in at the end instead of one
    # worker running a long one alone (the Makefile's --no-loadscope-reorder keeps this order)
    "tests/test_yours_distributed.py",
    "tests/test_yours_corpus.py",
    "notebooks/02_rmsnorm_triton.ipynb",
    "notebooks/04_ddp.ipynb",
    "tests/test_dry_run.py",
    "notebooks/03_collectives.ipynb",
    "notebooks/01_benchmarking_and_profiling.ipynb",
    "notebooks/05_optimizer_state_sharding.ipynb",
    "notebooks/07_fsdp.ipynb",
    "tests/test_launch.py",
    "tests/test_exit.py",
    "notebooks/06_flash_attention.ipynb",
    "tests/test_yours.py",
)


def pytest_collection_modifyitems(config, items):
    """LONGEST_FIRST's files and notebooks first, in its order; the rest after, as collected (a stable sort: a
    notebook's cells keep their order)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


def pytest_runtest_logreport(report):
    """HELPERS_TEST_TIMES=path: one JSON line per test (a notebook cell under nbval) as it finishes, so a run cut by
    a timeout (a lent GPU's 10-minute commands) still says where its time went. `make test` sets it."""
    path = os.environ.get("HELPERS_TEST_TIMES")
    if not path or (report.when != "call" and report.passed and report.duration < 0.5):
        return  # a set-up or teardown only when it failed or took time (a module's fixture: the dry run's 30 s)
    if hasattr(report, "node") and not os.environ.get("PYTEST_XDIST_WORKER"):
        return  # pytest-xdist's controller replaying a worker's report: the worker wrote it
    import json
    import time

    row = dict(test=report.nodeid, phase=report.when, outcome=report.outcome, seconds=round(report.duration, 3))
    row.update(worker=os.environ.get("PYTEST_XDIST_WORKER", ""), end=round(time.time(), 1))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a") as f:  # one short write per line in append mode: workers' lines do not interleave
        f.write(json.dumps(row) + "\n")
