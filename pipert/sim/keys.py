"""Constants and value keys shared by the engine's modules."""
from __future__ import annotations

__all__ = ["QUEUES", "vkey", "describe_key"]

COMPUTE_Q, SEND_Q, RECV_Q = 0, 1, 2
QUEUES = ("compute", "send", "recv")
K_COMPUTE, K_TRANSFER, K_COLLECTIVE = 0, 1, 2
MISSING = -2   # value absent
INITIAL = -1   # value present from the start (owned weights): no edge
# value kinds, the low 3 bits of a value key
_ACT, _STASH, _STASHW, _GRAD, _WEIGHT = 0, 1, 2, 3, 4
_KIND_NAMES = ("act", "stash", "stash_w", "grad", "weight")


def vkey(kind: int, unit: int, mb: int = 0) -> int:
    """Key of a value: kind in the low 3 bits, then the micro-batch (32 bits), then the unit."""
    return ((unit << 32 | mb) << 3) | kind


def describe_key(key: int) -> str:
    kind, um = key & 7, key >> 3
    u, m = um >> 32, um & 0xFFFFFFFF
    return f"weight u{u}" if kind == _WEIGHT else f"{_KIND_NAMES[kind]} u{u} m{m}"

