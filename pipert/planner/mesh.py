"""Tensor parallelism as a dimension of PipeMesh's plan: a mesh of T x P x D devices, TP innermost
(inside one node, with sequence parallelism), P and D as given. Every T that divides the GPUs per
node and the model's heads and KV heads (and, SP, its sequence) is planned; the plan of most
sequences per second per device (``B D / (T_iter T P D)``) among those that fit the budget wins.
A smaller T has less TP traffic but more parameters and activations per device, so the winner
is usually the smallest T that fits.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable

from .search import GiB, Plan, plan
from .workload import PAPER_MODELS, LayerShape

__all__ = ["Candidate", "tp_candidates", "best_tp", "format_candidates"]


@dataclass
class Candidate:
    """One T's outcome."""

    tp: int
    devices: int
    """T x P x D."""
    plan: Plan | None = None
    error: str = ""
    """Why this T has no plan (it does not fit the budget, ...)."""
    chosen: bool = False

    @property
    def per_device(self) -> float:
        """Sequences per second per device (0 without a plan)."""
        if self.plan is None:
            return 0.0
        c = self.plan.components
        return c.microbatches * c.dp / (self.plan.time["total"] * self.devices)

    def as_dict(self) -> dict[str, Any]:
        p = self.plan
        return {"tp": self.tp, "devices": self.devices, "chosen": self.chosen, "error": self.error,
                "t_iter": p.time["total"] if p else None, "memory": p.memory["total"] if p else None,
                "chunks": p.components.chunks if p else None, "per_device": self.per_device}


def tp_candidates(m: LayerShape, gpus_per_node: int) -> list[int]:
    """The divisors of ``gpus_per_node`` that divide ``m``'s heads, KV heads and sequence (SP)."""
    return [t for t in range(1, gpus_per_node + 1)
            if gpus_per_node % t == 0 and m.heads % t == 0 and m.kv_heads % t == 0 and m.seq % t == 0]


def best_tp(args: argparse.Namespace, build: Callable[..., tuple]) -> tuple[list[Candidate], tuple]:
    """(every T's candidate, the chosen one's ``build(args, T)`` result + its plan). ``build`` is
    ``pipert.planner.cli.build_problem``. Raises ValueError listing each T's reason when none fits."""
    name = args.model or "gpt3-58b"
    if name not in PAPER_MODELS:
        raise ValueError(f"--model {name!r} unknown with --pipemesh; allowed: {', '.join(PAPER_MODELS)}")
    gpn = args.ranks_per_node or 8
    stages, dp = args.stages or 0, args.dp or 3
    out: list[Candidate] = []
    problems: dict[int, tuple] = {}
    for t in tp_candidates(PAPER_MODELS[name], gpn):
        problem = build(args, t)
        c = problem[0]
        cand = Candidate(t, t * (stages or c.stages) * dp)
        try:
            cand.plan = plan(c, problem[2], problem[3], problem[1])
            problems[t] = problem
        except ValueError as e:
            cand.error = str(e)
        out.append(cand)
    fitting = [c for c in out if c.plan is not None]
    if not fitting:
        raise ValueError("no tensor-parallel size fits: " + "; ".join(f"T={c.tp}: {c.error}" for c in out))
    best = max(fitting, key=lambda c: (c.per_device, -c.tp))
    best.chosen = True
    return out, (*problems[best.tp], best.plan)


def format_candidates(cands: list[Candidate]) -> str:
    """A table of the T tried, the chosen one marked."""
    lines = [f"{'T':>3} {'devices':>8} {'M':>3} {'T_iter':>10} {'memory GiB':>11} {'seq/s/device':>13}"]
    for c in cands:
        mark = "  <- chosen" if c.chosen else ""
        if c.plan is None:
            lines.append(f"{c.tp:>3} {c.devices:>8}   -  does not fit: {c.error.split(' (')[0]}")
            continue
        lines.append(f"{c.tp:>3} {c.devices:>8} {c.plan.components.chunks:>3} {c.plan.time['total']:>10.5g} "
                     f"{c.plan.memory['total'] / GiB:>11.2f} {c.per_device:>13.5g}{mark}")
    return "\n".join(lines)
