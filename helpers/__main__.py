"""Command line: `python -m helpers COMMAND ...` (also under torchrun).

    python -m helpers env                          # what machine this is, which backends
    python -m helpers demo --world-size 2          # spawn 2 ranks, all-reduce their ids
    torchrun --nproc-per-node 2 -m helpers demo    # the same worker, ranks from torchrun
    python -m helpers writeup [--profile gpu]      # execute notebooks, export HTML (make writeup)
    python -m helpers kernels [--quick]            # compile every Triton kernel for sm_80/sm_90a: registers, spills
    python -m helpers tune attention|rmsnorm       # time the kernels' tile grids on a GPU; --check compiles them here
    python -m helpers bench TOPIC [...]            # a topic's benchmark script, e.g. `bench collectives`
    python -m helpers yours PATH/tests/adapters.py # your implementation checked and timed beside ours (make yours)
    python -m helpers reference [--budget-s S]     # the gpu profile's work in batches into data/reference/<device>/

Commands are the entries of COMMANDS, benchmarks those of BENCHMARKS (topic -> the experiment module whose
bench_main(argv) runs it): a function taking the remaining argv and returning an exit code.
"""

from __future__ import annotations

import argparse
import os
import sys


def cmd_env(argv: list[str]) -> int:
    """Print the environment report."""
    from helpers.env import environment_table, resolve_profile

    parser = argparse.ArgumentParser(prog="python -m helpers env")
    parser.add_argument("--profile", default="auto", help="auto | cpu | gpu")
    profile = resolve_profile(parser.parse_args(argv).profile)
    for key, value in environment_table(profile):
        print(f"{key:>22}: {value}")
    return 0


def cmd_demo(argv: list[str]) -> int:
    """All-reduce the rank ids on N ranks (spawned here, or the torchrun world) and check the sum."""
    from helpers.launch import all_reduce_rank_ids, launch

    parser = argparse.ArgumentParser(prog="python -m helpers demo")
    parser.add_argument("--world-size", type=int, default=int(os.environ.get("WORLD_SIZE", 2)))
    parser.add_argument("--backend", default="auto")
    args = parser.parse_args(argv)
    results = launch(all_reduce_rank_ids, args.world_size, backend=args.backend)
    if int(os.environ.get("RANK", 0)) != 0:
        return 0  # under torchrun only rank 0 reports
    expected = sum(range(args.world_size))
    for r in results:
        print(f"rank {r['rank']}/{r['world_size']} {r['backend']} on {r['device']}: sum = {r['sum']:g}")
    ok = all(r["sum"] == expected for r in results)
    print(f"{'OK' if ok else 'WRONG'}: expected {expected}")
    return 0 if ok else 1


def cmd_kernels(argv: list[str]) -> int:
    """Compile every Triton kernel for sm_80 and sm_90a; registers and spills per launch configuration."""
    from helpers.kernel_check import main

    return main(argv)


def cmd_tune(argv: list[str]) -> int:
    """Time each Triton kernel's configuration grid on a GPU and write the fastest into the code's tables."""
    from helpers.course.tune import main

    return main(argv)


def cmd_writeup(argv: list[str]) -> int:
    """Execute the notebooks and export HTML writeups, then the answers page and the front page's sentences from what
    they saved."""
    from helpers.course.answers import write_page
    from helpers.course.front import sentence
    from helpers.course.yours.page import has_saved_run
    from helpers.course.yours.page import write_page as yours_page
    from helpers.writeup import main

    pages = [("Answers, question by question", "answers.html", write_page)]
    if has_saved_run():  # the last `python -m helpers yours` run on this machine
        pages.append(("Yours beside ours: your adapters checked and timed", "yours.html", yours_page))
    return main(argv, extra_pages=pages, front=sentence)


def cmd_yours(argv: list[str]) -> int:
    """Check, time and account a student's implementation (the course's tests/adapters.py) beside ours."""
    from helpers.course.yours import main

    return main(argv)


def cmd_reference(argv: list[str]) -> int:
    """The gpu profile's work in timed batches within a budget, saved to data/reference/<device>/ (resumable)."""
    from helpers.course.reference import main

    return main(argv)


BENCHMARKS = {  # topic -> experiment module with bench_main(argv) -> exit code
    "rmsnorm": "helpers.experiments.rmsnorm",
    "collectives": "helpers.experiments.collectives",
    "ddp": "helpers.experiments.ddp",
    "sharding": "helpers.experiments.sharding",
    "attention": "helpers.experiments.attention",
    "fsdp": "helpers.experiments.fsdp",
    "walltime": "helpers.course.walltime",  # not a topic: each notebook's and the test suite's wall and CPU time
}


def cmd_bench(argv: list[str]) -> int:
    """Run a topic's benchmark script: `bench TOPIC ...` calls BENCHMARKS[TOPIC].bench_main(...)."""
    import importlib

    if not argv or argv[0] not in BENCHMARKS:
        print(f"usage: python -m helpers bench TOPIC [args]; topics: {', '.join(BENCHMARKS)}")
        return 0 if not argv else 2
    return importlib.import_module(BENCHMARKS[argv[0]]).bench_main(argv[1:])


COMMANDS = {
    "env": cmd_env,
    "demo": cmd_demo,
    "writeup": cmd_writeup,
    "bench": cmd_bench,
    "kernels": cmd_kernels,
    "tune": cmd_tune,
    "yours": cmd_yours,
    "reference": cmd_reference,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(__doc__)
        print("commands:", ", ".join(COMMANDS))
        return 2 if argv else 0
    try:
        return COMMANDS[argv[0]](argv[1:])
    except ValueError as err:  # the project's ValueErrors say what was wrong and what to do: one line, no traceback
        print(f"python -m helpers {argv[0]}: error: {err}", file=sys.stderr)
        return 2
    finally:
        _close_process_group()


def _close_process_group() -> None:
    """Under torchrun the ranks share a process group to the end: wait for each other, then tear it down together
    (a rank that exits while a peer's gloo thread still talks to it can abort with 'terminate called ...')."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    code = main()
    if "RANK" in os.environ:  # a torchrun rank: no interpreter teardown to race gloo's threads (launch.finish)
        from helpers.launch import finish

        finish(code)
    sys.exit(code)
