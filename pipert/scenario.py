"""A scenario: schedule config + cost model + topology + links, built from CLI-style flags.

Shared by ``simulate``, ``compare``, ``export``, ``emulate`` and ``plan`` so they read flags the same
way (declared and checked in :mod:`pipert.scenario_flags`).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any, Callable

from .cost.topology import Links, Topology
from .cost.uniform import UniformCost
from .ir import Schedule
from .schedules import build_schedule, family
from .scenario_flags import (DEFAULT_MICROBATCHES, DEFAULT_STAGES, HELIX_OPT_OUTS, check_scenario_flags, check_size,
                             check_tp_flags, dc_link, helix_options, nic_bandwidth, node_links, parse_options)

__all__ = ["Scenario", "scenario_from_args", "file_shape", "shape_flags", "load_or_build", "LAYER_PER_CHUNK"]

LAYER_PER_CHUNK = ("helixpipe", "helixpipe-2fold")
"""Families whose ``chunks`` is the number of layers per stage (their units are pieces of layers)."""


@dataclass
class Scenario:
    """Everything needed to build and time schedules on one configuration."""

    stages: int
    """Pipeline stages = ranks P."""
    microbatches: int
    """Micro-batches per step M."""
    chunks: int | None
    """Units per rank V for interleaved schedules (None: each schedule's default)."""
    cost_fn: Callable[..., Any]
    """(num_units, recompute=, loss_in_backward=) -> CostModel (analytic models size their units by
    the schedule's count and price the units' recomputation; uniform costs ignore both)."""
    topology: Topology
    links: Any
    """A LinkModel, or None when all transfers are free."""
    memory_limit: float | None = None
    """Per-rank memory limit in the cost model's memory unit (None: unlimited)."""
    options: dict = field(default_factory=dict)
    """Extra generator options (e.g. ranks_per_node for tawpipe)."""
    per_stage: bool = False
    """Uniform times describe one stage (one rank's share of the model) rather than one
    unit: a schedule with P·V units gets times / V, so every schedule trains the same
    model. ``compare`` sets this."""
    layers: int | None = None
    """Layers of the analytic cost model's transformer (None in uniform mode): schedules whose
    units are pieces of layers (HelixPipe: ``chunks`` = layers per stage) get V = layers / P."""
    tp: int = 1
    """Tensor-parallel size T: each rank is a group of T devices of one node (analytic costs)."""
    sp: bool = False
    """Sequence parallelism over each TP group."""
    recompute: str = "none"
    """Recomputation inside the units of a schedule that does not say its own (``meta["recompute"]``)."""
    nic_bandwidth: float | None = None
    """Bytes per second of each node's one NIC each way, shared by its ranks' inter-node
    messages (``pipert.sim.nic``); None: every rank pair has its own link."""
    dp: int = 1
    """Data-parallel replicas (``simulate --dp``): every schedule is built for one replica's
    ``microbatches`` and compiled with ``dp`` (:func:`pipert.compile`: replica d's stage s on rank
    d * P + s); ``topology`` and ``links`` span the P * dp ranks."""
    zero: int = 0
    """ZeRO stage of every unit over the replicas (``simulate --zero``; 0 with ``dp`` = 1)."""

    def cost_for(self, schedule: Schedule) -> Any:
        """The cost model for ``schedule``'s units, with the recomputation and the loss placement its
        generator recorded (HelixPipe's paper defaults), else the scenario's."""
        meta = schedule.meta
        return self.cost_for_units(schedule.num_units, meta.get("recompute", self.recompute),
                                   bool(meta.get("loss_in_backward", False)))

    def cost_for_units(self, num_units: int, recompute: str | None = None, loss_in_backward: bool = False) -> Any:
        cost = self.cost_fn(num_units, recompute=recompute or self.recompute, loss_in_backward=loss_in_backward)
        if self.per_stage and hasattr(cost, "scaled") and num_units != self.stages:
            return cost.scaled(self.stages / num_units)
        return cost

    def describe_nic(self) -> str:
        """--nic-bandwidth in words ("10 Gbit/s each way per node of 4 ranks, ...")."""
        from .linkflags import format_bandwidth
        return (f"{format_bandwidth(self.nic_bandwidth)} each way per node of {self.topology.ranks_per_node} "
                f"ranks, shared by their inter-node messages")

    @property
    def cost(self) -> Any:
        """The cost model of a plain P-unit pipeline (one unit per stage)."""
        return self.cost_fn(self.stages)

    def build(self, name: str, strict: bool = False) -> Schedule:
        """The schedule ``name`` on this scenario. Unless ``strict``, ``chunks`` reaches only
        the families that take that value, so one scenario can compare every family."""
        fam = family(name)
        chunks = self.chunks
        if not strict and chunks is not None and not (fam.min_chunks <= chunks <= (fam.max_chunks or chunks)):
            chunks = None
        if chunks is None and self.layers and name in LAYER_PER_CHUNK:
            if self.layers % self.stages:
                raise ValueError(f"{name} puts layers/P layers on each stage: the model's {self.layers} layers "
                                 f"do not split over P={self.stages} stages; allowed P: divisors of {self.layers}")
            chunks = self.layers // self.stages
        v = chunks or fam.default_chunks
        units = self.stages * v * (2 if name in LAYER_PER_CHUNK else 1)  # HelixPipe: 2 pieces per layer, + 1
        check_size(self.stages, units, self.microbatches, [name],
                   f"{name} --stages {self.stages} --microbatches {self.microbatches} --chunks {v}")
        sched = build_schedule(name, stages=self.stages, microbatches=self.microbatches, chunks=chunks,
                               **self.options_for(name, chunks or fam.default_chunks))
        if self.dp == 1:
            return sched
        from .compiler import compile
        return compile(sched, dp=self.dp, zero=self.zero, check=False).to_schedule()

    def options_for(self, name: str, chunks: int = 1) -> dict:
        """Options ``name`` accepts; delay-aware generators get the costs of their own units."""
        opts = dict(self.options)
        opts.update(cost=self.cost_for_units(self.stages * chunks), links=self.links, topology=self.topology,
                    memory_limit=self.memory_limit)
        from .compiler import replica_options
        opts = {**replica_options(name, self.dp, self.zero), **opts}
        accepted = family(name).options()
        return opts if accepted is None else {k: v for k, v in opts.items() if k in accepted}


def file_shape(schedule: Schedule, given: dict[str, int | None], path: str | None = None
               ) -> tuple[int, int, int | None]:
    """(stages, micro-batches, chunks) of a schedule file; a flag in ``given`` (flag -> value,
    None: not given) that contradicts the file raises ValueError naming both values and the
    file (``path``, else the schedule's name).
    Chunks are units per rank when every rank holds the same number, else None."""
    U, P = schedule.num_units, schedule.num_ranks
    chunks = U // P if schedule.placement.kind == "unit" and U % P == 0 else None
    shape = {"--stages": P, "--microbatches": schedule.num_microbatches, "--chunks": chunks}
    for flag, value in given.items():
        if value is not None and value != shape[flag]:
            raise ValueError(f"{flag} {value} contradicts schedule file {path or schedule.name!r}, which has "
                             f"{flag[2:]} = {shape[flag]}; leave {flag} out (a file keeps its shape)")
    return P, schedule.num_microbatches, chunks


def shape_flags(args: argparse.Namespace) -> dict[str, int | None]:
    """The shape flags as given on the command line (None: not given)."""
    return {"--stages": args.stages, "--microbatches": args.microbatches, "--chunks": args.chunks}


def _check_topology_flags(args: argparse.Namespace, stages: int, tp: int = 1, what: str = "stages") -> int | None:
    """--dcs and --ranks-per-node against the stage count (the flag's or a schedule file's; with
    --dp, the ranks of every replica: ``what`` names them); returns the pipeline ranks per node
    (--ranks-per-node counts devices: with --tp T a node holds ranks-per-node / T pipeline ranks)."""
    dcs = args.dcs or 1
    if stages % dcs:
        raise ValueError(f"--dcs {dcs} does not divide the {stages} {what} into equal blocks; allowed: a "
                         f"divisor of {stages}")
    rpn = args.ranks_per_node
    if rpn is None:
        return None
    per_node = rpn // tp
    if (stages // dcs) % per_node:
        with_tp = f" (--tp {tp}: {per_node} pipeline ranks of {tp} devices per node)" if tp > 1 else ""
        what = "pipeline ranks" if tp > 1 else "ranks"
        allowed = f"a multiple of --tp {tp} whose quotient is a divisor" if tp > 1 else "a divisor"
        raise ValueError(f"--ranks-per-node {rpn}{with_tp} does not divide the {stages // dcs} {what} of each "
                         f"datacenter; allowed: {allowed} of {stages // dcs}")
    return per_node


def scenario_from_args(args: argparse.Namespace, schedule: Schedule | None = None,
                       path: str | None = None) -> Scenario:
    """The scenario of the flags; with ``schedule`` (a loaded file, read from ``path``) its rank
    count, micro-batches and chunks, flags that contradict them rejected (:func:`file_shape`).
    Every flag is checked before anything is built, the shape against the size limits
    (:func:`pipert.scenario_flags.check_size`; one unit per stage at least)."""
    check_scenario_flags(args)
    tp = check_tp_flags(args)
    nic = nic_bandwidth(args)
    if schedule is not None:
        stages, microbatches, chunks = file_shape(schedule, shape_flags(args), path)
        check_size(stages, schedule.num_units, microbatches, what=f"schedule file {path or schedule.name!r}")
    else:
        stages = args.stages if args.stages is not None else DEFAULT_STAGES
        microbatches = args.microbatches if args.microbatches is not None else DEFAULT_MICROBATCHES
        chunks = args.chunks
        check_size(stages, stages * (chunks or 1), microbatches,
                   what=f"--stages {stages}{f' x --chunks {chunks}' if chunks else ''} --microbatches {microbatches}")
    dp = _replicas(args, schedule, microbatches)
    per_node = _check_topology_flags(args, stages * dp, tp, f"ranks of --stages {stages} x --dp {dp}" if dp > 1
                                     else "stages")
    topo = Topology(stages * dp, ranks_per_node=per_node, num_dcs=args.dcs or 1)
    options: dict = {}
    if per_node:
        options["ranks_per_node"] = per_node
    sp = bool(getattr(args, "sp", False))
    if args.model:
        cost, links, layers = _analytic(args, topo, tp, sp)
    else:
        tf = args.tf if args.tf is not None else 1.0
        tb = args.tb
        if tb is None and (args.td is None or args.tw is None):
            tb = 2.0
        uniform = UniformCost(tf=tf, tb=tb, td=args.td, tw=args.tw)

        def cost(num_units: int, **priced_by_analytic_model: Any) -> UniformCost:
            return uniform
        dc = dc_link(args)
        links = Links(topo, {"inter_dc": dc}) if dc is not None else None
        layers = None
    options.update(helix_options(args))
    given = parse_options(getattr(args, "options", None))
    if "recompute" in given and options.get("recompute", given["recompute"]) != given["recompute"]:
        raise ValueError(f"--options recompute={given['recompute']} contradicts --recompute {options['recompute']}; "
                         f"give one of them")
    options.update(given)
    return Scenario(stages, microbatches // dp, chunks, cost, topo, links, args.memory_limit, options,
                    layers=layers, tp=tp, sp=sp, recompute=getattr(args, "recompute", None) or "none",
                    nic_bandwidth=nic, dp=dp, zero=_zero(args, dp))


def _replicas(args: argparse.Namespace, schedule: Schedule | None, microbatches: int) -> int:
    """``--dp`` (1 when not given, or for a command without it): replicas of a schedule the command
    builds, each running microbatches / dp of the --microbatches."""
    dp = getattr(args, "dp", None)
    if dp is None:
        return 1
    if dp < 1:
        raise ValueError(f"--dp must be an integer >= 1 (data-parallel replicas), got {dp}")
    if schedule is not None and dp > 1:
        raise ValueError(f"--dp {dp} replicates a schedule this command builds; a schedule file keeps its shape "
                         f"(replicate it with pipert.compile(schedule, dp={dp}))")
    if microbatches % dp:
        raise ValueError(f"--microbatches {microbatches} do not split over --dp {dp} replicas; use a multiple of {dp}")
    return dp


def _zero(args: argparse.Namespace, dp: int) -> int:
    """``--zero`` (0 when not given, or for a command without it): one ZeRO stage for every unit,
    over the --dp replicas."""
    zero = getattr(args, "zero", None)
    if zero is None:
        return 0
    if zero not in (0, 1, 2, 3):
        raise ValueError(f"--zero must be a ZeRO stage 0, 1, 2 or 3 (every unit), got {zero}")
    if zero and dp == 1:
        raise ValueError(f"--zero {zero} shards over data-parallel replicas: give --dp > 1 too")
    return zero


def _analytic(args: argparse.Namespace, topo: Topology, tp: int = 1, sp: bool = False
              ) -> tuple[Callable[[int], Any], Links, int]:
    """(cost of a partition into n units, links, layers) of the analytic model: preset links, the
    cross-DC one replaced by what the flags give; TP collectives on the intra-node link."""
    from .cost.devices import DeviceSpec
    from .cost.tensor_parallel import tp_divisors, tp_problem
    from .cost.topology import default_link_specs
    from .cost.transformer import ModelSpec, TransformerCost, partition_helix, partition_layers
    overrides = {k: v for k, v in (("seq", args.seq), ("micro_batch", args.micro_batch_size)) if v is not None}
    spec = ModelSpec.preset(args.model, **overrides)
    device = DeviceSpec.preset(args.device or "h100")
    problem = tp_problem(spec, tp, sp)
    if problem:
        raise ValueError(f"--tp {tp}{' --sp' if sp else ''}: {problem} of --model {args.model}; allowed --tp: "
                         f"{', '.join(map(str, tp_divisors(spec, sp)))}")
    specs = node_links(args, default_link_specs())

    def cost(num_units: int, recompute: str = "none", loss_in_backward: bool = False) -> TransformerCost:
        kw = dict(tp=tp, sp=sp, tp_link=specs["intra_node"], recompute=recompute, loss_in_backward=loss_in_backward)
        if num_units == 2 * spec.layers + 1:
            return TransformerCost(spec, device, partition_helix(spec), **kw)
        if num_units > spec.layers:
            raise ValueError(f"--model {args.model} has {spec.layers} layers, too few for {num_units} units (--stages x "
                             f"chunks per stage); allowed: at most {spec.layers} units of whole layers, or "
                             f"{2 * spec.layers + 1} HelixPipe units")
        return TransformerCost(spec, device, partition_layers(spec, num_units), **kw)
    dc = dc_link(args, specs["inter_dc"])
    if dc is not None:
        specs["inter_dc"] = dc
    return cost, Links(topo, specs), spec.layers


def load_or_build(args: argparse.Namespace, name: str, measured: Callable[[int], Any] | None = None
                  ) -> tuple[Scenario, Schedule]:
    """The scenario and the schedule ``name``: a schedule file (its shape; see
    :mod:`pipert.ir.files`) or a registered name built on the flags' scenario. ``measured``
    (``emulate --real``: units count -> cost of the real units, in seconds) replaces the
    scenario's costs for a family that plans around given links, so it reads them in the unit
    of the links (:mod:`pipert.linkplan`)."""
    from .ir.files import is_schedule_file, load_schedule
    if is_schedule_file(name):
        sched = load_schedule(name)
        return scenario_from_args(args, sched, name), sched
    sc = scenario_from_args(args)
    from .schedules import PipelineConfig, family
    fam = family(name)
    accepted = fam.options()
    for flag_name, (opt, _) in HELIX_OPT_OUTS.items():
        if getattr(args, flag_name, False) and accepted is not None and opt not in accepted:
            raise ValueError(f"--{flag_name.replace('_', '-')} opts helixpipe-2fold out of a paper default; "
                             f"{name} has no option {opt}")
    untaken = [k for k in parse_options(getattr(args, "options", None)) if accepted is not None and k not in accepted]
    if untaken:
        raise ValueError(f"--options {untaken[0]}=...: {name} has no option {untaken[0]}; it takes: "
                         f"{', '.join(accepted) or 'none'}")
    chunks = sc.chunks if sc.chunks is not None else fam.default_chunks
    try:                                  # the family's constraints first: building can take long
        fam.validate(PipelineConfig(sc.stages, sc.microbatches, chunks))
    except ValueError as e:
        raise ValueError(f"{name} --stages {sc.stages} --microbatches {sc.microbatches} --chunks {chunks}: {e}") \
            from None
    if measured is not None and sc.links is not None:
        from .linkplan import plans_links
        if plans_links(name):
            real = measured(sc.stages * chunks)
            sc.cost_fn = lambda num_units, **priced_by_analytic_model: real
    return sc, sc.build(name, strict=True)
