"""Profiling real units: the time of each op and the size of each value, per unit.

``profile_units`` runs every unit on one micro-batch, in chain order (each unit gets the real
output of the one before), and measures what the cost model's interface asks for
(``pipert.cost.base.CostModel``): seconds of F, B, D, W and RECOMPUTE, and bytes of the values
of docs/semantics.md, measured exactly as the executor accounts them (``Instrumentation(measure_memory=
True)``): a stash is what autograd saved for it plus the inputs its runner keeps.
``pipert.cost.profiled.ProfiledCost`` turns the result into a cost model for the simulator.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch
from torch import nn

from ..device.tensors import tensor_key
from ..exec.stash import StashLedger
from ..exec.unit import UnitRunner, unit_runner

__all__ = ["UnitProfile", "profile_units", "value_bytes"]


@dataclass
class UnitProfile:
    """Measured costs of one unit for one micro-batch."""

    times: dict[str, float] = field(default_factory=dict)
    """Seconds of "F", "B", "D", "W", "RECOMPUTE" (median of the repeats)."""
    sizes: dict[str, int] = field(default_factory=dict)
    """Bytes of "stash", "stash_w", "kept", "act", "grad", "weight", "wgrad"."""


def value_bytes(v: Any) -> int:
    """Bytes of a value (a tensor or a tuple of them), each distinct view once."""
    ts = v if isinstance(v, (tuple, list)) else (v,)
    return sum(k[3] for k in {tensor_key(t) for t in ts if isinstance(t, torch.Tensor)})


def _grads_like(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return torch.ones_like(v) if v.is_floating_point() else None
    return tuple(_grads_like(t) for t in v)


def _stash_bytes(ledger: StashLedger, runner: UnitRunner, u: int) -> int:
    inputs = runner.held_inputs().get(0, ())
    return sum(k[3] for k in ledger.keys(u, 0) | {tensor_key(t) for t in inputs})


def _timed(fn, repeats: int) -> tuple[float, Any]:
    out, best = None, []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best.append(time.perf_counter() - t0)
    best.sort()
    return best[len(best) // 2], out


def profile_units(units: Sequence[nn.Module], inputs: torch.Tensor, targets: torch.Tensor,
                  repeats: int = 1, meta: dict | None = None) -> list[UnitProfile]:
    """Profile every unit on micro-batch ``inputs``/``targets`` (see the module doc), each run as
    a program with ``meta`` runs it (``unit_runner``: its loss in backward, the last unit keeps
    what that runner keeps). Parameter gradients the backward passes accumulate are cleared again."""
    out: list[UnitProfile] = []
    x: Any = inputs
    last = len(units) - 1
    for u, module in enumerate(units):
        prof = UnitProfile()
        ledger = StashLedger(lambda m=module: list(m.parameters()) + list(m.buffers()))
        runner = unit_runner(module, u, len(units), meta or {})
        y = targets if u == last else None

        def forward(graph: bool = True):
            runner.clear()
            ledger.clear()
            with ledger.capture(u, 0):
                return runner.forward(0, x, y, keep_graph=graph) if u == last else \
                    runner.forward(0, x, keep_graph=graph)

        prof.times["F"], o = _timed(forward, repeats)
        prof.sizes["stash"] = _stash_bytes(ledger, runner, u)
        g = None if u == last else _grads_like(o)
        prof.sizes["act"] = prof.sizes["grad"] = 0 if u == last else value_bytes(o)

        def backward():
            forward()
            t0 = time.perf_counter()
            runner.backward(0, g)
            return time.perf_counter() - t0

        def split() -> tuple[float, float, int]:
            forward()
            t0 = time.perf_counter()
            runner.backward_input(0, g)
            t1 = time.perf_counter()
            kept = _stash_bytes(ledger, runner, u)
            runner.backward_weight(0)
            return t1 - t0, time.perf_counter() - t1, kept

        prof.times["B"] = sorted(backward() for _ in range(repeats))[repeats // 2]
        split()  # untimed: the executor's D finds its graph's analysis stored after a unit's first micro-batch
        runs = sorted(split() for _ in range(repeats))
        prof.times["D"], prof.times["W"], prof.sizes["stash_w"] = runs[repeats // 2]

        def rebuild():
            forward(graph=False)
            kept = _stash_bytes(ledger, runner, u)
            t0 = time.perf_counter()
            with ledger.capture(u, 0):
                runner.recompute(0)
            return time.perf_counter() - t0, kept

        prof.times["RECOMPUTE"], prof.sizes["kept"] = sorted(rebuild() for _ in range(repeats))[repeats // 2]
        runner.clear()
        params = list(module.parameters())
        prof.sizes["weight"] = prof.sizes["wgrad"] = sum(p.numel() * p.element_size() for p in params)
        for p in params:
            p.grad = None
        out.append(prof)
        x = o
    return out
