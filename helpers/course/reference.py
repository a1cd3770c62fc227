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

from helpers import formulas as F
from helpers.course.reference_batches import SCALES, scale
from helpers.env import machine_facts
from helpers.experiments.attention import LEADERBOARD, PUBLISHED_MS, TILED_STEPS
from helpers.model import get_config
from helpers.results import DATA_DIR, ROOT, device_slug, git_commit, load_results

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
    Batch("04-sweep", "notebook 04: bucket-size sweep"),
)
BATCHES = {b.name: b for b in PLAN}


# ---- the cost model: seconds from closed forms over this device's rates ----


@dataclass(frozen=True)
class Rates:
    """What the cost model assumes of a device: sustained FLOP/s and bytes/s, gloo's all-reduce bytes/s, fixed costs."""

    flops_s: float
    bytes_s: float
    gloo_Bps: float
    nccl_Bps: float
    startup_s: float  # a child process: python, torch, the CUDA context
    launch_s: float  # one 2-rank launch: spawn, imports, rendezvous
    compile_s: float  # one torch.compile'd function
    jit_s: float  # one Triton kernel specialisation (0 in the interpreter)
    interpreted_call_s: float  # one Triton launch in the interpreter, tiny shapes
    ptxas_s: float  # one kernel configuration compiled for one arch by `python -m helpers kernels`
    gpus: int
    low_flops_s: float | None = None  # sustained bf16/fp16 FLOP/s (None: flops_s)
    eager_call_s: float = 10e-6  # one eager PyTorch op: Python, dispatch and the kernel launch

    def flops_for(self, dtype: str) -> float:
        """FLOP/s at `dtype`: fp32 runs disable TF32 (helpers.env), so they get the fp32 rate."""
        return self.flops_s if dtype in ("float32", "fp32") else (self.low_flops_s or self.flops_s)


GPU_EFFICIENCY = 0.3  # sustained share of the datasheet's dense fp32/bf16 peak for these models (notebook 01's MFU)
GPU_FALLBACK_FLOPS = {"fp32": 20e12, "bf16": 300e12}  # an unknown GPU's dense peaks, before GPU_EFFICIENCY


def gpu_rates(device_name: str, gpus: int) -> Rates:
    """Rates of a GPU: its datasheet fp32 (not tf32: fp32 runs disable it) and bf16 peaks (formulas.peak_flops) at
    GPU_EFFICIENCY; HBM-class memory; gloo through host copies (2 x 1 GB moved per rank in 1.4 s: seed 004 §3.1.1,
    2 H100s); NCCL over NVLink."""
    peak = {p: F.peak_flops(device_name, p) or GPU_FALLBACK_FLOPS[p] for p in ("fp32", "bf16")}
    return Rates(
        flops_s=peak["fp32"] * GPU_EFFICIENCY,
        bytes_s=1.5e12,
        gloo_Bps=1.5e9,
        nccl_Bps=100e9,
        startup_s=15,
        launch_s=25,
        compile_s=15,
        jit_s=1.5,
        interpreted_call_s=0,
        ptxas_s=0.3,
        gpus=gpus,
        low_flops_s=peak["bf16"] * GPU_EFFICIENCY,
        eager_call_s=12e-6,
    )


def cpu_rates() -> Rates:
    """Rates of this CPU, measured now in a fraction of a second (a 256³ matmul, a 16 MB copy)."""
    import torch

    a = torch.randn(256, 256)
    b = torch.empty(4 * 2**20)
    start = time.perf_counter()
    for _ in range(20):
        a @ a
    flops_s = 20 * 2 * 256**3 / (time.perf_counter() - start)
    start = time.perf_counter()
    for _ in range(5):
        b.clone()
    bytes_s = 5 * 2 * b.numel() * 4 / (time.perf_counter() - start)
    return Rates(
        flops_s=flops_s,
        bytes_s=bytes_s,
        gloo_Bps=1e9,
        nccl_Bps=1e9,
        startup_s=5,
        launch_s=15,
        compile_s=30,
        jit_s=0,
        interpreted_call_s=0.1,
        ptxas_s=0.15,
        gpus=0,
    )


def _step_s(size, batch: int, context: int, r: Rates) -> float:
    """A forward+backward of `size` on batch x context."""
    return F.train_flops(get_config(size), batch, context) / r.flops_s


def _attn_s(shape, impl: str, r: Rates, dtype: str = "float32") -> float:
    """A causal fwd+bwd of `impl` on (B, H, T, d) at `dtype`; naive costs more than its FLOPs, and the PyTorch tiles
    cost their eager launches on top (attention.tiled_launches: about 1.5 M at T = 16,384)."""
    import torch

    from helpers.attention import attention_flops, tiled_launches

    B, H, T, d = shape
    flops = attention_flops(B * H, T, T, d, True) + attention_flops(B * H, T, T, d, True, backward=True)
    compute = flops / r.flops_for(dtype) * {"naive": 4, "compiled": 3, "flash_pytorch": 2}.get(impl, 1.5)
    if impl != "flash_pytorch":
        return compute
    return compute + tiled_launches(T, d, getattr(torch, dtype), True) * r.eager_call_s


def _norm_calls_s(calls: int, rows: int, H: int, r: Rates) -> float:
    """`calls` fwd+bwd norm calls and as many copies (the yardstick), each at the device's bytes/s."""
    import torch

    return calls * 2 * F.norm_bytes(rows, H, torch.float32, True) / r.bytes_s


def _est_kernels(s, r: Rates) -> float:
    calls = 2 * (s["norm_warmup"] + s["norm_steps"])  # per impl: fwd, then fwd+bwd
    triton = calls * r.interpreted_call_s + 3 * r.jit_s
    attn = (s["attn_warmup"] + s["attn_steps"]) * sum(
        _attn_s(s["attn_shape"], i, r, s["attn_dtype"]) for i in s["attn_impls"]
    )
    return 2 * _norm_calls_s(calls, *s["norm_shape"], r) + triton + attn + 3 * r.jit_s


def _est_registers(s, r: Rates) -> float:
    from helpers.kernel_check import ARCHS, all_configs

    n = len(all_configs(s["quick"]))
    return n * len(ARCHS) * r.ptxas_s + (len(all_configs(True)) * r.jit_s if r.gpus else 0)


def _est_01(s, r: Rates) -> float:
    per_size = []
    for size in s["sizes"]:
        step = _step_s(size, s["batch"], s["context"], r)
        build = 6 * F.param_bytes(size) / r.bytes_s * 50  # random init: a few passes over the weights
        timing = (s["cold_steps"] + s["warmup"] + s["steps"]) * step * (1 / 3 + 1 + 1) + 6 * build
        peaks = (1 + len(s["autocast"])) * (3 * step + build)
        per_size.append(timing + peaks)
    return sum(per_size)


def _est_02(s, r: Rates) -> float:
    steps = s["warmup"] + s["steps"]
    total = 0.0
    for H in s["hidden"]:
        names = 1 + (H in s["compile_hidden"]) + (s["triton_shape"] is None)
        total += (
            len(s["dtypes"])
            * 2
            * (names * _norm_calls_s(steps, s["rows"], H, r) + (H in s["compile_hidden"]) * r.compile_s + 2 * r.jit_s)
        )
    if s["triton_shape"] is not None:
        total += len(s["dtypes"]) * 2 * 4 * r.interpreted_call_s
    return total


def _est_06(s, r: Rates) -> float:
    steps = s["warmup"] + s["steps"]
    total = 0.0
    for shape in s["bench_shapes"]:
        for impl in s["bench_impls"]:
            if impl == "flash_pytorch" and shape[2] > s["flash_pytorch_max_T"]:
                continue
            n = s["warmup"] + min(s["steps"], TILED_STEPS) if impl.endswith("pytorch") else steps  # sweep's cap
            total += sum(
                2 * n * _attn_s(shape, impl, r, dtype)  # fwd, bwd, fwd+bwd
                + (r.compile_s if impl == "compiled" else 0)
                + 3 * r.jit_s
                for dtype in s["dtypes"]
            )
    return total


def _est_03(s, r: Rates) -> float:
    from helpers.experiments.collectives import OPS

    total = 0.0
    for backend, device in s["combos"]:
        for n in s["world_sizes"]:
            if (device == "cuda" and not r.gpus) or (backend == "nccl" and r.gpus < n):
                continue  # run_grid skips it
            bw = r.nccl_Bps if backend == "nccl" else r.gloo_Bps
            call = {size: 2 * size / bw for size in s["sizes"]}  # _agreed_iters: 3 <= timed calls <= iters
            calls = sum(min(s["iters"], max(3, s["budget_s"] // c)) * c + s["warmup"] * c for c in call.values())
            total += r.launch_s + len(OPS) * calls
    return total


def _train_launch_s(size, variants: int, steps: int, batch: int, context: int, r: Rates, comm_bytes: float) -> float:
    """One 2-rank launch training `variants` copies of `size` for `steps`, each step sending comm_bytes over gloo."""
    per_step = _step_s(size, batch // 2, context, r) + comm_bytes / r.gloo_Bps + 16 * F.param_bytes(size) / r.bytes_s
    return r.launch_s + variants * steps * per_step


def _est_04(s, r: Rates) -> float:
    from helpers.experiments.ddp import SPEED_VARIANTS, sweep_variants

    total = 0.0
    for size in s["sizes"]:
        n = len(SPEED_VARIANTS) + (
            len([v for v in sweep_variants(s["buckets_mb"]) if v not in SPEED_VARIANTS])
            if size == s["sweep_model"]
            else 0
        )
        total += _train_launch_s(
            size, n, s["warmup"] + s["steps"], s["batch"], s["context"], r, 2 * F.param_bytes(size)
        )
    return total


def _est_05(s, r: Rates) -> float:
    m = s["speed_model"]
    return sum(
        _train_launch_s(m, len(kinds), s["warmup"] + s["steps"], s["batch"], s["context"], r, 3 * F.param_bytes(m))
        for kinds in s["speed_launches"]
    )


def _est_07(s, r: Rates) -> float:
    m = s["model"]
    memory = _train_launch_s(m, 3, 3, s["batch"], s["context"], r, 3 * F.param_bytes(m)) - r.launch_s
    return memory + _train_launch_s(m, 4, s["warmup"] + s["steps"], s["batch"], s["context"], r, 3 * F.param_bytes(m))


ESTIMATORS = {
    "kernels": _est_kernels,
    "registers": _est_registers,
    "01": _est_01,
    "02": _est_02,
    "03": _est_03,
    "04": _est_04,
    "04-sweep": _est_04,
    "07": _est_07,
    **{b.name: {"05": _est_05, "06": _est_06}[b.name[:2]] for b in PLAN if b.name[:3] in ("05-", "06-")},
}
assert set(ESTIMATORS) == set(SCALES) == set(BATCHES)


def model_estimate_s(name: str, profile: str, r: Rates) -> float:
    """The cost model's seconds for batch `name` at `profile`: its child's start plus its work."""
    return r.startup_s + ESTIMATORS[name](scale(name, profile), r)


def estimate_s(name: str, profile: str, r: Rates, manifest: dict) -> tuple[float, str]:
    """(seconds, where from): an earlier run's wall time on this device and profile (x1.1), else the cost model."""
    earlier = manifest.get("batches", {}).get(name, {})
    if manifest.get("profile") == profile and earlier.get("status") == "ok" and earlier.get("wall_s"):
        return 1.1 * earlier["wall_s"], f"earlier run ({earlier.get('commit')})"  # 10 % for the machine's spread
    return model_estimate_s(name, profile, r), "cost model"


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


# ---- headline figures beside the published ones ----

SEED_WRITEUP = "004_7287c5c69baef1ef.txt"  # /work/shared/seeds' full writeup (H100s); its README lists its mistakes
SEED_ZERO1 = "000_6835ed27c4bcad4a.txt"  # the ZeRO-1 accounting commentary (2 H100s)
LEADERBOARD_SHAPE = tuple(LEADERBOARD[k] for k in ("batch", "heads", "T", "d"))
LEADERBOARD_2025 = "the 2025 leaderboard (H100, bf16, fwd+bwd causal, batch 1 x 16 heads x 16384 x 64)"
SEED_BOTH_S = {"small": 2.41e-2, "medium": 5.36e-2, "large": 1.04e-1, "xl": 1.80e-1, "2.7B": 2.13e-1}  # §2.1.1(b)
SEED_PEAK_GIB = {"small": 2.81, "medium": 7.19, "large": 13.72, "xl": 23.88, "2.7B": 38.56}  # §2.4.1(b), full step
SEED_GLOO_CUDA_1GB_2 = 1.40  # §3.1.1: all-reduce of 1 GB, gloo + CUDA, 2 processes (each its own H100), seconds
SEED_ZERO1_OVERHEAD = 836.05 / 783.53  # 000: xl iteration with / without optimizer sharding, 2 H100s
SEED_SHARDED_XL = 198 / 202  # 004 §3.4.5(b): xl iteration sharded / not sharded, 1 node x 2 GPUs (disagrees with 000)
SEED_GLOO_BUCKETED_S = {("medium", 50): 1.12}  # 004 §3.4.4(a): GLOO step time, medium, 50 MB buckets, 2 H100s


def _rows(folder: Path, name: str) -> pd.DataFrame | None:
    path = folder / f"{name}.jsonl"
    return load_results(path).frame() if path.is_file() else None


def headlines(folder) -> pd.DataFrame:
    """The run's headline figures, each beside its published counterpart (None where nothing comparable is
    published, or the run did not produce it)."""
    folder, rows = Path(folder), []

    def add(figure, ours, published=None, source="", unit=""):
        rows.append({"figure": figure, "ours": ours, "published": published, "unit": unit, "published source": source})

    norm = _rows(folder, "kernels_rmsnorm")
    if norm is not None:
        for _, r in norm[norm.impl == "triton"].iterrows():
            add(
                f"RMSNorm Triton {r['pass']}, {r['rows']} x {r['H']} {r['dtype']}: fraction of copy bandwidth",
                r.frac_of_copy,
                None,
                "none published (claim: close to 1)",
                "x",
            )
    attn = _rows(folder, "kernels_attention")
    if attn is not None:
        for r in attn.itertuples():
            at_shape = (r.batch, r.heads, r.T, r.d, r.dtype) == (*LEADERBOARD_SHAPE, "bfloat16")
            pub = (
                {"naive": PUBLISHED_MS["naive (published)"], "flash_triton": PUBLISHED_MS["best class entry"]}.get(
                    r.impl
                )
                if at_shape
                else None
            )
            add(
                f"attention {r.impl} fwd+bwd, {r.batch}x{r.heads}x{r.T}x{r.d} {r.dtype}",
                r.median_ms,
                pub,
                (LEADERBOARD_2025 + (": naive" if r.impl == "naive" else ": best class entry")) if pub else "",
                "ms",
            )
    times = _rows(folder, "01_timing")
    seed_shape = times is not None and (
        times.attrs["provenance"].get("batch"),
        times.attrs["provenance"].get("context"),
    ) == (16, 128)
    if times is not None:
        warm = times[(times["pass"] == "both") & (times["warm-up"] > 0)]
        for r in warm.itertuples():
            pub = SEED_BOTH_S.get(r.size) if seed_shape else None
            add(
                f"{r.size} forward+backward, warm, fp32",
                r.median_s,
                pub,
                f"{SEED_WRITEUP} §2.1.1(b), batch 16 x 128" if pub else "",
                "s",
            )
    peaks = _rows(folder, "01_memory_peaks")
    if peaks is not None:
        full = peaks[(peaks["pass"] == "full step") & (peaks.precision == "fp32")]
        for r in full.itertuples():
            pub = SEED_PEAK_GIB.get(r.size) if seed_shape else None
            add(
                f"{r.size} peak memory, full step, fp32",
                None if pd.isna(r.peak_MiB) else r.peak_MiB / 1024,
                pub,
                f"{SEED_WRITEUP} §2.4.1(b), batch 16 x 128" if pub else "",
                "GiB",
            )
    coll = _rows(folder, "collectives")
    if coll is not None:
        big = coll[(coll.op == "all_reduce") & (coll.size_bytes == coll.size_bytes.max())]
        for r in big.itertuples():
            pub = (
                SEED_GLOO_CUDA_1GB_2
                if (r.backend, r.device, r.world_size, r.size_bytes) == ("gloo", "cuda", 2, 2**30)
                else None
            )
            add(
                f"all_reduce {r.size}, {r.backend}+{r.device}, {r.world_size} ranks",
                r.time_s,
                pub,
                f"{SEED_WRITEUP} §3.1.1 (each rank its own H100; ours may share one GPU)" if pub else "",
                "s",
            )
    ddp = _rows(folder, "04_ddp_speed")
    if ddp is not None:
        for r in ddp[ddp.variant.isin(["bucketed 25 MB", "torch_ddp 25 MB"])].itertuples():
            add(f"{r.model} DDP step, {r.variant}, 2 ranks", r.step_s, None, "", "s")
    sweep = _rows(folder, "04_ddp_sweep_speed")
    if sweep is not None and sweep.attrs["provenance"].get("backend") == "gloo":
        for (model, mb), pub in SEED_GLOO_BUCKETED_S.items():
            hit = sweep[(sweep.model == model) & (sweep.variant == f"bucketed {mb:g} MB")]
            if len(hit):
                add(
                    f"{model} DDP step, bucketed {mb} MB, gloo, 2 ranks",
                    hit.step_s.iloc[0],
                    pub,
                    f"{SEED_WRITEUP} §3.4.4(a) (each rank its own H100; ours may share one GPU)",
                    "s",
                )
    sh = _rows(folder, "05_sharding_speed")
    if sh is not None and {"sharded", "unsharded"} <= set(sh.kind):
        it, model = sh.set_index("kind")["iteration_s"], sh.attrs["provenance"].get("model")
        pub = SEED_ZERO1_OVERHEAD if model == "xl" else None
        add(
            f"{model} sharded / unsharded iteration time",
            it["sharded"] / it["unsharded"],
            pub,
            f"{SEED_ZERO1} (xl, 2 H100s; ours: 2 ranks on one GPU)" if pub else "",
            "x",
        )
        if model == "xl":  # the two published figures disagree (the seeds' README): both shown
            add(
                f"{model} sharded / unsharded iteration time",
                it["sharded"] / it["unsharded"],
                SEED_SHARDED_XL,
                f"{SEED_WRITEUP} §3.4.5(b) (xl, 1 node x 2 GPUs)",
                "x",
            )
    fs = _rows(folder, "07_fsdp_speed")
    if fs is not None and "torch_fsdp" in set(fs.kind):
        ms = fs.set_index("kind")["median_ms"]
        add("FSDP / fully_shard step time", ms["fsdp"] / ms["torch_fsdp"], None, "none published (claim: <= 1.10)", "x")
    regs = _rows(folder, "kernels_registers")
    if regs is not None:
        add(
            "Triton kernel configurations with spills (sm_80, sm_90a)",
            int((regs.spill_bytes > 0).sum()),
            0,
            "the design's claim: none",
            "count",
        )
    return pd.DataFrame(rows, columns=["figure", "ours", "published", "unit", "published source"])


def format_table(df: pd.DataFrame) -> str:
    """A DataFrame as plain text with 3 significant digits."""
    return df.to_string(index=False, float_format=lambda v: f"{v:.3g}", na_rep="-") if len(df) else "(nothing)"


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
