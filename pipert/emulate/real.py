"""Emulation with the model's real units: the Pipeline on the local transport, every
message delayed by a LinkEmulator; the prediction comes from the simulator fed with the
units' profiled times (this process, this device).

The ranks are threads of this process on one device, so two predictions are given: the
simulator's (a device per rank) and the same DAG timed with the ranks sharing the device
(:func:`pipert.sim.shared.shared_step`; capacity 1 on a GPU, the logical CPUs on a CPU)."""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import nn

from ..ir import Action, Op, Payload, Schedule
from ..ir.program import Program
from ..sim import simulate
from ..sim.shared import shared_step

__all__ = ["ProfiledCost", "profile_units", "RealEmulation", "emulate_real"]


class ProfiledCost:
    """Measured seconds per (op, unit) for one micro-batch, real message and weight sizes."""

    def __init__(self, times: dict[tuple[Op, int], float], act_bytes: Sequence[float],
                 weight_bytes: Sequence[float]) -> None:
        self.times, self.act_bytes, self.weight_bytes = times, list(act_bytes), list(weight_bytes)

    def compute_time(self, action: Action, rank: int) -> float:
        if action.op is Op.OPT or not action.is_compute:
            return 0.0
        op = Op.F if action.op is Op.RECOMPUTE else action.op
        return self.times[(op, action.unit)]

    def message_bytes(self, payload: Payload, unit: int, num_mbs: int = 1) -> float:
        if payload in (Payload.WEIGHT, Payload.WGRAD):
            return self.weight_bytes[unit]
        return self.act_bytes[unit] * num_mbs

    def memory(self, kind: str, unit: int) -> float:
        if kind in ("weight", "wgrad"):
            return self.weight_bytes[unit]
        if kind in ("act", "grad"):
            return self.act_bytes[unit]
        return 1.0 if kind == "stash" else 0.5


def _best(setup, op, reps: int) -> float:
    """Fastest of ``reps`` timings of ``op()`` (after an untimed ``setup()``): the least
    disturbed by other load on the machine."""
    best = float("inf")
    for _ in range(reps):
        setup()
        _sync()
        t0 = time.perf_counter()
        op()
        _sync()
        best = min(best, time.perf_counter() - t0)
    return best


def _sync() -> None:
    """Waits for queued GPU work (a no-op without CUDA), so a timing covers the kernels, not their launch."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def profile_units(units: Sequence[nn.Module], x: torch.Tensor, y: torch.Tensor, reps: int = 5,
                  meta: Any = None) -> ProfiledCost:
    """F, B, D and W of every unit on one micro-batch (x, y), each timed on its own, run as a
    program with ``meta`` runs them (its loss in backward: C(L)'s head timed in B and D)."""
    from ..exec.unit import unit_runner
    times: dict[tuple[Op, int], float] = {}
    act_bytes, weight_bytes = [], []
    h = x
    last = len(units) - 1
    for u, mod in enumerate(units):
        runner = unit_runner(mod, u, len(units), meta or {})
        tgt = y if u == last else None
        out = runner.forward(0, h, tgt)
        runner.clear()
        grad = None if u == last else (tuple(torch.ones_like(t) for t in out) if isinstance(out, tuple)
                                       else torch.ones_like(out))

        def fwd() -> None:
            runner.forward(0, h, tgt)

        times[(Op.F, u)] = _best(runner.clear, fwd, reps)
        runner.clear()
        times[(Op.B, u)] = _best(lambda: (runner.clear(), fwd()), lambda: runner.backward(0, grad), reps)
        times[(Op.D, u)] = _best(lambda: (runner.clear(), fwd()), lambda: runner.backward_input(0, grad), reps)
        times[(Op.W, u)] = _best(lambda: (runner.clear(), fwd(), runner.backward_input(0, grad)),
                                 lambda: runner.backward_weight(0), reps)
        runner.clear()
        for p in mod.parameters():
            p.grad = None
        weight_bytes.append(sum(p.numel() * p.element_size() for p in mod.parameters()))
        flat = out if isinstance(out, tuple) else (out,)
        act_bytes.append(sum(t.numel() * t.element_size() for t in flat) if u < last else 0)
        h = out
    return ProfiledCost(times, act_bytes, weight_bytes)


@dataclass
class RealEmulation:
    """Measured step time of the real units against the simulator's prediction (seconds)."""

    schedule: Program
    """The program that ran (and was simulated)."""
    step_seconds: float
    predicted: float
    steps: int
    predicted_shared: float  # the ranks sharing this process's device
    capacity: float  # computes the device runs at full speed at once

    @property
    def error(self) -> float:
        return (self.step_seconds - self.predicted) / self.predicted

    @property
    def error_shared(self) -> float:
        return (self.step_seconds - self.predicted_shared) / self.predicted_shared


def device_capacity(device: torch.device) -> float:
    """Computes of concurrent ranks that ``device`` runs at full speed: 1 on a GPU (the ranks'
    kernels share it), the logical CPUs (one intra-op thread per rank) on a CPU."""
    return 1.0 if device.type == "cuda" else float(os.cpu_count() or 1)



def emulate_real(schedule: Program | Schedule, units: Sequence[nn.Module], x: torch.Tensor, y: torch.Tensor,
                 links: Any = None, steps: int = 5) -> RealEmulation:
    """Run ``steps`` training steps of the real units with every message delayed by ``links``
    (pipert.cost Links in seconds); median step time beside the simulated one. A Schedule is
    compiled first (``pipert.compile``): the simulator times the program that runs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one intra-op thread: ranks are threads sharing the cores
    try:
        return _emulate_real(schedule, units, x, y, links, steps)
    finally:
        torch.set_num_threads(threads)


def _emulate_real(schedule: Program | Schedule, units: Sequence[nn.Module], x: torch.Tensor, y: torch.Tensor,
                  links: Any, steps: int) -> RealEmulation:
    from ..compiler import compile
    from ..pipeline import Pipeline, split_microbatches
    from .emulator import scaled_link_emulator
    # what is simulated below is what runs
    program = schedule if isinstance(schedule, Program) else compile(schedule, units=units)
    M = program.num_microbatches
    xs, ys = split_microbatches(x, M), split_microbatches(y, M)
    import copy
    cost = profile_units([copy.deepcopy(u) for u in units], xs[0], ys[0], meta=program.meta)
    predicted = simulate(program, cost, links=links).makespan
    capacity = device_capacity(x.device)
    shared = shared_step(program, cost, links, [0] * program.num_ranks, [capacity])
    em = scaled_link_emulator(links, program.num_ranks, 1.0)
    pipe = Pipeline(units, program, optimizer=lambda ps: torch.optim.SGD(ps, lr=1e-3), links=em)
    pipe.step(x, y)  # warm-up
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        pipe.step(x, y)
        times.append(time.perf_counter() - t0)
    return RealEmulation(program, statistics.median(times), predicted, steps, shared, capacity)
