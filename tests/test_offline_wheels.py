"""The offline GPU route (README "On a lent GPU machine"): `make wheels` carries requirements-notebook.txt's pins, the
image holds the rest. Every requirement of the project (its dependencies and dev extras, and theirs in turn, read from
this environment's installed metadata for CPython 3.12 on Linux) must be one or the other, or `pip install -e .[dev]`
stops offline (issue 39 item 1: ruff was neither)."""

from __future__ import annotations

import importlib.metadata as md
import re
from pathlib import Path

import pytest

packaging = pytest.importorskip("packaging")
from packaging.requirements import Requirement  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TARGET = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux", "os_name": "posix"}
TARGET |= {"platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def carried_and_image() -> tuple[set[str], set[str]]:
    """(names pinned in requirements-notebook.txt, names of its '# image:' list)."""
    lines = (ROOT / "requirements-notebook.txt").read_text().splitlines()
    pinned = {canonical(line.split("==")[0]) for line in lines if line and not line.startswith("#")}
    image = {canonical(n) for line in lines if line.startswith("# image: ") for n in line[9:].split()}
    return pinned, image


def project_requirements(extras=("dev",)) -> list[Requirement]:
    """pyproject.toml's dependencies and the named extras, as installed here (this project's own metadata)."""
    reqs = [Requirement(r) for r in md.requires("llmsys-companion") or []]
    return [r for r in reqs if r.marker is None or any(r.marker.evaluate(TARGET | {"extra": e}) for e in ("", *extras))]


def closure(reqs: list[Requirement], stop: frozenset[str] = frozenset()) -> tuple[set[str], set[str]]:
    """(every requirement name reachable from `reqs` on the target, the names not installed here to walk further);
    `stop`: names whose own requirements are not walked (the image's: installed there with theirs)."""
    seen, unwalked, todo = set(), set(), list(reqs)
    while todo:
        req = todo.pop()
        name = canonical(req.name)
        if name in seen:
            continue
        seen.add(name)
        if name in stop:
            continue
        try:
            sub = md.requires(req.name) or []
        except md.PackageNotFoundError:
            unwalked.add(name)
            continue
        for text in sub:
            r = Requirement(text)
            env = TARGET | {"extra": next(iter(req.extras), "")}
            if r.marker is None or r.marker.evaluate(env):
                todo.append(r)
    return seen, unwalked


def test_every_requirement_is_carried_or_in_the_image():
    pinned, image = carried_and_image()
    needed, _ = closure(project_requirements())
    missing = sorted(needed - pinned - image - {"llmsys-companion"})
    assert not missing, f"neither in requirements-notebook.txt nor in the GPU image: {missing} (add their pins)"


def test_the_check_sees_a_dev_tool_the_wheels_lack():
    """The walk reaches the dev extras' own tools (ruff, pinned in pyproject.toml): dropping its pin would fail."""
    pinned, image = carried_and_image()
    needed, _ = closure(project_requirements())
    assert {"ruff", "nbval", "selenium"} <= needed
    assert "ruff" in pinned and "ruff" not in image


def test_the_smoke_wheels_carry_what_the_notebook_runner_needs_beyond_the_image():
    """`make smoke-wheels` (docs/gpu.md: the smoke run on a lent GPU machine): every name is pinned here, and the
    project's own dependencies, nbval, its kernel and ipywidgets need nothing the smoke set and the image lack (a
    missing one stops the run there)."""
    pinned, image = carried_and_image()
    makefile = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    smoke = {canonical(n) for n in re.search(r"^SMOKE_WHEELS := (.*)$", makefile, re.M).group(1).split()}
    assert smoke <= pinned, sorted(smoke - pinned)
    runner = [Requirement(n) for n in ("nbval", "ipykernel", "ipywidgets")]
    needed, _ = closure(project_requirements(extras=()) + runner, stop=frozenset(image))
    missing = sorted(needed - smoke - image)
    assert not missing, f"the smoke run's wheels lack {missing}: add them to SMOKE_WHEELS"
    assert not smoke & image, sorted(smoke & image)  # the image's own versions are kept
