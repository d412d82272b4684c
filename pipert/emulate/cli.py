"""``pipert emulate``: run a schedule with all ranks in this process, links delayed."""
from __future__ import annotations

import argparse
import json
import math

__all__ = ["register", "cmd_emulate"]


def cmd_emulate(args: argparse.Namespace) -> int:
    from ..scenario import load_or_build
    from .emulator import emulate
    check_emulate_flags(args)
    sc, sched = load_or_build(args, args.schedule, _measured(args) if args.real else None)
    if args.real:
        return _real(args, sc, sched)
    unit = _time_unit(args) if args.time_unit is not None else (1.0 if args.model else 2e-3)
    res = emulate(sched, sc.cost_for(sched), sc.links, time_unit=unit)
    if args.trace:
        from ..sim.export import write_chrome_trace
        write_chrome_trace(res, args.trace, us_per_unit=unit * 1e6)
    if args.plot:
        from ..sim.export import gantt_png
        gantt_png(res, args.plot, title=f"{sched.name} (emulated): makespan {res.makespan:.4g}")
    if args.json:
        print(json.dumps({"schedule": sched.name, "measured_makespan": res.makespan,
                          "predicted_makespan": res.predicted, "ideal_makespan": res.ideal_makespan,
                          "relative_error": res.error,
                          "measured_bubble_ratio": res.bubble_ratio, "time_unit_s": unit}))
        return 0
    print(f"schedule            {sched.name}  (P={sched.num_ranks}, M={sched.num_microbatches})")
    print(f"time unit           {unit:g} s")
    print(f"measured makespan   {res.makespan:.6g}   ({res.makespan * unit * 1e3:.3f} ms)")
    print(f"simulated makespan  {res.predicted:.6g}")
    if res.ideal_makespan is not None:
        print(f"ideal-clock makespan {res.ideal_makespan:.6g}   (the issued delays without wake-up overhead)")
    print(f"difference          {res.error:+.2%}")
    for what, path in (("trace", args.trace), ("plot", args.plot)):
        if path:
            print(f"wrote measured {what} to {path}")
    return 0


def check_emulate_flags(args: argparse.Namespace) -> None:
    """The flags only emulate has, in constant time (the scenario's are checked with it)."""
    from ..scenario_flags import check_scenario_flags, refuse_given
    check_scenario_flags(args)
    if args.time_unit is not None and not 0 < _time_unit(args) < math.inf:
        raise ValueError(f"--time-unit must be a finite time > 0, got {args.time_unit!r}")
    if args.steps is not None and args.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {args.steps}")
    if not args.real:
        refuse_given(args, ("real_model", "steps"), "applies to the model's real units: give --real too")
        return
    refuse_given(args, ("time_unit", "trace", "plot"), "applies to timed compute, but --real runs the model's "
                                                       "real units and records no timeline: leave one of them out")
    from ..models import model_names
    if args.real_model is not None and args.real_model not in model_names():
        raise ValueError(f"--real-model {args.real_model!r} unknown; allowed: {', '.join(model_names())}")


def _time_unit(args: argparse.Namespace) -> float:
    """Seconds of one time unit (--time-unit: a time with a unit, or a bare number of seconds)."""
    from ..linkflags import parse_duration
    return parse_duration(args.time_unit, "--time-unit", bare="s")


def _real_units(args: argparse.Namespace, num_units: int, meta: dict) -> tuple[list, object, object]:
    """(units, inputs, targets) of --real: the --real-model preset cut into ``num_units`` units as
    a schedule with ``meta`` runs them, and M x --micro-batch-size sequences of --seq tokens
    (M: ``meta``'s micro-batches, else 1)."""
    import torch
    from ..models import model_config, model_from_config, partition
    from ..models.partition import check_unit_count
    from ..models.recompute import units_recompute
    cut = meta.get("cut")
    # a helix schedule fixes the layer count (2L+1 units): the preset is built with L layers
    extra = {"layers": meta["layers"]} if cut == "helix" else {}
    name = args.real_model or "tiny"
    cfg = model_config(name, max_seq=max(args.seq or 128, 16), **extra)
    check_unit_count(meta.get("name", args.schedule), num_units, name, cfg.layers, cut)
    units = partition(model_from_config(cfg, seed=0), num_units, cut=cut,
                      recompute=units_recompute(args.recompute, meta))
    seq, mbs = args.seq or 128, args.micro_batch_size or 2
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab, (meta.get("microbatches", 1) * mbs, seq + 1), generator=g)
    return units, tokens[:, :-1], tokens[:, 1:]


def _measured(args: argparse.Namespace):
    """Units count -> the real units' measured cost (seconds, bytes; ``pipert.linkplan``): what a
    generator that plans around the links reads under --real."""
    def cost(num_units: int):
        from ..linkplan import link_plan
        units, x, y = _real_units(args, num_units, {})
        return link_plan(units, x, y, None)["cost"]
    return cost


def _real(args: argparse.Namespace, sc, sched) -> int:
    """Real units of the built-in model; link flags take units (seconds, bytes per second)."""
    from .real import emulate_real
    units, x, y = _real_units(args, sched.num_units, {**sched.meta, "name": sched.name,
                                                      "microbatches": sched.num_microbatches})
    r = emulate_real(sched, units, x, y, sc.links, steps=args.steps or 5)
    out = {"schedule": sched.name, "measured_step_s": r.step_seconds, "predicted_step_s": r.predicted,
           "relative_error": r.error, "predicted_shared_step_s": r.predicted_shared,
           "relative_error_shared": r.error_shared, "shared_cores": r.capacity,
           "read": "predicted_step_s (any ranks per core: its times hold the waits for a core and for the "
                   "interpreter lock the threads share, which the shared one does not see)",
           "compute": "real units, measured in each traced step (pipert.tools.fidelity); shared: the ranks "
                      "share this host's cores"}
    width = max(map(len, out)) + 2
    print(json.dumps(out) if args.json else "\n".join(f"{k:<{width}}{v}" for k, v in out.items()))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    from ..scenario_flags import add_dp_arg, add_helix_args, add_options_arg, add_scenario_args
    p = sub.add_parser("emulate", help="run a schedule in one process with calibrated compute and delayed links")
    p.add_argument("schedule", help="registered schedule name, or a schedule file (.json, torch's .csv)")
    add_scenario_args(p)
    add_helix_args(p)
    add_options_arg(p)
    add_dp_arg(p)
    p.add_argument("--time-unit", default=None,
                   help="wall time of one time unit of the costs: 2ms, or a bare number of seconds (default 2ms "
                        "for uniform costs, 1s for --model; not with --real)")
    p.add_argument("--real", action="store_true",
                   help="run the built-in model's real units (local transport, delayed links; link flags with units: "
                        "--dc-latency 2ms --dc-bandwidth 1Gbps)")
    p.add_argument("--real-model", default=None, help="model preset for --real (LLaMA or gpt-*; default tiny)")
    p.add_argument("--steps", type=int, default=None, help="measured steps for --real (default 5)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--trace", help="write the measured timeline as a Chrome trace")
    p.add_argument("--plot", help="write the measured timeline as a PNG")
    p.set_defaults(fn=cmd_emulate)
