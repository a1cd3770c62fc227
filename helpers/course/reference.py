"""`python -m helpers reference`: the gpu profile's work in batches, for a GPU lent for half an hour.

    python -m helpers reference                        # everything that fits 25 minutes, into data/reference/<device>/
    python -m helpers reference --budget-s 900 --only kernels 01
    python -m helpers reference --profile cpu --out /tmp/ref   # the tiny plan, end to end, on any machine

Batches run in order of value (PLAN), each in its own process with a timeout (at most MAX_BATCH_S), calling the
notebooks' experiment functions (helpers.course.reference_batches). Before each, its time is estimated: the wall
time an earlier run of it took on this device and profile (the manifest keeps them), else a cost model (closed-form
FLOPs and bytes over this device's rates, plus process starts, launches and compiles). A batch whose estimate does
not fit the budget left is skipped; a batch already saved for this device, profile and commit is not rerun. The
folder gets one small JSON-lines file per result and manifest.json (commit, torch, triton, driver, device, each
batch's status and wall time); the run ends with headline figures beside the published ones.

Here: the plan, the manifest, the runner and the CLI; the cost model is helpers.course.reference_cost and the headline
figures helpers.course.reference_headlines (their names stay importable from here).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from helpers.course.reference_batches import SCALES
from helpers.course.reference_cost import ESTIMATORS, Rates, cpu_rates, estimate_s, gpu_rates
from helpers.course.reference_cost import GPU_EFFICIENCY as GPU_EFFICIENCY  # re-exported (the tests' names)
from helpers.course.reference_cost import _attn_s as _attn_s
from helpers.course.reference_cost import model_estimate_s as model_estimate_s
from helpers.course.reference_headlines import format_table, headlines
from helpers.env import machine_facts
from helpers.results import DATA_DIR, ROOT, device_slug, git_commit

MAX_BATCH_S = 480  # one batch's limit: 8 minutes, so one lent half hour holds several and a hang costs one batch
DEFAULT_BUDGET_S = 25 * 60  # a lent GPU's 30 minutes, less its start and the transfers
MANIFEST = "manifest.json"
LOG_TAIL = 2000  # characters of a failed batch's output kept in the manifest


@dataclass(frozen=True)
class Batch:
    """One unit of the reference run: a child process running reference_batches' function `name` (or `command`
    with the folder appended, and its own `estimate_s`, for a plan of other work)."""

    name: str
    title: str
    env: dict = field(default_factory=dict)  # extra environment of the child
    command: tuple = ()
    estimate_s: float | None = None

    def argv(self, profile: str, folder: Path) -> list[str]:
        if self.command:
            return [*self.command, str(folder)]
        return [
            sys.executable,
            "-m",
            "helpers.course.reference_batches",
            self.name,
            "--profile",
            profile,
            "--out",
            str(folder),
        ]


PLAN = (  # in order of value: what a short lease must produce first
    Batch("kernels", "RMSNorm Triton fwd, fwd+bwd vs copy bandwidth; FlashAttention-2 at the leaderboard shape"),
    Batch(
        "registers",
        "every Triton kernel compiled: registers and spills (ptxas; and the driver's on a GPU)",
        env={"TRITON_INTERPRET": "0"},
    ),  # the compiler, never the interpreter
    Batch("01", "notebook 01: time per size and pass, memory peaks, FLOPs and MFU"),
    Batch("02", "notebook 02: norm implementations per width and dtype"),
    *(
        Batch(name, f"notebook 06: attention implementations per shape, {name[3:]}")
        for name in SCALES
        if name.startswith("06-")
    ),
    Batch("03", "notebook 03: collectives, 2 ranks, per backend and device"),
    Batch("04", "notebook 04: DDP variants' step time per size"),
    *(Batch(name, f"notebook 05: optimizer speed, {name[3:]}") for name in SCALES if name.startswith("05-")),
    Batch("07", "notebook 07: FSDP vs DDP, ZeRO-1, fully_shard: speed and memory"),
    Batch("08", "notebook 08: tensor parallelism exact, its bytes and memory; TP steps against the α-β model"),
    Batch("04-sweep", "notebook 04: bucket-size sweep"),
)
BATCHES = {b.name: b for b in PLAN}
assert set(BATCHES) == set(ESTIMATORS)  # a cost estimate for every batch


# ---- facts, manifest ----


def driver_facts() -> dict:
    """NVIDIA driver version, GPU count and memory per GPU from nvidia-smi (no CUDA context here); {} without it."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return {}
    lines = [line.split(",") for line in out.stdout.strip().splitlines() if "," in line]
    if out.returncode or not lines:
        return {}
    return {"driver": lines[0][0].strip(), "gpus": len(lines), "gpu_memory_bytes": float(lines[0][1]) * 2**20}


def sources_stamp(root: Path = ROOT) -> str:
    """ "src-" and a short SHA-256 of helpers/'s Python sources (paths and contents): the code's stamp where there is
    no git (a copied tree), so a saved batch is rerun once the code changes."""
    digest = hashlib.sha256()
    for path in sorted(Path(root, "helpers").rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return "src-" + digest.hexdigest()[:12]


def code_commit(root: Path = ROOT) -> str:
    """Short hash of the last commit that changed anything outside data/, "-dirty" when such a tracked file has
    changed since: what a saved batch depends on (committing its results does not make it stale). Without git,
    sources_stamp."""

    def git(*args):
        try:
            out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
        except OSError:  # no git on the machine
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    if git_commit(root) is None:  # no git, or root is not the top of a repo
        return sources_stamp(root)
    outside = ["--", ".", ":(exclude)data"]
    commit = git("log", "-1", "--format=%h", *outside)
    dirty = git("status", "--porcelain", "--untracked-files=no", *outside)
    return sources_stamp(root) if not commit else commit + ("-dirty" if dirty else "")


def read_manifest(folder: Path) -> dict:
    """The folder's manifest.json, or {} when there is none yet."""
    path = Path(folder) / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else {}


def _write_manifest(folder: Path, manifest: dict) -> None:
    manifest["updated"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
    tmp = folder / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, folder / MANIFEST)


def memory_notes(profile: str, gpu_bytes: float | None) -> dict[str, str]:
    """Per batch, the gpu_plans warning for the notebook it runs when a run will not fit this GPU's memory."""
    if profile != "gpu" or not gpu_bytes:
        return {}
    from helpers.experiments.gpu_plans import PLANS, fit_summary

    notes = {nb: fit_summary(nb, gpu_bytes) for nb in PLANS}
    return {b.name: notes[b.name[:2]] for b in PLAN if b.name[:2] in notes and "warning" in notes[b.name[:2]]}


# ---- running ----


def run_child(argv: list[str], timeout_s: float, env: dict | None = None) -> tuple[str, int | None, str, float]:
    """Run argv in its own process group with a timeout: (status, return code, output, wall seconds). On timeout
    the whole group (its spawned ranks too) is killed."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # this checkout's helpers
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path, **(env or {})},
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
        status = "ok" if proc.returncode == 0 else "failed"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        status = "timeout"
    return status, proc.returncode, out or "", time.perf_counter() - start


def _saved_names(output: str) -> list[str]:
    lines = [line for line in output.splitlines() if line.startswith("saved: ")]
    return lines[-1].split()[1:] if lines else []


def _only(only, plan) -> list[Batch]:
    """The plan's batches named in `only` (names or comma-separated lists), in the plan's order."""
    if not only:
        return list(plan)
    names = {n for item in only for n in str(item).split(",") if n}
    exact = {b.name for b in plan}
    family = {n: {b.name for b in plan if b.name.startswith(n + "-")} for n in names - exact}  # "05": 05-<kind>...
    unknown = {n for n, members in family.items() if not members}
    if unknown:
        raise ValueError(f"unknown batch(es) {', '.join(sorted(unknown))}; batches: {', '.join(b.name for b in plan)}")
    names |= {m for members in family.values() for m in members}
    return [b for b in plan if b.name in names]


def run_reference(
    budget_s: float = DEFAULT_BUDGET_S,
    only=None,
    out=None,
    profile: str = "gpu",
    plan=PLAN,
    rates: Rates | None = None,
    max_batch_s: float = MAX_BATCH_S,
    commit: str | None = None,
    echo=print,
    archive_dir=None,
) -> pd.DataFrame:
    """Run the plan's batches in order within budget_s; write <out>/<device>/ (results + manifest.json); return
    one row per batch: status, estimate and where it came from, wall time. `commit` names the code; by default
    code_commit() (git, else a hash of the sources). With archive_dir, the folder is archived there at the end."""
    if profile not in ("cpu", "gpu"):
        raise ValueError(f"--profile must be cpu or gpu, got {profile!r}")
    if not budget_s > 0:
        raise ValueError(f"--budget-s must be > 0, got {budget_s}")
    facts = {k: v for k, v in machine_facts().items() if k != "hostname"}
    if profile == "gpu" and facts["device_type"] != "cuda":
        raise ValueError("the gpu profile needs CUDA and torch sees no GPU here; use --profile cpu for the tiny plan")
    driver = driver_facts()
    default = DATA_DIR / "reference" if profile == "gpu" else DATA_DIR / "local" / "reference"  # tiny plan: ignored
    folder = Path(out if out is not None else default) / device_slug(facts["device"])
    folder.mkdir(parents=True, exist_ok=True)
    commit = commit or code_commit()
    manifest = read_manifest(folder)
    if manifest.get("device") not in (None, facts["device"]):
        raise ValueError(f"{folder} holds a run of {manifest['device']!r}, not of this {facts['device']!r}")
    if manifest.get("profile") not in (None, profile):
        raise ValueError(f"{folder} holds a {manifest['profile']} profile run; give --out another folder for {profile}")
    rates = rates or (
        gpu_rates(facts["device"], driver.get("gpus", facts["gpu_count"])) if profile == "gpu" else cpu_rates()
    )
    notes = memory_notes(profile, driver.get("gpu_memory_bytes"))
    manifest.update(
        device=facts["device"],
        profile=profile,
        commit=commit,
        torch=facts.get("torch"),
        triton=facts.get("triton"),
        cuda=facts.get("cuda"),
        driver=driver.get("driver"),
        python=facts.get("python"),
        gpus=driver.get("gpus", facts.get("gpu_count")),
        budget_s=budget_s,
    )
    manifest.setdefault("batches", {})
    start, rows = time.perf_counter(), []
    for batch in _only(only, plan):
        left = budget_s - (time.perf_counter() - start)
        earlier = manifest["batches"].get(batch.name, {})
        est, source = (
            (batch.estimate_s, "given")
            if batch.estimate_s is not None
            else estimate_s(batch.name, profile, rates, manifest)
        )
        row = dict(batch=batch.name, title=batch.title, estimate_s=round(est, 1), estimate_from=source)
        if earlier.get("status") == "ok" and earlier.get("commit") == commit:
            rows.append(dict(row, status="saved earlier", wall_s=earlier.get("wall_s")))
            echo(f"== {batch.name}: saved earlier at commit {commit}, not run again")
            continue
        if est > left:
            rows.append(dict(row, status=f"skipped: needs ~{est:.0f} s, {left:.0f} s left", wall_s=None))
            echo(f"== {batch.name}: skipped, estimate {est:.0f} s ({source}) > {left:.0f} s left")
            if earlier.get("status") != "ok":
                manifest["batches"][batch.name] = dict(status="skipped", estimate_s=round(est, 1), commit=commit)
            continue
        echo(f"== {batch.name}: {batch.title} (estimate {est:.0f} s, {source}; {left:.0f} s left)")
        status, code, output, wall = run_child(batch.argv(profile, folder), min(max_batch_s, left), batch.env)
        entry = dict(
            status=status,
            wall_s=round(wall, 1),
            estimate_s=round(est, 1),
            estimate_from=source,
            commit=commit,
            date=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            returncode=code,
            results=_saved_names(output),
        )
        if batch.name in notes:
            entry["memory_note"] = notes[batch.name]
        if status != "ok":
            entry["log_tail"] = output[-LOG_TAIL:]
            echo(output[-LOG_TAIL:])
        manifest["batches"][batch.name] = entry
        _write_manifest(folder, manifest)
        rows.append(dict(row, status=status, wall_s=round(wall, 1)))
        echo(f"   {status} in {wall:.0f} s" + (f": {', '.join(entry['results'])}" if entry["results"] else ""))
    _write_manifest(folder, manifest)
    table = pd.DataFrame(rows)
    table.attrs["folder"] = folder
    if archive_dir is not None:
        table.attrs["archive"] = archive(folder, archive_dir)
        echo(f"== this chunk's results: {_shown(table.attrs['archive'])}")
    return table


def archive(folder: Path, archive_dir) -> Path:
    """The device folder as it is now (results and manifest) in one archive, <archive_dir>/<device>-NN.tar.gz, NN
    counting this device's chunks: on a machine whose commands are cut at 10 minutes each chunk's results can be
    carried off as soon as it ends, and the newest archive holds everything saved so far."""
    archive_dir = Path(archive_dir)
    archive_dir.mkdir(parents=True, exist_ok=True)
    n = len(list(archive_dir.glob(f"{folder.name}-*.tar.gz"))) + 1
    path = archive_dir / f"{folder.name}-{n:02d}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    return path


def _shown(path: Path) -> str:
    """`path` relative to the checkout where it lies inside it (no absolute path of a clone in a writeup)."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def manifests(root=None) -> pd.DataFrame:
    """One row per reference run under root (data/reference/): device, profile, date, commit, versions, batches done
    (notebook 00 shows it); one line and an empty frame when there is none yet."""
    root = Path(root if root is not None else DATA_DIR / "reference")
    rows = []
    for path in sorted(root.glob(f"*/{MANIFEST}")):
        m = json.loads(path.read_text())
        done = [n for n, b in m.get("batches", {}).items() if b.get("status") == "ok"]
        rows.append(
            {
                "device": m.get("device"),
                "profile": m.get("profile"),
                "date": (m.get("updated") or "")[:10],
                "commit": m.get("commit"),
                "torch": m.get("torch"),
                "triton": m.get("triton"),
                "driver": m.get("driver"),
                "batches done": " ".join(done),
                "batches not done": " ".join(n for n in m.get("batches", {}) if n not in done),
            }
        )
    if not rows:
        print(
            f"no reference run saved yet under {_shown(root)}/: python -m helpers reference (make reference) on a "
            "GPU makes one"
        )
    return pd.DataFrame(
        rows,
        columns=[
            "device",
            "profile",
            "date",
            "commit",
            "torch",
            "triton",
            "driver",
            "batches done",
            "batches not done",
        ],
    )


def main(argv: list[str]) -> int:
    """`python -m helpers reference`: run the plan within the budget, print each batch's status and the headlines."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m helpers reference", description=main.__doc__)
    p.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help="seconds for the whole run")
    p.add_argument("--only", nargs="+", help=f"batches to run, of: {' '.join(BATCHES)}")
    p.add_argument(
        "--out",
        help="root folder (default data/reference, or data/local/reference for the cpu plan); "
        "the run goes into OUT/<device>/",
    )
    p.add_argument(
        "--profile", default="gpu", choices=["cpu", "gpu"], help="gpu: the reference sizes; cpu: a tiny plan"
    )
    p.add_argument(
        "--commit", help="name the code's version yourself (default: git's commit, else a hash of helpers/'s sources)"
    )
    p.add_argument(
        "--archive-dir",
        default=str(ROOT / "build" / "reference"),
        help="where each run (chunk) leaves one archive of the device's results (default build/reference)",
    )
    args = p.parse_args(argv)
    table = run_reference(
        args.budget_s, args.only, args.out, args.profile, commit=args.commit, archive_dir=args.archive_dir
    )
    folder = table.attrs["folder"]
    print(f"\nbatches ({folder}):")
    print(format_table(table.drop(columns=["title"])))
    print("\nheadline figures beside the published ones:")
    print(format_table(headlines(folder)))
    saved = read_manifest(folder).get("batches", {})
    left = [b.name for b in _only(args.only, PLAN) if saved.get(b.name, {}).get("status") != "ok"]
    print("\nevery batch is saved" if not left else f"\nnot saved yet: {' '.join(left)} (run the command again)")
    failed = table["status"].isin(["failed", "timeout"]).sum() if len(table) else 0
    return 1 if failed else 0
