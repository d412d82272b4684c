"""torch.distributed.pipelining's action format, read into pipert's IR and written from it.

torch names an action ``{stage}{type}{micro-batch}`` (``0F1``, ``3I0``, ``2W1``, ``1SEND_F0``);
a stage is a pipert unit. The types map as follows (torch's ``_ComputationType``):

=============  ===========================================================================
``F``          ``F u m``
``B``          ``B u m`` (full backward)
``I``          ``D u m`` (input-gradient backward)
``W``          ``W u m``
``SEND_F``     ``SEND act u m ->rank(u+1)``
``RECV_F``     ``RECV act u-1 m <-rank(u-1)`` (the input of stage u)
``SEND_B``     ``SEND grad u-1 m ->rank(u-1)`` (the gradient of stage u's input)
``RECV_B``     ``RECV grad u m <-rank(u+1)``
=============  ===========================================================================

``REDUCE_GRAD`` (no micro-batch) ends a stage's gradient: torch's runtime scales the stage's
gradients by 1/M there (and reduces them over data-parallel replicas); it must follow the
stage's last backward (its M-th B or W) on the stage's rank, once. pipert finishes gradients
implicitly before ``OPT``, so :func:`from_torch` checks and drops it, and :func:`to_torch` with
``comms`` writes it after each stage's last backward and the sends right after it, as torch's
own lowering does. ``UNSHARD`` and ``RESHARD`` are FSDP hooks with no meaning for unsharded
stages; :func:`from_torch` rejects them unless ``fsdp="drop"``. Torch's bubbles (``None``
entries, empty CSV cells) are skipped.

Which rank runs a stage is read from the orders themselves (the rank whose list holds the
stage's computes). Compute-only orders are lowered by :func:`pipert.ir.lowering.lower`; orders
with communication keep torch's send and receive positions. ``OPT`` steps are appended on
each unit's rank after its last compute.

Orders with communication are what ``_PipelineScheduleRuntime._load_csv(path,
format="compute_comms")`` runs as written. Its receives block (``_simulate_comms_compute``
models each RECV as waiting for its SEND; NCCL completes one pair's operations in posting
order), so :func:`to_torch` refuses a program whose receives stall under that rule
(:func:`pipert.ir.torch_receives.torch_stalls`);
:func:`pipert.ir.torch_receives.receives_for_torch` places receives where it does not.
"""
from __future__ import annotations

import csv
import io
import re
from typing import Iterable

from .action import Action, Op, Payload, ScheduleFormatError
from .lowering import add_optimizer_steps, lower
from .schedule import Placement, Schedule
from .semantics import LOCAL_WGRAD_OPS, P2P_OPS

__all__ = ["parse_torch_action", "from_torch", "to_torch", "torch_text", "read_torch_csv", "write_torch_csv"]

_RE = re.compile(r"^(\d+)(F|I|B|W|UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)(\d*)$")
_COMPUTE = {"F": Op.F, "B": Op.B, "I": Op.D, "W": Op.W}
_COMM = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
_FSDP = ("UNSHARD", "RESHARD")
_HOOKS = _FSDP + ("REDUCE_GRAD",)   # the types without a micro-batch
_BACKWARD_DONE = ("B", "W")           # the types whose M-th of a stage completes its gradient
_TO_TORCH = {Op.F: "F", Op.B: "B", Op.D: "I", Op.W: "W"}

TorchAction = tuple[int, str, "int | None"]
"""(stage, type, micro-batch) as torch writes them."""


def parse_torch_action(text: str) -> TorchAction:
    """``"3I0"`` -> ``(3, "I", 0)``; raises ScheduleFormatError naming the text otherwise."""
    m = _RE.match(text.strip())
    if not m:
        raise ScheduleFormatError(f"torch action {text!r} not understood; expected STAGE TYPE MICROBATCH with "
                                  f"TYPE one of F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B, UNSHARD, RESHARD, "
                                  f"REDUCE_GRAD (e.g. '0F1', '2SEND_B3')")
    stage, kind, mb = m.groups()
    if kind not in _HOOKS and not mb:
        raise ScheduleFormatError(f"torch action {text!r} needs a micro-batch index")
    return int(stage), kind, int(mb) if mb else None


def _parsed(orders: dict[int, list] | list[list]) -> list[list[TorchAction]]:
    rows = orders if isinstance(orders, list) else [orders[r] for r in range(len(orders))]
    if isinstance(orders, dict) and sorted(orders) != list(range(len(orders))):
        raise ScheduleFormatError(f"torch orders must have ranks 0..{len(orders) - 1}, got {sorted(orders)}")
    out = []
    for row in rows:
        acts = []
        for a in row:
            if a is None or (isinstance(a, str) and not a.strip()):
                continue
            acts.append(parse_torch_action(a if isinstance(a, str) else repr(a)))
        out.append(acts)
    return out


def from_torch(orders: dict[int, list] | list[list], name: str = "torch", fsdp: str = "reject",
               post_ahead: int = 1) -> Schedule:
    """A pipert Schedule from torch's per-rank orders (``schedule.pipeline_order`` or
    ``pipeline_order_with_comms``, as ``_Action`` objects or their strings).

    ``fsdp="drop"`` skips UNSHARD/RESHARD; REDUCE_GRAD is checked (module doc) and skipped;
    ``post_ahead`` is passed to :func:`lower` for compute-only orders.
    """
    if fsdp not in ("reject", "drop"):
        raise ValueError(f"fsdp {fsdp!r} unknown; allowed: 'reject', 'drop'")
    rows = _parsed(orders)
    P = len(rows)
    stage_rank: dict[int, int] = {}
    has_comm = False
    for r, acts in enumerate(rows):
        for stage, kind, mb in acts:
            if kind == "REDUCE_GRAD":
                continue
            if kind in _FSDP:
                if fsdp == "reject":
                    raise ScheduleFormatError(f"rank {r}: torch action {stage}{kind} is an FSDP hook; pipert "
                                              f"expresses sharding with ALLGATHER/REDUCESCATTER (pass fsdp='drop' "
                                              f"to import unsharded stages)")
                continue
            has_comm |= kind in _COMM
            if kind in _COMPUTE:
                if stage_rank.setdefault(stage, r) != r:
                    raise ScheduleFormatError(f"torch stage {stage} computes on ranks {stage_rank[stage]} and {r}; "
                                              f"a stage must run on one rank")
    U = len(stage_rank)
    if sorted(stage_rank) != list(range(U)):
        raise ScheduleFormatError(f"torch orders compute stages {sorted(stage_rank)}; expected 0..{U - 1}")
    M = _microbatch_count(rows)
    _check_reduce_grad(rows, stage_rank, M)
    placement = Placement.by_unit([stage_rank[u] for u in range(U)])
    if not has_comm:
        compute = [[Action(_COMPUTE[k], unit=s, mb=(m,)) for s, k, m in acts if k in _COMPUTE] for acts in rows]
        return lower(name, P, U, M, placement, add_optimizer_steps(compute, placement), post_ahead=post_ahead)
    programs = [[x for s, k, m in acts if k not in _HOOKS for x in [_action(s, k, m, stage_rank, U, r)]]
                for r, acts in enumerate(rows)]
    programs = add_optimizer_steps(programs, placement)
    return Schedule(name, P, U, M, placement, programs, {"source": "torch"})


def _microbatch_count(rows: list[list[TorchAction]]) -> int:
    """M: stage 0 forwards micro-batches 0..M-1, and so must every stage, once each (torch's own
    orders can break this: torch 2.13's ``Schedule1F1B.pipeline_order`` numbers the last rank's
    forwards 1..M)."""
    forwards: dict[int, list[int]] = {}
    for acts in rows:
        for stage, kind, mb in acts:
            if kind == "F":
                forwards.setdefault(stage, []).append(mb)
    M = len(forwards.get(0, ()))
    for stage in sorted(forwards):
        got = forwards[stage]
        if sorted(got) != list(range(M)):
            missing = sorted(set(range(M)) - set(got))
            extra = sorted({m for m in got if got.count(m) > 1 or m >= M})
            raise ScheduleFormatError(f"torch stage {stage} forwards micro-batches {_span(got)}; every stage must "
                                      f"forward 0..{M - 1} (as stage 0 does) once each: missing {missing}, "
                                      f"repeated or out of range {extra}")
    return M


def _check_reduce_grad(rows: list[list[TorchAction]], stage_rank: dict[int, int], M: int) -> None:
    """Each REDUCE_GRAD follows its stage's M-th backward (B or W) on the stage's rank, once."""
    reduced: set[int] = set()
    for r, acts in enumerate(rows):
        done: dict[int, int] = {}
        for stage, kind, _ in acts:
            if kind in _BACKWARD_DONE:
                done[stage] = done.get(stage, 0) + 1
            if kind != "REDUCE_GRAD":
                continue
            where = f"rank {r}: torch action {stage}REDUCE_GRAD"
            if stage_rank.get(stage) != r:
                on = f"rank {stage_rank[stage]}" if stage in stage_rank else "no rank"
                raise ScheduleFormatError(f"{where} names a stage this rank does not compute (stage {stage} "
                                          f"computes on {on})")
            if stage in reduced:
                raise ScheduleFormatError(f"{where} is the stage's second; torch's runtime scales its gradients once")
            if done.get(stage, 0) != M:
                raise ScheduleFormatError(f"{where} follows {done.get(stage, 0)} of the stage's {M} backwards "
                                          f"(B or W); it must follow the last, where the stage's gradient is "
                                          f"complete")
            reduced.add(stage)


def _span(mbs: list[int]) -> str:
    s = sorted(set(mbs))
    return f"{s[0]}..{s[-1]}" if s == list(range(s[0], s[-1] + 1)) else str(s)


def _action(stage: int, kind: str, mb: int, stage_rank: dict[int, int], U: int, rank: int) -> Action:
    if kind in _COMPUTE:
        return Action(_COMPUTE[kind], unit=stage, mb=(mb,))
    peer_stage = stage + 1 if kind in ("SEND_F", "RECV_B") else stage - 1
    if not 0 <= peer_stage < U:
        raise ScheduleFormatError(f"rank {rank}: torch action {stage}{kind}{mb} has no peer stage {peer_stage}")
    peer = stage_rank[peer_stage]
    if kind == "SEND_F":
        return Action(Op.SEND, unit=stage, mb=(mb,), payload=Payload.ACT, peer=peer)
    if kind == "RECV_F":
        return Action(Op.RECV, unit=stage - 1, mb=(mb,), payload=Payload.ACT, peer=peer)
    if kind == "SEND_B":
        return Action(Op.SEND, unit=stage - 1, mb=(mb,), payload=Payload.GRAD, peer=peer)
    return Action(Op.RECV, unit=stage, mb=(mb,), payload=Payload.GRAD, peer=peer)


def to_torch(schedule: Schedule, comms: bool = False, check: bool = True) -> list[list[str]]:
    """Per-rank torch action strings of ``schedule``: compute only, or (``comms``) torch's
    ``compute_comms`` form with its activation and gradient transfers where they stand and a
    REDUCE_GRAD per stage (module doc). Programs torch cannot express are rejected: folds,
    sub-blocks, weight payloads, RECOMPUTE, collectives and memory ops (OPT and WAIT, implicit
    in torch's runtime, are left out); with ``comms`` and ``check``, also programs whose
    receives stall torch's runtime (:func:`pipert.ir.torch_receives.torch_stalls`)."""
    M = schedule.num_microbatches
    out = []
    for r, acts in enumerate(schedule.actions):
        row: list[str] = []
        backwards: dict[int, int] = {}
        complete: list[int] = []   # stages whose REDUCE_GRAD goes after the sends that follow
        for a in acts:
            if a.op in (Op.OPT, Op.WAIT):
                continue
            if complete and a.op is not Op.SEND:
                row.extend(f"{u}REDUCE_GRAD" for u in complete)
                complete = []
            text = torch_text(a, r, comms)
            if text:
                row.append(text)
            if comms and a.op in LOCAL_WGRAD_OPS:
                backwards[a.unit] = backwards.get(a.unit, 0) + 1
                if backwards[a.unit] == M:
                    complete.append(a.unit)
        row.extend(f"{u}REDUCE_GRAD" for u in complete)
        out.append(row)
    if comms and check:
        from .torch_receives import describe_stalls, torch_stalls
        stalled = torch_stalls(out)
        if stalled:
            raise ScheduleFormatError(f"{schedule.name}: torch's runtime would stall on these receives "
                                      f"({describe_stalls(stalled)}); a receive there waits for a send its peer "
                                      f"makes only later. pipert.ir.torch_receives.receives_for_torch (what pipert "
                                      f"export writes) moves such receives to their consumers")
    return out


def torch_text(a: Action, rank: int, comms: bool = True) -> str:
    """``a`` (an action of rank ``rank``) as torch writes it; "" for what torch's orders leave
    implicit (OPT, WAIT; transfers unless ``comms``). ScheduleFormatError naming the action if
    torch's format cannot hold it."""
    if a.op in (Op.OPT, Op.WAIT):
        return ""
    text = _torch_text(a, comms)
    if text is None:
        raise ScheduleFormatError(f"rank {rank}: action {a} has no torch equivalent; torch's format holds "
                                  f"F, B, I(=D), W of one micro-batch and activation/gradient SEND/RECV")
    return text


def _torch_text(a: Action, comms: bool) -> str | None:
    if len(a.mb) > 1 or a.sub is not None:
        return None
    if a.op in _TO_TORCH:
        return f"{a.unit}{_TO_TORCH[a.op]}{a.mb[0]}"
    if a.op in P2P_OPS and a.payload in (Payload.ACT, Payload.GRAD):
        if not comms:
            return ""
        m = a.mb[0]
        if a.payload is Payload.ACT:
            return f"{a.unit}SEND_F{m}" if a.op is Op.SEND else f"{a.unit + 1}RECV_F{m}"
        return f"{a.unit + 1}SEND_B{m}" if a.op is Op.SEND else f"{a.unit}RECV_B{m}"
    return None


def read_torch_csv(text: str) -> list[list[str]]:
    """Rows of torch's ``_dump_csv`` (one rank a row, empty cells for bubbles)."""
    return [[c for c in row] for row in csv.reader(io.StringIO(text)) if row]


def write_torch_csv(rows: Iterable[list[str]]) -> str:
    """Torch's CSV form of per-rank action strings."""
    buf = io.StringIO()
    csv.writer(buf).writerows(rows)
    return buf.getvalue()
