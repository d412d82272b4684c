"""The scenario flags of simulate, compare, export, emulate and plan: declared once, checked in
constant time before any schedule is built (ValueError naming the flag, its value and what is
allowed).

Units of time. With uniform costs (no ``--model``) every time (``--tf``, ``--tb``, ``--td``,
``--tw``, ``--dc-latency``, ``--dc-transfer``) is a bare number in one abstract unit, the unit
of ``--tf`` (``emulate`` maps it to seconds by ``--time-unit``); a value with a unit (``20ms``)
is refused there, since those costs have no seconds. With ``--model`` (analytic costs, in
seconds) and with ``emulate --real`` (the model's real units) the link flags take units
(``--dc-latency 20ms``, ``--dc-bandwidth 10Gbps``, as in ``pipert train``) and a bare number
other than 0 is refused. A flag that only works with another one is refused without it,
naming both.

Size. Building and simulating a schedule takes time and memory that grow with its ranks and
with its (unit, micro-batch) pairs (each pair is several actions): shapes beyond
:data:`MAX_RANKS` ranks or :data:`MAX_PAIRS` pairs are refused before anything is built.
"""
from __future__ import annotations

import argparse
import math
from typing import Any, Iterable

__all__ = ["add_scenario_args", "add_tp_args", "add_helix_args", "helix_options", "add_options_arg", "parse_options",
           "OPTIONS_HELP", "check_tp_flags", "node_links", "check_scenario_flags",
           "seconds_mode", "dc_link", "nic_bandwidth", "check_size", "refuse_given", "HELIX_OPT_OUTS",
           "flag", "DEFAULT_STAGES", "DEFAULT_MICROBATCHES", "MAX_RANKS", "MAX_PAIRS", "PAIR_LIMITS"]

DEFAULT_STAGES = 4
DEFAULT_MICROBATCHES = 8
MAX_RANKS = 1024
"""Most ranks a scenario may have (the engine's set-up per rank grows with the rank count)."""
MAX_PAIRS = 1 << 15
"""Most (unit, micro-batch) pairs of one schedule: P=64 x M=512 of 1F1B fits."""
PAIR_LIMITS = {"crosspipe-greedy": 1 << 13, "crosspipe-wave": 1 << 13, "crosspipe-optimal": 1 << 7}
"""Families whose builders search, with their own (lower) limit of pairs: the greedy ones at
every step; CP-SAT's model grows with the square of the pairs per rank (P=8 M=32 takes tens
of seconds and 600 MB; P=8 M=16 a few seconds)."""

_AT_LEAST_ONE = ("stages", "microbatches", "chunks", "ranks_per_node", "dcs", "seq", "micro_batch_size")
_POSITIVE = ("tf", "tb", "td", "tw", "memory_limit")
_UNIFORM_ONLY = ("tf", "tb", "td", "tw", "dc_transfer")
_MODEL_ONLY = ("seq", "micro_batch_size", "device")
_DC_LINK = ("dc_latency", "dc_transfer", "dc_bandwidth")
SCENARIO_FLAGS = ("stages", "microbatches", "chunks", "tf", "tb", "td", "tw", "model", "seq", "micro_batch_size",
                  "device", "ranks_per_node", "dcs", "dc_latency", "dc_transfer", "dc_bandwidth", "memory_limit")
"""Every flag :func:`add_scenario_args` declares (all default to None: given or not)."""


def flag(name: str) -> str:
    """The command-line spelling of a flag's destination name."""
    return "--" + name.replace("_", "-")


def _uniform_time(text: str) -> float:
    """A uniform cost as argparse reads it: a bare number (its range is checked with the others)."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: uniform costs are bare numbers in one time unit, that of --tf "
                                         f"(e.g. 2); for costs in seconds give --model instead") from None


def add_scenario_args(p: argparse.ArgumentParser) -> None:
    """The scenario flags; every one defaults to None (not given): the shape flags fall back to a
    schedule file's shape, else DEFAULT_STAGES and DEFAULT_MICROBATCHES."""
    g = p.add_argument_group("pipeline")
    g.add_argument("--stages", "-P", type=int, default=None,
                   help=f"pipeline stages (ranks, at most {MAX_RANKS}); default {DEFAULT_STAGES}, or a schedule file's")
    g.add_argument("--microbatches", "-M", type=int, default=None,
                   help=f"micro-batches per step; default {DEFAULT_MICROBATCHES}, or a schedule file's (units x "
                        f"micro-batches at most {MAX_PAIRS})")
    g.add_argument("--chunks", "-V", type=int, default=None,
                   help="units per rank for interleaved schedules (a schedule file's: its units / ranks)")
    u = p.add_argument_group("uniform costs: bare numbers in one time unit, that of --tf (not with --model)")
    u.add_argument("--tf", type=_uniform_time, default=None,
                   help="forward time of one unit and micro-batch (default 1.0)")
    u.add_argument("--tb", type=_uniform_time, default=None, help="full backward time (default 2.0)")
    u.add_argument("--td", type=_uniform_time, default=None, help="input-gradient time (default tb/2)")
    u.add_argument("--tw", type=_uniform_time, default=None, help="weight-gradient time (default tb/2)")
    m = p.add_argument_group("analytic transformer costs, in seconds (instead of uniform)")
    m.add_argument("--model", default=None, help="model preset: tiny, 1b, 7b, 13b, 70b (LLaMA-style), gpt-1.3b, "
                   "gpt-3b, gpt-7b (HelixPipe's GPT-3-style models), gpt3-58b, llama2-55b (PipeMesh's)")
    m.add_argument("--seq", type=int, default=None, help="sequence length (with --model)")
    m.add_argument("--micro-batch-size", type=int, default=None, help="sequences per micro-batch (with --model)")
    m.add_argument("--device", default=None, help="device preset (with --model; default h100)")
    t = p.add_argument_group("topology and links")
    t.add_argument("--ranks-per-node", type=int, default=None, help="ranks (devices) per node (default: all on one "
                   "node); with --tp T a node holds ranks-per-node / T pipeline ranks")
    t.add_argument("--dcs", type=int, default=None, help="datacenters; stages split into equal consecutive blocks")
    t.add_argument("--dc-latency", default=None,
                   help="latency of a cross-DC message (with --dcs): uniform costs: a bare number in the time unit "
                        "of --tf (2); --model: with a unit (20ms)")
    t.add_argument("--dc-transfer", default=None,
                   help="link occupancy of each cross-DC message (with --dcs, uniform costs): a bare number in the "
                        "time unit of --tf")
    t.add_argument("--dc-bandwidth", default=None,
                   help="bandwidth of the cross-DC link (with --dcs and --model): with a unit (10Gbps, 400MB/s)")
    p.add_argument("--memory-limit", type=float, default=None, help="per-rank memory limit (cost-model units)")


def add_tp_args(p: argparse.ArgumentParser) -> None:
    """``--tp`` and ``--sp`` (simulate, compare): every pipeline rank a tensor-parallel group of T
    devices of one node (docs/tensor_parallel_cost.md)."""
    g = p.add_argument_group("tensor parallelism inside each pipeline rank (with --model)")
    g.add_argument("--tp", type=int, default=None,
                   help="tensor-parallel size T: each pipeline rank is T devices of one node, Megatron-style; "
                        "their collectives are priced on the intra-node link (default 1). With --tp, "
                        "--ranks-per-node counts devices: a node holds ranks-per-node / T pipeline ranks")
    g.add_argument("--sp", action="store_true", help="sequence parallelism over the --tp group (Megatron SP): "
                   "all-gathers and reduce-scatters instead of all-reduces, activations and boundary messages "
                   "1/T of the bytes")
    g.add_argument("--intra-node-bandwidth", default=None, help="bandwidth between two devices of a node, with a "
                   "unit (450GB/s; with --model; default 200GB/s): TP collectives and messages inside a node")
    g.add_argument("--node-latency", default=None, help="latency between two devices of different nodes of a "
                   "datacenter, with a unit (5us; with --model and --ranks-per-node; default 10us)")
    g.add_argument("--node-bandwidth", default=None, help="bandwidth between two devices of different nodes, with "
                   "a unit (100Gbps: a node's NICs shared by its devices; with --model and --ranks-per-node; "
                   "default 200Gbps)")
    g.add_argument("--nic-bandwidth", default=None, help="bandwidth of each node's one NIC each way, with a unit "
                   "(10Gbps; with --model and --ranks-per-node): the inter-node messages of a node's ranks share it "
                   "(pipert.sim.nic; e.g. TawPipe's weight passing between node groups); default: every rank pair "
                   "has its own inter-node link")


def check_tp_flags(args: argparse.Namespace) -> int:
    """--tp, --sp and the node links (--intra-node-bandwidth, --node-latency, --node-bandwidth)
    against --model and --ranks-per-node, in constant time; returns T (1 when not given). A flag
    parser without them (export, emulate, plan) gives T = 1."""
    if args.model is None:
        refuse_given(args, _NODE_LINK, "sets a link of the analytic model (bytes per second): give --model too")
        refuse_given(args, ("nic_bandwidth",), "shares a NIC among the analytic model's messages (bytes per "
                                               "second): give --model too")
    elif args.ranks_per_node is None:
        refuse_given(args, _NODE_LINK[1:], "describes the link between nodes: give --ranks-per-node as well")
        refuse_given(args, ("nic_bandwidth",), "is the NIC the ranks of one node share: give --ranks-per-node as well")
    node_links(args)
    tp, sp = getattr(args, "tp", None), bool(getattr(args, "sp", False))
    if tp is None and not sp:
        return 1
    if args.model is None:
        refuse_given(args, ("tp", "sp"), "prices tensor parallelism with the analytic model (FLOPs, bytes and "
                                         "collectives per layer): give --model too")
    if tp is not None and tp < 1:
        raise ValueError(f"--tp must be >= 1, got {tp}")
    t = tp or 1
    if sp and t < 2:
        raise ValueError(f"--sp shards the sequence over the tensor-parallel group, but --tp is {t}: give --tp T "
                         f"with T >= 2")
    rpn = args.ranks_per_node
    if rpn is not None and rpn % t:
        divisors = ", ".join(str(d) for d in range(1, rpn + 1) if rpn % d == 0)
        raise ValueError(f"--tp {t}: a tensor-parallel group lies inside one node, and T={t} devices do not fit "
                         f"a node of --ranks-per-node {rpn} devices in whole groups; allowed --tp: {divisors}")
    return t


_NODE_LINK = ("intra_node_bandwidth", "node_latency", "node_bandwidth")


def node_links(args: argparse.Namespace, specs: dict | None = None) -> dict:
    """``specs`` (link class -> :class:`pipert.cost.LinkSpec`) with the intra-node and inter-node
    links the flags give replaced (seconds and bytes per second; a parser without these flags
    changes nothing)."""
    out = dict(specs or {})
    given = {k: getattr(args, k, None) for k in _NODE_LINK}
    if all(v is None for v in given.values()):
        return out
    from .cost.topology import LinkSpec, default_link_specs
    from .linkflags import parse_bandwidth, parse_duration
    preset = default_link_specs()
    intra, inter = out.get("intra_node", preset["intra_node"]), out.get("inter_node", preset["inter_node"])
    if given["intra_node_bandwidth"] is not None:
        out["intra_node"] = LinkSpec(intra.latency, parse_bandwidth(given["intra_node_bandwidth"],
                                                                    "--intra-node-bandwidth"), intra.per_message)
    if given["node_latency"] is not None or given["node_bandwidth"] is not None:
        lat = inter.latency if given["node_latency"] is None else parse_duration(given["node_latency"],
                                                                                  "--node-latency")
        bw = inter.bandwidth if given["node_bandwidth"] is None else parse_bandwidth(given["node_bandwidth"],
                                                                                      "--node-bandwidth")
        out["inter_node"] = LinkSpec(lat, bw, inter.per_message)
    return out


def nic_bandwidth(args: argparse.Namespace) -> float | None:
    """Bytes per second of --nic-bandwidth (None: not given, or a parser without it)."""
    text = getattr(args, "nic_bandwidth", None)
    if text is None:
        return None
    from .linkflags import parse_bandwidth
    return parse_bandwidth(text, "--nic-bandwidth")


def seconds_mode(args: argparse.Namespace) -> bool:
    """Whether times are seconds: the analytic model's costs, or ``emulate --real``'s real units."""
    return args.model is not None or bool(getattr(args, "real", False))


def refuse_given(args: argparse.Namespace, names: Iterable[str], reason: str) -> None:
    """ValueError naming the first of ``names`` given on the command line (not None), its value
    and ``reason``, a predicate that says what it needs or contradicts ("needs --model")."""
    for name in names:
        v = getattr(args, name, None)
        if v is not None and v is not False:
            shown = "" if v is True else " " + (" ".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v))
            raise ValueError(f"{flag(name)}{shown} {reason}")


HELIX_OPT_OUTS = {"sync_folds": ("asynchronous", False), "loss_in_forward": ("loss_in_backward", False)}
"""Opt-out flag -> (generator option, value) of helixpipe-2fold's paper defaults."""


def add_helix_args(p: argparse.ArgumentParser) -> None:
    """The units' recomputation and the opt-outs of helixpipe-2fold's paper defaults
    (``pipert.schedules.helixpipe.PAPER_DEFAULTS``); all default to None/False (not given)."""
    from .cost.modes import RECOMPUTE_MODES
    g = p.add_argument_group("recomputation and HelixPipe's paper defaults (helixpipe-2fold runs asynchronously, "
                             "recomputes without attention and computes the loss in backward)")
    g.add_argument("--recompute", default=None, choices=RECOMPUTE_MODES,
                   help="recomputation inside every unit, priced by the analytic model (with --model); default: "
                        "the schedule's (no_attention for helixpipe-2fold, else none)")
    g.add_argument("--sync-folds", action="store_true", help="helixpipe-2fold: one compute and one message per "
                   "fold pair instead of the asynchronous two-fold (each fold's message leaving after its own compute)")
    g.add_argument("--loss-in-forward", action="store_true", help="helixpipe-2fold: LM head and loss in the "
                   "forward of the last unit instead of its backward")


OPTIONS_HELP = ("generator options name=value;... (pipemesh: enqueue=4,4;dequeue=2,2,2,2;units_per_chunk=1; "
                "crosspipe-*: recompute=full;memory_budget=static-max;dp_time=0.5)")


def add_dp_arg(p: argparse.ArgumentParser) -> None:
    """``--dp`` and ``--zero`` (simulate, emulate): replicas of a schedule the command builds and their
    ZeRO stage (:func:`pipert.scenario._replicas`, :func:`pipert.scenario._zero`)."""
    p.add_argument("--dp", type=int, default=None, help="data-parallel replicas D of a schedule this command builds "
                   "(pipert.compile(..., dp=D): replica d's stage s on rank d*P+s, each unit's gradients reduced "
                   "over its replicas); -M counts every replica's micro-batches and --dcs splits the P*D ranks, as "
                   "in train; CrossPipe's generators plan around the reductions on those links")
    p.add_argument("--zero", type=int, default=None, help="ZeRO stage 0-3 of every unit over the --dp replicas, as "
                   "in train (compile(..., zero=Z): reduce-scatters and weight gathers; CrossPipe's generators "
                   "price them too); default 0")


def add_options_arg(p: argparse.ArgumentParser) -> None:
    """``--options`` (simulate, emulate, compare, export), parsed as ``train --options`` (:func:`parse_options`)."""
    p.add_argument("--options", default=None, help=OPTIONS_HELP + "; compare gives each option to the schedules "
                   "that take it")


TOLD_BY_FLAGS = {"zero": "--zero (with --dp)"}
"""Generator options a flag sets, so the generator plans the program the command runs."""


def parse_options(text: str | None, flag: str = "--options") -> dict:
    """Generator options of ``name=value`` pairs separated by ';' (names with '-' read as '_'; integer
    text becomes an int, other values stay text for the generator to check); a pair without '=' is
    a ValueError naming it."""
    out: dict = {}
    for pair in (p.strip() for p in (text or "").split(";")):
        if not pair:
            continue
        name, eq, value = pair.partition("=")
        if not eq or not name.strip():
            raise ValueError(f"{flag}: {pair!r} is not name=value (pairs separated by ';')")
        if name.strip() in TOLD_BY_FLAGS:
            raise ValueError(f"{flag}: {name.strip()}=... is told to the generator by {TOLD_BY_FLAGS[name.strip()]}; "
                             f"give that flag instead")
        value = value.strip()
        out[name.strip().replace("-", "_")] = int(value) if value.lstrip("-").isdigit() else value
    return out


def helix_options(args: argparse.Namespace) -> dict:
    """The generator options the flags of :func:`add_helix_args` give (only those given)."""
    out = {opt: value for name, (opt, value) in HELIX_OPT_OUTS.items() if getattr(args, name, False)}
    if getattr(args, "recompute", None) is not None:
        out["recompute"] = args.recompute
    return out


def check_scenario_flags(args: argparse.Namespace) -> None:
    """Every scenario flag and combination, in constant time."""
    for name in _AT_LEAST_ONE:
        v = getattr(args, name)
        if v is not None and v < 1:
            raise ValueError(f"{flag(name)} must be >= 1, got {v}")
    for name in _POSITIVE:
        v = getattr(args, name)
        if v is not None and not 0 < v < math.inf:
            raise ValueError(f"{flag(name)} must be a finite number > 0, got {v}")
    if args.stages is not None and args.stages > MAX_RANKS:
        raise ValueError(f"--stages {args.stages}: at most {MAX_RANKS} ranks can be simulated; allowed: "
                         f"1..{MAX_RANKS}")
    if args.model is not None:
        refuse_given(args, _UNIFORM_ONLY, f"sets a uniform cost, but --model {args.model} times every unit in "
                                          f"seconds with the analytic model: give one of them (its links: "
                                          f"--dc-latency, --dc-bandwidth with units)")
        from .cost.devices import DEVICE_PRESETS
        from .cost.transformer import MODEL_PRESETS
        if args.model not in MODEL_PRESETS:
            raise ValueError(f"--model {args.model!r} unknown; allowed: {', '.join(MODEL_PRESETS)}")
        if args.device is not None and args.device not in DEVICE_PRESETS:
            raise ValueError(f"--device {args.device!r} unknown; allowed: {', '.join(DEVICE_PRESETS)}")
    else:
        real = bool(getattr(args, "real", False))  # emulate --real reads --seq and --micro-batch-size
        refuse_given(args, ("device",) if real else _MODEL_ONLY, "applies to the analytic model only: give --model too")
    if getattr(args, "recompute", None) not in (None, "none") and args.model is None \
            and not getattr(args, "real", False):
        raise ValueError(f"--recompute {args.recompute} is priced by the analytic model: give --model too (uniform "
                         f"costs have no recomputation)")
    if (args.dcs or 1) < 2:
        refuse_given(args, _DC_LINK, "describes the link between datacenters: give --dcs >= 2 as well")
    dc_link(args)


def _abstract_time(args: argparse.Namespace, name: str) -> float:
    """A time of uniform costs: a bare number in the time unit of --tf, >= 0."""
    text = getattr(args, name)
    try:
        v = float(text)
    except ValueError:
        raise ValueError(f"{flag(name)} {text!r}: uniform costs have no seconds; give a bare number in the time "
                         f"unit of --tf (e.g. {flag(name)} 2), or --model for costs in seconds") from None
    if not 0 <= v < math.inf:
        raise ValueError(f"{flag(name)} must be a finite number >= 0, got {v}")
    return v


def dc_link(args: argparse.Namespace, preset: Any = None) -> Any:
    """The cross-DC :class:`pipert.cost.LinkSpec` the flags give (None: none given): in the time
    unit of --tf with uniform costs, in seconds and bytes per second otherwise; what is not given
    comes from ``preset`` (a LinkSpec) or is free."""
    given = {k: getattr(args, k) for k in _DC_LINK if getattr(args, k) is not None}
    if not given:
        return None
    from .cost.topology import LinkSpec
    if not seconds_mode(args):
        if "dc_bandwidth" in given:
            raise ValueError(f"--dc-bandwidth {given['dc_bandwidth']}: a bandwidth needs message sizes in bytes, "
                             f"which uniform costs do not have; give --dc-transfer (each message's occupancy in the "
                             f"time unit of --tf), or --model")
        latency, transfer = (_abstract_time(args, k) if k in given else 0.0 for k in ("dc_latency", "dc_transfer"))
        return LinkSpec(latency, math.inf, transfer)
    from .linkflags import parse_bandwidth, parse_duration
    base = preset or LinkSpec()
    return LinkSpec(parse_duration(given["dc_latency"], "--dc-latency") if "dc_latency" in given else base.latency,
                    parse_bandwidth(given["dc_bandwidth"], "--dc-bandwidth") if "dc_bandwidth" in given
                    else base.bandwidth,
                    parse_duration(given["dc_transfer"], "--dc-transfer") if "dc_transfer" in given
                    else base.per_message)


def check_size(stages: int, units: int, microbatches: int, names: Iterable[str] = (), what: str = "") -> None:
    """Refuse a shape too large to build and simulate: more than :data:`MAX_RANKS` ranks, or more
    (unit, micro-batch) pairs than the limit of every family in ``names`` (:data:`PAIR_LIMITS`,
    else :data:`MAX_PAIRS`). ``what`` says how the counts came about (flags, a file)."""
    if stages > MAX_RANKS:
        raise ValueError(f"{what or f'--stages {stages}'}: {stages} ranks; at most {MAX_RANKS} can be simulated")
    pairs = units * microbatches
    limit, by = min(((PAIR_LIMITS.get(n, MAX_PAIRS), n) for n in names), default=(MAX_PAIRS, ""))
    if pairs > limit:
        who = f" for {by} (its builder searches)" if limit < MAX_PAIRS else ""
        raise ValueError(f"{what or f'--stages {stages} --microbatches {microbatches}'}: {units} units x "
                         f"{microbatches} micro-batches = {pairs} (unit, micro-batch) pairs, each several actions "
                         f"to build and simulate; allowed: at most {limit} pairs{who}")
