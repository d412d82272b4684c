"""A ``pipert`` command run in this process, its output captured (for tests).

``run_cli`` calls ``pipert.cli.main`` with file descriptors 1 and 2 (and ``sys.stdout``/``sys.stderr``)
pointed at temporary files: the ranks a launch starts take the launcher's descriptors with them
(the fork server passes them), so their output lands there too. It stands for ``python -m pipert``
where the separate process adds nothing under test (no signal, interpreter exit or torchrun), and
saves that process's start and torch import.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass

__all__ = ["CliRun", "run_cli"]


@dataclass
class CliRun:
    """One command's exit status, stdout and stderr."""

    returncode: int
    stdout: str
    stderr: str

    def rows(self) -> list[dict]:
        """The JSON objects it printed, one a line (``--json``); the command must have succeeded."""
        if self.returncode != 0:
            raise AssertionError(f"exit status {self.returncode}:\n{self.stderr[-3000:]}")
        return [json.loads(line) for line in self.stdout.splitlines() if line.startswith("{")]


def run_cli(*argv: str) -> CliRun:
    """``pipert argv`` in this process; argparse's refusals give their status (2), as on the command line."""
    from .cli import main
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        saved_fds, saved_streams = (os.dup(1), os.dup(2)), (sys.stdout, sys.stderr)
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)
        try:
            rc = main(list(argv))
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
        finally:
            for stream in (sys.stdout, sys.stderr):
                stream.close()  # flushes; the descriptors stay open (closefd=False)
            sys.stdout, sys.stderr = saved_streams
            for fd, saved in zip((1, 2), saved_fds):
                os.dup2(saved, fd)
                os.close(saved)
        out.seek(0)
        err.seek(0)
        return CliRun(rc, out.read().decode(), err.read().decode())
