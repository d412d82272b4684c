"""``pipert plan --auto``: its flags, their checks, and the ranked table or JSON it prints
(docs/planner.md). Every size, time and bandwidth takes a unit; a bad value is refused naming
the flag, the value and what is allowed, before any work."""
from __future__ import annotations

import argparse
import json
import math
import shlex
from typing import Any

from .cluster import Cluster, parse_size

__all__ = ["add_auto_args", "check_auto_flags", "cmd_auto", "model_from_flag", "AUTO_ONLY", "NOT_AUTO"]

AUTO_ONLY = ("gpus_per_node", "nodes", "gpu_memory", "intra_node_latency", "intra_node_bandwidth", "node_latency",
             "node_bandwidth", "schedules", "top", "profile", "save_schedule", "jobs")
"""Flags only ``--auto`` reads."""
NOT_AUTO = ("microbatches", "chunks", "tf", "tb", "td", "tw", "ranks_per_node", "dc_transfer", "memory_limit",
            "optimal", "pp_vs_dp", "latencies", "bandwidths", "pipemesh", "paper", "memory_budget", "inter_node_gbps")
"""Flags of the other modes of ``plan`` that ``--auto`` does not read (with the one it reads instead)."""
_INSTEAD = {"ranks_per_node": "--gpus-per-node", "memory_limit": "--gpu-memory", "memory_budget": "--gpu-memory",
            "inter_node_gbps": "--node-bandwidth", "microbatches": "--batch (and --micro-batch-size)",
            "chunks": "the search's V"}
_SIZES = ("layers", "hidden", "ffn", "heads", "kv_heads", "vocab", "seq")


def add_auto_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("automatic planner (--auto: every family x layout, ranked by simulated step time; "
                             "also reads --model, --device, --dcs, --dc-latency, --dc-bandwidth, --batch, --tp, "
                             "--sp, --dp, -P, --micro-batch-size, --seq, --time-limit, --json)")
    g.add_argument("--auto", action="store_true", help="search every schedule family and layout (P, D, T, V, "
                   "micro-batches, recomputation, ZeRO) for --model on the cluster; print the best's command")
    g.add_argument("--gpus-per-node", type=int, default=None, help="devices per node (default 8)")
    g.add_argument("--nodes", type=int, default=None, help="nodes in all, split evenly over --dcs (default 1)")
    g.add_argument("--gpu-memory", default=None, help="memory per device with a unit: 80GiB (default: --device's)")
    g.add_argument("--intra-node-latency", default=None, help="latency inside a node, with a unit (default 5us)")
    g.add_argument("--intra-node-bandwidth", default=None, help="bandwidth between two devices of a node, with a "
                   "unit (default 200GB/s)")
    g.add_argument("--node-latency", default=None, help="latency between nodes of a datacenter (default 10us)")
    g.add_argument("--node-bandwidth", default=None, help="bandwidth per device between nodes, with a unit "
                   "(default 200Gbps)")
    g.add_argument("--schedules", default=None, help="comma-separated families to search (default: "
                   "1f1b, interleaved-1f1b, zb-h1, zb-v, weipipe-interleave, tawpipe, helixpipe-2fold, pipemesh, "
                   "crosspipe-greedy)")
    g.add_argument("--top", type=int, default=None, help="rows of the table (default 5)")
    g.add_argument("--profile", action="store_true", help="first measure this machine (one real unit profile of "
                   "--model, a pipert train preset, and the link of two gloo processes) and plan with those")
    g.add_argument("--jobs", type=int, default=None, help="processes simulating at once (default: the cores "
                   "this process may use; forked; 1 with --profile)")
    g.add_argument("--save-schedule", default=None, help="write the best runnable layout's schedule as JSON; the "
                   "printed command then runs that file")


def model_from_flag(text: str | None, seq: int | None = None) -> tuple[Any, str]:
    """(ModelSpec, name) of ``--model``: a preset (7b) or sizes (layers=32,hidden=4096,heads=32; optional
    ffn, kv_heads, vocab, seq)."""
    from ..cost.transformer import MODEL_PRESETS, ModelSpec, llama_like
    if text is None:
        raise ValueError(f"--auto plans for a model: give --model, a preset ({', '.join(MODEL_PRESETS)}) or sizes "
                         f"(layers=32,hidden=4096,heads=32)")
    over = {"seq": seq} if seq is not None else {}
    if "=" not in text:
        if text not in MODEL_PRESETS:
            raise ValueError(f"--model {text!r} unknown; allowed: {', '.join(MODEL_PRESETS)}, or sizes "
                             f"layers=..,hidden=..,heads=..")
        return ModelSpec.preset(text, **over), text
    sizes: dict[str, int] = {}
    for pair in text.split(","):
        k, _, v = pair.partition("=")
        k = k.strip().replace("-", "_")
        if k not in _SIZES or not v.strip().isdigit() or int(v) < 1:
            raise ValueError(f"--model {text!r}: {pair!r} is not size=positive integer; allowed sizes: "
                             f"{', '.join(_SIZES)}")
        sizes[k] = int(v)
    missing = [k for k in ("layers", "hidden", "heads") if k not in sizes]
    if missing:
        raise ValueError(f"--model {text!r}: give {', '.join(missing)} too (layers, hidden and heads are needed)")
    sizes.update({"seq": seq} if seq else {})
    try:
        spec = llama_like(sizes.pop("hidden"), sizes.pop("layers"), **sizes)
    except ValueError as e:
        raise ValueError(f"--model {text!r}: {e}") from None
    return spec, "custom"


def cluster_from_args(args: argparse.Namespace) -> Cluster:
    """The cluster of the flags (links: the presets with what the flags give replaced)."""
    from ..cost.devices import DEVICE_PRESETS, DeviceSpec
    from ..cost.topology import LinkSpec, default_link_specs
    from ..linkflags import parse_bandwidth, parse_duration
    name = args.device or "h100"
    if name not in DEVICE_PRESETS:
        raise ValueError(f"--device {name!r} unknown; allowed: {', '.join(DEVICE_PRESETS)}")
    device = DeviceSpec.preset(name)
    if args.gpu_memory is not None:
        device = DeviceSpec.preset(name, memory=parse_size(args.gpu_memory, "--gpu-memory"))
    dcs = args.dcs or 1
    nodes = args.nodes if args.nodes is not None else 1
    if dcs > 1 and args.nodes is None:
        nodes = dcs
    links = default_link_specs()
    for cls, lat, bw in (("intra_node", "intra_node_latency", "intra_node_bandwidth"),
                         ("inter_node", "node_latency", "node_bandwidth"),
                         ("inter_dc", "dc_latency", "dc_bandwidth")):
        s = links[cls]
        flag_l, flag_b = "--" + lat.replace("_", "-"), "--" + bw.replace("_", "-")
        latency = s.latency if getattr(args, lat) is None else parse_duration(getattr(args, lat), flag_l)
        bandwidth = s.bandwidth if getattr(args, bw) is None else parse_bandwidth(getattr(args, bw), flag_b)
        if not math.isfinite(latency):
            raise ValueError(f"{flag_l} {getattr(args, lat)}: must be a finite time")
        links[cls] = LinkSpec(latency, bandwidth)
    return Cluster(args.gpus_per_node if args.gpus_per_node is not None else 8, nodes, dcs, device, links)


def check_auto_flags(args: argparse.Namespace) -> None:
    """The flags of ``--auto`` alone and together, before any work; flags of ``--auto`` without it."""
    from ..scenario_flags import flag, refuse_given
    if not args.auto:
        refuse_given(args, AUTO_ONLY, "is a flag of the automatic planner: give --auto too")
        return
    for name in NOT_AUTO:
        instead = f" (it reads {_INSTEAD[name]})" if name in _INSTEAD else ""
        refuse_given(args, (name,), f"does not apply to --auto{instead}")
    for name in ("gpus_per_node", "nodes", "dcs", "top", "jobs", "batch", "tp", "dp", "stages", "seq",
                 "micro_batch_size"):
        v = getattr(args, name, None)
        if v is not None and v < 1:
            raise ValueError(f"{flag(name)} must be >= 1, got {v}")
    if (args.dcs or 1) < 2:
        refuse_given(args, ("dc_latency", "dc_bandwidth"), "describes the link between datacenters: give --dcs >= 2")
    if args.dcs and args.nodes is not None and args.nodes % args.dcs:
        raise ValueError(f"--nodes {args.nodes} do not split into --dcs {args.dcs} equal datacenters; allowed "
                         f"--nodes: a multiple of {args.dcs}")
    if args.time_limit is not None and not 0 < args.time_limit < math.inf:
        raise ValueError(f"--time-limit must be a finite time > 0, got {args.time_limit}")
    if args.schedules:
        from ..schedules import available
        bad = [n for n in args.schedules.split(",") if n not in available()]
        if bad:
            raise ValueError(f"--schedules: unknown {', '.join(bad)}; allowed: {', '.join(available())}")


def cmd_auto(args: argparse.Namespace) -> int:
    from ..linkflags import format_duration
    from .auto import search
    from .command import not_runnable, train_model
    from .layouts import FAMILIES
    from .runner import default_jobs
    check_auto_flags(args)
    spec, name = model_from_flag(args.model, args.seq)
    cluster = cluster_from_args(args)
    if args.tp is not None and cluster.gpus_per_node % args.tp:
        raise ValueError(f"--tp {args.tp}: a tensor-parallel group lies inside a node of --gpus-per-node "
                         f"{cluster.gpus_per_node}; allowed --tp: divisors of {cluster.gpus_per_node}")
    batch = args.batch if args.batch is not None else 4 * cluster.gpus
    cost_for, measured, tp = None, {}, args.tp
    if args.profile:
        if tp not in (None, 1):
            raise ValueError(f"--tp {tp}: --profile measures whole units on this machine; allowed --tp: 1")
        tp = 1
        from .measure import measured_cluster
        cluster, cost_for, measured = measured_cluster(train_model(name, spec) or name, spec, cluster)
    families = tuple(args.schedules.split(",")) if args.schedules else FAMILIES
    res = search(spec, cluster, batch, families=families, tp=tp, sp=bool(args.sp), stages=args.stages,
                 dp=args.dp, micro_batch=args.micro_batch_size, top=args.top or 5,
                 time_budget=args.time_limit if args.time_limit is not None else 25.0, cost_for=cost_for,
                 jobs=args.jobs or default_jobs(), wanted=lambda c: not not_runnable(c))
    model = train_model(name, spec)
    rows = _rows(res.ranked[:args.top or 5], model or name, spec, cluster)
    best = _best_runnable(res.ranked, name, model, spec, cluster, args.save_schedule)
    if args.json:
        print(json.dumps({"model": {"name": name, "params": spec.num_params, "layers": spec.layers,
                                    "seq": spec.seq}, "cluster": _cluster_dict(cluster), "batch": batch,
                          "measured": measured, "search": res.as_dict(), "ranking": rows, "best": best}))
        return 0 if res.ranked else 1
    print(f"{name} ({spec.num_params / 1e9:.3g}B parameters, seq {spec.seq}) on {cluster.describe()}")
    print(f"global batch {batch} sequences; {res.layouts} layouts in {res.seconds:.1f} s: {res.simulated} "
          f"simulated, {res.pruned_bound} left out by the lower bound, {res.pruned_memory} by memory"
          + (f", {res.not_run} not reached in the time limit" if res.not_run else "")
          + (f", {sum(res.failed.values())} failed" if res.failed else ""))
    for why, n in sorted(res.failed.items()):
        print(f"failed: {why} ({n}x)")
    if res.not_run:
        print(f"stopped at the time limit ({args.time_limit or 25.0:g} s, --time-limit): the layouts not reached "
              f"have lower bounds from {format_duration(res.next_bound)}"
              + ("; none of them beats the best found" if res.ranked and res.next_bound >= res.ranked[0].step
                 else ""))
    if measured:
        print("measured: " + ", ".join(f"{k} {v}" for k, v in measured.items() if k != "units"))
    if not res.ranked:
        common = sorted({**res.skipped, **res.failed}.items(), key=lambda kv: -kv[1])[:3]
        print("nothing fits: " + (f"every layout needs more than {cluster.device.memory / 2**30:g} GiB per device "
                                  f"(--gpu-memory)" if res.pruned_memory else
                                  "no layout could be built; most common reasons: " +
                                  "; ".join(f"{why} ({n}x)" for why, n in common)))
        return 1
    print(_table(rows))
    if best is None:
        print("no command: none of the layouts found runs under pipert train (" +
              "; ".join(sorted({r['why_not'] for r in rows if r['why_not']})) + ")")
        return 0
    if best["rank"] != 1:
        print(f"the fastest has no command ({rows[0]['why_not']}); the fastest pipert train runs is rank "
              f"{best['rank']}:")
    print(f"command ({best['describe']}, step {format_duration(best['step_s'])}):")
    print("  " + best["command"])
    for note in best["notes"]:
        print("note: " + note)
    return 0


def _rows(cands: list, name: str, spec: Any, cluster: Cluster) -> list[dict]:
    from .command import command_line, not_runnable, train_argv
    out = []
    for k, c in enumerate(cands, 1):
        why = not_runnable(c)
        argv = None if why else train_argv(c, name, spec.seq, spec.dtype_bytes)
        out.append({"rank": k, **c.as_dict(), "why_not": why, "train_args": argv,
                    "command": command_line(argv, cluster) if argv else None})
    return out


def _best_runnable(cands: list, name: str, model: str | None, spec: Any, cluster: Cluster,
                   save: str | None) -> dict | None:
    """The fastest candidate pipert train runs: its command (a saved schedule file with ``save``) and
    notes. ``model``: what ``pipert train --model`` takes for ``name`` (``command.train_model``)."""
    from .command import command_line, cpu_argv, not_runnable, runtime_models, train_argv
    for k, c in enumerate(cands, 1):
        if not_runnable(c):
            continue
        notes = []
        schedule = None
        if save:
            _save_schedule(c, spec, cluster, save)
            schedule = save
            notes.append(f"wrote the simulated schedule to {save}: the command runs exactly that order")
        elif c.layout.family == "crosspipe-greedy":
            notes.append(f"{c.layout.family} orders its actions by the planner's costs and links; pipert train "
                         f"builds it without them (give --save-schedule FILE to run the simulated order)")
        argv = train_argv(c, model or name, spec.seq, spec.dtype_bytes, schedule)
        models = runtime_models()
        cpu = None
        if model != name:
            cpu = cpu_argv(c)
            said = (f"pipert train has no model {name!r} (its presets: {', '.join(models)}): the layout flags "
                    f"stand for your own model" if model is None else
                    f"pipert train's preset {name!r} is another model: --model gives the sizes planned"
                    if name in models else
                    f"pipert train has no preset {name!r}: --model gives its sizes" if "=" in model else
                    f"pipert train's preset {model!r} has the sizes of {name!r}")
            notes.append(f"{said}; scaled down to a CPU (--model tiny, P=2, D<=2, T=1, gloo): pipert train "
                         f"{shlex.join(cpu)}")
        return {"rank": k, **c.as_dict(), "describe": c.layout.describe(), "train_args": argv,
                "command": command_line(argv, cluster), "cpu_train_args": cpu, "notes": notes}
    return None


def _save_schedule(c: Any, spec: Any, cluster: Cluster, path: str) -> None:
    from .auto import schedule_of
    schedule_of(spec, cluster, c).save(path)


def _table(rows: list[dict]) -> str:
    head = (f"{'rank':<5}{'schedule':<20}{'P':>4}{'D':>4}{'T':>3}{'V':>3}{'M':>5}{'b':>3}{'ZeRO':>5}  "
            f"{'recompute':<13}{'step s':>10}{'bubble':>8}{'exp.comm s':>11}{'memory':>11}  runs")
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['rank']:<5}{r['schedule']:<20}{r['P']:>4}{r['D']:>4}{r['T']:>3}{r['V']:>3}{r['M']:>5}"
                     f"{r['micro_batch']:>3}{r['zero']:>5}  {r['recompute']:<13}{r['step_s']:>10.4g}"
                     f"{r['bubble']:>8.1%}{r['exposed_comm_s']:>11.4g}{_size(r['memory_bytes']):>11}  "
                     f"{'yes' if not r['why_not'] else 'no'}")
    return "\n".join(lines)


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n:.0f} B"


def _cluster_dict(c: Cluster) -> dict:
    return {"gpus_per_node": c.gpus_per_node, "nodes": c.nodes, "dcs": c.dcs, "device": c.device.name,
            "memory_bytes": c.device.memory,
            "links": {k: {"latency_s": s.latency, "bandwidth_Bps": s.bandwidth if math.isfinite(s.bandwidth) else None}
                      for k, s in c.links.items() if k != "local"}}
