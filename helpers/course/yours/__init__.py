"""`python -m helpers yours PATH/TO/tests/adapters.py`: check your assignment's code against the course's contract
(each edition's handout and tests), time it beside ours and PyTorch's, and write writeups/yours.html.

    python -m helpers yours ../assignment2-systems/tests/adapters.py          # every topic the file implements
    python -m helpers yours adapters.py --topics rmsnorm,attention --repeat 3
    python -m helpers yours adapters.py --python ../assignment2-systems/.venv/bin/python
    make yours ADAPTERS=../assignment2-systems/tests/adapters.py ARGS="--topics attention"

What counts (pass / fail, and the exit status) is what the edition's handout and tests promise: their shapes, dtypes,
models and requirements. Deeper probes (other lengths, 4-D inputs, bf16, unused parameters, buffers, memory formulas)
are reported in a section of their own, "beyond the handout", folded per topic, as information: "differs" or
"raises" (the saved status stays fail / error), each with why the handout does not require it; it never changes the
exit status. A Triton check this environment cannot run (no GPU, or a Triton without block pointers) says so and is
not a failure.

Your code runs in your own environment when there is one: `--python PATH`, by default `<assignment root>/.venv/bin/
python` when it exists (where `uv sync` puts the course's torch and Triton). Otherwise it runs here, with the course's
common dependencies, `cs336-basics` on the path and your packages' metadata visible, nothing installed into your
repository and no folder left behind; your adapters file is imported as pytest would from the assignment's root or the
repository's (helpers.course.yours.student_env), NVTX ranges run as no-ops on a CPU-only torch. Each implementation's
checks and the timing run in launched processes of their own (helpers.launch), so a crash, a hang or a NaN is
reported where it happened and hides nothing else. Results are saved with provenance
(data/local/<device>/yours_*.jsonl) and written as writeups/yours.html; the exit status is 0 only when every check
of what you implemented, that this environment can run, passed.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, fields, replace
from pathlib import Path

from helpers.course.yours.options import IN_ONE_RANK, RUNNERS, Options  # noqa: F401 (the package's API)


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
    from helpers.course.yours.adapters import AdaptersError, no_adapters_file
    from helpers.course.yours.report import failure_summary
    from helpers.launch import RankError, launch

    path = Path(adapters_path)
    if not path.is_file():
        raise no_adapters_file(path)
    try:
        [found] = launch(inventory_worker, 1, str(path.resolve()), backend="gloo", device="cpu", timeout_s=120)
    except (RankError, TimeoutError) as exc:
        raise AdaptersError(f"importing {path} failed: {failure_summary(exc)}") from None
    if "error" in found:
        raise AdaptersError(found["error"])
    return found


def first_launch_worker(adapters_path: str, opts: Options, topics: list[str]) -> tuple[dict, dict]:
    """The inventory and then every requested kernel topic the file implements, in one launched rank: the student's
    code is imported once instead of once per launch (about 4 s each on a 2-core CPU). (inventory, {topic: result});
    when this launch crashes or hangs, run() goes back to a launch per step, which pins the failure down; a topic
    that meets a CUDA error (and those after it) is left out, to run in launches of its own."""
    found = inventory_worker(adapters_path)
    if "error" in found:
        return found, {}
    done = {}
    for topic in topics:
        named = [impl for impl, status in found[topic] if status == "ok"]
        if topic in IN_ONE_RANK and named:
            module, name = RUNNERS[topic]
            result = getattr(importlib.import_module(module), name)(adapters_path, opts, named)
            if result.poisoned:  # a CUDA error: this process can run nothing more on the GPU
                break
            done[topic] = result
    return found, done


def _first_launch(adapters_path, topics: list[str], opts: Options) -> tuple[dict, dict]:
    """first_launch_worker's answer, or (inventory(), {}) from a launch of its own when that one failed."""
    from helpers.course.yours.adapters import AdaptersError, no_adapters_file
    from helpers.launch import RankError, launch

    path = Path(adapters_path)
    if not path.is_file():
        raise no_adapters_file(path)
    try:
        [(found, done)] = launch(first_launch_worker, 1, str(path.resolve()), opts, topics, timeout_s=opts.timeout_s)
    except (RankError, TimeoutError):
        return inventory(adapters_path), {}
    if "error" in found:
        raise AdaptersError(found["error"])
    return found, done


def run_topic(adapters_path, topic: str, opts: Options, impls: list[str] | None = None):
    """One topic's TopicResult; a crash, a timeout or an error of ours becomes an ERROR check, never an exception."""
    from helpers.course.yours.adapters import ADAPTERS
    from helpers.course.yours.report import ERROR, Check, TopicResult, failure_summary
    from helpers.launch import RankError

    try:
        if topic in IN_ONE_RANK:
            from helpers.course.yours.kernels.launch import run_kernel_topic

            return run_kernel_topic(str(adapters_path), topic, opts, list(ADAPTERS[topic]) if impls is None else impls)
        module, name = RUNNERS[topic]
        return getattr(importlib.import_module(module), name)(str(adapters_path), opts)
    except (RankError, TimeoutError) as exc:
        return TopicResult(topic, [Check(topic, "-", "runs to the end", ERROR, failure_summary(exc))])
    except Exception as exc:  # noqa: BLE001 - one topic's failure never stops the others
        return TopicResult(topic, [Check(topic, "-", "runs to the end", ERROR, f"{type(exc).__name__}: {exc}")])


def run(adapters_path, topics=None, opts: Options | None = None, progress: bool = True) -> list:
    """Every requested topic the file implements, checked and timed: a TopicResult per topic, in order."""
    from tqdm.auto import tqdm

    from helpers.course.yours.adapters import ADAPTERS
    from helpers.course.yours.report import SKIPPED, Check, TopicResult

    opts, topics = opts or Options(), list(topics or RUNNERS)
    if any(topic not in IN_ONE_RANK for topic in topics):  # before the first launch starts launch's forkserver
        from helpers.course.yours.dist_common import warm_launches

        warm_launches()
    bar = tqdm(total=len(topics), desc="yours: importing your code, kernel topics", unit="topic", disable=not progress)
    found, done = _first_launch(adapters_path, topics, opts)
    bar.set_description("yours")
    bar.update(sum(topic in done for topic in topics))
    path = str(Path(adapters_path).resolve())
    out = []
    for topic in topics:
        if topic not in done:
            bar.set_postfix_str(topic)
        named = [impl for impl, status in found[topic] if status == "ok"]
        if not named:
            names = ", ".join(names[0] for names in ADAPTERS[topic].values())
            out.append(TopicResult(topic, [Check(topic, "-", "adapters present", SKIPPED, f"none of {names}")]))
            bar.update(1)
            continue
        res = done[topic] if topic in done else run_topic(path, topic, opts, named)
        absent = [
            Check(
                topic,
                impl,
                "adapter present",
                SKIPPED,
                f"no {ADAPTERS[topic][impl][0]} in the file (another edition's)",
            )
            for impl, status in found[topic]
            if status != "ok" and topic in IN_ONE_RANK
        ]
        res.checks = absent + res.checks
        out.append(res)
        if topic not in done:
            bar.update(1)
    bar.close()
    return out


# ---- in the student's own environment -------------------------------------------------------------------------

SHIMMED = ("cloudpickle", "tqdm")  # what helpers' launch and timing need that a course environment may lack


def _shim_dir(parent: Path) -> str:
    """A folder (in `parent`) of links to this environment's pure-Python packages that helpers needs (SHIMMED), for
    another Python to append to its sys.path: its own copies, when it has them, come first."""
    folder = parent / "shim"
    folder.mkdir()
    for name in SHIMMED:
        spec = importlib.util.find_spec(name)
        if spec and spec.origin:
            src = Path(spec.origin).parent if spec.submodule_search_locations else Path(spec.origin)
            (folder / src.name).symlink_to(src)
    return str(folder)


def child(argv: list[str] | None = None) -> None:
    """Entry point in the student's Python: run the topics of a request file, write the results as JSON."""
    request, answer = (argv or sys.argv[1:])[:2]
    req = json.loads(Path(request).read_text())
    sys.path.append(req["shim"])
    import torch

    from helpers.course.yours.adapters import AdaptersError

    try:
        triton = importlib.import_module("triton").__version__
    except ImportError:
        triton = None
    env = {"python": sys.executable, "torch": torch.__version__, "triton": triton}
    try:
        results = run(req["adapters"], req["topics"], Options(**req["opts"]), progress=False)
        out = {
            "env": env,
            "results": [{"topic": r.topic, "checks": [asdict(c) for c in r.checks], "rows": r.rows} for r in results],
        }
    except AdaptersError as exc:
        out = {"env": env, "error": str(exc)}
    Path(answer).write_text(json.dumps(out, default=str))


def run_elsewhere(python: Path, adapters_path, topics, opts: Options) -> tuple[list, dict]:
    """run() in another Python (the student's environment): (TopicResults, {python, torch, triton} there).
    AdaptersError when that Python cannot run the companion (no torch there) or cannot import the file."""
    from helpers.course.yours.adapters import AdaptersError
    from helpers.course.yours.report import Check, TopicResult

    root = Path(__file__).resolve().parents[3]
    with tempfile.TemporaryDirectory(prefix="yours-") as tmp:
        request, answer = Path(tmp) / "request.json", Path(tmp) / "answer.json"
        request.write_text(
            json.dumps(
                {
                    "adapters": str(Path(adapters_path).resolve()),
                    "topics": list(topics),
                    "opts": asdict(opts),
                    "shim": _shim_dir(Path(tmp)),
                }
            )
        )
        env = {**os.environ, "PYTHONPATH": str(root)}
        proc = subprocess.run(
            [str(python), "-c", "from helpers.course.yours import child; child()", str(request), str(answer)],
            env=env,
            stdout=sys.stdout,
            stderr=subprocess.PIPE,
            text=True,
            timeout=opts.timeout_s * 20,
            check=False,
        )
        if not answer.exists():
            tail = "\n".join(proc.stderr.strip().splitlines()[-6:])
            raise AdaptersError(
                f"{python} could not run the checks (exit {proc.returncode}): {tail}\nIt needs torch "
                "(and triton for the Triton checks): is it your assignment's environment?"
            )
        out = json.loads(answer.read_text())
    if "error" in out:
        raise AdaptersError(out["error"])
    names = {f.name for f in fields(Check)}
    results = [
        TopicResult(r["topic"], [Check(**{k: v for k, v in c.items() if k in names}) for c in r["checks"]], r["rows"])
        for r in out["results"]
    ]
    return results, out["env"]


def default_python(adapters_path) -> Path | None:
    """<assignment root>/.venv/bin/python when the student has that environment (`uv sync` makes it), else None."""
    from helpers.course.yours.adapters import assignment_root

    candidate = assignment_root(Path(adapters_path)) / ".venv" / "bin" / "python"
    return candidate if candidate.exists() else None


# ---- the report -----------------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    """The command: parse, run (here or in the student's Python), print, save, write the page; 0 only when every
    check of what is implemented, that can run here, passed."""
    from helpers.course.yours.adapters import no_adapters_file
    from helpers.course.yours.report import checks_table, print_report, side_by_side, summary
    from helpers.env import resolve_profile
    from helpers.results import save_results

    parser = argparse.ArgumentParser(
        prog="python -m helpers yours",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 2)[2],
    )
    parser.add_argument("adapters", type=Path, help="your assignment's tests/adapters.py")
    parser.add_argument("--topics", default=",".join(RUNNERS), help=f"comma-separated, from {', '.join(RUNNERS)}")
    parser.add_argument("--profile", default="auto", help="auto | cpu | gpu")
    parser.add_argument(
        "--python",
        type=Path,
        default=None,
        help="the Python to run your code with (default: <assignment root>/.venv/bin/python when it "
        "exists, else this one)",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs of each distributed check (races)")
    parser.add_argument("--steps", type=int, default=Options.steps, help="timed steps per implementation")
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out of the timings")
    parser.add_argument("--no-timing", action="store_true", help="the checks alone (no timing, no side-by-side rows)")
    parser.add_argument("--timeout-s", type=float, default=Options.timeout_s, help="per launched check")
    parser.add_argument("--out", type=Path, default=None, help="the page's folder (default: writeups/)")
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        help="where the rows are saved (default: data/local/<device>/, which the writeup links)",
    )
    args = parser.parse_args(argv)
    topics = [t.strip() for t in args.topics.split(",") if t.strip()]
    unknown = [t for t in topics if t not in RUNNERS]
    if unknown or not topics:
        raise ValueError(f"unknown topics {unknown}: choose from {', '.join(RUNNERS)}")
    if args.repeat < 1 or args.steps < 1 or args.timeout_s <= 0:
        raise ValueError("--repeat and --steps must be at least 1 and --timeout-s positive")
    if not args.adapters.is_file():
        raise no_adapters_file(args.adapters)
    profile = resolve_profile(args.profile)
    opts = replace(
        Options(),
        profile=profile,
        repeat=args.repeat,
        steps=args.steps,
        compiled=not args.no_compile,
        timed=not args.no_timing,
        timeout_s=args.timeout_s,
    )
    python = args.python or default_python(args.adapters)
    if python is not None and not Path(python).exists():
        raise ValueError(f"--python {python} does not exist")
    if python is not None and Path(python).absolute() != Path(sys.executable).absolute():
        print(f"running your code with {python}")
        results, where = run_elsewhere(Path(python), args.adapters, topics, opts)
    else:
        results, where = run(args.adapters, topics, opts), {"python": sys.executable}
    print_report(results)
    checks, rows = checks_table(results), side_by_side(results)
    extra = dict(adapters=str(args.adapters.resolve()), topics=topics, **{f"student_{k}": v for k, v in where.items()})
    save_results(checks, "yours_checks", profile, directory=args.results, **extra)
    save_results(rows, "yours_rows", profile, directory=args.results, **extra)
    from helpers.course.yours.page import write_page
    from helpers.results import ROOT  # the repository (helpers.writeup's too: importing that takes 2 s, nbformat)

    page = (args.out or ROOT / "writeups") / "yours.html"
    write_page(page, profile, data_dir=args.results)
    text, ok = summary(checks.to_dict(orient="records"))
    print(f"\n{text}; page: {page}")
    return 0 if ok else 1
