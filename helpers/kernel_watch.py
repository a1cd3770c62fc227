"""A notebook kernel that dies fails its cell at once, saying how it ended and what it last wrote to stderr.

Without this a dead kernel costs the whole cell timeout and then a failure that names no cause (issue 34: a
compiled kernel that aborted with "free(): invalid pointer"). Two users:

- the writeup's executor (helpers.writeup.execute, nbclient): nbclient notices the death within a second and raises
  DeadKernelError; `KernelStderr.report()` turns it into the notebook's error line;
- nbval (`make test`): this module is a pytest plugin (pyproject's addopts: `-p helpers.kernel_watch`) that starts
  each notebook's kernel with its stderr kept here instead of thrown away, and checks between messages (every
  POLL_S) that the kernel still runs.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

POLL_S = 1.0  # how often a wait for the kernel's next message checks that the kernel still runs
TAIL_BYTES = 16384  # how much of the kernel's stderr is kept (the last lines are shown)
TAIL_LINES = 20


def skip_iri_grammar() -> None:
    """Leave out jsonschema's check of the "iri" string format, which no notebook's schema uses: jsonschema (which
    nbformat imports) compiles an RFC 3987 grammar for it when rfc3987_syntax is installed (JupyterLab brings it),
    1.2 s of a core in every process that reads a notebook (each pytest worker, the writeup). Marked absent before
    jsonschema's first import, as where that optional package is not installed. At this module's import: it is the
    plugin pytest loads before nbval, and the writeup imports it first."""
    if "jsonschema" not in sys.modules:
        sys.modules.setdefault("rfc3987_syntax", None)


skip_iri_grammar()


class KernelDied(RuntimeError):
    """The notebook's kernel process ended while a cell ran or waited."""


def describe_exit(code: int | None) -> str:
    """Say how a process ended, from its exit code (negative: the signal that killed it)."""
    if code is None:
        return "ended (exit code unknown)"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


class KernelStderr:
    """A pipe for a kernel's stderr: what comes through is echoed to `echo` (a file descriptor, or None to drop it,
    as nbval does) and its tail kept, so that `report()` can say how the kernel ended and what it last wrote.

    Pass `.fd` as the kernel's stderr, then `close()` this side's copy of it and set `.process` to the kernel's."""

    def __init__(self, echo: int | None = None):
        read_fd, self.fd = os.pipe()
        self.process = None  # the kernel's subprocess.Popen, once started
        self._tail = bytearray()
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, args=(read_fd, echo), daemon=True, name="kernel-stderr")
        self._reader.start()

    def _read(self, read_fd: int, echo: int | None) -> None:
        """Reader thread: copy the pipe to `echo` and keep its last TAIL_BYTES until the kernel's end closes it."""
        with os.fdopen(read_fd, "rb", buffering=0) as pipe:
            while chunk := pipe.read(4096):
                if echo is not None:
                    try:
                        os.write(echo, chunk)
                    except OSError:
                        echo = None
                with self._lock:
                    self._tail += chunk
                    del self._tail[:-TAIL_BYTES]

    def close(self) -> None:
        """Close this side's copy of the write end once the kernel has its own (the reader then sees the pipe end
        when the kernel and its children are gone)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def last_lines(self, n: int = TAIL_LINES) -> list[str]:
        """The last `n` non-blank lines the kernel wrote, as a terminal shows them (progress bars' \\r resolved)."""
        self._reader.join(timeout=0.5)  # let the reader take in what the kernel wrote just before it died
        with self._lock:
            text = self._tail.decode("utf-8", "replace")
        lines = [line.rsplit("\r", 1)[-1].rstrip() for line in text.split("\n")]
        return [line for line in lines if line.strip()][-n:]

    def report(self) -> str:
        """One paragraph: how the kernel ended and the last lines of its stderr."""
        code = self.process.poll() if self.process is not None else None
        lines = self.last_lines()
        tail = ("; its last lines on stderr:\n    " + "\n    ".join(lines)) if lines else "; it wrote nothing to stderr"
        return f"the notebook's kernel {describe_exit(code)}{tail}"


def _watched_kernel_class():
    """nbval's RunningKernel with the kernel's stderr kept (nbval throws it away) and a dead kernel noticed at once:
    a wait for a message raises KernelDied within POLL_S of the kernel's end, instead of waiting out the timeout."""
    from queue import Empty

    from nbval.kernel import RunningKernel, start_new_kernel

    class WatchedKernel(RunningKernel):
        def __init__(self, kernel_name, cwd=None, startup_timeout=60):
            self.stderr = KernelStderr()
            try:
                self.km, self.kc = start_new_kernel(
                    startup_timeout=startup_timeout, kernel_name=kernel_name, stderr=self.stderr.fd, cwd=cwd
                )
            finally:
                self.stderr.close()
            self.stderr.process = getattr(self.km.provisioner, "process", None)
            self._ensure_iopub_up()

        def get_message(self, stream, timeout=None):
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                left = POLL_S if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    return super().get_message(stream, timeout=min(POLL_S, left))
                except Empty:
                    if not self.km.is_alive():
                        raise KernelDied(self.stderr.report()) from None
                    if deadline is not None and time.monotonic() >= deadline:
                        raise

    return WatchedKernel


def pytest_configure(config) -> None:
    """pytest hook: make nbval start its kernels watched (nothing to do where nbval is not installed)."""
    try:
        import nbval.plugin
    except ImportError:
        return
    nbval.plugin.RunningKernel = _watched_kernel_class()
