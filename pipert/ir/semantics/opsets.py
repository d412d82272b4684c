"""Sets of ops, each derived from the op table (:data:`.table.TABLE`): the one place that says
which ops are computes, messages, collectives, which read weights, and so on."""
from __future__ import annotations

from ..ops import Op
from .table import TABLE, Queue, Value

__all__ = ["UNIT_COMPUTE_OPS", "COMPUTE_OPS", "P2P_OPS", "COLLECTIVE_OPS", "COMM_OPS", "MEMORY_OPS", "ROOTED_OPS",
           "BACKWARD_OPS", "STASH_READERS", "WEIGHT_READERS", "BWD_COPY_READERS", "LOCAL_WGRAD_OPS",
           "BOUNDARY_OPS", "GRAD_WRITERS", "SIDED_OPS", "DROPPING_OPS", "HOST_OPS", "PIECEWISE_OPS", "TIMED_OPS"]


def _ops(test) -> frozenset[Op]:
    return frozenset(op for op, spec in TABLE.items() if test(spec))


def _reads(spec, *kinds: Value) -> bool:
    return any(r.value in kinds for r in spec.reads)


def _writes(spec, *kinds: Value) -> bool:
    return any(r.value in kinds for r in spec.writes)


UNIT_COMPUTE_OPS = _ops(lambda s: s.queue is Queue.COMPUTE and s.fields.needs == ("unit", "mb"))
"""F, B, D, W, RECOMPUTE: computes of a unit's micro-batches."""
COMPUTE_OPS = _ops(lambda s: s.queue is Queue.COMPUTE and s.timed and "payload" not in s.fields.needs)
"""The unit computes and OPT: the ops whose values are fixed by the op (no payload)."""
P2P_OPS = _ops(lambda s: s.queue in (Queue.SEND, Queue.RECV))
COLLECTIVE_OPS = _ops(lambda s: s.queue is Queue.GROUP)
COMM_OPS = P2P_OPS | COLLECTIVE_OPS
MEMORY_OPS = _ops(lambda s: s.queue is Queue.COMPUTE and "payload" in s.fields.needs and "waits" not in s.fields.needs)
"""FREE, OFFLOAD, PREFETCH."""
ROOTED_OPS = _ops(lambda s: "root" in s.fields.needs)
"""BROADCAST, REDUCE."""
STASH_READERS = _ops(lambda s: _reads(s, Value.STASH))
"""B, D: the backward that consumes a forward's stash (the first backward of a (unit, micro-batch))."""
BACKWARD_OPS = _ops(lambda s: _reads(s, Value.STASH, Value.STASH_W))
"""B, D, W."""
WEIGHT_READERS = UNIT_COMPUTE_OPS & _ops(lambda s: _reads(s, Value.WEIGHT))
"""Computes that read a unit's weights (W: only gathered ZeRO-3 weights)."""
BWD_COPY_READERS = _ops(lambda s: s.side == "bwd")
"""Computes that read the ``bwd`` copy of gathered ZeRO-3 weights when copies are kept apart."""
LOCAL_WGRAD_OPS = UNIT_COMPUTE_OPS & _ops(lambda s: _writes(s, Value.WGRAD))
"""B, W: computes that add a micro-batch's contribution to the rank's weight gradient."""
BOUNDARY_OPS = UNIT_COMPUTE_OPS & _ops(lambda s: _writes(s, Value.ACT, Value.GRAD))
"""F, B, D: computes that read and write the values crossing unit boundaries."""
GRAD_WRITERS = _ops(lambda s: s.queue is Queue.COMPUTE and _writes(s, Value.GRAD))
"""B, D: computes that write the gradient of their input."""
SIDED_OPS = _ops(lambda s: "side" in s.fields.allows)
"""ALLGATHER, FREE: the ops that may name a gathered copy of ZeRO-3 weights."""
DROPPING_OPS = MEMORY_OPS & _ops(lambda s: any(r.release and not r.host for r in s.reads))
"""FREE, OFFLOAD: memory ops that take the value off the device."""
HOST_OPS = _ops(lambda s: any(r.host for r in s.reads + s.writes))
"""OFFLOAD, PREFETCH: memory ops that move a value to host memory or back."""
PIECEWISE_OPS = _ops(lambda s: s.pieces)
"""W: computes whose sub-blocks the executor runs as pieces."""
TIMED_OPS = _ops(lambda s: s.timed)
