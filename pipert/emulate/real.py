"""Emulation with the model's real units: the Pipeline on the local transport (the ranks are
threads of this process), every message delayed by a LinkEmulator. The prediction is the one
``pipert train --profile`` gives (``pipert.tools.fidelity``, the one place that computes it): the
simulator fed with what each traced step measured, its computes, its messages and the time around
them. Two predictions: a core per rank, the one to read with any number of ranks per core (its
compute times and queue overhead hold the waits for a core and for the interpreter lock the
threads share), and the ranks sharing this host's cores from CPU seconds (a cross-check that does
not see the interpreter lock; None on a GPU)."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import nn

from ..ir import Schedule
from ..ir.program import Program

__all__ = ["RealEmulation", "emulate_real"]


@dataclass
class RealEmulation:
    """Measured step time of the real units against the predictions (seconds, medians over the
    measured steps, each step predicted from its own measurements)."""

    schedule: Program
    """The program that ran (and was simulated)."""
    step_seconds: float
    predicted: float
    steps: int
    predicted_shared: float | None  # the ranks sharing this host's cores; None on a GPU
    capacity: float  # cores the shared prediction gives the ranks (0 on a GPU)

    @property
    def error(self) -> float:
        return (self.step_seconds - self.predicted) / self.predicted

    @property
    def error_shared(self) -> float | None:
        if self.predicted_shared is None:
            return None
        return (self.step_seconds - self.predicted_shared) / self.predicted_shared


def emulate_real(schedule: Program | Schedule, units: Sequence[nn.Module], x: torch.Tensor, y: torch.Tensor,
                 links: Any = None, steps: int = 5) -> RealEmulation:
    """Run ``steps`` traced training steps of the real units (after one warm-up step) with every
    message delayed by ``links`` (pipert.cost Links in seconds). A Schedule is compiled first
    (``pipert.compile``): the simulator times the program that runs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one intra-op thread: ranks are threads sharing the cores
    try:
        return _emulate_real(schedule, units, x, y, links, steps)
    finally:
        torch.set_num_threads(threads)


def _emulate_real(schedule: Program | Schedule, units: Sequence[nn.Module], x: torch.Tensor, y: torch.Tensor,
                  links: Any, steps: int) -> RealEmulation:
    from ..compiler import compile
    from ..exec.instrument import Instrumentation
    from ..pipeline import Pipeline
    from ..tools.fidelity import local_measurements, predict_step, predict_step_shared, profile_from_measurements
    from .emulator import scaled_link_emulator
    program = schedule if isinstance(schedule, Program) else compile(schedule, units=units)
    em = scaled_link_emulator(links, program.num_ranks, 1.0)
    pipe = Pipeline(units, program, optimizer=lambda ps: torch.optim.SGD(ps, lr=1e-3), links=em,
                    instrument=Instrumentation(trace=True))
    pipe.step(x, y)  # warm-up
    times, own, shared = [], [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        pipe.step(x, y)
        times.append(time.perf_counter() - t0)
        prof = profile_from_measurements([local_measurements(pipe)], program.num_units)
        own.append(predict_step(program, prof, links))
        shared.append(predict_step_shared(program, prof, links))
    cores = prof.cores[0] if prof.cores else 0.0
    return RealEmulation(program, statistics.median(times), statistics.median(own), steps,
                         None if shared[0] is None else statistics.median(shared), cores)
