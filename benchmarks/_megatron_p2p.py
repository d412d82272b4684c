"""1F1B as Megatron-LM runs it: every stage-boundary transfer blocks the next compute.

Megatron-LM's non-interleaved 1F1B (``forward_backward_pipelining_without_interleaving`` in
megatron/core/pipeline_parallel/schedules.py) exchanges activations and gradients through
``P2PCommunicator.send_forward_recv_backward``, ``send_backward_recv_forward``, ``recv_forward``,
``send_forward``, ... (megatron/core/pipeline_parallel/p2p_communication.py). Each of them calls
``_communicate`` with its default ``wait_on_reqs=True``, which waits on every request of the
batch before returning, so the next forward or backward starts only after the call's sends and
receives completed; and a receive is posted only in the call just before its consumer, so a
transfer starts when both stages have reached their matching call (NCCL's send completes when
its receive runs).

:func:`blocking_p2p` writes that into a schedule with the IR's own ops, for the simulator to
time: each RECV moves to just before its consumer (``receives_at_consumer``), and each run of
consecutive SEND/RECV actions (one Megatron call) is followed by a WAIT on each of them.
The zero-bubble runtime (sail-sg/zero-bubble-pipeline-parallelism,
megatron/core/pipeline_parallel/zerobubble/runtime.py) does not block: ``flush`` posts its sends
and drops their handles, and ``schedule_f_impl``/``schedule_b_impl`` wait on a receive only at
its consumer, which is how pipert's schedules run.
"""
from __future__ import annotations

import dataclasses

from pipert.ir import Op
from pipert.ir.passes import receives_at_consumer
from pipert.ir.schedule import Schedule

__all__ = ["blocking_p2p"]


def blocking_p2p(schedule: Schedule) -> Schedule:
    """``schedule`` with receives at their consumers and each run of SEND/RECV awaited (WAIT on
    each) before the rank's next compute: Megatron-LM's blocking exchange (module doc)."""
    placed = receives_at_consumer(schedule)
    out = []
    for acts in placed.actions:
        new, run = [], []
        for a in acts:
            if a.op in (Op.SEND, Op.RECV):
                run.append(a)
            else:
                new += [dataclasses.replace(c, op=Op.WAIT, waits=c.op) for c in run]
                run = []
            new.append(a)
        new += [dataclasses.replace(c, op=Op.WAIT, waits=c.op) for c in run]
        out.append(new)
    return placed.with_actions(out)
