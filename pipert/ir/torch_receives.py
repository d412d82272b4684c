"""torch.distributed.pipelining's blocking receives: where its runtime stalls on a program in its
``compute_comms`` form, and where pipert's receives go so that it does not.

``_PipelineScheduleRuntime`` runs each rank's list in order; its dry run
``_simulate_comms_compute`` (torch 2.13) takes a rank's next action only when it is ready:

=====================  =====================================================================
``sRECV_Fm``           stage s-1's rank has done ``(s-1)SEND_Fm``
``sRECV_Bm``           stage s+1's rank has done ``(s+1)SEND_Bm``
``sSEND_Fm``           this rank has done ``sFm``
``sSEND_Bm``           this rank has done ``sIm`` or ``sBm``
``sFm`` (s > 0)        this rank has done ``sRECV_Fm`` or ``(s-1)Fm`` (both stages here)
``sIm``/``sBm``        s is the last stage, or this rank has done ``sRECV_Bm``, ``(s+1)Im`` or
                       ``(s+1)Bm``
``W``, hooks           always (``REDUCE_GRAD``, ``UNSHARD``, ``RESHARD`` act on this rank alone)
=====================  =====================================================================

A receive therefore blocks its rank until the peer has sent, as NCCL's in-order operations of
one pair of ranks make it do on GPUs. Readiness only grows as ranks advance, so the ranks that
can never finish are found by advancing every rank while it can, in any order; torch's lock-step
dry run reports "Schedule is not progressing" for exactly those programs. Torch's simulator has
no rule for the hooks (it raises on them); here they are ready, as the runtime runs them.
"""
from __future__ import annotations

from .action import Action, Op, ScheduleFormatError
from .passes import consumer_positions
from .schedule import Schedule
from .semantics import Semantics
from .torch_format import TorchAction, parse_torch_action, torch_text

__all__ = ["torch_stalls", "describe_stalls", "receives_for_torch"]


class _Ranks:
    """Every rank's torch actions (None: one torch does not hold, always ready) advanced under the
    rules of the module doc. ``orders[r][at[r]:]`` may be rearranged between two :meth:`advance`
    calls: what a rank has done stays done."""

    def __init__(self, orders: list[list[TorchAction | None]]) -> None:
        self.orders = orders
        self.stage_rank = {a[0]: r for r, acts in enumerate(orders) for a in acts if a is not None}
        self.last = max(self.stage_rank, default=0)
        self.done: list[set[TorchAction]] = [set() for _ in orders]
        self.at = [0] * len(orders)

    def _ready(self, r: int, action: TorchAction | None) -> bool:
        if action is None:
            return True
        stage, kind, mb = action
        here = self.done[r]
        if kind == "RECV_F":
            return (stage - 1, "SEND_F", mb) in self.done[self.stage_rank.get(stage - 1, r)]
        if kind == "RECV_B":
            return (stage + 1, "SEND_B", mb) in self.done[self.stage_rank.get(stage + 1, r)]
        if kind == "SEND_F":
            return (stage, "F", mb) in here
        if kind == "SEND_B":
            return (stage, "I", mb) in here or (stage, "B", mb) in here
        if kind == "F":
            return stage == 0 or (stage, "RECV_F", mb) in here or (stage - 1, "F", mb) in here
        if kind in ("I", "B"):
            return stage == self.last or any(a in here for a in ((stage, "RECV_B", mb), (stage + 1, "I", mb),
                                                                  (stage + 1, "B", mb)))
        return True

    def advance(self) -> dict[int, int]:
        """Advance every rank while it can; the ranks left short of their end -> where they stop."""
        moved = True
        while moved:
            moved = False
            for r, acts in enumerate(self.orders):
                while self.at[r] < len(acts) and self._ready(r, acts[self.at[r]]):
                    if acts[self.at[r]] is not None:
                        self.done[r].add(acts[self.at[r]])
                    self.at[r] += 1
                    moved = True
        return {r: self.at[r] for r, acts in enumerate(self.orders) if self.at[r] < len(acts)}


def torch_stalls(rows: list[list[str]]) -> dict[int, tuple[int, str]]:
    """Rank -> (position, action) where that rank stops for good under the rules of the module
    doc; empty when every rank runs to its end. ``rows``: one list of torch action strings per
    rank (empty strings are bubbles)."""
    ranks = _Ranks([[parse_torch_action(a) for a in row if a.strip()] for row in rows])
    return {r: (i, _text(ranks.orders[r][i])) for r, i in ranks.advance().items()}


def describe_stalls(stalled: dict[int, tuple[int, str]]) -> str:
    """``"rank 0 at action 5 (0RECV_B0), rank 1 at action 3 (1RECV_F1)"``."""
    return ", ".join(f"rank {r} at action {i} ({text})" for r, (i, text) in sorted(stalled.items()))


def receives_for_torch(schedule: Schedule) -> Schedule:
    """``schedule`` with each receive where the program posts it, except those torch's runtime
    would stall on: a stalled receive moves down to its consumer (where
    :func:`pipert.ir.passes.receives_at_consumer` puts it), together with the later receives of its
    link it would pass, until no rank stalls. Moving a rank's next receive changes nothing the
    rank has done, so one run of the ranks places every receive. ScheduleFormatError if ranks
    stall with their receives at their consumers (the compute order itself cannot run), or
    naming an action torch's format cannot hold."""
    programs = schedule.actions
    sem = Semantics.of(schedule)
    target = [consumer_positions(acts, sem, r) for r, acts in enumerate(programs)]
    key: list[list[float]] = [list(range(len(acts))) for acts in programs]
    order = [list(range(len(acts))) for acts in programs]   # indices into programs[r], as arranged now
    torch_of = [[_torch_action(a, r) for a in acts] for r, acts in enumerate(programs)]
    ranks = _Ranks([list(row) for row in torch_of])
    while stalled := ranks.advance():
        moved = False
        for r, at in stalled.items():
            i = order[r][at]
            if key[r][i] == target[r][i]:
                continue
            _to_consumer(programs[r], key[r], target[r], i)
            order[r][at:] = sorted(order[r][at:], key=lambda j: (key[r][j], j))
            ranks.orders[r][at:] = [torch_of[r][j] for j in order[r][at:]]
            moved = True
        if not moved:
            where = describe_stalls({r: (i, _text(ranks.orders[r][i])) for r, i in stalled.items()})
            raise ScheduleFormatError(f"{schedule.name}: torch's runtime stalls ({where}) even with every "
                                      f"receive right before its consumer")
    out = [[programs[r][i] for i in order[r]] for r in range(len(programs))]
    return schedule if out == programs else schedule.with_actions(out)


def _to_consumer(acts: list[Action], key: list[float], target: list[float], i: int) -> None:
    """RECV ``i`` takes its consumer position, and so does every later RECV of its link that would
    otherwise stand above it (consumer positions keep the link's order)."""
    key[i] = bound = target[i]
    peer = acts[i].peer
    for j in range(i + 1, len(acts)):
        if acts[j].op is Op.RECV and acts[j].peer == peer and key[j] < bound:
            key[j] = target[j]
            bound = max(bound, target[j])


def _torch_action(a: Action, rank: int) -> TorchAction | None:
    text = torch_text(a, rank)
    return parse_torch_action(text) if text else None


def _text(action: TorchAction | None) -> str:
    stage, kind, mb = action
    return f"{stage}{kind}{'' if mb is None else mb}"
