"""Tensor (and sequence) parallelism inside a unit, as Megatron-LM runs it: which collectives each
piece of a transformer runs over its T-way group, their bytes, their time on the node's link.

A rank of the program is a TP group of T devices of one node (global rank = program rank x T +
t, TP innermost); the validator and the simulator see one rank, whose computes take the sharded
compute time plus these collectives (they are on the critical path of the compute: Megatron
waits for each one before the next GEMM).

Per decoder layer and micro-batch (Korthikanti et al. 2022, "Reducing Activation Recomputation
in Large Transformer Models", section 4.2), every collective over a buffer of ``b*s*h``
elements (the whole tensor; each rank holds ``1/T`` of it under SP):

- TP only: forward 2 all-reduces (after the attention out-projection and after the MLP's down
  projection: the ``g`` operator), backward 2 all-reduces (the ``f`` operator before the QKV
  projection and before the MLP's first GEMM);
- TP + SP: forward 2 all-gathers (before QKV and before the MLP) and 2 reduce-scatters (after
  the out-projection and after the down projection); backward the conjugates, 2 reduce-scatters
  and 2 all-gathers.

Pieces (``pipert.cost.transformer``): ``qkv`` (and ``pre_attn``) holds the first ``f``/``g``
pair, ``post_attn`` the out-projection's and the MLP's; ``attn`` and ``norm1`` none. The
vocabulary-parallel embedding reduces its output (all-reduce, or reduce-scatter under SP;
backward: the all-gather's conjugate under SP); the vocabulary-parallel head gathers its input
under SP (backward: reduce-scatter, or all-reduce without SP) and its cross-entropy runs 3
all-reduces of ``b*s`` fp32 numbers (max, target logit, sum of exponentials).

Phases: ``F`` (also a RECOMPUTE, and the forward a D reruns under recomputation), ``D`` (the
input-gradient pass, also in B), ``W`` (a weight-gradient pass split from its D). Under SP a
column-parallel linear (QKV, the MLP's first GEMM, the LM head) keeps only its sequence shard
and needs the whole sequence for its weight gradient: a full backward (B) gathers it again while
the input-gradient GEMM runs (Megatron's asynchronous all-gather, hidden: not priced), a split W
gathers it again first and waits for it (the Zero Bubble code that HelixPipe's paper runs as
ZB1P, sail-sg/zero-bubble-pipeline-parallelism@93af65c, ``execute_w_pass``: all-gather, wait,
GEMM): one all-gather of ``b*s*h`` per column-parallel linear. Without SP, W runs none.

Ring times (``pipert.cost.topology.Links.collective``): all-reduce ``2(T-1)/T * bytes / bw``,
all-gather and reduce-scatter ``(T-1)/T * bytes / bw`` (plus ``2(T-1)`` or ``T-1`` link
latencies), ``bytes`` the whole buffer.
"""
from __future__ import annotations

from typing import Any

from .topology import Links, LinkSpec, Topology, default_link_specs

__all__ = ["PHASES", "piece_collectives", "layer_collectives", "collectives_time", "tp_problem", "tp_divisors",
           "CE_REDUCTIONS"]

PHASES = ("F", "D", "W")
CE_REDUCTIONS = 3
"""All-reduces of the vocabulary-parallel cross-entropy (max, target logit, sum of exponentials)."""
_FP32 = 4

Collective = tuple[str, float]
"""(op, bytes of the whole buffer): op one of allreduce, allgather, reducescatter."""


def piece_collectives(piece: str, model: Any, sp: bool) -> dict[str, list[Collective]]:
    """The collectives one micro-batch of ``piece`` runs over its TP group, per phase (F, D, W).
    ``model``: a ``ModelSpec``. Without TP (T = 1) a caller prices them at 0."""
    th = float(model.tokens * model.hidden * model.dtype_bytes)
    ar, ag, rs = ("allreduce", th), ("allgather", th), ("reducescatter", th)
    regather = [ag] if sp else []                 # a split W's gather of a column-parallel input
    if piece in ("qkv", "pre_attn"):              # f before the QKV projection (g under SP)
        return {"F": [ag] if sp else [], "D": [rs] if sp else [ar], "W": regather}
    if piece == "post_attn":                      # g after out-proj; f before the MLP; g after it
        return {"F": [rs, ag, rs] if sp else [ar, ar], "D": [ag, rs, ag] if sp else [ar], "W": regather}
    if piece == "embed":                          # vocabulary-parallel lookup, partial sums reduced
        return {"F": [rs] if sp else [ar], "D": [ag] if sp else [], "W": []}
    if piece == "head":                           # f (g under SP) before the LM head; cross-entropy
        ce = [("allreduce", float(model.tokens * _FP32))] * CE_REDUCTIONS
        return {"F": ([ag] if sp else []) + ce, "D": [rs] if sp else [ar], "W": regather}
    return {"F": [], "D": [], "W": []}            # norm1, attn: nothing crosses the group


def layer_collectives(model: Any, sp: bool, parallel: bool = False) -> dict[str, list[Collective]]:
    """One decoder layer's collectives per phase (``pre_attn`` + ``post_attn``); ``model``: anything
    with ``tokens``, ``hidden`` and ``dtype_bytes``. ``parallel``: attention and MLP read one
    input and their outputs are summed (Falcon's parallel blocks), so one gather (or ``f``) and
    one reduction per layer serve both: half of the collectives."""
    pre, post = piece_collectives("pre_attn", model, sp), piece_collectives("post_attn", model, sp)
    out = {ph: pre[ph] + post[ph] for ph in PHASES}
    return {ph: c[: len(c) // 2] for ph, c in out.items()} if parallel else out


def collectives_time(collectives: list[Collective], tp: int, link: LinkSpec | None = None) -> float:
    """Seconds of ``collectives`` run one after another by a ring of ``tp`` devices joined by
    ``link`` (default: the preset intra-node link)."""
    if tp <= 1 or not collectives:
        return 0.0
    spec = link if link is not None else default_link_specs()["intra_node"]
    ring = Links(Topology(tp), {"intra_node": spec})
    group = tuple(range(tp))
    return sum(ring.collective(op, group, nbytes) for op, nbytes in collectives)


def _sizes(model: Any, sp: bool) -> dict[str, int]:
    """What T must divide: heads and KV heads (attention is split by heads), the MLP width, the
    vocabulary (embedding and head split by rows), and the sequence under SP."""
    out = {"heads": model.heads, "kv_heads": model.kv_heads, "ffn": model.ffn, "vocab": model.vocab}
    if sp:
        out["seq"] = model.seq
    return out


def tp_divisors(model: Any, sp: bool, limit: int | None = None) -> list[int]:
    """Every T (up to ``limit``) that divides all of :func:`_sizes`."""
    sizes = _sizes(model, sp)
    top = min(sizes.values()) if limit is None else min(limit, *sizes.values())
    return [t for t in range(1, top + 1) if all(v % t == 0 for v in sizes.values())]


def tp_problem(model: Any, tp: int, sp: bool) -> str | None:
    """Why ``tp`` cannot shard ``model`` (None: it can): the first size it does not divide."""
    for name, v in _sizes(model, sp).items():
        if v % tp:
            why = " (sequence parallelism splits the sequence)" if name == "seq" else ""
            return f"T={tp} does not divide the model's {name}={v}{why}"
    return None
