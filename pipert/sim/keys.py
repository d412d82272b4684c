"""Constants and packed value keys shared by the engine's modules.

A value key packs ``(kind, shard, unit, micro-batch)`` of pipert.ir.semantics into one int:
kind in the low 3 bits, the shard flag in bit 3, the host flag in bit 4, then the micro-batch
(32 bits), then the unit. Per-unit kinds (weights, weight gradients) use micro-batch 0 for the
whole unit and k+1 for ZeRO class k of a unit with several (pipert.ir.semantics, "ZeRO classes"),
plus BWD for the backward copy of gathered ZeRO-3 weights: the slots of ``pipert.ir.semantics.slot``.
"""
from __future__ import annotations

from ..ir.semantics import BWD, MEMORY_KIND, PER_UNIT, Value

__all__ = ["QUEUES", "vkey", "describe_key", "unpack_key", "BWD"]

COMPUTE_Q, SEND_Q, RECV_Q, GROUP_Q = 0, 1, 2, 3
QUEUES = ("compute", "send", "recv", "group")
K_COMPUTE, K_TRANSFER, K_COLLECTIVE = 0, 1, 2
MISSING = -2   # value absent
INITIAL = -1   # value present from the start (held weights): no edge
SHARD, HOST, SHIFT = 8, 16, 5


def vkey(kind: int, unit: int, mb: int = 0, shard: bool = False, host: bool = False) -> int:
    """Key of a value (see module doc)."""
    return ((unit << 32 | mb) << SHIFT) | kind | (SHARD if shard else 0) | (HOST if host else 0)


def unpack_key(key: int) -> tuple[Value, int, int, bool, bool]:
    """(kind, unit, micro-batch, shard, host) of a key."""
    um = key >> SHIFT
    return Value(key & 7), um >> 32, um & 0xFFFFFFFF, bool(key & SHARD), bool(key & HOST)


def describe_key(key: int) -> str:
    kind, u, m, shard, host = unpack_key(key)
    name = ("shard of " if shard else "") + MEMORY_KIND[kind] + (" (offloaded)" if host else "")
    if kind in PER_UNIT:  # the micro-batch slot of a per-unit value: 0 whole unit, k+1 ZeRO class k
        zc, bwd = m % BWD, m >= BWD
        return f"{name} u{u}" + (f" z{zc - 1}" if zc else "") + (" bwd" if bwd else "")
    return f"{name} u{u} m{m}"
