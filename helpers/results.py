"""Save and load tidy measurements with their provenance, so a run here can sit beside a reference run.

    save_results(rows, "attention_sweep", profile=profile)       # data/local/<device>/attention_sweep.jsonl
    ref = [load_results(p) for p in find_results("attention_sweep")]   # data/reference/*/...
    ref[0].frame(), ref[0].label        # DataFrame, "NVIDIA H100 80GB HBM3 · gpu · 2026-11-23"
    reference_rows("attention_bench")   # every reference device's rows, with device and date columns
    beside_reference(local_df, "attention_bench", ["impl", "T", "ms"])   # this machine's rows above them

A file is JSON lines: first `{"provenance": {...}}`, then one object per row.
"local" runs are made here (git-ignored); "reference" runs were made elsewhere and are committed.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from datetime import date, datetime, timezone
from pathlib import Path

import pandas as pd
import torch

from helpers.env import machine_facts

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT / "data"
KINDS = ("local", "reference")


def git_commit(root: Path = ROOT) -> str | None:
    """Short HEAD commit of the repo at `root`, "-dirty" when tracked files changed; None without git or repo."""

    def git(*args):
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() if out.returncode == 0 else None

    try:
        top = git("rev-parse", "--show-toplevel")
        if top is None or Path(top).resolve() != Path(root).resolve():
            return None  # no repo, or `root` merely sits inside some other repo
        commit, status = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return None if commit is None else commit + ("-dirty" if status else "")


CPU_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")  # environment switches that cap the CPU kernels


def provenance(profile: str | None = None, **extra) -> dict:
    """Machine facts, commit, UTC date and profile (no hostname), plus `extra`: what every saved run carries."""
    facts = {k: v for k, v in machine_facts().items() if k != "hostname"}
    facts.update(commit=git_commit(), date=datetime.now(timezone.utc).isoformat(timespec="seconds"), profile=profile)
    caps = {k: os.environ[k] for k in CPU_CAPS if os.environ.get(k)}
    if caps:  # a capped instruction set changes what a CPU's bf16 timings mean (answers say so)
        facts["cpu_caps"] = caps
    facts.update(extra)
    return facts


def device_slug(name: str) -> str:
    """Folder-safe lower-case slug of a device name: "NVIDIA H100 80GB HBM3" -> "nvidia-h100-80gb-hbm3"."""
    name = re.sub(r"\((r|tm|c)\)", " ", str(name).lower())  # Intel(R) Xeon(R) -> intel xeon
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "unknown"


def _folder(kind: str, device: str | None = None) -> Path:
    """DATA_DIR/kind/<device slug> (this machine's device when None)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    return DATA_DIR / kind / device_slug(device if device is not None else machine_facts()["device"])


def _jsonable(value, key: str = ""):
    """Plain JSON value for numpy/torch scalars, Paths, dates, dtypes; nan and inf become None."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _jsonable(v, f"{key}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, key) for v in value]
    if value is pd.NaT or value is pd.NA:
        return None
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, (Path, torch.dtype, torch.device)):
        return str(value)
    if hasattr(value, "tolist"):  # numpy scalars and arrays, torch tensors
        return _jsonable(value.tolist(), key)
    raise TypeError(f"cannot save {key or 'value'}={value!r} ({type(value).__name__}) as JSON")


def save_results(rows, name: str, profile: str | None = None, kind: str = "local", directory=None, **extra) -> Path:
    """Write tidy rows (list of dicts or DataFrame) with provenance to <kind>/<device>/<name>.jsonl; return the path."""
    if isinstance(rows, pd.DataFrame):
        rows = rows.to_dict(orient="records")
    prov = provenance(profile, **extra)
    lines = [{"provenance": prov}] + [dict(row) for row in rows]
    text = "".join(json.dumps(_jsonable(line), allow_nan=False, ensure_ascii=False) + "\n" for line in lines)
    folder = Path(directory) if directory is not None else _folder(kind, prov["device"])
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.jsonl"
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


@dataclass
class Results:
    """Rows of one saved run, its provenance, and the file they came from."""

    rows: list[dict]
    provenance: dict
    path: Path | None = None

    def frame(self) -> pd.DataFrame:
        """The rows as a DataFrame, with the provenance in df.attrs["provenance"]."""
        df = pd.DataFrame(self.rows)
        df.attrs["provenance"] = dict(self.provenance)
        return df

    @property
    def label(self) -> str:
        """Short legend/caption text: "device · profile · date"."""
        p = self.provenance
        parts = [p.get("device"), p.get("profile"), (p.get("date") or "")[:10]]
        return " · ".join(str(x) for x in parts if x) or (self.path.stem if self.path else "results")


def _available(folder: Path, pattern: str) -> str:
    """The saved runs matching `pattern` under `folder`, as "device/name" or "name", for error messages."""
    found = sorted(p.relative_to(folder).with_suffix("").as_posix() for p in folder.glob(pattern))
    return ", ".join(found) if found else "nothing"


def load_results(path_or_name, kind: str = "local", device: str | None = None) -> Results:
    """Read a run saved by save_results, from a path or a name resolved as save_results would."""
    text = str(path_or_name)
    if isinstance(path_or_name, Path) or text.endswith(".jsonl") or os.sep in text or "/" in text:
        path, where, pattern = Path(path_or_name), Path(path_or_name).parent, "*.jsonl"
    else:
        path, where, pattern = _folder(kind, device) / f"{text}.jsonl", DATA_DIR / kind, "*/*.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"no results at {path}; available under {where}: {_available(where, pattern)}")
    with open(path, encoding="utf-8") as f:
        lines = [json.loads(line) for line in f if line.strip()]
    prov = {}
    if lines and set(lines[0]) == {"provenance"}:
        prov = lines.pop(0)["provenance"]
    return Results(rows=lines, provenance=prov, path=path)


def find_results(name: str, kind: str = "reference") -> list[Path]:
    """Every device's saved run called `name` under DATA_DIR/kind, sorted (e.g. all reference GPUs)."""
    return sorted((DATA_DIR / kind).glob(f"*/{name}.jsonl"))


REFERENCE_COMMAND = "python -m helpers reference (make reference) on a GPU"


def _with_run_columns(df: pd.DataFrame, prov: dict, run: str) -> pd.DataFrame:
    """`df` with run, device (the machine's name), date and profile first; a row's own torch device -> torch_device."""
    df = df.rename(columns={"device": "torch_device"}) if "device" in df.columns else df.copy()
    profile = prov.get("profile") or (df["profile"] if "profile" in df.columns else None)
    cols = {"run": run, "device": prov.get("device"), "date": (prov.get("date") or "")[:10], "profile": profile}
    df = df.drop(columns=[c for c in cols if c in df.columns])
    for i, (key, value) in enumerate(cols.items()):
        df.insert(i, key, value)
    return df


REFERENCE_EDITION = "2024"  # what a reference run saved without an edition measured (before EDITION existed)


def reference_rows(name: str, edition: str | None = None) -> pd.DataFrame:
    """Every reference device's saved rows of `name` (data/reference/*/<name>.jsonl), with run, device, date and
    profile columns first; an empty frame when none is saved (the answers page and the notebooks read these).
    edition: only the runs made on that edition's models (a run saved without one is REFERENCE_EDITION's)."""
    runs = map(load_results, find_results(name))
    if edition is not None:
        runs = [r for r in runs if str(r.provenance.get("edition") or REFERENCE_EDITION) == str(edition)]
    frames = [_with_run_columns(r.frame(), r.provenance, "reference") for r in runs]
    empty = pd.DataFrame(columns=["run", "device", "date", "profile"])
    return pd.concat(frames, ignore_index=True) if frames else empty


def beside_reference(
    local, name: str, columns=None, profile: str | None = None, edition: str | None = None
) -> pd.DataFrame:
    """This machine's rows (a DataFrame, or Results; made at `profile`) above every reference device's rows of
    `name`, with device and date; `columns` picks the rest. edition: only reference runs of that edition's models
    (another edition's rows would sit beside this run as if comparable). With no such reference saved yet, one line
    says so and which command makes it."""
    if isinstance(local, Results):
        local_df, prov = local.frame(), local.provenance
    else:
        local_df, prov = pd.DataFrame(local), provenance(profile)
    ref = reference_rows(name, edition)
    if ref.empty:
        other = "" if edition is None or reference_rows(name).empty else f" on the {edition} edition's models"
        print(f"no reference run of {name!r}{other} saved yet under data/reference/: {REFERENCE_COMMAND} makes it")
    both = pd.concat([_with_run_columns(local_df, prov, "this machine"), ref], ignore_index=True)
    keep = ["run", "device", "date", "profile"] + [c for c in (columns or []) if c in both.columns]
    return both[keep] if columns else both
