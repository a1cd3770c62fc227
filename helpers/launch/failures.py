"""What launch knows about ranks that failed: which rank failed first and why (its traceback, or how it died), the
error naming every other rank's state, a warning for a rank that died after returning, and stopping the rest."""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

from helpers.kernel_watch import describe_exit


class RankError(RuntimeError):
    """A rank raised or died; carries the rank and, where there was one, its traceback."""

    def __init__(self, message: str, rank: int, remote_traceback: str | None = None):
        super().__init__(message)
        self.rank = rank
        self.remote_traceback = remote_traceback


def _failed(procs, workdir: Path) -> list[int]:
    """Ranks that ended badly without returning: a rank whose result is saved has done its work, whatever its exit."""
    return [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and not (workdir / f"rank{r}.pt").exists()]


def _warn_late_deaths(procs, workdir: Path) -> None:
    """Say so (without failing) when a rank died after returning its result, e.g. in native teardown code."""
    late = [f"rank {r} {describe_exit(p.exitcode)}" for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
    if late:
        warnings.warn(f"launch: {'; '.join(late)} after returning its result; the results are complete", stacklevel=3)


def _failure(procs, first_dead: list[int], workdir: Path, world_size: int) -> RankError:
    """Build the error for the rank that failed first, naming the others' state.

    `first_dead` are the ranks already dead when the parent first saw a failure. Among them a rank
    that left no traceback (killed by a signal) is the cause, since its peers' errors follow from it;
    otherwise the earliest traceback by the ranks' own clocks.
    """
    errors = {}
    for rank in range(world_size):
        f = workdir / f"rank{rank}.err"
        if f.exists():
            errors[rank] = json.loads(f.read_text())
    silent = [r for r in first_dead if r not in errors]
    first = silent[0] if silent else min((r for r in errors), key=lambda r: errors[r]["time"])
    dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
    others = [f"rank {r} {'also failed' if r in dead else 'was terminated'}" for r in range(world_size) if r != first]
    tb = None
    if first in errors:
        e, tb = errors[first], errors[first]["traceback"]
        msg = (
            f"rank {first} of {world_size} raised {e['type']}: {e['message']}\n\n"
            f"--- traceback from rank {first} ---\n{tb}"
        )
    else:
        msg = (
            f"rank {first} of {world_size} {describe_exit(procs[first].exitcode)} before or outside the worker's "
            "Python code (out of memory, a crash in native code, os._exit; its stderr may say more). "
            'In a script, call launch() under `if __name__ == "__main__":` since spawned ranks re-import it.'
        )
    if others:
        msg += "\n(" + "; ".join(others) + ")"
    return RankError(msg, rank=first, remote_traceback=tb)


def _stop(procs) -> None:
    """Terminate, then kill, every worker still alive, and reap them all."""
    procs = [p for p in procs if p.pid is not None]  # skip any never started
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 3.0
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()
