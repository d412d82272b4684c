"""``compile(schedule, ...) -> Program``: the one way from a schedule to what the ranks run.

One pipeline of passes, always in this order (each recorded in ``Program.passes``):

1. ``build:<name>`` — a named schedule is built by its family's generator
   (``pipert.schedules.build_schedule``) for one replica's share of the micro-batches. A family's
   own lowering is the last step of its generator: ``assemble``/``lower`` place the transfers that
   the placement implies and post receives (``post_ahead``), CrossPipe places them by its model
   (``lower_crosspipe``), WeiPipe and TawPipe route weights through their ring (``lower_ring``);
   a Schedule given instead of a name arrives lowered.
2. the schedule passes named in ``passes``, in the given order (``pipert.ir.passes.PASSES``:
   receive posting ``post_receives_early``/``receives_at_consumer``, ``send_early``,
   ``expand_folds``, ``recompute``, ``offload_stashes``, ``offload_weights``, ``merge_sub_blocks``);
3. ``replicate:<policy>`` — with ``dp > 1``, data-parallel replication with DP/ZeRO collectives
   placed by a registered replication policy (``pipert.schedules.data_parallel.POLICIES``: the
   family's own, e.g. PipeMesh's overlap, unless ``replication`` names one);
4. ``merge_sub_blocks`` — the executor runs a piece ``sI/N`` of F, B, D or RECOMPUTE as the whole
   compute at its last piece (W keeps its pieces);
5. validation of exactly that schedule under ``rules`` (gloo's, or NCCL's: ``pipert.comm.nccl``),
   then freezing it into a Program whose ``validated`` digest is that schedule's.

The Program is what every consumer takes: ``validate``/``simulate``/``emulate`` (which also take a
Schedule when planning) and ``Pipeline`` / ``RankExecutor`` (which refuse a Program that is not
what the validator accepted).
"""
from __future__ import annotations

from typing import Any, Sequence

from .ir.passes import apply_passes, merge_sub_blocks
from .ir.program import RULES, CompileOptions, Program, schedule_digest
from .ir.schedule import Schedule
from .schedules import build_schedule
from .sim import validate

__all__ = ["compile", "STAGES"]

STAGES = ("build", "passes", "replicate", "merge_sub_blocks", "validate")
"""The compile pipeline's stages, in order (module doc)."""


def compile(schedule: Schedule | str, *, stages: int | None = None, microbatches: int | None = None,  # noqa: A001
            chunks: int | None = None, schedule_options: dict | None = None, passes: Sequence[str] = (),
            dp: int = 1, zero: Any = 0, zero3_buffers: int = 1, replication: str = "auto",
            rules: str = "gloo", units: Sequence[Any] | None = None, check: bool = True) -> Program:
    """Compile ``schedule`` (a Schedule of one replica, or a registered name) into a Program.

    ``stages``/``microbatches``/``chunks``/``schedule_options`` shape a named schedule
    (``microbatches`` counts every replica's micro-batches; given with a Schedule they must match
    it). ``passes``: schedule passes by name, applied in order. ``dp``: data-parallel replicas;
    ``zero``: ZeRO stage(s) over them (``pipert.schedules.zero_rules``; rules and shares need
    ``units``, the model's unit modules, for their parameter names and sizes); ``zero3_buffers``:
    1 or 2 gathered ZeRO-3 copies; ``replication``: the replication policy (auto: the family's).
    ``rules``: "gloo" or "nccl", the communication rules it is validated under and runs under.
    ``units`` (optional) must number the schedule's units. ``check=False`` skips validation (a test
    hook, ``pipert.exec.instrument.Instrumentation``): the Program then runs only where the
    instrumentation allows it.
    """
    if isinstance(schedule, Program):
        raise TypeError(f"program {schedule.name!r} is already compiled; compile program.to_schedule() to "
                        f"change it")
    if rules not in RULES:
        raise ValueError(f"rules {rules!r} unknown; allowed: {', '.join(RULES)}")
    if isinstance(dp, bool) or not isinstance(dp, int) or dp < 1:
        raise ValueError(f"dp must be a positive integer (data-parallel replicas), got {dp!r}")
    options = CompileOptions(stages, microbatches, chunks, tuple(sorted((schedule_options or {}).items())),
                             tuple(passes), dp, zero, zero3_buffers, replication, rules, check)
    made: list[str] = []
    s = _build(schedule, options, units, made)
    s = apply_passes(s, options.passes)
    made += options.passes
    s = _replicate(s, options, units, made)
    merged = merge_sub_blocks(s)
    if merged is not s:
        made.append("merge_sub_blocks")
    _check_shape(merged, options, units)
    validated = None
    if check:
        validate(merged, transport=rules)
        validated = schedule_digest(merged, rules)
    return Program.of(merged, options=options, rules=rules, passes=tuple(made), validated=validated)


def _build(schedule: Schedule | str, o: CompileOptions, units: Sequence[Any] | None, made: list[str]) -> Schedule:
    if not isinstance(schedule, str):
        if o.chunks is not None or o.schedule_options:
            raise ValueError("chunks and schedule_options shape a named schedule; this one is built already")
        return schedule
    if o.microbatches is None:
        raise ValueError("microbatches is required when the schedule is given by name")
    if o.microbatches % o.dp:
        raise ValueError(f"{o.microbatches} micro-batches do not split over dp={o.dp} replicas; use a multiple "
                         f"of {o.dp}")
    stages = o.stages or (len(units) if units is not None else None)
    if stages is None:
        raise ValueError("stages is required when the schedule is given by name (or give the units)")
    made.append(f"build:{schedule}")
    return build_schedule(schedule, stages=stages, microbatches=o.microbatches // o.dp, chunks=o.chunks,
                          **{**replica_options(schedule, o.dp, o.zero, units), **dict(o.schedule_options)})


def replica_options(name: str, dp: int, zero: Any = 0, units: Sequence[Any] | None = None) -> dict:
    """Generator options telling a family that plans its replicas' gradient reductions (one that
    takes ``dp``: CrossPipe's, TawPipe's) that the program is replicated ``dp`` times, and to one that
    also takes ``dp_op`` (CrossPipe) the collective each unit's reduction will be (``ALLREDUCE``,
    ``REDUCESCATTER`` under ZeRO, as ``replicate`` emits), which it prices on the links it is given,
    and ``zero``, the stage whose weight gathers it prices too (not for stages per parameter).
    Options given explicitly override these."""
    from .schedules import family
    accepted = family(name).options()
    if dp == 1 or accepted is None or "dp" not in accepted:
        return {}
    from .schedules.zero_rules import resolve_zero
    zeros, _ = resolve_zero(0 if zero is None else zero, _unit_params(units, len(units) if units else 1, zero))
    if "dp_op" not in accepted:
        return {"dp": dp}
    ops = ["allreduce" if not any(z if isinstance(z, tuple) else (z,)) else "reducescatter" for z in zeros]
    out = {"dp": dp, "dp_op": ops if units else ops[0]}
    if "zero" in accepted and not any(isinstance(z, tuple) for z in zeros):   # per-parameter: not priced
        out["zero"] = list(zeros) if units else zeros[0]
    return out


def _replicate(s: Schedule, o: CompileOptions, units: Sequence[Any] | None, made: list[str]) -> Schedule:
    if o.dp == 1:
        if (o.zero not in (0, None, "0") or o.zero3_buffers != 1) and s.placement.replicas is None:
            raise ValueError(f"zero={o.zero!r} needs data-parallel replicas (dp > 1)")
        return s
    from .schedules.data_parallel import policy_for, replicate
    from .schedules.zero_rules import resolve_zero
    zeros, numel = resolve_zero(o.zero, _unit_params(units, s.num_units, o.zero))
    policy = policy_for(s, o.replication)
    made.append(f"replicate:{policy}")
    return replicate(s, o.dp, zeros, numel, o.zero3_buffers, policy)


def _unit_params(units: Sequence[Any] | None, num_units: int, zero: Any) -> list[list[tuple[str, int]]]:
    """Per unit, its parameters' (name, element count); without units only whole-unit stages resolve."""
    if units is not None:
        return [[(n, p.numel()) for n, p in m.named_parameters()] for m in units]
    if isinstance(zero, str) and zero.strip() not in ("0", "1", "2", "3"):
        raise ValueError(f"zero={zero!r} is decided per parameter: compile(..., units=...) needs the model's units")
    if isinstance(zero, (list, tuple)) and any(isinstance(z, (list, tuple)) for z in zero):
        raise ValueError("zero with stages per parameter needs the model's units (compile(..., units=...))")
    return [[] for _ in range(num_units)]


def _check_shape(s: Schedule, o: CompileOptions, units: Sequence[Any] | None) -> None:
    """The compiled schedule has the units and micro-batches the caller asked for."""
    if units is not None and s.num_units != len(units):
        raise ValueError(f"schedule {s.name!r} has {s.num_units} units but the model was partitioned into "
                         f"{len(units)}")
    if o.microbatches is not None and s.num_microbatches != o.microbatches:
        raise ValueError(f"schedule {s.name!r} runs {s.num_microbatches} micro-batches per step, not "
                         f"microbatches={o.microbatches}")
