"""Running a notebook top to bottom in a kernel of this very Python, with parameters injected as papermill does,
and a kernel's death reported within about a second (helpers.kernel_watch).
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat

from helpers.kernel_watch import KernelStderr

ROOT = Path(__file__).resolve().parent.parent.parent  # the repository (kernels' resource dir; pages' paths)
ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")


def inject_parameters(nb, **params) -> None:
    """Insert `NAME = value` lines after the cell tagged `parameters` (at the top when there is none)."""
    if not params:
        return
    source = "# Injected parameters\n" + "".join(f"{k} = {v!r}\n" for k, v in params.items())
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]})
    tagged = [i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])]
    nb.cells.insert(tagged[0] + 1 if tagged else 0, cell)


_IPC: list[Path] = []


def _ipc_folder() -> Path:
    """One private temporary folder per process for the kernels' IPC sockets, removed when the process exits."""
    if not _IPC:
        import atexit
        import shutil
        import tempfile

        _IPC.append(Path(tempfile.mkdtemp(prefix="helpers-kernels-")))
        atexit.register(shutil.rmtree, _IPC[0], ignore_errors=True)
    return _IPC[0]


def _this_python_kernel_manager():
    """A KernelManager class that runs this very Python (the project's .venv), whatever kernels are installed, talking
    to it over local IPC sockets in a private temporary folder: no TCP ports, so no kernel warning about TCP without
    encryption in the log."""
    from ipykernel.kernelspec import get_kernel_dict
    from jupyter_client.kernelspec import KernelSpec
    from jupyter_client.manager import AsyncKernelManager

    class ThisPython(AsyncKernelManager):  # async: nbclient's check that the kernel lives runs beside the waits
        def __init__(self, **kwargs):
            kwargs.setdefault("transport", "ipc")
            kwargs.setdefault("ip", str(_ipc_folder() / "kernel"))  # sockets kernel-1, kernel-2, ... (free numbers)
            super().__init__(**kwargs)

        async def start_kernel(self, stderr_watch: KernelStderr | None = None, **kwargs):
            """Start the kernel; with `stderr_watch` its stderr goes through that pipe (how it died, if it does)."""
            if stderr_watch is None:
                return await super().start_kernel(**kwargs)
            try:
                await super().start_kernel(stderr=stderr_watch.fd, **kwargs)
            finally:
                stderr_watch.close()
            stderr_watch.process = self.provisioner.process

        @property
        def kernel_spec(self):
            return KernelSpec(resource_dir=str(ROOT), **get_kernel_dict())

    return ThisPython


def execute(path: Path, params: dict, timeout_s: int = 3600):
    """Run a notebook top to bottom in its folder; return (executed notebook, error text or None).

    A kernel that dies stops the notebook within about a second (nbclient checks every second); the error then says
    how it ended and what it last wrote to stderr, which is echoed to this process's stderr as it comes."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, DeadKernelError

    nb = nbformat.read(path, as_version=4)
    inject_parameters(nb, **params)
    # The kernel's own stderr (what C code and child processes write; what a crash writes last) goes to its stderr
    # file descriptor, not into the notebook, as under nbval: through `stderr` to this process's stderr.
    client = NotebookClient(
        nb,
        kernel_manager_class=_this_python_kernel_manager(),
        kernel_name="python3",
        timeout=timeout_s,
        resources={"metadata": {"path": str(path.parent)}},
        extra_arguments=["--IPKernelApp.capture_fd_output=False"],
        # killed after its last cell, as nbval does: every cell has written what it makes, launch() has stopped its
        # ranks, and the forkserver ends with its parent; a graceful shutdown waited ~2.5 s a notebook for the
        # interpreter's teardown once torch had launched ranks
        shutdown_kernel="immediate",
    )
    stderr = KernelStderr(echo=2)
    running = ["start-up"]
    client.on_cell_execute = lambda cell, cell_index: running.append(f"cell {cell_index} (id {cell.get('id')})")
    try:
        client.execute(stderr_watch=stderr)
        return nb, None
    except CellExecutionError as exc:
        text = ANSI_COLOUR.sub("", str(exc)).strip()
        return nb, text.splitlines()[-1] if text else "cell failed"
    except (DeadKernelError, RuntimeError):  # RuntimeError: nbclient's "Kernel died before replying"
        if stderr.process is None or stderr.process.poll() is None:
            raise  # the kernel runs: not a death
        return nb, f"{running[-1]}: {stderr.report()}"
    finally:
        stderr.close()
