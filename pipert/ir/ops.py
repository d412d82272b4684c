"""The ops and payloads of the IR (their meaning: ``pipert.ir.semantics``)."""
from __future__ import annotations

from enum import Enum

__all__ = ["Op", "Payload"]


class Op(str, Enum):
    F = "F"                      # forward of one unit for one micro-batch (or a fold)
    B = "B"                      # full backward: input grad and weight grad
    D = "D"                      # input-grad only (zero-bubble "B" pass)
    W = "W"                      # weight-grad only; needs the D of the same (unit, mb) first
    OPT = "OPT"                  # optimizer step for one unit (or all units the rank owns)
    RECOMPUTE = "RECOMPUTE"      # forward again to rebuild what backward needs
    SEND = "SEND"
    RECV = "RECV"
    WAIT = "WAIT"                # completes an earlier SEND/RECV with the same fields
    ALLGATHER = "ALLGATHER"
    REDUCESCATTER = "REDUCESCATTER"
    ALLREDUCE = "ALLREDUCE"
    BROADCAST = "BROADCAST"
    REDUCE = "REDUCE"
    FREE = "FREE"
    OFFLOAD = "OFFLOAD"
    PREFETCH = "PREFETCH"

    def __str__(self) -> str:
        return self.value


class Payload(str, Enum):
    ACT = "act"        # output activation of a unit
    GRAD = "grad"      # gradient w.r.t. the output activation of a unit
    WEIGHT = "weight"  # the parameters of a unit
    WGRAD = "wgrad"    # an accumulated weight-gradient of a unit
    STASH = "stash"    # what backward of (unit, micro-batch) needs; only FREE/OFFLOAD/PREFETCH move it

    def __str__(self) -> str:
        return self.value
