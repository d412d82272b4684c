"""ProfiledCost: a cost model from measurements of the real units (``pipert.tools.profile``).

Times are seconds per unit and micro-batch: a fold of k micro-batches takes k times as long; a
sub-block ``sI/N`` takes its own measured time where the profile has one (key :func:`piece_key`),
else 1/N of its op (``compute_time`` prices pieces itself: ``pipert.ir.semantics.action_time``).
Sizes are bytes per micro-batch, measured as the executor
accounts memory (docs/semantics.md, "Memory"). OPT takes its unit's "OPT" time where the profile
has one (measured in a step: ``pipert.tools.fidelity``), else ``t_opt`` seconds.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..ir.action import Action, Op, Payload
from ..ir.semantics import UNIT_COMPUTE_OPS

__all__ = ["ProfiledCost", "piece_key"]

_TIMED = {op: op.value for op in UNIT_COMPUTE_OPS}   # the profile's key of each unit compute


def piece_key(op: str, piece: tuple[int, int]) -> str:
    """The profile's key of sub-block ``piece = (j, n)`` of compute ``op`` ("W s1/4")."""
    return f"{op} s{piece[0]}/{piece[1]}"


class ProfiledCost:
    """Cost model of measured unit profiles (objects with ``times`` and ``sizes`` dicts)."""

    def __init__(self, profiles: Sequence[Any], t_opt: float = 0.0) -> None:
        if not profiles:
            raise ValueError("ProfiledCost needs one profile per unit, got none")
        self.profiles = list(profiles)
        self.t_opt = t_opt

    def compute_time(self, action: Action, rank: int) -> float:
        if action.op is Op.OPT:
            own = self.profiles[action.unit].times.get("OPT") if action.unit is not None else None
            return self.t_opt if own is None else own
        key = _TIMED.get(action.op)
        if key is None:
            return 0.0
        times = self.profiles[action.unit].times
        if action.sub is None:
            return times[key]
        own = times.get(piece_key(key, action.sub))
        return times[key] / action.sub[1] if own is None else own

    compute_time.prices_pieces = True  # type: ignore[attr-defined]  # read by action_time

    def message_bytes(self, payload: Payload, unit: int, num_mbs: int = 1) -> float:
        sizes = self.profiles[unit].sizes
        if payload is Payload.ACT or payload is Payload.GRAD:
            return float(sizes["act"] * num_mbs)
        return float(sizes["weight"])

    def memory(self, kind: str, unit: int) -> float:
        try:
            return float(self.profiles[unit].sizes[kind])
        except KeyError:
            raise ValueError(f"unknown memory kind {kind!r}; allowed: {', '.join(self.profiles[unit].sizes)}") from None
