"""Data parallelism over any pipeline schedule: D replicas of a P-rank program.

``replicate(schedule, dp, zero)`` turns a schedule of P ranks and M/D micro-batches into one of
P*D ranks and M micro-batches: replica d is ranks ``d*P .. d*P+P-1`` and runs micro-batches
``d, d+D, d+2D, ...`` (its j-th is the base schedule's micro-batch j). Each unit's weights are
held by its owner in every replica (``Placement.replicas``); the replicas combine their weight
gradients right before each ``OPT u`` over the unit's replica group:

- ZeRO 0: ``ALLREDUCE wgrad u``;
- ZeRO 1/2: ``REDUCESCATTER wgrad u``, ``OPT u`` on the shard, ``ALLGATHER weight u``;
- ZeRO 3: also ``ALLGATHER weight u`` before the unit's first compute of the step and
  ``FREE weight u`` after its last, so only the shard is kept between steps.

A unit may instead get one stage per parameter (``zero[u]`` a tuple, with ``zero_numel[u]`` the
parameters' element counts): each stage present is a ZeRO class of the unit, and every collective
and FREE above acts on one class (``z3``), following that class's stage; ``OPT u`` steps them all.

``zero3_buffers=2`` keeps the gathered ZeRO-3 weights for forward and for backward computes apart
(``Placement.zero3_buffers``): the ``fwd`` copy is gathered before a rank's first F of the unit and
freed after its last, the ``bwd`` copy gathered before its first B, D or RECOMPUTE and freed after
its last backward compute (W included: its saved tensors refer to the parameters).

Where the collectives go is a *replication policy* (:data:`POLICIES`): ``at-opt`` (above, the
default) or one a family registers for its schedules (:func:`register_policy`): ``pipemesh``
registers ``pipemesh-overlap`` (``pipert.schedules.pipemesh.overlap_collectives``): ZeRO-3 gathers
and frees around every run of a chunk, ZeRO-2/3 reduce-scatters after every backward run
(accumulated on the shard), all of them bucketed one per pass beside the passes they overlap; the
optimizer steps at the end, and the ZeRO-1/2 weights are gathered at the start of the next step,
before each chunk's first run.

A base schedule's own collectives (TawPipe's BROADCAST and REDUCE over a node) are copied into
each replica like its P2P: member r of a group becomes ``r + d*P`` (:func:`relabel`), so replica d
runs them among its own ranks; a ZeRO-3 owner gathers its weights before the first action that
reads them whole (a compute, a SEND, the root of a BROADCAST: ``sends_payload``).

Program ranks are replica-major: rank = d*P + stage. Which process runs each of them is
``pipert.comm.mesh.ProcessLayout``'s (``--mesh-order``; by default the global rank equals the
program rank without TP, as ``init_device_mesh(..., (D, P), mesh_dim_names=("dp", "pp"))`` numbers it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..ir import Action, Op, Payload, Placement, Schedule
from ..ir.semantics import COMM_OPS, HOST_OPS, TABLE, WEIGHT_READERS, sends_payload

__all__ = ["replicate", "replica_groups", "relabel", "WEIGHT_READERS", "Replication", "ReplicaProgram", "POLICIES",
           "register_policy", "policy_for"]


@dataclass(frozen=True)
class Replication:
    """What a replication policy needs to write one replica's program of one base rank."""

    base: Schedule
    """The schedule of one replica (P ranks, M/D micro-batches)."""
    dp: int
    """Replicas."""
    parts: list
    """Per unit, its ZeRO parts as (class, stage) (``Placement.zero_parts``)."""
    groups: list
    """Per unit, the ranks of the P*D layout that hold its weights."""
    split: bool
    """Whether gathered ZeRO-3 weights of forward and backward computes are kept apart."""


ReplicaProgram = Callable[[Replication, int, int], list]
"""A replication policy: ``(replication, base rank r, replica d) -> replica d's program of rank r``."""

POLICIES: dict[str, ReplicaProgram] = {}
"""Replication policies by name (:func:`register_policy`)."""

_FAMILY_POLICY: dict[str, str] = {}


def register_policy(name: str, program: ReplicaProgram, families: tuple[str, ...] = ()) -> None:
    """Add policy ``name``; it becomes the default (``policy="auto"``) of the schedules of ``families``."""
    POLICIES[name] = program
    for f in families:
        _FAMILY_POLICY[f] = name


def policy_for(base: Schedule, policy: str = "auto") -> str:
    """The policy replicating ``base``: ``policy``, or with "auto" the one its family registered
    (``at-opt`` when none)."""
    name = _FAMILY_POLICY.get(base.meta.get("family"), "at-opt") if policy == "auto" else policy
    if name not in POLICIES:
        raise ValueError(f"replication policy {policy!r} unknown; allowed: auto, {', '.join(POLICIES)}")
    return name


def replica_groups(base: Schedule, dp: int) -> list[tuple[int, ...]]:
    """Per unit, the ranks of the P*D layout that hold its weights."""
    P = base.num_ranks
    return [tuple(base.placement.weight_owner[u] + d * P for d in range(dp)) for u in range(base.num_units)]


def replicate(base: Schedule, dp: int, zero: int | list = 0, zero_numel: list | None = None,
              zero3_buffers: int = 1, policy: str = "auto") -> Schedule:
    """The data-parallel schedule of ``base`` (see the module doc). ``zero``: one ZeRO stage for
    every unit, or per unit either a stage or a tuple of stages per parameter; ``zero_numel``: per
    unit the parameters' element counts, needed for units with per-parameter stages (None for the
    others); ``zero3_buffers``: 1 or 2 gathered copies of ZeRO-3 weights (module doc); ``policy``:
    where the collectives go (:data:`POLICIES`; auto: :func:`policy_for`)."""
    program = POLICIES[policy_for(base, policy)]
    if dp < 1:
        raise ValueError(f"dp must be >= 1, got {dp}")
    if base.placement.replicas is not None:
        raise ValueError(f"schedule {base.name!r} is already data-parallel")
    P, U, M = base.num_ranks, base.num_units, base.num_microbatches
    zeros = [zero] * U if isinstance(zero, int) else list(zero)
    if len(zeros) != U or any(not isinstance(z, (tuple, list)) and z not in (0, 1, 2, 3) for z in zeros):
        raise ValueError(f"zero must be 0..3, once or per unit ({U} units; a unit's entry may be a tuple of "
                         f"stages per parameter); got {zero!r}")
    groups = replica_groups(base, dp)
    ranks = tuple(tuple(base.placement.rank(u, m // dp) + (m % dp) * P for m in range(M * dp)) for u in range(U))
    placement = Placement("table", ranks, base.placement.weight_owner, tuple(groups), tuple(zeros), zero_numel,
                          zero3_buffers)
    parts = [placement.zero_parts(u) for u in range(U)]
    split = zero3_buffers == 2
    moved = sorted({a.unit for _, _, a in base if a.op in COMM_OPS and (placement.mixed(a.unit) or split)
                    and a.payload in (Payload.WEIGHT, Payload.WGRAD)})
    if moved:
        raise ValueError(f"schedule {base.name!r} moves the weights or gradients of unit(s) {moved} between ranks; "
                         f"ZeRO stages per parameter and separate ZeRO-3 buffers need a schedule that passes "
                         f"activations only (one stage per unit is allowed)")
    offloaded = sorted({a.unit for _, _, a in base if a.op in HOST_OPS
                        and a.payload is Payload.WEIGHT and (placement.mixed(a.unit) or split)})
    if offloaded:
        raise ValueError(f"schedule {base.name!r} already offloads the weights of unit(s) {offloaded}, which "
                         f"ZeRO stages per parameter (or separate ZeRO-3 buffers) split into classes: replicate "
                         f"first, then apply offload_weights (it moves a mixed unit class by class)")
    if base.meta.get("update_every"):
        raise ValueError(f"schedule {base.name!r} steps the optimizer several times per batch; data "
                         f"parallelism over it is not supported")
    rep = Replication(base, dp, parts, groups, split)
    actions = [program(rep, r, d) for d in range(dp) for r in range(P)]
    meta = dict(base.meta, dp=dp, zero=[list(z) if isinstance(z, (tuple, list)) else z for z in zeros], pp_stages=P)
    return Schedule(f"{base.name}-dp{dp}" + (f"-zero{zero}" if isinstance(zero, int) and zero else ""),
                    P * dp, U, M * dp, placement, actions, meta)


def at_opt(rep: Replication, r: int, d: int) -> list[Action]:
    """Replica d's copy of base rank r with the collectives at each ``OPT`` (module doc)."""
    base, split, parts, groups = rep.base, rep.split, rep.parts, rep.groups
    first_use: dict[tuple, int] = {}
    last_use: dict[tuple, int] = {}
    for i, a in enumerate(base.actions[r]):
        if a.unit is not None and (a.op in WEIGHT_READERS or a.payload is Payload.WEIGHT and sends_payload(a, r)):
            key = (a.unit, _side(a) if split else None)
            if not (split and a.op is Op.W):  # a W needs the backward copy present, never gathers it
                first_use.setdefault(key, i)
            last_use[key] = i
    prog = []
    for i, a in enumerate(base.actions[r]):
        a = relabel(a, d, rep.dp, base.num_ranks)
        u = a.unit
        if a.op is Op.OPT:
            for uu in ([u] if u is not None else base.units_owned(r)):
                prog += _reduce_then_step(uu, groups[uu], parts[uu])
            continue
        owner = u is not None and base.placement.weight_owner[u] == r
        z3 = [zc for zc, z in parts[u] if z == 3] if owner else []
        side = _side(a) if split and z3 else None
        if z3 and first_use.get((u, side)) == i:
            prog += [Action(Op.ALLGATHER, unit=u, payload=Payload.WEIGHT, group=groups[u], zclass=zc,
                            side=side) for zc in z3]
        prog.append(a)
        if z3 and last_use.get((u, side)) == i:
            prog += [Action(Op.FREE, unit=u, payload=Payload.WEIGHT, zclass=zc, side=side) for zc in z3]
    return prog


def _side(a: Action) -> str | None:
    """The gathered copy of ZeRO-3 weights a compute reads (pipert.ir.semantics)."""
    return TABLE[a.op].side


def relabel(a: Action, d: int, dp: int, P: int) -> Action:
    """Replica d's copy of a base action: its micro-batches and peers."""
    import dataclasses
    kw = {}
    if a.mb:
        kw["mb"] = tuple(j * dp + d for j in a.mb)
    if a.peer is not None:
        kw["peer"] = a.peer + d * P
    if a.group:
        kw["group"] = tuple(g + d * P for g in a.group)
    if a.root is not None:
        kw["root"] = a.root + d * P
    return dataclasses.replace(a, **kw) if kw else a


def _reduce_then_step(u: int, group: tuple[int, ...], parts: list[tuple[int | None, int]]) -> list[Action]:
    out = [Action(Op.ALLREDUCE if z == 0 else Op.REDUCESCATTER, unit=u, payload=Payload.WGRAD, group=group,
                  zclass=zc) for zc, z in parts]
    out.append(Action(Op.OPT, unit=u))
    return out + [Action(Op.ALLGATHER, unit=u, payload=Payload.WEIGHT, group=group, zclass=zc)
                  for zc, z in parts if z in (1, 2)]


register_policy("at-opt", at_opt)
