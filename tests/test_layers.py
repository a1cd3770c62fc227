"""The package's layers (../shared/design.md): infrastructure < library < experiments < course (cross-notebook work)
< entry points; no cycles."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.__main__ import BENCHMARKS

PKG = Path(__file__).resolve().parent.parent / "helpers"
INFRASTRUCTURE = {
    "env",
    "pins",
    "launch",
    "timing",
    "results",
    "writeup",
    "kernel_watch",
    "calculator",
    "budget",
    "section",
}
ENTRY_POINTS = {"__main__", "__init__"}


def _imports(path: Path) -> set[str]:
    """Every helpers module a file imports, at any depth (function-level imports count)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("helpers"):
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("helpers")}
    return out


def _layer(module: str) -> int:
    name = module.removeprefix("helpers.")
    if name.startswith("experiments"):
        return 2
    if name.startswith("course"):
        return 3
    if name in ENTRY_POINTS:
        return 4
    return 0 if name.split(".")[0] in INFRASTRUCTURE else 1


MODULES = {f"helpers.{p.relative_to(PKG).with_suffix('').as_posix().replace('/', '.')}": p for p in PKG.rglob("*.py")}


@pytest.mark.parametrize("module", sorted(m for m in MODULES if not m.endswith("__init__")))
def test_each_module_imports_only_its_own_layer_or_below(module):
    known = {m for m in MODULES}
    for imported in _imports(MODULES[module]) & known:
        assert _layer(imported) <= _layer(module), f"{module} (layer {_layer(module)}) imports {imported}"


def test_no_import_cycles():
    """A package counts as its __init__ (`from helpers.x import y` imports helpers.x first, then helpers.x.y)."""
    named = {m.removesuffix(".__init__"): p for m, p in MODULES.items()}
    graph = {m: {i for i in _imports(p) if i in named and i not in (m, "helpers")} for m, p in named.items()}
    state = {}

    def visit(m, path):
        state[m] = "open"
        for n in graph[m]:
            assert state.get(n) != "open", "import cycle: " + " -> ".join(path + [n])
            if n not in state:
                visit(n, path + [n])
        state[m] = "done"

    for m in graph:
        if m not in state:
            visit(m, [m])


def test_every_bench_topic_has_a_bench_main():
    import importlib

    for topic, module in BENCHMARKS.items():
        assert callable(importlib.import_module(module).bench_main), topic


BAD_INPUT = [["bench", "rmsnorm", "--hidden", "-5"], ["bench", "ddp", "--steps", "0"], ["bench", "no-such-topic"]]


def test_the_entry_point_answers_bad_input_in_one_line():
    """`python -m helpers` itself, as a student types it: exit status 2 and no traceback."""
    run = subprocess.run([sys.executable, "-m", "helpers", *BAD_INPUT[0]], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2, run
    assert "Traceback" not in run.stdout + run.stderr


@pytest.mark.parametrize(
    "argv", BAD_INPUT[1:] + ([["writeup", "--profile", "gpu"]] if not torch.cuda.is_available() else [])
)
def test_each_command_answers_bad_input_in_one_line(argv, capsys):
    """The other commands through the same main() in this process (a fresh Python apiece took 2-4 s)."""
    from helpers.__main__ import main

    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's refusals
        code = exit_.code
    out = capsys.readouterr()
    assert code == 2, out
    assert "Traceback" not in out.out + out.err


MAX_LINES = 480  # "no module over about 450 lines" (issue 47): split a module by topic before it passes this


def test_no_module_is_longer_than_a_reader_can_hold():
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these by topic (at most {MAX_LINES} lines each): {long}"
