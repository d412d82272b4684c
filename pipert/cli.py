"""The ``pipert`` command: simulate | compare | export | train | emulate | plan."""
from __future__ import annotations

import argparse
import atexit
import importlib
import json
import os
import signal
import sys
from dataclasses import fields
from typing import Any, Callable

__all__ = ["main", "build_parser"]

_HELD: list = []
"""What a command's result holds (a simulated schedule and its graph: about 10^6 objects), kept past
the command's return: the process's own command then ends without freeing it one by one (main)."""


def _schedule_names() -> list[str]:
    from .schedules import available
    return available()


def cmd_simulate(args: argparse.Namespace) -> int:
    from .scenario import load_or_build
    from .sim import simulate
    from .sim.engine import paused_gc
    if args.grid and args.json:
        raise ValueError("--grid prints a text grid, but --json prints one JSON object only: give one of them")
    with paused_gc():  # building allocates one object per action and frees none of them cyclically
        sc, sched = load_or_build(args, args.schedule)
    if args.passes:
        from .ir.passes import apply_passes
        sched = apply_passes(sched, [n for n in args.passes.split(",") if n])
    # simulate() runs the validator's engine and raises its first error: one pass does both
    res = simulate(sched, sc.cost_for(sched), links=sc.links, topology=sc.topology, memory_limit=sc.memory_limit,
                   transport=args.transport, nic_bandwidth=sc.nic_bandwidth)
    if args.trace:
        from .sim.export import write_chrome_trace
        write_chrome_trace(res, args.trace)
    if args.plot:
        from .sim.export import plot_gantt
        plot_gantt(res, args.plot)
    if args.save:
        sched.save(args.save)
    nccl = _nccl_facts(sched) if args.transport == "nccl" else {}
    _HELD.append((sched, res))
    if args.json:
        print(json.dumps({
            "schedule": sched.name, "stages": sched.num_ranks, "microbatches": sched.num_microbatches,
            "units": sched.num_units, "dp": sc.dp, "zero": sc.zero, "tp": sc.tp, "sp": sc.sp, "makespan": res.makespan,
            "bubble_ratio": res.bubble_ratio,
            "peak_memory": list(res.peak_memory), "comm_bytes": dict(res.comm_bytes),
            "busy": list(res.busy), "exposed_comm": list(res.exposed_comm), "nic_bandwidth_Bps": sc.nic_bandwidth,
            **nccl}))
        return 0
    ranks = f"P={sc.stages} x D={sc.dp} ranks{f', ZeRO {sc.zero}' if sc.zero else ''}" if sc.dp > 1 \
        else f"P={sched.num_ranks}"
    print(f"schedule      {sched.name}  ({ranks}, M={sched.num_microbatches}, units={sched.num_units})")
    if sc.tp > 1:
        print(f"tensor par.   T={sc.tp}{', SP' if sc.sp else ''}: {sched.num_ranks * sc.tp} devices; every time and "
              f"size below is one device's (TP collectives inside the computes)")
    if sc.nic_bandwidth is not None:
        print(f"shared NIC    {sc.describe_nic()}")
    print(f"makespan      {res.makespan:.6g}")
    print(f"bubble ratio  {res.bubble_ratio:.4f}")
    print(f"peak memory   {', '.join(f'{m:.6g}' for m in res.peak_memory)}")
    print(f"comm bytes    {', '.join(f'{k}={v:.6g}' for k, v in res.comm_bytes.items()) or 'none'}")
    if nccl:
        print(f"communicators {len(nccl['communicators'])}, warmed up in this order: {' '.join(nccl['communicators'])}")
        print(f"without warm-up {nccl['startup_without_warmup']}")
    if args.grid:
        from .sim.export import text_grid
        print(text_grid(res))
    for what, path in (("trace", args.trace), ("plot", args.plot), ("schedule", args.save)):
        if path:
            print(f"wrote {what} to {path}")
    return 0


def _nccl_facts(sched: Any) -> dict:
    """Under NCCL: the communicators in warm-up order, and what start-up without warm-up does."""
    from .comm.nccl import describe_hang, startup_hang, warmup_order
    blocked = startup_hang(sched)
    return {"communicators": [str(c) for c in warmup_order(sched)],
            "startup_without_warmup": ("deadlock: " + describe_hang(sched, blocked)) if blocked else "completes"}


def cmd_compare(args: argparse.Namespace) -> int:
    from .compare import compare, print_ranking
    from .scenario import load_or_build, scenario_from_args
    names = args.schedules.split(",") if args.schedules else None
    if names:
        from .schedules import family
        for name in names:
            family(name)  # an unknown name is a typo, not a schedule that does not apply: refused
    if args.file:
        sc, sched = load_or_build(args, args.file)
        rows = compare(sc, names=names, files=[sched])
    else:
        sc = scenario_from_args(args)
        rows = compare(sc, names=names)
    if args.json:
        print(json.dumps([r.as_dict() for r in rows]))
    else:
        print_ranking(rows, sc)
    if args.plot:
        from .compare import plot_comparison
        plot_comparison(rows, sc, args.plot)
        if not args.json:
            print(f"wrote {args.plot}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .ir.files import dump_schedule
    from .scenario import load_or_build
    if args.receives is not None and not args.comms:
        raise ValueError(f"--receives {args.receives} applies with --comms only: a compute-only order holds no "
                         f"receives")
    _, sched = load_or_build(args, args.schedule)
    if args.passes:
        from .ir.passes import apply_passes
        sched = apply_passes(sched, [n for n in args.passes.split(",") if n])
    text = dump_schedule(sched, args.format, comms=args.comms, receives=args.receives or "program")
    if args.output:
        with open(args.output, "w", newline="") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


_FILE_SHAPED = ("stages", "microbatches", "chunks")
"""Train flags a schedule file sets (the parser leaves them None unless given)."""
_SHORT_FLAGS = {"stages": "-P", "microbatches": "-M"}  # as in simulate, compare, export, emulate, plan


def cmd_train(args: argparse.Namespace) -> int:
    from .ir.files import is_schedule_file, load_schedule
    from .train import TrainConfig, run_train
    values = {f.name: getattr(args, f.name) for f in fields(TrainConfig)}
    defaults = TrainConfig()
    if args.plan:
        _take_plan(args.plan, values, getattr(args, "given", set()))
    if is_schedule_file(values["schedule"]):
        from .scenario import file_shape
        given = {"--stages": args.stages, "--microbatches": None if args.microbatches is None else
                 args.microbatches // max(values["dp"], 1), "--chunks": args.chunks}
        P, M, V = file_shape(load_schedule(values["schedule"]), given, values["schedule"])
        values.update(stages=P, microbatches=M * max(values["dp"], 1), chunks=V)
    for name in _FILE_SHAPED:
        if values[name] is None:
            values[name] = getattr(defaults, name)
    from .launch.failures import LaunchError
    try:
        run_train(TrainConfig(**values))
    except LaunchError as e:
        _end_progress_line(values)
        print(e.report(), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        _end_progress_line(values)
        raise
    return 0


def _end_progress_line(values: dict) -> None:
    """Without --json rank 0 draws a progress bar on stderr, which a stopped or failed job leaves
    without its newline: what follows starts on a line of its own."""
    if not values["json"]:
        sys.stderr.write("\n")


class _Given(argparse.Action):
    """Stores the value (``const`` for a flag without one) and records the flag's dest in
    ``namespace.given``, so that a flag given with its default value is told from one left out."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any, option_string: Any = None) -> None:
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)
        namespace.given = getattr(namespace, "given", set()) | {self.dest}


def _take_plan(path: str, values: dict, given_flags: set) -> None:
    """The plan's settings into ``values``; a flag given with another value is refused."""
    from .planner.planfile import load_plan, train_settings
    for name, want in train_settings(load_plan(path)).items():
        given = values[name]
        if name not in given_flags:
            values[name] = want
        elif given != want:
            flag = _SHORT_FLAGS.get(name, "--" + name.replace("_", "-"))
            raise ValueError(f"{flag} {given} conflicts with --plan {path}, which sets {want!r}; leave {flag} out "
                             f"(or give the plan's value)")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``pipert`` parser; ``only``: with just that command's sub-parser (``main`` parses with
    it, so one command does not import what the others need to declare their flags)."""
    p = argparse.ArgumentParser(prog="pipert", description="Pipeline-parallel training: simulate, compare, train, "
                                "emulate and plan schedules (GPipe, 1F1B, ZB, WeiPipe, TawPipe, CrossPipe).")
    from . import __version__
    p.add_argument("--version", action="version", version=f"pipert {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    for name, add in _COMMANDS.items():
        if only is None or name == only:
            add(sub)
    sub.metavar = "{" + ",".join(_COMMANDS) + "}"  # a missing command is named by its choices
    return p


def _add_simulate(sub: Any) -> None:
    from .scenario_flags import add_dp_arg, add_helix_args, add_options_arg, add_scenario_args, add_tp_args
    s = sub.add_parser("simulate", help="simulate one schedule on one scenario")
    s.add_argument("schedule", help="registered schedule name, or a schedule file: pipert's .json, torch.pipelining's "
                   ".csv (_dump_csv) or its orders as .json; the file's shape (ranks, units, micro-batches) is kept")
    add_scenario_args(s)
    add_tp_args(s)
    add_helix_args(s)
    add_options_arg(s)
    add_dp_arg(s)
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument("--trace", help="write a Chrome-trace JSON (open in Perfetto)")
    s.add_argument("--plot", help="write a PNG Gantt chart")
    s.add_argument("--grid", action="store_true", help="print a time-aligned text grid")
    s.add_argument("--passes", default="", help="comma-separated lowering passes applied before simulating, as "
                   "pipert train --passes applies them (recompute, offload_stashes, offload_weights, "
                   "expand_folds, merge_sub_blocks, post_receives_early, receives_at_consumer, send_early)")
    s.add_argument("--save", help="write the schedule as JSON (after --passes)")
    s.add_argument("--transport", default="gloo", choices=("gloo", "nccl"),
                   help="communication rules the program is checked and timed under: gloo, or nccl (a "
                   "communicator per direction of a rank pair and per group, warmed up before the step, each "
                   "running its operations in posting order; docs/semantics.md)")
    s.set_defaults(fn=cmd_simulate)


def _add_compare(sub: Any) -> None:
    from .scenario_flags import add_helix_args, add_options_arg, add_scenario_args, add_tp_args
    c = sub.add_parser("compare", help="simulate every applicable schedule on one scenario, ranked")
    c.add_argument("file", nargs="?", default=None, help="a schedule file (as for simulate), ranked against the "
                   "registered schedules on its shape")
    add_scenario_args(c)
    add_tp_args(c)
    add_helix_args(c)
    add_options_arg(c)
    c.add_argument("--schedules", help="comma-separated names (default: all registered)")
    c.add_argument("--json", action="store_true", help="print a JSON list")
    c.add_argument("--plot", default="pipert-compare.png", help="PNG with one Gantt chart per schedule ('' to skip)")
    c.set_defaults(fn=cmd_compare)


def _add_export(sub: Any) -> None:
    from .scenario_flags import add_helix_args, add_options_arg, add_scenario_args
    from .ir.files import EXPORT_FORMATS, RECEIVES
    e = sub.add_parser("export", help="write a schedule as pipert JSON, a text grid, or torch.pipelining's CSV/JSON")
    e.add_argument("schedule", help="registered schedule name, or a schedule file (converted)")
    add_scenario_args(e)
    add_helix_args(e)
    add_options_arg(e)
    e.add_argument("--format", default="json", choices=EXPORT_FORMATS,
                   help="json: pipert's schedule file; text: every action, one column per rank; torch-csv: "
                   "torch's _dump_csv form (load it with _load_csv); torch-json: the same rows as JSON")
    e.add_argument("--comms", action="store_true", help="torch formats: include SEND_F/RECV_F/SEND_B/RECV_B and "
                   "REDUCE_GRAD (torch's compute_comms form: _PipelineScheduleRuntime._load_csv(path, "
                   "format='compute_comms') runs it); default: compute only")
    e.add_argument("--receives", default=None, choices=list(RECEIVES), help="with --comms, where each receive "
                   "stands: " + "; ".join(f"{k}: {v}" for k, v in RECEIVES.items()) + " (default: program)")
    e.add_argument("--passes", default="", help="comma-separated lowering passes applied before writing")
    e.add_argument("--output", "-o", default=None, help="file to write (default: standard output)")
    e.set_defaults(fn=cmd_export)


def _add_train(sub: Any) -> None:
    from .linkflags import duration_arg
    from .train import TrainConfig
    t = sub.add_parser("train", help="train the built-in model with a pipeline schedule")
    defaults = TrainConfig()
    types = {"lr": float, "timeout": duration_arg("s")}  # the others: their default's type, else int
    for f in fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        default = getattr(defaults, f.name)
        doc = (_TRAIN_HELP.get(f.name) or _shared_help(f.name)) + \
            (f" (default: {default})" if default not in (None, False, "") else "")
        if isinstance(default, bool):
            t.add_argument(flag, action=_Given, nargs=0, const=True, default=False, help=doc)
        else:
            kind = types.get(f.name) or (type(default) if default is not None else int)
            names = (flag, _SHORT_FLAGS[f.name]) if f.name in _SHORT_FLAGS else (flag,)
            t.add_argument(*names, type=kind, default=None if f.name in _FILE_SHAPED else default, action=_Given,
                           help=doc + (" or a schedule file's" if f.name in _FILE_SHAPED else ""))
    t.set_defaults(fn=cmd_train)


def _shared_help(name: str) -> str:
    from .scenario_flags import OPTIONS_HELP
    return OPTIONS_HELP if name == "options" else ""


def _registered(module: str) -> Callable[[Any], None]:
    """The ``register(sub)`` of a command module, imported when the command is declared."""
    def add(sub: Any) -> None:
        importlib.import_module(module, __package__).register(sub)
    return add


_COMMANDS: dict[str, Callable[[Any], None]] = {
    "simulate": _add_simulate, "compare": _add_compare, "export": _add_export, "train": _add_train,
    "emulate": _registered(".emulate.cli"), "plan": _registered(".plan"), "bench": _registered(".bench")}
"""Each command and the function that declares its sub-parser, in the order help lists them."""


_TRAIN_HELP = {
    "schedule": "registered schedule name or a schedule file (.json, torch's .csv)", "stages": "pipeline ranks P", "microbatches": "micro-batches per step M",
    "chunks": "units per rank for interleaved schedules", "ranks_per_node": "ranks per node (tawpipe)",
    "dp": "data-parallel replicas D of the pipeline (stages x dp processes)",
    "plan": "a PipeMesh plan file (pipert plan --pipemesh ... --save FILE): sets --schedule, -P, --dp, --chunks, -M, "
            "--options (sequences, buckets as units per chunk), --zero, --zero3-buffers, --recompute, --tp/--sp; "
            "a flag given with another value is refused",
    "zero": "ZeRO over the replicas (needs --dp > 1): a stage 0-3 for every unit, or per parameter: rules "
            "'3:mlp,2:attn,1' (first pattern contained in the name wins, last entry the default) or shares "
            "'p=0.4,g=0.7' (ZeRO-3 and ZeRO-2/3 shares of each unit, largest parameters first)",
    "tp": "tensor-parallel processes T per pipeline rank (stages x dp x tp processes)",
    "mesh_order": "the process mesh's dimensions, outermost first: a permutation of dp,pp,tp; tp last keeps each "
                  "TP group on consecutive ranks (one node); docs/tensor_parallel.md",
    "sp": "sequence parallelism in each TP group (with --tp > 1): norms and stage boundaries split along the sequence",
    "zero3_buffers": "gathered copies of ZeRO-3 weights: 1, or 2 (forward and backward computes apart)",
    "passes": "comma-separated lowering passes: recompute, offload_stashes, offload_weights, expand_folds, ...",
    "steps": "training steps", "batch_size": "sequences per step", "seq": "tokens per sequence",
    "model": "model preset: tiny, small, medium, large, gpt-tiny, gpt-small, gpt-1.3b, gpt-3b, gpt-7b; or a "
             "LLaMA-shaped model by its sizes: layers=32,hidden=4096,heads=32[,kv_heads=..,ffn=..,vocab=..,max_seq=..]",
    "mlp_chunk": "token rows per chunk of the chunked MLP (pipert.kernels); 0: the plain MLP",
    "mlp_recompute": "chunked MLP: save only its input, recompute pre-activations in backward",
    "recompute": "recompute inside units: none, no_attention (keep attention output + softmax stats), full, or "
                 "keep:GROUP,... (keep those op groups: attention, projection, activation, norm; recompute the rest) "
                 "(default: the schedule's: no_attention for helixpipe-2fold, else none)",
    "sync_folds": "helixpipe-2fold: one compute and one message per fold pair, not the asynchronous two-fold",
    "loss_in_forward": "helixpipe-2fold: LM head and loss in the last unit's forward, not its backward",
    "dtype": "float32, float64 or bfloat16",
    "lr": "AdamW learning rate (default 3e-3; on --resume the checkpoint's, which a given --lr replaces)",
    "backend": "auto, gloo, nccl, nccl-sim (gloo processes that follow NCCL's rules) or local", "seed": "initialisation and data seed",
    "check": "also run the single-process reference step; report relative errors",
    "json": "one JSON object per step instead of a progress bar",
    "timeout": "time any communication may wait before the run fails: 90s, 2min, or a bare number of seconds",
    "dcs": "datacenters: ranks (replica d's stage s is rank d*P+s) split into equal consecutive blocks; messages "
           "and --dp collectives between them delayed as the simulator prices them",
    "dc_latency": "latency between datacenters (with --dcs), with a unit: 20ms, 150us (a bare number is refused)",
    "dc_bandwidth": "bandwidth between datacenters (with --dcs), with a unit: 10Gbps, 400MB/s (default unlimited)",
    "node_latency": "latency between nodes of a datacenter (with --ranks-per-node), with a unit: 10us",
    "node_bandwidth": "bandwidth between nodes of a datacenter (with --ranks-per-node), with a unit: 200Gbps",
    "profile": "measure each unit's compute times on the running job; print the simulator's step time beside "
               "the measured one",
    "save": "folder of checkpoints (DCP, one step-N folder each); one is written after the last step; the folder "
            "belongs to one run (DIR/run.json): another run's folder is refused",
    "save_every": "also write a checkpoint every N steps (with --save)",
    "resume": "resume from a checkpoint folder (or a --save folder: its newest, which must be complete); --steps is "
              "the total; --model, --dtype, --seq, --batch-size, --seed must be the checkpoint's",
}


def main(argv: list[str] | None = None) -> int:
    """Run the command in ``argv`` (None: the process's own command line, whose end is the process's:
    see _leave) and return its exit status."""
    line = sys.argv[1:] if argv is None else argv
    parser = build_parser(line[0] if line and line[0] in _COMMANDS else None)
    args = parser.parse_args(argv)
    try:
        rc = _run(args)
        if argv is None and _HELD:
            _leave(rc)
    finally:
        _HELD.clear()
    return rc


def _leave(rc: int) -> None:
    """End the process with status ``rc`` as the interpreter's exit would, less freeing what _HELD
    holds object by object (0.1 s for a large simulation): atexit handlers run, stdout and stderr
    are flushed, then os._exit. Only for main(None): the process's own command, after which
    nothing runs (the console script and ``python -m pipert`` call sys.exit(main()))."""
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # the reader closed early: as main's handler, quietly
        rc = 141
    os._exit(rc)


def _run(args: argparse.Namespace) -> int:
    """The command's exit status; its usual failures as a message on stderr and a status."""
    try:
        return args.fn(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"pipert {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C, or a stop signal the launcher passed on after ending its ranks
        signum = getattr(e, "signum", signal.SIGINT)
        print(f"pipert {args.command}: stopped by {signal.Signals(signum).name}", file=sys.stderr)
        return 128 + signum
    except BrokenPipeError:  # the reader closed early (e.g. `| head`): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
