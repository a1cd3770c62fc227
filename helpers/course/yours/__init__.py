"""`python -m helpers yours PATH/TO/tests/adapters.py`: a student's implementation checked, timed and accounted
beside ours and PyTorch's.

    python -m helpers yours ../assignment2-systems/tests/adapters.py          # every topic the file implements
    python -m helpers yours adapters.py --topics rmsnorm,attention --repeat 3
    make yours ADAPTERS=../assignment2-systems/tests/adapters.py

Each topic runs the student's code in launched processes (helpers.launch), so a crash, a hang or a NaN is reported
as that topic's error and the other topics still run. Topic modules: `kernels` (rmsnorm, attention) and
`distributed` (ddp, sharding, fsdp). Results are saved with provenance (data/local/<device>/yours_*.jsonl) and
written as writeups/yours.html; the exit status is 1 when any check failed.
"""
from __future__ import annotations

import argparse
import importlib
import textwrap
from dataclasses import dataclass, replace
from pathlib import Path


@dataclass
class Options:
    """What a run of the checks asks for."""
    profile: str = "cpu"  # "cpu": small shapes, gloo; "gpu": the course's shapes
    repeat: int = 1  # distributed checks run this many times (races show up as a differing repeat)
    steps: int = 10  # timed steps per implementation (interleaved; at least 6 pairs for a verdict)
    warmup: int = 2
    timed: bool = True  # time the implementations (the checks alone: False)
    compiled: bool = True  # time torch.compile'd PyTorch too (its first call compiles: seconds on a CPU)
    timeout_s: float = 300.0  # per launched check: a hung collective is reported after this


RUNNERS = {  # topic -> (module, function): kernels run in one launched rank here, distributed ones launch their own
    "rmsnorm": ("helpers.course.yours.kernels", "rmsnorm_worker"),
    "attention": ("helpers.course.yours.kernels", "attention_worker"),
    "ddp": ("helpers.course.yours.distributed", "run_ddp"),
    "sharding": ("helpers.course.yours.distributed", "run_sharding"),
    "fsdp": ("helpers.course.yours.distributed", "run_fsdp"),
}
IN_ONE_RANK = ("rmsnorm", "attention")


def inventory_worker(adapters_path: str) -> dict:
    """{topic: [(impl, 'ok' | 'absent')]} of the file, or {'error': why it cannot be imported} (a launched rank)."""
    from helpers.course.yours import adapters as A

    try:
        module = A.load(adapters_path)
    except A.AdaptersError as exc:
        return {"error": str(exc)}
    return {t: [(a.impl, a.status) for a in A.implementations(module, t)] for t in A.TOPICS}


def inventory(adapters_path) -> dict:
    """What the file implements, found by importing it in a launched process (its import may crash or hang)."""
    from helpers.course.yours.adapters import AdaptersError
    from helpers.launch import RankError, launch
    from helpers.course.yours.report import failure_summary

    path = Path(adapters_path)
    if not path.is_file():
        raise AdaptersError(f"no adapters file at {path}: pass the path to your assignment's tests/adapters.py")
    try:
        [found] = launch(inventory_worker, 1, str(path.resolve()), backend="gloo", device="cpu", timeout_s=120)
    except (RankError, TimeoutError) as exc:
        raise AdaptersError(f"importing {path} failed: {failure_summary(exc)}") from None
    if "error" in found:
        raise AdaptersError(found["error"])
    return found


def run_topic(adapters_path, topic: str, opts: Options):
    """One topic's TopicResult; a crash, a timeout or an error of ours becomes an ERROR check, never an exception."""
    from helpers.course.yours.report import ERROR, Check, TopicResult, failure_summary
    from helpers.launch import RankError, launch

    module, name = RUNNERS[topic]
    fn = getattr(importlib.import_module(module), name)
    try:
        if topic in IN_ONE_RANK:
            return launch(fn, 1, str(adapters_path), opts, timeout_s=opts.timeout_s)[0]
        return fn(str(adapters_path), opts)
    except (RankError, TimeoutError) as exc:
        return TopicResult(topic, [Check(topic, "-", "runs to the end", ERROR, failure_summary(exc))])
    except Exception as exc:  # noqa: BLE001 - one topic's failure never stops the others
        return TopicResult(topic, [Check(topic, "-", "runs to the end", ERROR, f"{type(exc).__name__}: {exc}")])


def run(adapters_path, topics=None, opts: Options | None = None, progress: bool = True) -> list:
    """Every requested topic the file implements, checked and timed: a TopicResult per topic, in order."""
    from tqdm.auto import tqdm

    from helpers.course.yours.adapters import ADAPTERS
    from helpers.course.yours.report import SKIPPED, Check, TopicResult

    opts = opts or Options()
    found = inventory(adapters_path)
    path = str(Path(adapters_path).resolve())
    out = []
    for topic in tqdm(list(topics or RUNNERS), desc="yours", unit="topic", disable=not progress):
        if all(status != "ok" for _, status in found[topic]):
            names = ", ".join(names[0] for names in ADAPTERS[topic].values())
            out.append(TopicResult(topic, [Check(topic, "-", "adapters present", SKIPPED, f"none of {names}")]))
            continue
        out.append(run_topic(path, topic, opts))
    return out


def _wrap(text: str, width: int = 100) -> str:
    return "\n".join(textwrap.wrap(text, width, subsequent_indent="      ")) if text else ""


def print_report(results: list) -> None:
    """The terminal tables: each topic's checks (failures in full), then the side-by-side rows."""
    from helpers.course.yours.report import readable_rows

    for res in results:
        print(f"\n== {res.topic}")
        for c in res.checks:
            print(f"  {c.status:>15}  {c.impl:<11} {c.prop}")
            if c.detail and c.status != "pass":
                print("      " + _wrap(c.detail))
    for res in results:
        if res.rows:
            print(f"\n== {res.topic}: side by side (ratios paired in one interleaved loop)")
            print(readable_rows(res.rows).to_string(index=False, max_colwidth=90))


def main(argv: list[str]) -> int:
    """The command: parse, run, print, save, write the page; 1 when a check failed."""
    from helpers.course.yours.report import checks_table, side_by_side
    from helpers.env import resolve_profile
    from helpers.results import save_results

    parser = argparse.ArgumentParser(prog="python -m helpers yours", description=__doc__.split("\n")[0])
    parser.add_argument("adapters", type=Path, help="your assignment's tests/adapters.py")
    parser.add_argument("--topics", default=",".join(RUNNERS), help=f"comma-separated, from {', '.join(RUNNERS)}")
    parser.add_argument("--profile", default="auto", help="auto | cpu | gpu")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each distributed check (races)")
    parser.add_argument("--steps", type=int, default=Options.steps, help="timed steps per implementation")
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out of the timings")
    parser.add_argument("--timeout-s", type=float, default=Options.timeout_s, help="per launched check")
    parser.add_argument("--out", type=Path, default=None, help="the page's folder (default: writeups/)")
    parser.add_argument("--results", type=Path, default=None,
                        help="where the rows are saved (default: data/local/<device>/, which the writeup links)")
    args = parser.parse_args(argv)
    topics = [t.strip() for t in args.topics.split(",") if t.strip()]
    unknown = [t for t in topics if t not in RUNNERS]
    if unknown or not topics:
        raise ValueError(f"unknown topics {unknown}: choose from {', '.join(RUNNERS)}")
    if args.repeat < 1 or args.steps < 1 or args.timeout_s <= 0:
        raise ValueError("--repeat and --steps must be at least 1 and --timeout-s positive")
    profile = resolve_profile(args.profile)
    opts = replace(Options(), profile=profile, repeat=args.repeat, steps=args.steps, compiled=not args.no_compile,
                   timeout_s=args.timeout_s)
    results = run(args.adapters, topics, opts)
    print_report(results)
    checks, rows = checks_table(results), side_by_side(results)
    extra = dict(adapters=str(args.adapters.resolve()), topics=topics)
    save_results(checks, "yours_checks", profile, directory=args.results, **extra)
    save_results(rows, "yours_rows", profile, directory=args.results, **extra)
    from helpers.course.yours.page import write_page
    from helpers.writeup import ROOT

    page = (args.out or ROOT / "writeups") / "yours.html"
    write_page(page, profile, data_dir=args.results)
    failed = checks[checks.status.isin(["fail", "error"])]
    print(f"\n{len(checks) - len(failed)} of {len(checks)} checks without failure; page: {page}")
    return 1 if len(failed) else 0
