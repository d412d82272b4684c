"""A scenario: schedule config + cost model + topology + links, built from CLI-style flags.

Shared by ``simulate``, ``compare``, ``emulate`` and ``plan`` so they read flags the same way.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from .cost.topology import Links, Topology
from .cost.uniform import UniformCost
from .ir import Schedule
from .schedules import build_schedule, family

__all__ = ["Scenario", "add_scenario_args", "scenario_from_args", "file_shape", "shape_flags", "load_or_build",
           "DEFAULT_STAGES", "DEFAULT_MICROBATCHES", "check_scenario_flags", "LAYER_PER_CHUNK"]

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
    cost_fn: Callable[[int], Any]
    """num_units -> CostModel (analytic models size their units by the schedule's count)."""
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

    def cost_for(self, schedule: Schedule) -> Any:
        """The cost model for ``schedule``'s units."""
        return self.cost_for_units(schedule.num_units)

    def cost_for_units(self, num_units: int) -> Any:
        cost = self.cost_fn(num_units)
        if self.per_stage and hasattr(cost, "scaled") and num_units != self.stages:
            return cost.scaled(self.stages / num_units)
        return cost

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
        return build_schedule(name, stages=self.stages, microbatches=self.microbatches, chunks=chunks,
                              **self.options_for(name, chunks or fam.default_chunks))

    def options_for(self, name: str, chunks: int = 1) -> dict:
        """Options ``name`` accepts; delay-aware generators get the costs of their own units."""
        opts = dict(self.options)
        opts.update(cost=self.cost_for_units(self.stages * chunks), links=self.links, topology=self.topology,
                    memory_limit=self.memory_limit)
        accepted = family(name).options()
        return opts if accepted is None else {k: v for k, v in opts.items() if k in accepted}


DEFAULT_STAGES = 4
DEFAULT_MICROBATCHES = 8


def add_scenario_args(p: argparse.ArgumentParser) -> None:
    """The scenario flags. The shape flags default to None: a schedule file's own shape, else
    DEFAULT_STAGES and DEFAULT_MICROBATCHES (see :func:`scenario_from_args`)."""
    g = p.add_argument_group("pipeline")
    g.add_argument("--stages", "-P", type=int, default=None,
                   help=f"pipeline stages (ranks); default {DEFAULT_STAGES}, or a schedule file's")
    g.add_argument("--microbatches", "-M", type=int, default=None,
                   help=f"micro-batches per step; default {DEFAULT_MICROBATCHES}, or a schedule file's")
    g.add_argument("--chunks", "-V", type=int, default=None,
                   help="units per rank for interleaved schedules (a schedule file's: its units / ranks)")
    u = p.add_argument_group("uniform costs (time of one unit for one micro-batch)")
    u.add_argument("--tf", type=float, default=None, help="forward time (default 1.0)")
    u.add_argument("--tb", type=float, default=None, help="full backward time (default 2.0)")
    u.add_argument("--td", type=float, default=None, help="input-gradient time (default tb/2)")
    u.add_argument("--tw", type=float, default=None, help="weight-gradient time (default tb/2)")
    m = p.add_argument_group("analytic transformer costs (instead of uniform)")
    m.add_argument("--model", default=None, help="model preset: tiny, 1b, 7b, 13b, 70b")
    m.add_argument("--seq", type=int, default=None, help="sequence length")
    m.add_argument("--micro-batch-size", type=int, default=None, help="sequences per micro-batch")
    m.add_argument("--device", default="h100", help="device preset for the analytic model")
    t = p.add_argument_group("topology and links")
    t.add_argument("--ranks-per-node", type=int, default=None, help="ranks per node (default: all on one node)")
    t.add_argument("--dcs", type=int, default=1, help="datacenters; stages split into equal consecutive blocks")
    t.add_argument("--dc-latency", type=float, default=0.0, help="latency of a cross-DC message (time unit of --tf)")
    t.add_argument("--dc-transfer", type=float, default=0.0, help="link occupancy of a cross-DC message")
    p.add_argument("--memory-limit", type=float, default=None, help="per-rank memory limit (cost-model units)")


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


_AT_LEAST_ONE = ("stages", "microbatches", "chunks", "ranks_per_node", "dcs", "seq", "micro_batch_size")
_POSITIVE = ("tf", "tb", "td", "tw", "memory_limit")
_NON_NEGATIVE = ("dc_latency", "dc_transfer")


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_scenario_flags(args: argparse.Namespace) -> None:
    """Every scenario flag in constant time, before any schedule is built: ValueError naming the
    flag, its value and what is allowed."""
    for name in _AT_LEAST_ONE:
        v = getattr(args, name)
        if v is not None and v < 1:
            raise ValueError(f"{_flag(name)} must be >= 1, got {v}")
    for name in _POSITIVE:
        v = getattr(args, name)
        if v is not None and not 0 < v < math.inf:
            raise ValueError(f"{_flag(name)} must be a finite number > 0, got {v}")
    for name in _NON_NEGATIVE:
        v = getattr(args, name)
        if not 0 <= v < math.inf:
            raise ValueError(f"{_flag(name)} must be a finite number >= 0, got {v}")
    if args.model is not None:
        from .cost.devices import DEVICE_PRESETS
        from .cost.transformer import MODEL_PRESETS
        if args.model not in MODEL_PRESETS:
            raise ValueError(f"--model {args.model!r} unknown; allowed: {', '.join(MODEL_PRESETS)}")
        if args.device not in DEVICE_PRESETS:
            raise ValueError(f"--device {args.device!r} unknown; allowed: {', '.join(DEVICE_PRESETS)}")


def _check_topology_flags(args: argparse.Namespace, stages: int) -> None:
    """--dcs and --ranks-per-node against the stage count (the flag's or a schedule file's)."""
    if stages % args.dcs:
        raise ValueError(f"--dcs {args.dcs} does not divide the {stages} stages into equal blocks; allowed: a "
                         f"divisor of {stages}")
    rpn = args.ranks_per_node
    if rpn is not None and (stages // args.dcs) % rpn:
        raise ValueError(f"--ranks-per-node {rpn} does not divide the {stages // args.dcs} ranks of each "
                         f"datacenter; allowed: a divisor of {stages // args.dcs}")


def scenario_from_args(args: argparse.Namespace, schedule: Schedule | None = None,
                       path: str | None = None) -> Scenario:
    """The scenario of the flags; with ``schedule`` (a loaded file, read from ``path``) its rank
    count, micro-batches and chunks, flags that contradict them rejected (:func:`file_shape`)."""
    check_scenario_flags(args)
    if schedule is not None:
        stages, microbatches, chunks = file_shape(schedule, shape_flags(args), path)
    else:
        stages = args.stages if args.stages is not None else DEFAULT_STAGES
        microbatches = args.microbatches if args.microbatches is not None else DEFAULT_MICROBATCHES
        chunks = args.chunks
    _check_topology_flags(args, stages)
    topo = Topology(stages, ranks_per_node=args.ranks_per_node, num_dcs=args.dcs)
    options: dict = {}
    if args.ranks_per_node:
        options["ranks_per_node"] = args.ranks_per_node
    if args.model:
        from .cost.devices import DeviceSpec
        from .cost.transformer import ModelSpec, TransformerCost, partition_helix, partition_layers
        for flag, v in (("--seq", args.seq), ("--micro-batch-size", args.micro_batch_size)):
            if v is not None and v < 1:
                raise ValueError(f"{flag} must be >= 1, got {v}")
        overrides = {k: v for k, v in (("seq", args.seq), ("micro_batch", args.micro_batch_size)) if v is not None}
        spec = ModelSpec.preset(args.model, **overrides)
        device = DeviceSpec.preset(args.device)

        def cost(num_units: int) -> TransformerCost:
            if num_units == 2 * spec.layers + 1:
                return TransformerCost(spec, device, partition_helix(spec))
            if num_units > spec.layers:
                raise ValueError(f"{num_units} units: the {spec.layers}-layer model has at most {spec.layers} "
                                 f"units of whole layers, or {2 * spec.layers + 1} HelixPipe units")
            return TransformerCost(spec, device, partition_layers(spec, num_units))
        links = Links.preset(topo)
        layers = spec.layers
    else:
        tf = args.tf if args.tf is not None else 1.0
        tb = args.tb
        if tb is None and (args.td is None or args.tw is None):
            tb = 2.0
        uniform = UniformCost(tf=tf, tb=tb, td=args.td, tw=args.tw)

        def cost(num_units: int) -> UniformCost:
            return uniform
        links = Links.uniform_dc(topo, args.dc_latency, args.dc_transfer) if (args.dc_latency or args.dc_transfer) else None
        layers = None
    return Scenario(stages, microbatches, chunks, cost, topo, links, args.memory_limit, options,
                    layers=layers)


def load_or_build(args: argparse.Namespace, name: str) -> tuple[Scenario, Schedule]:
    """The scenario and the schedule ``name``: a schedule file (its shape; see
    :mod:`pipert.ir.files`) or a registered name built on the flags' scenario."""
    from .ir.files import is_schedule_file, load_schedule
    if is_schedule_file(name):
        sched = load_schedule(name)
        return scenario_from_args(args, sched, name), sched
    sc = scenario_from_args(args)
    from .schedules import PipelineConfig, family
    fam = family(name)
    chunks = sc.chunks if sc.chunks is not None else fam.default_chunks
    try:                                  # the family's constraints first: building can take long
        fam.validate(PipelineConfig(sc.stages, sc.microbatches, chunks))
    except ValueError as e:
        raise ValueError(f"{name} --stages {sc.stages} --microbatches {sc.microbatches} --chunks {chunks}: {e}") \
            from None
    return sc, sc.build(name, strict=True)
