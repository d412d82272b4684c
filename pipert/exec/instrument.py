"""Instrumentation: the test and measurement hooks of a Pipeline and its executors, in one object.

Production training passes none (``Pipeline(..., instrument=None)``): the executor then runs its
program with no hook. Tests and measurement tools pass an :class:`Instrumentation`:

- ``fault``: a :class:`Fault` stops one rank before one of its actions (hang, exit or raise), to
  test how the others fail;
- ``record``: each compute's (action index, op, unit, micro-batch, digest of the value read, digest
  of the value written) in the order they ran (``StepResult.order``; :func:`digest`);
- ``measure_memory``: the bytes each rank's program holds after every action, and the live stashes
  (``StepResult.memory``, ``StepResult.stashes``);
- ``trace``: every action's (text, start, end), each compute's own time and every message
  (``StepResult.trace``, ``op_times``, ``messages``; read by ``pipert.tools.fidelity``);
- ``check=False``: compile without validating and let the executor run the unvalidated program
  (tests of what the transports do with a program the validator rejects);
- ``warmup=False``: communicators are created at first use instead of all of them before the first
  step (tests of the start-up deadlocks that ``validate(..., warmup=False)`` reports).

``record`` and ``measure_memory`` need the actions to run one at a time (host queues).
"""
from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass
from typing import Any

__all__ = ["Instrumentation", "Fault", "digest", "NONE"]

_MODES = ("hang", "exit", "raise")


@dataclass(frozen=True)
class Fault:
    """Deliberate failure for tests: rank ``rank`` stops before its action ``at_action``."""

    rank: int
    at_action: int
    mode: str = "hang"
    """"hang": until the Pipeline gives up on the step; "exit": leave the process; "raise": raise here."""

    def __post_init__(self) -> None:
        if self.mode not in _MODES:
            raise ValueError(f"fault mode {self.mode!r} unknown; allowed: {', '.join(_MODES)}")

    def trip(self, aborted: threading.Event, error: type[Exception]) -> None:
        """Stop here as ``mode`` says; a hang ends when ``aborted`` is set, raising ``error``."""
        if self.mode == "exit":
            os._exit(3)
        if self.mode == "raise":
            raise error(f"rank {self.rank}: injected fault at action {self.at_action}")
        aborted.wait()
        raise error(f"rank {self.rank}: injected hang at action {self.at_action} aborted")


@dataclass(frozen=True)
class Instrumentation:
    """The hooks one Pipeline runs with (module doc); the default has every hook off."""

    fault: Fault | None = None
    """A rank stops mid-step (tests of failures)."""
    record: bool = False
    """Record each compute with digests of what it read and wrote (``StepResult.order``)."""
    measure_memory: bool = False
    """Record the bytes held and live stashes after every action (``StepResult.memory``)."""
    trace: bool = False
    """Time every action, compute and message (``StepResult.trace``, ``op_times``, ``messages``)."""
    check: bool = True
    """False: compile without validating and run the program anyway (tests only)."""
    warmup: bool = True
    """False: no communicator warm-up; each is created at its first use (tests only)."""

    @property
    def serial(self) -> bool:
        """Whether the actions must run one at a time (a snapshot after every action)."""
        return self.record or self.measure_memory

    def fault_of(self, rank: int) -> Fault | None:
        """The fault that stops ``rank`` (None: it runs to the end)."""
        return self.fault if self.fault is not None and self.fault.rank == rank else None


NONE = Instrumentation()
"""Every hook off: what production runs."""


def digest(v: Any) -> str | None:
    """A fingerprint of a value's bytes (a tensor or tuple of tensors; None for none)."""
    if v is None:
        return None
    import torch
    h = hashlib.sha1()
    for t in (v if isinstance(v, (tuple, list)) else (v,)):
        if isinstance(t, torch.Tensor):
            h.update(str(tuple(t.shape)).encode())
            h.update(t.detach().reshape(-1).contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
