"""How a local job's ranks start: forked from a server process that has imported torch once.

Importing torch (and ``torch._dynamo``, which the first optimizer imports) costs seconds of CPU
per process; with ``spawn`` every rank pays it, and P ranks on fewer cores pay it P times over.
Under ``forkserver`` the server imports them once and each rank is a fork of it. pipert itself
is not preloaded: a rank imports it (fast once torch is loaded) under the environment below, so
variables read at import (``PIPERT_NO_EXT``, ``PIPERT_SIM_PURE``) take their current values.

Invariant: a rank sees the launcher's environment and stdout/stderr as they are when the job
starts. A server started under another environment or other stdio (a test that changed an
environment variable, pytest's per-test capture) is stopped and a fresh one started; the server
lives no longer than the launcher (it exits when the launcher's end of its pipe closes).
"""
from __future__ import annotations

import multiprocessing
import os
from typing import Any

__all__ = ["start_method"]

PRELOAD = ["torch", "torch._dynamo", "torch.distributed", "torch.distributed.elastic.multiprocessing.errors"]
"""Modules the server imports before it forks ranks."""

_server_state: Any = None  # (environment, stdout id, stderr id) the running server was started under


def start_method() -> str:
    """``"forkserver"`` with a server matching this process's environment and stdio (see the
    module doc), or ``"spawn"`` where the platform has no fork server."""
    global _server_state
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return "spawn"
    from multiprocessing import forkserver
    state = (dict(os.environ), _file_id(1), _file_id(2))
    if state != _server_state:
        forkserver._forkserver._stop()  # no-op when none runs; the next rank start begins a new one
        forkserver.set_forkserver_preload(PRELOAD)
        _server_state = state
    return "forkserver"


def _file_id(fd: int) -> tuple[int, int] | None:
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino
