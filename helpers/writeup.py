"""Execute every notebook and export HTML writeups: the engine behind `make writeup`.

    python -m helpers writeup                      # notebooks/*.ipynb -> writeups/*.html + index.html
    python -m helpers writeup --profile gpu        # inject PROFILE = "gpu" after each `parameters` cell
    python -m helpers writeup notebooks/00_setup.ipynb --hide-code

Parameters are injected the way papermill does it (a cell tagged
`injected-parameters` right after the cell tagged `parameters`), so papermill
runs the same notebooks too. A notebook that fails still gets its HTML, with
the error in place, and the command exits non-zero at the end.
"""
from __future__ import annotations

import argparse
import html
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent


def inject_parameters(nb, **params) -> None:
    """Insert `NAME = value` lines after the cell tagged `parameters` (at the top when there is none)."""
    if not params:
        return
    source = "# Injected parameters\n" + "".join(f"{k} = {v!r}\n" for k, v in params.items())
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]})
    tagged = [i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])]
    nb.cells.insert(tagged[0] + 1 if tagged else 0, cell)


def _this_python_kernel_manager():
    """A KernelManager class that runs this very Python (the project's .venv), whatever kernels are installed."""
    from ipykernel.kernelspec import get_kernel_dict
    from jupyter_client.kernelspec import KernelSpec
    from jupyter_client.manager import KernelManager

    class ThisPython(KernelManager):
        @property
        def kernel_spec(self):
            return KernelSpec(resource_dir=str(ROOT), **get_kernel_dict())

    return ThisPython


def execute(path: Path, params: dict, timeout_s: int = 3600):
    """Run a notebook top to bottom in its folder; return (executed notebook, error text or None)."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError

    nb = nbformat.read(path, as_version=4)
    inject_parameters(nb, **params)
    client = NotebookClient(nb, kernel_manager_class=_this_python_kernel_manager(), kernel_name="python3",
                            timeout=timeout_s, resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
        return nb, None
    except CellExecutionError as exc:
        return nb, str(exc).strip().splitlines()[-1] if str(exc).strip() else "cell failed"


def notebook_title(nb, fallback: str) -> str:
    """The first markdown heading of a notebook, else `fallback`."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return fallback


def export_html(nb, out: Path, title: str, hide_code: bool = False) -> None:
    """Write one self-contained HTML page (plots are embedded as images)."""
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(template_name="lab", exclude_input=hide_code)
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": title}})
    out.write_text(body, encoding="utf-8")


def write_index(entries: list[dict], out_dir: Path, profile: str) -> Path:
    """writeups/index.html: title, device, profile, date and one link per notebook."""
    from helpers.env import machine_facts

    facts = machine_facts()
    rows = "\n".join(
        f"<tr><td><a href='{html.escape(e['html'])}'>{html.escape(e['title'])}</a></td>"
        f"<td>{html.escape(e['notebook'])}</td><td>{e['seconds']:.0f} s</td>"
        f"<td>{'ok' if e['error'] is None else 'FAILED: ' + html.escape(e['error'])}</td></tr>"
        for e in entries
    )
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>LLM systems companion: writeups</title>
<style>body{{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto}}td,th{{padding:.3rem .8rem;text-align:left}}</style>
</head><body><h1>LLM systems companion: writeups</h1>
<p>Device: <b>{html.escape(facts['device'])}</b> ({facts['cpu_count']} CPU cores, {facts['gpu_count']} GPU(s));
profile: <b>{html.escape(profile)}</b>; torch {facts['torch']}, triton {facts['triton']};
made {datetime.now(timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}.</p>
<table><tr><th>writeup</th><th>notebook</th><th>run time</th><th>status</th></tr>
{rows}
</table></body></html>
"""
    index = out_dir / "index.html"
    index.write_text(page, encoding="utf-8")
    return index


def main(argv: list[str] | None = None) -> int:
    """Execute notebooks in order, export one HTML page each plus index.html; 1 if any failed."""
    from helpers.env import resolve_profile

    parser = argparse.ArgumentParser(prog="python -m helpers writeup", description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/*.ipynb in order")
    parser.add_argument("--profile", default="auto", help="auto | cpu | gpu (injected as PROFILE)")
    parser.add_argument("--out", type=Path, default=ROOT / "writeups")
    parser.add_argument("--hide-code", action="store_true", help="leave code cells out of the HTML")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per cell")
    args = parser.parse_args(argv)

    profile = resolve_profile(args.profile)
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
    if not paths:
        print("no notebooks found", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    params = {} if args.profile == "auto" else {"PROFILE": profile}
    entries = []
    for i, path in enumerate(paths, 1):
        print(f"[{i}/{len(paths)}] {path.name} (profile {profile}) ...", flush=True)
        start = time.perf_counter()
        nb, error = execute(path, params, args.timeout)
        seconds = time.perf_counter() - start
        title = notebook_title(nb, path.stem)
        out = args.out / (path.stem + ".html")
        export_html(nb, out, title, args.hide_code)
        entries.append({"notebook": path.name, "title": title, "html": out.name, "seconds": seconds, "error": error})
        print(f"    {'ok' if error is None else 'FAILED: ' + error} in {seconds:.0f} s -> {out}", flush=True)
    index = write_index(entries, args.out, profile)
    failed = [e["notebook"] for e in entries if e["error"]]
    print(f"wrote {index}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0
