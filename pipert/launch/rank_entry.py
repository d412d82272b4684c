"""One rank's process, as ``pipert.launch.launch`` starts it through torch's agent.

The agent sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT and TORCHELASTIC_ERROR_FILE.
Invariants: a rank never outlives its launcher (a SIGKILLed launcher cannot clean up, so the
orphaned ranks remove its job folder before they leave); a rank leaves by ``os._exit`` on any
failure or stop signal (its peers may be gone: no teardown that could block); its error is in
the error file (``record``), never on stderr.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import select
import shutil
import signal
import sys
import threading
import time
from typing import Any, Callable

from .starter import Inherited, adopt

__all__ = ["run_rank"]

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


def run_rank(fn: Callable[..., Any], args: tuple, backend: str, timeout: float, launcher: int,
             launcher_tmp: str, given: Inherited, job_dir: str) -> None:
    """Initialise torch.distributed from the agent's environment and run ``fn(rank, world, *args)``
    while process ``launcher`` lives (the launcher, not necessarily this process's parent: a fork
    server starts the ranks, see ``pipert.launch.starter``), with the launcher's stdio and
    variables ``given``. An orphaned rank removes the job folder and the launcher's
    multiprocessing folder ``launcher_tmp`` (the server's socket)."""
    adopt(given)
    from torch.distributed.elastic.multiprocessing.errors import record
    gone = _watcher(launcher)
    leaving = threading.RLock()  # one thread cleans up and exits; re-entrant for a signal handler

    def leave(code: int) -> None:
        with leaving:
            try:
                if gone(0):  # orphaned: the launcher died without removing its folders
                    shutil.rmtree(job_dir, ignore_errors=True)
                    shutil.rmtree(launcher_tmp, ignore_errors=True)
                for stream in (sys.stdout, sys.stderr):
                    with contextlib.suppress(Exception):  # e.g. a handler interrupting a write
                        stream.flush()
            finally:
                os._exit(code)

    # The launcher's death is seen by the watcher alone: the death signal torch.multiprocessing
    # asks for (SIGINT) can arrive while the dying launcher still is this process's parent.
    _prctl(_PR_SET_PDEATHSIG, 0)
    # Ctrl-C reaches every process of the group: leave quietly, the launcher reports.
    signal.signal(signal.SIGINT, lambda signum, frame: leave(128 + signum))
    threading.Thread(target=_watch_launcher, args=(gone, leave), name="pipert-watch-launcher",
                     daemon=True).start()
    _prctl(_PR_SET_NAME, f"pipert-rank{os.environ.get('RANK', '')}".encode()[:15])  # in ps, top, /proc/PID/comm
    try:
        record(_run)(fn, args, backend, timeout)
    except BaseException:  # recorded in this rank's error file by ``record``
        leave(1)


def _run(fn: Callable[..., Any], args: tuple, backend: str, timeout: float) -> None:
    import torch.distributed as dist
    from . import init_from_env
    rank = init_from_env(backend, timeout)
    fn(rank, dist.get_world_size(), *args)
    dist.destroy_process_group()


def _watch_launcher(gone: Callable[[float | None], bool], leave: Callable[[int], None]) -> None:
    """Leave once the launcher is gone, even while the main thread is inside a blocking call
    that delays Python's signal handlers."""
    gone(None)
    leave(1)


def _watcher(pid: int) -> Callable[[float | None], bool]:
    """``gone(wait)``: whether process ``pid`` has ended, waiting up to ``wait`` seconds for it
    (None: until it does). A pidfd where Linux has one (an ended process counts even while its
    parent has not reaped it), else the process's presence in /proc, polled."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None

    def gone(wait: float | None) -> bool:
        if fd is not None:
            return bool(select.select([fd], [], [], wait)[0])
        end = None if wait is None else time.monotonic() + wait
        while _present(pid):
            if end is not None and time.monotonic() >= end:
                return False
            time.sleep(0.2)
        return True
    return gone


def _present(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by another user
        pass
    return True


def _prctl(option: int, value: int | bytes) -> None:
    """Linux's prctl(2) for this process (elsewhere a no-op)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(option, value, 0, 0, 0)
