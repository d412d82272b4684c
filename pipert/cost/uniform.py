"""UniformCost: every unit costs the same; times in the user's unit, sizes in abstract units."""
from __future__ import annotations

from dataclasses import dataclass

from ..ir.action import Action, Op, Payload

__all__ = ["UniformCost"]

# identity checks on enum members are much cheaper than hashing them
_F, _RC, _B, _D, _W, _OPT = Op.F, Op.RECOMPUTE, Op.B, Op.D, Op.W, Op.OPT


@dataclass
class UniformCost:
    """Same compute time and sizes for every unit and rank (the CLI's uniform mode).

    Give ``tb`` (then ``td = tw = tb / 2`` unless given), or ``td`` and ``tw`` (then
    ``tb = td + tw``); with none of them ``tb = 2 * tf``. Times are per micro-batch of a whole compute (folds
    and sub-blocks: ``pipert.ir.semantics.action_time``).
    """

    tf: float = 1.0
    """Forward time of one unit for one micro-batch (also RECOMPUTE)."""
    tb: float | None = None
    """Full backward time (input grad + weight grad)."""
    td: float | None = None
    """Input-grad-only backward time (zero-bubble D)."""
    tw: float | None = None
    """Weight-grad-only backward time (zero-bubble W)."""
    t_opt: float = 0.0
    """Optimizer step time of one OPT action."""
    w_fraction: float = 0.5
    """Fraction of a stash still held after D, until W frees it."""
    act_bytes: float = 1.0
    """Size of one activation or activation-gradient message per micro-batch (and of its buffer)."""
    weight_bytes: float = 1.0
    """Size of one unit's weights or weight gradient."""
    stash: float = 1.0
    """Memory one F holds for its backward (one unit, one micro-batch)."""

    def __post_init__(self) -> None:
        if self.tb is None:
            if self.td is None or self.tw is None:
                if self.td is None and self.tw is None:
                    self.tb = 2.0 * self.tf
                else:
                    raise ValueError("give --tb, or both --td and --tw")
            else:
                self.tb = self.td + self.tw
        if self.td is None and self.tw is None:
            self.td = self.tw = self.tb / 2
        elif self.td is None:
            self.td = self.tb - self.tw
        elif self.tw is None:
            self.tw = self.tb - self.td
        if not self.tf > 0:
            raise ValueError(f"--tf must be > 0, got {self.tf}")
        for name in ("tb", "td", "tw", "t_opt", "act_bytes", "weight_bytes"):
            v = getattr(self, name)
            if v < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {v}")
        if not 0 <= self.w_fraction <= 1:
            raise ValueError(f"--w-fraction must be in [0, 1], got {self.w_fraction}")
        self._mem = {"stash": self.stash, "stash_w": self.w_fraction * self.stash, "act": self.act_bytes, "grad": self.act_bytes,
                     "weight": self.weight_bytes, "wgrad": self.weight_bytes}

    def scaled(self, k: float) -> "UniformCost":
        """The same model cut into units ``k`` times as large: times, stash and weights
        scale by ``k``; boundary activations keep their size."""
        return UniformCost(tf=self.tf * k, tb=self.tb * k, td=self.td * k, tw=self.tw * k, t_opt=self.t_opt * k,
                           w_fraction=self.w_fraction, act_bytes=self.act_bytes,
                           weight_bytes=self.weight_bytes * k, stash=self.stash * k)

    def compute_time(self, action: Action, rank: int) -> float:
        """Duration of one micro-batch of a whole compute; 0 for memory and communication actions."""
        op = action.op
        if op is _F or op is _RC:
            return self.tf
        if op is _B:
            return self.tb
        if op is _D:
            return self.td
        if op is _W:
            return self.tw
        if op is _OPT:
            return self.t_opt
        return 0.0

    def op_times(self) -> dict[Op, float]:
        """``compute_time`` of each unit compute op: it depends on the op alone (not the unit, rank or
        micro-batch), so a caller may read this table instead of calling it."""
        return {op: self.compute_time(Action(op, 0, (0,)), 0) for op in (_F, _RC, _B, _D, _W)}

    def message_bytes(self, payload: Payload, unit: int, num_mbs: int = 1) -> float:
        if payload is Payload.ACT or payload is Payload.GRAD:
            return self.act_bytes * num_mbs
        return self.weight_bytes

    def memory(self, kind: str, unit: int) -> float:
        try:
            return self._mem[kind]
        except KeyError:
            raise ValueError(f"unknown memory kind {kind!r}; allowed: {', '.join(self._mem)}") from None
