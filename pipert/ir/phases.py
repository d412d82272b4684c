"""Parts of a program that a user's training loop runs one at a time.

- :func:`update_split`: where each rank's *update* begins: its first OPT. ``forward_backward``
  runs every rank's actions before it, ``optimizer_step`` the rest. A program splits there only
  if the update touches nothing but weights and their gradients: after the split a rank runs
  OPT, collectives and memory ops of weights or gradients, never a compute other than OPT, a
  point-to-point message or an activation, and the k-th collective of each group falls on the
  same side of the split on every member (so neither part waits on the other).
- :func:`forward_only`: the evaluation program of a training program whose units stay where
  they are (every compute of a unit on a rank that holds it) and whose weights are whole
  (ZeRO <= 2): its forwards, the activations they pass and the gathers of updated weights that
  precede them (ZeRO-1/2 shards gathered at the start of a step), nothing of the backward or the
  update.
"""
from __future__ import annotations

from .action import BACKWARD_OPS, COLLECTIVE_OPS, MEMORY_OPS, Action, Op, Payload
from .schedule import Schedule

__all__ = ["update_split", "forward_only", "forward_only_program", "SplitError"]

_UPDATE_PAYLOADS = frozenset({Payload.WEIGHT, Payload.WGRAD})


class SplitError(ValueError):
    """The program cannot be run in the parts asked for; the message says why."""


def update_split(schedule: Schedule) -> tuple[int, ...]:
    """Per rank, the index of its first OPT (the length of its list if it has none)."""
    starts = []
    for r, acts in enumerate(schedule.actions):
        start = next((i for i, a in enumerate(acts) if a.op is Op.OPT), len(acts))
        for i in range(start, len(acts)):
            a = acts[i]
            if not _update_action(a):
                raise SplitError(
                    f"schedule {schedule.name!r} cannot run its update apart from its forward and backward: rank {r} "
                    f"runs action {i} ({a}) after its first optimizer step (action {start}, {acts[start]}), and only "
                    f"OPT and collectives or memory ops of weights and gradients may follow it; use Pipeline.step, "
                    f"which runs the whole step with its optimizer inside")
        starts.append(start)
    _check_collectives(schedule, starts)
    return tuple(starts)


def _update_action(a: Action) -> bool:
    if a.op is Op.OPT:
        return True
    return (a.op in COLLECTIVE_OPS or a.op in MEMORY_OPS) and a.payload in _UPDATE_PAYLOADS


def _check_collectives(schedule: Schedule, starts: tuple[int, ...] | list[int]) -> None:
    """The k-th collective of a group is on the same side of the split on every member."""
    sides: dict[tuple, dict[int, list[tuple[bool, int]]]] = {}
    for r, acts in enumerate(schedule.actions):
        for i, a in enumerate(acts):
            if a.op in COLLECTIVE_OPS:
                sides.setdefault(tuple(sorted(a.group)), {}).setdefault(r, []).append((i >= starts[r], i))
    for group, by_rank in sides.items():
        ranks = sorted(by_rank)
        for k, (side, i) in enumerate(by_rank[ranks[0]]):
            for r in ranks[1:]:
                if k < len(by_rank[r]) and by_rank[r][k][0] != side:
                    j = by_rank[r][k][1]
                    raise SplitError(
                        f"schedule {schedule.name!r}: collective {k} of group {list(group)} is in the update on "
                        f"one rank and before it on another (rank {ranks[0]} action {i}, rank {r} action {j}); "
                        f"forward_backward would wait for optimizer_step")


def forward_only(schedule: Schedule) -> Schedule:
    """The evaluation program of ``schedule`` (module doc): every F with the activation messages
    between them, in the training program's order."""
    pl = schedule.placement
    for r, acts in enumerate(schedule.actions):
        for i, a in enumerate(acts):
            if a.op is Op.F and r not in pl.holders(a.unit):
                raise SplitError(
                    f"schedule {schedule.name!r} moves weights to the computes (rank {r} runs {a} without holding "
                    f"unit {a.unit}); evaluation runs where the weights are held, which this schedule does not do")
    sharded = [u for u in range(schedule.num_units) if any(z >= 3 for _, z in pl.zero_parts(u))]
    if sharded:
        raise SplitError(f"schedule {schedule.name!r} keeps the weights of units {sharded} sharded (ZeRO-3) and "
                         f"gathers them for each compute; evaluation runs on whole weights: use zero <= 2")
    actions = []
    for acts in schedule.actions:
        update = next((i for i, a in enumerate(acts) if a.op is Op.OPT), len(acts))
        actions.append([a for i, a in enumerate(acts) if _forward_action(a) or
                        i < update and a.op in COLLECTIVE_OPS and a.payload is Payload.WEIGHT])
    return Schedule(name=f"{schedule.name}-eval", num_ranks=schedule.num_ranks, num_units=schedule.num_units,
                    num_microbatches=schedule.num_microbatches, placement=pl, actions=actions,
                    meta=dict(schedule.meta))


def _forward_action(a: Action) -> bool:
    if a.op is Op.F:
        return True
    return a.op in (Op.SEND, Op.RECV, Op.WAIT) and a.payload is Payload.ACT


def forward_only_program(schedule: Schedule) -> bool:
    """Whether ``schedule`` is an evaluation program: no backward compute, no OPT or RECOMPUTE,
    nothing of a gradient."""
    return not any(a.op in BACKWARD_OPS or a.op is Op.OPT or a.op is Op.RECOMPUTE or
                   a.payload in (Payload.GRAD, Payload.WGRAD) for _, _, a in schedule)
