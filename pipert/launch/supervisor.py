"""Local jobs under torch's elastic agent (``LocalElasticAgent``: rendezvous, spawn, error files,
signal handling, shutdown), with one policy of pipert's: after the first rank fails, the others
get ``grace`` seconds to end on their own, so that their errors can name the action and the peer
they waited for; then every rank still running is killed (a stopped one too).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
import uuid
from typing import Any, Callable, Iterator

from torch.distributed.elastic.agent.server.api import RunResult, WorkerSpec, WorkerState
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, SignalException
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler
from torch.distributed.elastic.utils.process_state import read_proc_state

from .failures import LaunchError, LaunchInterrupted, RankEnd, root_cause_order
from .starter import start_method, stop_server

__all__ = ["run_local"]

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
_SHUTDOWN_S = 3
"""Seconds a rank gets to end after the launcher's stop signal before SIGKILL."""


class _GraceAgent(LocalElasticAgent):
    """torch's local agent, reporting a failure once every rank has ended or ``grace`` seconds
    after the first one failed, whichever comes first."""

    def __init__(self, spec: WorkerSpec, log_dir: str, grace: float) -> None:
        super().__init__(spec, DefaultLogsSpecs(log_dir=log_dir), start_method=start_method(),
                         shutdown_timeout=_SHUTDOWN_S)
        self.grace = grace
        self.ended: dict[int, tuple[float, int]] = {}  # local rank -> (seen at, exit code or -signal)
        self.killed: dict[int, str | None] = {}        # local rank -> its /proc state when killed

    def _monitor_workers(self, worker_group: Any) -> RunResult:
        self._note_ended()
        failed = [t for t, code in self.ended.values() if code != 0]
        if failed and len(self.ended) < worker_group.spec.local_world_size:
            if time.monotonic() - min(failed) < self.grace:
                return RunResult(state=WorkerState.HEALTHY)
            self._kill_running()
        return super()._monitor_workers(worker_group)

    def _note_ended(self) -> None:
        """Exit codes (negative: the signal) of the ranks that ended, from the process objects the
        process context joins later (an exit code, once read, stays with its object)."""
        pc = getattr(self._pcontext, "_pc", None)  # torch's MultiprocessContext: its ProcessContext
        if pc is None:
            return
        for local_rank, proc in enumerate(pc.processes):
            if local_rank not in self.ended and proc.exitcode is not None:
                self.ended[local_rank] = (time.monotonic(), proc.exitcode)

    def _kill_running(self) -> None:
        for local_rank, pid in self._pcontext.pids().items():
            if local_rank not in self.ended and local_rank not in self.killed:
                self.killed[local_rank] = read_proc_state(pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def rank_ends(self, result: RunResult) -> dict[int, RankEnd]:
        """How every rank that did not succeed ended (local rank = rank: one node)."""
        for r, failure in result.failures.items():  # ended and reaped between two looks
            self.ended.setdefault(r, (time.monotonic(), failure.exitcode))
        files = self._pcontext.error_files if self._pcontext else {}
        first = min(((t, r) for r, (t, code) in self.ended.items() if code != 0), default=None)
        out: dict[int, RankEnd] = {}
        for r, (seen, code) in self.ended.items():
            if code == 0:
                continue
            text, message = _error_file(files.get(r, ""))
            if text is None:
                text = message = (f"exited with code {code}" if code > 0
                                  else f"killed by signal {signal.Signals(-code).name}")
            out[r] = RankEnd(r, text, message, seen)
        for r, state in self.killed.items():
            how = (" (it was suspended: process state T, e.g. SIGSTOP or a debugger)" if state and state[0] in "Tt"
                   else "")
            after = f" {self.grace:g} s after rank {first[1]} failed" if first else ""
            text = f"stopped by the launcher: still running{after}{how}"
            out[r] = RankEnd(r, text, text, None)
        return out


def _error_file(path: str) -> tuple[str | None, str]:
    """(traceback, one-line message) from a rank's torchelastic error file; (None, "") without one."""
    if not path or not os.path.isfile(path):
        return None, ""
    with open(path) as f:
        message = json.load(f)["message"]
    if isinstance(message, str):
        return message, message
    return message["extraInfo"].get("py_callstack") or message["message"], message["message"]


def run_local(entry: Callable[..., None], nprocs: int, args: tuple, grace: float) -> None:
    """Run ``entry(*args, job_dir)`` in ``nprocs`` processes on this machine under torch's agent.

    Raises ``LaunchError`` (root cause first) if a rank fails, ``LaunchInterrupted`` if this
    process gets SIGINT/SIGTERM/SIGHUP/SIGQUIT (after every rank has ended). Nothing is left
    running, and the job folder (``pipert-*`` in the temporary directory: error files, logs) is
    removed either way.
    """
    with _own_stop_signals(), _quiet_agent_logs():
        job_dir = tempfile.mkdtemp(prefix="pipert-")
        try:
            rdzv = get_rendezvous_handler(RendezvousParameters(
                backend="c10d", endpoint="127.0.0.1:0", run_id=f"pipert-{uuid.uuid4().hex}", min_nodes=1,
                max_nodes=1, local_addr="127.0.0.1"))
            spec = WorkerSpec(role="pipert", local_world_size=nprocs, rdzv_handler=rdzv, entrypoint=entry,
                              args=(*args, job_dir), max_restarts=0, monitor_interval=0.1, local_addr="127.0.0.1")
            agent = _GraceAgent(spec, job_dir, grace)
            try:
                result = agent.run()
            finally:
                rdzv.shutdown()
            if result.is_failed():
                ends = agent.rank_ends(result)
                order = root_cause_order(ends)
                raise LaunchError({r: ends[r].text for r in order}, order, {r: ends[r].message for r in order})
        except SignalException as e:
            stop_server()  # this process is going down: so is the ranks' fork server, before it
            raise LaunchInterrupted(e.sigval) from None
        finally:
            shutil.rmtree(job_dir, ignore_errors=True)


@contextlib.contextmanager
def _own_stop_signals() -> Iterator[None]:
    """Stop signals raise ``SignalException`` here until the agent installs torch's handler (the
    same behaviour), so a stop at any point cleans up; the caller's handlers come back after."""
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        raise SignalException(f"process {os.getpid()} got signal {signum}", sigval=signal.Signals(signum))
    before = {s: signal.getsignal(s) for s in _STOP_SIGNALS}
    for s in _STOP_SIGNALS:
        signal.signal(s, stop)
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def _quiet_agent_logs() -> Iterator[None]:
    """The agent's own log lines (worker failures, shutdown) stay out of the output: pipert reports
    the ranks' errors itself. ``LOGLEVEL`` set in the environment keeps them."""
    if "LOGLEVEL" in os.environ:
        yield
        return
    loggers = [logging.getLogger(n) for n in ("torch.distributed.elastic", "torch.multiprocessing")]
    saved = [(lg, lg.propagate, lg.handlers[:]) for lg in loggers]
    for lg in loggers:
        lg.propagate = False
        lg.handlers = [logging.NullHandler()]
    try:
        yield
    finally:
        for lg, propagate, handlers in saved:
            lg.propagate, lg.handlers = propagate, handlers
