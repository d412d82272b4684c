"""The executor's collective and memory verbs (see executor.py and docs/semantics.md).

A collective is posted where it stands and completes where its result is first needed: for a
unit's weights or gradient through ``UnitState.expect`` (``ready``/``settle``), for an
activation or gradient value through the executor's pending table. Where the placement's
``collective_queue`` is the compute queue it completes at once. Which payloads each collective
carries is the op table's (``pipert.ir.semantics``; an Action checks it when it is made).
"""
from __future__ import annotations

from typing import Any

import torch

from ..errors import PipelineError
from ..ir import Action, Op, Payload
from ..ir.semantics import DROPPING_OPS, Value


__all__ = ["run_collective", "run_memory_op"]

_KIND = {Payload.ACT: Value.ACT, Payload.GRAD: Value.GRAD}


def run_collective(ex: Any, i: int, a: Action) -> None:
    if a.payload in (Payload.WEIGHT, Payload.WGRAD):
        _unit_collective(ex, i, a)
    else:
        _value_collective(ex, i, a)


def _post(ex: Any, i: int, a: Action, t: torch.Tensor, out: torch.Tensor | None = None):
    # the group in the action's order: transports key it sorted, emulated links price its ring
    handle = ex._post(lambda: ex.transport.collective(a.op.value, t, a.group, a.root, out=out), i, a)
    ex._count(f"{a.op.value.lower()}:{a.payload.value}", t)
    return handle


def _unit_collective(ex: Any, i: int, a: Action) -> None:
    st, u, zc, op, is_root = ex.state, a.unit, a.zclass, a.op, ex.rank == a.root
    wgrad = a.payload is Payload.WGRAD
    if op is Op.ALLGATHER:
        shard = st.shards[(u, zc)].detach()
        out = shard.new_empty(shard.numel() * len(st.group(u)))
        handle = _post(ex, i, a, shard, out)
        done = (lambda: st.bind(u, out, zc)) if a.side is None else (lambda: st.keep_copy(u, zc, a.side, out))
        buffer = out
    elif op is Op.REDUCESCATTER:
        full = st.padded_flat(u, a.payload, zc)
        out = st.shard_buffer(u, full, zc)
        handle = _post(ex, i, a, full, out)
        done = (lambda: st.add_shard_grad(u, out, zc)) if wgrad else (lambda: _bind_shard(st, (u, zc), out))
        buffer = None  # a shard: static model state
    else:
        if wgrad:
            t = st.take_wgrad(u, zc) if (op is not Op.BROADCAST or is_root) else st.new_flat(u, zc)
        else:
            t = st.flat(u, Payload.WEIGHT, zc) if (op is not Op.BROADCAST or is_root) else st.new_flat(u, zc)
        handle = _post(ex, i, a, t)
        writes = op is Op.ALLREDUCE or (op is Op.REDUCE and is_root) or (op is Op.BROADCAST and not is_root)
        if not writes:  # this member only gives: completed as it finishes, like a send
            with ex._sends_lock:
                ex.sends.append((handle, t, i, a))
            return
        buffer = t
        if wgrad:  # the local contributions left at the post: the result adds to what came since
            done = lambda: st.add_grads(u, t, accumulate=True, zc=zc)  # noqa: E731
        else:
            done = lambda: st.bind(u, t, zc)  # noqa: E731
    st.expect(u, handle, done, i, a, ex._complete, buffer)
    if ex.blocking_collectives:
        st.settle(u)


def _bind_shard(st, part: tuple, out: torch.Tensor) -> None:
    with torch.no_grad():
        st.shards[part].copy_(out)


def _value_collective(ex: Any, i: int, a: Action) -> None:
    """Collectives of activations or gradients, one per micro-batch value."""
    op, is_root = a.op, ex.rank == a.root
    kind = _KIND[a.payload]
    keys = [(kind, a.unit, m) for m in a.mb]
    if op is Op.BROADCAST and not is_root:
        t = ex._empty(keys)
    else:
        t = ex._payload_out(i, a, release=not (op is Op.BROADCAST and is_root))
    handle = _post(ex, i, a, t)
    if op is Op.ALLREDUCE or (op is Op.REDUCE and is_root) or (op is Op.BROADCAST and not is_root):
        for k in keys:
            ex.pending[k] = (handle, t, keys, i, a)
        if ex.blocking_collectives:
            ex._settle(keys[0])
    else:
        with ex._sends_lock:
            ex.sends.append((handle, t, i, a))


# --------------------------------------------------------------------------- memory ops
def run_memory_op(ex: Any, i: int, a: Action) -> None:
    st, op, u, pl, zc = ex.state, a.op, a.unit, a.payload, a.zclass
    if pl is Payload.STASH:
        for m in a.mb:
            # the stash is on the device from its F (or RECOMPUTE) to its first backward; PREFETCH
            # reads the host copy an OFFLOAD left (pipert.ir.semantics: STASH and its host copy)
            on_host = st.stash.is_offloaded(u, m)
            if on_host != (op is Op.PREFETCH) or not on_host and not ex.runners[u].has_stash(m):
                where = "in host memory" if op is Op.PREFETCH else "on the device"
                raise PipelineError(f"rank {ex.rank}: action {i} ({a}): no stash of unit {u} micro-batch {m} "
                                    f"{where} (was the schedule validated?)", ex.rank)
            if op is Op.FREE:
                ex.runners[u].drop(m)
                st.stash.drop(u, m)
            elif op is Op.OFFLOAD:
                st.offload_stash(u, m)
            else:
                st.prefetch_stash(u, m)
        return
    if pl is Payload.WEIGHT:
        if op is not Op.PREFETCH:
            st.settle_weights(u)
            if not st.has_weights(u, zc, a.side):
                raise PipelineError(f"rank {ex.rank}: action {i} ({a}): unit {u}'s weights are not on the device "
                                    f"(freed, offloaded, stale or never gathered; was the schedule validated?)", ex.rank)
        if op is Op.OFFLOAD:
            st.offload(("weight", u, zc), st.flat(u, Payload.WEIGHT, zc))
        if a.side is not None:
            st.free_copy(u, i, zc, a.side)
        elif op in DROPPING_OPS:
            st.free(u, i, zc)
        else:
            st.bind(u, st.restore(("weight", u, zc)), zc)
        return
    if pl is Payload.WGRAD:
        if op is Op.PREFETCH:
            st.add_grads(u, st.restore(("wgrad", u, zc)), accumulate=True, zc=zc)
            return
        t = st.take_wgrad(u, zc)
        if op is Op.OFFLOAD:
            st.offload(("wgrad", u, zc), t)
        return
    kind = _KIND[pl]
    for m in a.mb:
        key = (kind, u, m)
        if op is Op.PREFETCH:
            ex.values[key] = ex.boundary(u, m).unpack(st.restore(key))
            continue
        v = ex._take(key, i, a)
        if op is Op.OFFLOAD:
            st.offload(key, ex.boundary(u, m).pack(v))
