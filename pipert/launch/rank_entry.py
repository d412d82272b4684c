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
import shutil
import signal
import sys
import threading
import time
from typing import Any, Callable

__all__ = ["run_rank"]

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15


def run_rank(fn: Callable[..., Any], args: tuple, backend: str, timeout: float, job_dir: str) -> None:
    """Initialise torch.distributed from the agent's environment and run ``fn(rank, world, *args)``."""
    from torch.distributed.elastic.multiprocessing.errors import record
    launcher = os.getppid()
    leaving = threading.RLock()  # one thread cleans up and exits; re-entrant for a signal handler

    def leave(code: int) -> None:
        with leaving:
            try:
                if os.getppid() != launcher:  # orphaned: the launcher died without removing its folder
                    shutil.rmtree(job_dir, ignore_errors=True)
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
    threading.Thread(target=_watch_launcher, args=(launcher, leave), name="pipert-watch-launcher",
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


def _watch_launcher(launcher: int, leave: Callable[[int], None]) -> None:
    """Leave once the launcher is gone, even while the main thread is inside a blocking call
    that delays Python's signal handlers."""
    while os.getppid() == launcher:
        time.sleep(0.2)
    leave(1)


def _prctl(option: int, value: int | bytes) -> None:
    """Linux's prctl(2) for this process (elsewhere a no-op)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(option, value, 0, 0, 0)
