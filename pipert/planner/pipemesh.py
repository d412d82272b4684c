"""PipeMesh's cost and memory model (Li et al., TPDS 2025, section IV-A) and its per-q choices
(section IV-B): enqueue/dequeue sequences, mixed ZeRO sharding (cases A and B), Eqs. 1-5.

Times may be in any unit (seconds, ms) as long as all of them share it; sizes are bytes and
parameter counts. Per chunk and per micro-batch unless named otherwise; ``B`` is the number
of micro-batches of one pipeline per iteration (the paper's B; Table IV's batch / D).

Decisions the paper leaves open (docs/pipemesh.md):
- sequences are split into near-equal parts with the larger parts last; a q whose sequence
  would hold an element < P is not offered;
- ZeRO-3 is enabled when M > 4, the paper's rule (section IV-A), with psi_p the largest share
  that leaves D_p^bwd = 0; by M_p's formula it saves parameter memory only when
  ``2/D + 8/M < 2`` (M > 4D/(D-1)), so for 4 < M <= 4D/(D-1) the paper's rule spends memory
  for the overlap (``zero3_saves_memory`` says which);
- times used to size windows exclude recomputation (the recomputation is chosen later), so the
  exposed DP time is an upper bound once recomputation lengthens the passes.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["Components", "Sharding", "QueuePlan", "split_even", "enqueue_sequence", "live_passes",
           "exposed_dp", "queue_plan", "megatron_plan", "breadth_first_plan", "state_memory",
           "activation_memory", "iteration_time", "ZERO1", "ZERO3_MIN_CHUNKS", "zero3_enabled",
           "zero3_saves_memory"]


def _pos_int(name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
        raise ValueError(f"{name}={v!r}: must be a positive integer")


def _nonneg(name: str, v: Any) -> None:
    if isinstance(v, bool) or not isinstance(v, numbers.Real) or not v >= 0 or math.isinf(v):
        raise ValueError(f"{name}={v!r}: must be a finite number >= 0")


@dataclass(frozen=True)
class Components:
    """What the cost model reads: the mesh shape and per-chunk component times."""

    stages: int
    """P: pipeline stages."""
    dp: int
    """D: data-parallel replicas of each stage."""
    chunks: int
    """M: model chunks per stage."""
    microbatches: int
    """B: micro-batches of one pipeline per iteration (>= P)."""
    fwd: float
    """C_comp^fwd: one chunk's forward pass on one micro-batch, without recomputation."""
    bwd: float
    """C_comp^bwd: one chunk's backward pass on one micro-batch, without recomputation."""
    dp_comm: float
    """C_DP: reduce-scatter of all of one chunk's gradients (or all-gather of its parameters)."""
    pp_comm: float = 0.0
    """C_PP: receiving one pass's input from the neighbouring stage."""
    params: float = 0.0
    """psi: parameters held by one device (all its chunks, unsharded count)."""

    def __post_init__(self) -> None:
        for n in ("stages", "dp", "chunks", "microbatches"):
            _pos_int(n, getattr(self, n))
        for n in ("fwd", "bwd", "dp_comm", "pp_comm", "params"):
            _nonneg(n, getattr(self, n))
        if self.microbatches < self.stages:
            raise ValueError(f"microbatches={self.microbatches}: PipeMesh needs B >= P={self.stages} "
                             f"micro-batches per pipeline")

    @property
    def comp(self) -> float:
        """C_comp = C^fwd + C^bwd."""
        return self.fwd + self.bwd


@dataclass(frozen=True)
class Sharding:
    """Per-parameter ZeRO stages of one device and the bucket counts that hide their traffic."""

    zero_grad: float
    """psi_g: parameters whose gradients are sharded (ZeRO-2 and ZeRO-3)."""
    zero_param: float
    """psi_p: parameters that are themselves sharded (ZeRO-3); <= zero_grad."""
    bz2: int = 0
    """B_Z2: backward passes one chunk's gradient reduce-scatter overlaps."""
    bz3_fwd: int = 0
    """B_Z3^fwd: forward passes one chunk's ZeRO-3 all-gather overlaps."""
    bz3_bwd: int = 0
    """B_Z3^bwd: backward passes one chunk's ZeRO-3 all-gather overlaps."""


ZERO1 = Sharding(0.0, 0.0)


@dataclass(frozen=True)
class QueuePlan:
    """One elastic schedule: sequences, sharding and the exposed DP time of Eqs. 2-5."""

    q: int
    """Buffer queue size e_1."""
    enqueue: tuple[int, ...]
    """(e_1, ..., e_R), summing to B."""
    dequeue: tuple[int, ...]
    """(d_1, ..., d_S), summing to B."""
    case: str
    """"A" (every gradient sharded), "B" (ZeRO-1/2 mix), or "fixed" (given sharding)."""
    sharding: Sharding
    exposed: dict[str, float]
    """D_o, D_g, D_p_fwd, D_p_bwd (Eqs. 2-5)."""

    @property
    def dp_crit(self) -> float:
        """T_DP^crit: the sum of Eqs. 2-5."""
        return sum(self.exposed.values())

    def as_dict(self) -> dict[str, Any]:
        return {"q": self.q, "enqueue": list(self.enqueue), "dequeue": list(self.dequeue), "case": self.case,
                "sharding": asdict(self.sharding), "exposed": dict(self.exposed), "dp_crit": self.dp_crit}


def _h(c: float, window: float) -> float:
    """H(C, C') = max(0, C - C'): communication left after overlapping with C' of compute."""
    return max(0.0, c - window)


def split_even(total: int, parts: int) -> tuple[int, ...]:
    """``total`` in ``parts`` near-equal positive integers, the larger ones last."""
    _pos_int("parts", parts)
    if total < parts:
        raise ValueError(f"cannot split {total} micro-batches into {parts} non-empty groups")
    base, extra = divmod(total, parts)
    return tuple(base + (1 if k >= parts - extra else 0) for k in range(parts))


def enqueue_sequence(B: int, q: int, P: int) -> tuple[int, ...]:
    """e_1 = q; the other B - q micro-batches evenly over ceil((B - q)/q) enqueues. Every element
    must be >= P (the warm-up of Algorithm 1 assumes it)."""
    if not P <= q <= B:
        raise ValueError(f"q={q}: the buffer queue size must be in [P, B] = [{P}, {B}]")
    rest = B - q
    seq = (q,) + (split_even(rest, -(-rest // q)) if rest else ())
    if min(seq) < P:
        raise ValueError(f"q={q}: enqueue sequence {seq} has a group smaller than P={P}")
    return seq


def live_passes(e1: int, M: int, P: int, B: int, stage: int = 1) -> int:
    """Forward passes stage ``stage`` (1-indexed) holds before its first backward:
    e_1(M-1) + 2(P-i) + 1 (Algorithm 1's warm-up plus the first 1F1B forward), at most all
    M B of them (the same count as ``pipert.schedules.pipemesh.peak_live_passes``)."""
    if not 1 <= stage <= P:
        raise ValueError(f"stage={stage}: allowed 1..{P} (1-indexed)")
    return min(e1 * (M - 1) + 2 * (P - stage) + 1, M * B)


def exposed_dp(c: Components, enqueue: tuple[int, ...], dequeue: tuple[int, ...], sh: Sharding) -> dict[str, float]:
    """Eqs. 2-5 for the given sequences and sharding. ZeRO-2/3 traffic scales with the sharded
    share of the parameters: C^g_DP = C_DP psi_g/psi, C^p_DP = C_DP psi_p/psi."""
    R, S, M = len(enqueue), len(dequeue), c.chunks
    frac_g = sh.zero_grad / c.params if c.params else 0.0
    frac_p = sh.zero_param / c.params if c.params else 0.0
    cg, cp = c.dp_comm * frac_g, c.dp_comm * frac_p
    d_o = 2 * c.dp_comm + (M - 1) * (_h(c.dp_comm, enqueue[0] * c.fwd) + _h(c.dp_comm, dequeue[-1] * c.bwd))
    d_g = (S - 1) * M * _h(cg, sh.bz2 * c.bwd) if cg else 0.0
    d_pf = (R - 1) * M * _h(cp, sh.bz3_fwd * c.fwd) if cp else 0.0
    d_pb = (S * M - 1) * _h(cp, sh.bz3_bwd * c.bwd) if cp else 0.0
    return {"D_o": d_o, "D_g": d_g, "D_p_fwd": d_pf, "D_p_bwd": d_pb}


ZERO3_MIN_CHUNKS = 5
"""The paper enables ZeRO-3 only when M > 4 (section IV-A: "M_p is no smaller than 2 psi when M <= 4")."""


def zero3_enabled(c: Components) -> bool:
    """The paper's rule: ZeRO-3 parameters only with M > 4 chunks per stage."""
    return c.chunks >= ZERO3_MIN_CHUNKS


def zero3_saves_memory(c: Components) -> bool:
    """M_p per ZeRO-3 parameter is 2/D + 8/M bytes against 2 for ZeRO-1/2: less only when
    M > 4D/(D-1) (the paper's M > 4 is the D -> infinity limit)."""
    return 2 / c.dp + 8 / c.chunks < 2


def queue_plan(c: Components, q: int, dequeue: tuple[int, ...] | None = None) -> QueuePlan:
    """Sequences and sharding for buffer size ``q`` (section IV-B, cases A and B); ``dequeue``
    replaces the case's dequeue sequence (same length as the enqueue one)."""
    B, P, M = c.microbatches, c.stages, c.chunks
    e = enqueue_sequence(B, q, P)
    S = len(e)
    if dequeue is not None and (len(dequeue) != S or sum(dequeue) != B or min(dequeue) < P):
        raise ValueError(f"dequeue={dequeue}: needs {S} groups of >= P={P} micro-batches summing to B={B}")
    psi = c.params
    if B * c.bwd >= S * c.dp_comm:                      # case A: every gradient sharded
        d = dequeue or split_even(B, S)
        bz2 = min(d[0], math.ceil(c.dp_comm / c.bwd)) if c.bwd else d[0]
        bz3_bwd = min(d) - bz2
        psi_p = 0.0
        if zero3_enabled(c) and bz3_bwd > 0 and c.dp_comm > 0:
            psi_p = psi * min(1.0, bz3_bwd * c.bwd / c.dp_comm)
        elif zero3_enabled(c) and c.dp_comm == 0:
            psi_p = psi
        cp = c.dp_comm * (psi_p / psi) if psi else 0.0
        fwd_window = min(e[1:]) if S > 1 else e[0]
        bz3_fwd = min(fwd_window, math.ceil(cp / c.fwd)) if c.fwd and cp else 0
        return QueuePlan(q, e, d, "A", Sharding(psi, psi_p, bz2, bz3_fwd, max(bz3_bwd, 0)),
                         exposed_dp(c, e, d, Sharding(psi, psi_p, bz2, bz3_fwd, max(bz3_bwd, 0))))
    # case B: no ZeRO-3; d_S just hides C_DP, the rest evenly; ZeRO-2 while D_g = 0
    d_s = max(P, math.ceil(c.dp_comm / c.bwd)) if c.bwd else B
    d_s = min(d_s, B - (S - 1) * P)
    d = dequeue or (split_even(B - d_s, S - 1) if S > 1 else ()) + (d_s,)
    bz2 = min(d[:-1]) if S > 1 else 0
    psi_g = psi if S == 1 else psi * min(1.0, bz2 * c.bwd / c.dp_comm)
    sh = Sharding(psi_g, 0.0, bz2, 0, 0)
    return QueuePlan(q, e, d, "B", sh, exposed_dp(c, e, d, sh))


def megatron_plan(c: Components) -> QueuePlan:
    """Megatron's interleaved 1F1B as an elastic schedule: e = d = (P, P, ...), ZeRO-1 only.
    Needs B divisible by P (as Megatron does)."""
    if c.microbatches % c.stages:
        raise ValueError(f"microbatches={c.microbatches}: Megatron's interleaved schedule needs a "
                         f"multiple of P={c.stages}")
    seq = (c.stages,) * (c.microbatches // c.stages)
    return QueuePlan(c.stages, seq, seq, "fixed", ZERO1, exposed_dp(c, seq, seq, ZERO1))


def breadth_first_plan(c: Components) -> QueuePlan:
    """Breadth-first: one group of all B micro-batches (q = B), sharding by the same cases."""
    return queue_plan(c, c.microbatches)


def state_memory(c: Components, sh: Sharding) -> dict[str, float]:
    """Bytes of optimizer states, gradients and parameters on a device (mixed precision, Adam):
    M_o = 12 psi/D; M_g = 2(psi - psi_g) + (2/D + 4/M) psi_g; M_p = 2(psi - psi_p) + (2/D + 8/M) psi_p."""
    psi, D, M = c.params, c.dp, c.chunks
    return {"optimizer": 12 * psi / D,
            "gradients": 2 * (psi - sh.zero_grad) + (2 / D + 4 / M) * sh.zero_grad,
            "parameters": 2 * (psi - sh.zero_param) + (2 / D + 8 / M) * sh.zero_param}


def activation_memory(c: Components, e1: int, per_pass: float, stage: int = 1) -> float:
    """M_a: live passes of ``stage`` times the bytes one pass stores."""
    return live_passes(e1, c.chunks, c.stages, c.microbatches, stage) * per_pass


def iteration_time(c: Components, dp_crit: float, recompute: float = 0.0) -> dict[str, float]:
    """Eq. 1 with C_comp = C^fwd + C^bwd + ``recompute`` (per chunk and micro-batch):
    T_comp = M B C_comp, T_bubble = (P-1) C_comp, T_PP = 2(P-1) C_PP."""
    comp = c.comp + recompute
    parts = {"compute": c.chunks * c.microbatches * comp, "bubble": (c.stages - 1) * comp,
             "pp_crit": 2 * (c.stages - 1) * c.pp_comm, "dp_crit": dp_crit}
    parts["total"] = sum(parts.values())
    return parts
