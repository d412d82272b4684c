"""How a local job's ranks start: forked from a server process that has imported torch once.

Importing torch (and ``torch._dynamo``, which the first optimizer imports) costs seconds of CPU
per process; with ``spawn`` every rank pays it, and P ranks on fewer cores pay it P times over.
Under ``forkserver`` the server imports them once and each rank is a fork of it. pipert itself
is not preloaded: a rank imports it (fast once torch is loaded) under the environment below, so
variables read at import (``PIPERT_NO_EXT``, ``PIPERT_SIM_PURE``) take their current values.

Invariant: a rank sees the launcher's environment and stdout/stderr as they are when the job
starts. The launcher's stdout/stderr and the variables in ``VOLATILE`` travel with each rank
(``Inherited``, applied by ``adopt`` before anything else runs in the rank); a server started under
any other difference in the environment (a variable torch may read at import) is stopped and a
fresh one started. The server lives no longer than the launcher (it exits when the launcher's end
of its pipe closes).
"""
from __future__ import annotations

import multiprocessing
import os
from typing import Any

__all__ = ["Inherited", "adopt", "inherited", "start_method", "stop_server", "warm"]

PRELOAD = ["torch", "torch._dynamo", "torch.distributed", "torch.distributed.elastic.multiprocessing.errors"]
"""Modules the server imports before it forks ranks."""

VOLATILE = ("PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR")
"""Variables that change between launches of one process and are read by nothing at import
(pytest sets the first per test; importing torch._dynamo sets the second to its default, read
when a compile cache is first used): they travel with each rank instead of restarting the server."""

_server_state: Any = None  # the environment (less VOLATILE) the running server was started under


def start_method() -> str:
    """``"forkserver"`` with a server matching this process's environment and stdio (see the
    module doc), or ``"spawn"`` where the platform has no fork server."""
    global _server_state
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    from multiprocessing import forkserver
    state = {k: v for k, v in os.environ.items() if k not in VOLATILE}
    if state != _server_state:
        forkserver._forkserver._stop()  # no-op when none runs; the next rank start begins a new one
        forkserver.set_forkserver_preload(PRELOAD)
        _server_state = state
    return "forkserver"


def stop_server() -> None:
    """Stop the fork server (it ends once the ranks it forked have ended); the next launch
    starts a new one."""
    global _server_state
    if "forkserver" in multiprocessing.get_all_start_methods():
        from multiprocessing import forkserver
        forkserver._forkserver._stop()
        _server_state = None


def warm() -> None:
    """Start the server now (it imports torch while this process goes on), so that a launch
    later in this process does not wait for it; a no-op where there is no fork server."""
    if start_method() == "forkserver":
        from multiprocessing import forkserver
        forkserver.ensure_running()


class _Fd:
    """One of the launcher's file descriptors, duplicated into the rank when pickled for it (the
    fork server passes it over its socket), or None where the launcher has it closed."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple:
        from multiprocessing import reduction
        try:
            os.fstat(self.fd)
        except OSError:
            return (_Fd, (None,))
        return (_detach, (reduction.DupFd(self.fd),))


def _detach(dup: Any) -> _Fd:
    return _Fd(dup.detach())


class Inherited:
    """What a rank takes from its launcher at start: ``VOLATILE``'s values, stdout and stderr."""

    def __init__(self) -> None:
        self.env = {k: os.environ.get(k) for k in VOLATILE}
        self.stdio = (_Fd(1), _Fd(2))


def inherited() -> Inherited:
    """This process's ``Inherited``, to pass to the ranks it launches."""
    return Inherited()


def adopt(got: Inherited) -> None:
    """In a rank: take the launcher's stdout/stderr and volatile variables."""
    for k, v in got.env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    for target, src in zip((1, 2), got.stdio):
        if src.fd is None:
            os.close(target)
        elif src.fd != target:
            os.dup2(src.fd, target)
            os.close(src.fd)
