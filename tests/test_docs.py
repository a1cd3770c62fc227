"""Every command shown in README.md and docs/*.md still works as written: a make target exists and `make -n` accepts
it with the variables given; a `python -m helpers` command (also under torchrun) exists and accepts every option the
line passes (each `--flag` appears in its --help), a `bench TOPIC` names a benchmark. The commands themselves run in
the tests of what they do (make test runs the suite; writeup, yours, reference, kernels, bench and the launcher
have tests of their own); this file keeps the documentation from going stale."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from helpers.__main__ import BENCHMARKS, COMMANDS

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"```bash\n(.*?)```", re.DOTALL)


def documented_commands(page: Path) -> list[str]:
    """The command lines of a page's bash blocks, comments and continuation lines joined."""
    lines = []
    for block in BLOCK.findall(page.read_text()):
        for raw in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", raw).strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


COMMAND_LINES = [(page.relative_to(ROOT).as_posix(), line) for page in PAGES for line in documented_commands(page)]


def _help_text(argv: list[str]) -> str:
    """What `python -m helpers ARGV --help` prints (run in this process)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as done:
        COMMANDS[argv[0]](argv[1:] + ["--help"])
    assert done.value.code in (0, None)
    return out.getvalue()


def _check_helpers(args: list[str]) -> None:
    """`python -m helpers ARGS`: the command exists, and every --flag passed is one it documents."""
    assert args and args[0] in COMMANDS, f"no command {args[:1]} in python -m helpers ({', '.join(COMMANDS)})"
    head = args[:2] if args[0] == "bench" else args[:1]
    if args[0] == "bench":
        assert len(args) > 1 and args[1] in BENCHMARKS, f"no benchmark {args[1:2]} ({', '.join(BENCHMARKS)})"
    text = _help_text(head)
    for flag in (a.split("=")[0] for a in args[len(head) :] if a.startswith("--")):
        assert flag in text, f"{' '.join(head)} has no option {flag}"


def _check_make(args: list[str], env: list[str]) -> None:
    """`make TARGET VAR=VALUE ...`: the target and variables exist, and make's dry run accepts them."""
    makefile = (ROOT / "Makefile").read_text()
    targets = [a for a in args if "=" not in a]
    variables = [a.split("=")[0] for a in args + env if "=" in a]
    for target in targets:
        assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"no make target {target!r}"
    for var in variables:
        known = re.search(rf"\b{re.escape(var)}\b", makefile) or var.startswith("PIP_")
        assert known, f"the Makefile reads no variable {var!r}"
    run = subprocess.run(["make", "-n", *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]


@pytest.mark.parametrize("page, line", COMMAND_LINES, ids=[f"{p}: {line[:60]}" for p, line in COMMAND_LINES])
def test_each_documented_command_is_still_right(page, line):
    words = shlex.split(line)
    env = []
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):  # VAR=value before the command
        env.append(words.pop(0))
    program = Path(words[0]).name
    if program == "make":
        _check_make(words[1:], env)
    elif program.startswith("python") and words[1:3] == ["-m", "helpers"]:
        _check_helpers(words[3:])
    elif program == "torchrun":
        m = words.index("-m")
        assert words[m + 1] == "helpers", line
        _check_helpers(words[m + 2 :])
    else:
        pytest.fail(f"{page}: a command this test cannot check: {line!r} (teach it, or show it as inline code)")


def test_the_pages_show_commands_and_link_each_other():
    assert len(COMMAND_LINES) >= 15
    readme = (ROOT / "README.md").read_text()
    for doc in sorted((ROOT / "docs").glob("*.md")):
        assert f"docs/{doc.name}" in readme, f"README.md does not link docs/{doc.name}"
    for image in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", readme):
        assert (ROOT / image).is_file(), f"README.md shows {image}, which is not in the repository"
    assert len(readme.splitlines()) <= 120, "the README is a front door: keep it about 100 lines"


def test_a_stale_command_would_be_caught():
    with pytest.raises(AssertionError, match="has no option --no-such-flag"):
        _check_helpers(["kernels", "--no-such-flag"])
    with pytest.raises(AssertionError, match="no make target"):
        _check_make(["no-such-target"], [])
