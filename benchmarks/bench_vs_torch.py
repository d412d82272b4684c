"""pipert against PyTorch: torch.distributed.pipelining, and a plain training loop.

Multi-rank: for P in {2, 4} gloo processes, schedules GPipe, 1F1B and interleaved 1F1B
(V = 2) and M in {P, 2P}, pipert's ``Pipeline(backend="dist")`` and torch's
``PipelineStage`` + schedule train the same LLaMA units (same seed, same batches, SGD) in
the same processes (a fresh launch per configuration). Steps alternate between the two
(ABBA order), each timed from a barrier to a barrier, so machine noise hits both; the
ratio is taken per pair of adjacent steps. Both sides' losses are compared every step, the
parameters after the last step, and torch's executed forward/backward order against
pipert's schedule (apples to apples).

Single stage: pipert's ``Pipeline`` with P = 1 ('1f1b', M micro-batches, backend "local")
against a plain loop doing the same gradient accumulation and SGD step, alternating too.

After the timed steps, a few breakdown steps per configuration split each rank's step into
forward, backward, optimizer and everything else, from each runtime's own compute times
(``_breakdown``: pipert traced, torch's stage calls timed from outside); cProfile is not used, as
it sees only its own thread and pipert computes on ``pipert._C`` worker threads.

Writes benchmarks/results/vs_torch.csv (ratios), vs_torch_breakdown.csv, vs_torch_sync.csv,
vs_torch.context.json (hardware, date, commit, load, settings) and vs_torch.md, which is built
from them alone (``--from-csv`` rebuilds it).

    python benchmarks/bench_vs_torch.py [--steps 40] [--quick] [--from-csv]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _breakdown import FIELDS, Clock, pipert_parts, rank_row, time_optimizer, time_torch_stages  # noqa: E402
from _breakdown import analysis as breakdown_analysis, table as breakdown_table  # noqa: E402
from _common import RESULTS, context, load_average, read_csv, rebuild, report_header, write_csv, write_results  # noqa: E402

SCHEDULE_NAMES = ("gpipe", "1f1b", "interleaved-1f1b")
RATIO_TARGET = 1.0
OVERHEAD_TARGET = 0.05
LR = 0.01


@dataclass(frozen=True)
class Setup:
    """Model, batch and measurement sizes (shared by every configuration)."""

    hidden: int = 128
    """Model width (heads 4, kv heads 2, ffn 8/3 hidden)."""
    layers: int = 8
    """Decoder layers; P*V units need at least that many."""
    seq: int = 64
    """Tokens per sequence."""
    mb_size: int = 2
    """Sequences per micro-batch."""
    warmup: int = 3
    """Untimed steps per system before measuring (shape inference, allocator)."""
    steps: int = 40
    """Measured steps per system."""
    breakdown_steps: int = 4
    """Steps per system for the time breakdown, after as many warm-up steps (not timed)."""
    threads: int = 1
    """torch intra-op threads per process (2 cores; up to 4 ranks)."""


def model_config(s: Setup):
    from pipert.models import LlamaConfig
    return LlamaConfig(vocab=256, hidden=s.hidden, layers=s.layers, heads=4, kv_heads=2,
                       ffn=s.hidden * 8 // 3, max_seq=s.seq)


def batch(s: Setup, microbatches: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    tok = torch.randint(0, 256, (microbatches * s.mb_size, s.seq + 1), generator=g)
    return tok[:, :-1].contiguous(), tok[:, 1:].contiguous()


def sgd(params) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=LR)


def breakdown_steps(s: Setup, microbatches: int, systems: dict[str, Callable], parts: dict[str, Callable[[], dict]],
                    sync: Callable[[], None]) -> dict[str, list[tuple[float, float, dict[str, float]]]]:
    """Per system, (step wall s, process CPU s, ``parts[name]()``) of each breakdown step, after
    ``s.warmup`` untimed ones, the systems alternating in ABBA order; ``sync`` before and after each
    step (a barrier where ranks are processes). ``parts`` is read after every step, warm-up included."""
    out: dict[str, list] = {n: [] for n in systems}
    names = list(systems)
    for i in range(s.warmup + s.breakdown_steps):
        x, y = batch(s, microbatches, i)
        for name in (names if i % 2 == 0 else names[::-1]):
            sync()
            t0, c0 = time.perf_counter(), time.process_time()
            systems[name](x, y)
            sync()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            p = parts[name]()
            if i >= s.warmup:
                out[name].append((wall, cpu, p))
    return out


def _rows(key: dict, steps: dict[str, list]) -> list[dict]:
    return [rank_row({**key, "system": name}, st) for name, st in steps.items()]


def _no_split_computes(pipe) -> None:
    """The breakdown compares whole computes with torch's: a program without sub-blocks."""
    if any(a.sub is not None for acts in pipe.program.actions for a in acts):
        raise ValueError("the breakdown needs a program without sub-blocks")


# --------------------------------------------------------------------------- multi-rank
def early_receives(schedule):
    """The schedule with every RECV posted one compute earlier: moved past the SENDs right
    before it and the compute before those, never past another RECV (each link's receives
    keep their order). Close to where torch's interleaved runtime posts them. Only for the
    A/B comparison below; Pipeline validates it."""
    from pipert.ir import Op
    lists = []
    for acts in schedule.actions:
        out: list = []
        for a in acts:
            i = len(out)
            if a.op is Op.RECV:
                while i > 0 and out[i - 1].op is Op.SEND:
                    i -= 1
                if i > 0 and out[i - 1].op in (Op.F, Op.B):
                    i -= 1
                else:
                    i = len(out)
            out.insert(i, a)
        lists.append(out)
    return schedule.with_actions(lists)


def _pair_run(s: Setup, schedule: str, microbatches: int) -> dict:
    """Both runtimes on this rank for one configuration; rank 0 returns the row. pipert also
    runs the schedule with receives posted one compute earlier ("pipert_early", A/B)."""
    from pipert.models import LlamaModel, partition
    from pipert.pipeline import Pipeline
    from pipert.schedules import build_schedule
    from _torch_pipelining import SCHEDULES, TorchPipe
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = SCHEDULES[schedule][1]
    cfg = model_config(s)
    units = lambda: partition(LlamaModel(cfg, seed=0), world * chunks)  # noqa: E731 - same weights each call
    sched = build_schedule(schedule, stages=world, microbatches=microbatches, chunks=chunks if chunks > 1 else None)
    units_p, units_t = units(), units()
    pipe = Pipeline(units_p, sched, backend="dist", optimizer=sgd)
    early = Pipeline(units(), early_receives(sched), backend="dist", optimizer=sgd)

    # torch's first step traced: its forward/backward order must be pipert's; then fresh weights
    x, y = batch(s, microbatches, 0)
    same = torch.tensor([int(TorchPipe.build(units(), schedule, microbatches, LR).traced_step(x, y)
                             == _pipert_order(pipe, rank))])
    dist.all_reduce(same, op=dist.ReduceOp.MIN)
    tpipe = TorchPipe.build(units_t, schedule, microbatches, LR)

    def run_torch(x, y) -> list:
        losses: list = []
        tpipe.step(x, y, losses)
        return losses

    systems = {"pipert": pipe.step, "torch": run_torch, "pipert_early": early.step}
    times: dict[str, list[float]] = {n: [] for n in systems}  # wall s, barrier to barrier
    cpu: dict[str, list[float]] = {n: [] for n in systems}    # this process's CPU s (all threads)
    loss_diff = 0.0
    names = list(systems)
    for i in range(s.warmup + s.steps):
        x, y = batch(s, microbatches, i)
        out = {}
        for name in (names if i % 2 == 0 else names[::-1]):  # ABBA (ABC CBA) order
            dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            out[name] = systems[name](x, y)
            dist.barrier()
            if i >= s.warmup:
                times[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
        # torch's losses live on the last stage; pipert returns the mean on every rank
        t = torch.tensor([sum(float(l.detach()) for l in out["torch"]) / microbatches if out["torch"] else 0.0],
                         dtype=torch.float64)
        dist.all_reduce(t)
        loss_diff = max(loss_diff, abs(out["pipert"] - float(t)) / abs(float(t)))
    param_diff = torch.tensor([_param_diff(units_p, units_t, pipe)], dtype=torch.float64)
    dist.all_reduce(param_diff, op=dist.ReduceOp.MAX)
    cpu_sum = torch.tensor([cpu[n] for n in names], dtype=torch.float64)
    dist.all_reduce(cpu_sum)  # CPU seconds per step summed over ranks

    mine = _multi_breakdown(s, schedule, microbatches, units, sched)
    parts = [None] * world if rank == 0 else None
    dist.gather_object(mine, parts, dst=0)
    sync = _sync_costs()
    if rank != 0:
        return {}
    row = {"schedule": schedule, "P": world, "V": chunks, "M": microbatches, "loss_rel_diff": loss_diff,
           "param_rel_diff": float(param_diff), "breakdown": [r for p in parts for r in p],
           "same_order": bool(same.item()), **sync}
    for k, n in enumerate(names):
        row[f"{n}_s"], row[f"{n}_cpu_s"] = times[n], cpu_sum[k].tolist()
    return row


def _multi_breakdown(s: Setup, schedule: str, microbatches: int, units: Callable, sched) -> list[dict]:
    """This rank's breakdown rows (not timed): a traced pipert and a torch pipeline whose computes
    are timed from outside, both on fresh weights, barrier to barrier as in the timed steps."""
    from pipert.models import lm_loss
    from pipert.pipeline import Pipeline
    from _torch_pipelining import TorchPipe
    rank = dist.get_rank()
    from pipert.exec.instrument import Instrumentation
    traced = Pipeline(units(), sched, backend="dist", optimizer=sgd, instrument=Instrumentation(trace=True))
    _no_split_computes(traced)
    clock = Clock()
    tpipe = TorchPipe.build(units(), schedule, microbatches, LR, loss_fn=clock.wrap("forward", lm_loss))
    time_torch_stages(tpipe.stages, clock)
    time_optimizer(tpipe.optimizer, clock)
    steps = breakdown_steps(s, microbatches, {"pipert": traced.step, "torch": lambda x, y: tpipe.step(x, y, [])},
                            {"pipert": lambda: pipert_parts(traced.last_results[rank].op_times),
                             "torch": clock.take}, dist.barrier)
    return _rows(dict(schedule=schedule, P=dist.get_world_size(), M=microbatches, rank=rank), steps)


def _sync_costs(reps: int = 20) -> dict[str, float]:
    """Median ms of one barrier (paid by both sides per timed step) and of pipert's loss
    all-reduce (two float64) when all ranks arrive together."""
    out = {}
    for name, op in (("barrier_ms", dist.barrier),
                     ("allreduce_ms", lambda: dist.all_reduce(torch.zeros(2, dtype=torch.float64)))):
        ts = []
        for _ in range(reps):
            dist.barrier()
            t0 = time.perf_counter()
            op()
            ts.append(time.perf_counter() - t0)
        out[name] = 1e3 * statistics.median(ts)
    return out


def _pipert_order(pipe, rank: int) -> list[str]:
    """This rank's compute actions in torch's notation (``2F0``: stage 2, forward, micro-batch 0)."""
    return [f"{a.unit}{a.op.value}{m}" for a in pipe.program.compute_actions(rank) if a.op.value in ("F", "B")
            for m in a.mb]


def _param_diff(units_p, units_t, pipe) -> float:
    """Max relative difference of this rank's owned parameters after training."""
    worst = 0.0
    for u in pipe.program.units_owned(dist.get_rank()):
        for (n, a), (_, b) in zip(units_p[u].named_parameters(), units_t[u].named_parameters()):
            d = (a.detach().double() - b.detach().double()).abs().max().item()
            worst = max(worst, d / max(b.detach().double().abs().max().item(), 1e-30))
    return worst


def multi_worker(rank: int, world: int, s: Setup, schedule: str, microbatches: int, out_path: str) -> None:
    """Process entry: one configuration, both runtimes; rank 0 writes the row as JSON."""
    torch.set_num_threads(s.threads)
    row = _pair_run(s, schedule, microbatches)
    if rank == 0:
        print(f"  P={world} {schedule:17s} M={microbatches}: pipert {1e3 * statistics.median(row['pipert_s']):.1f} ms,"
              f" torch {1e3 * statistics.median(row['torch_s']):.1f} ms", flush=True)
        with open(out_path, "w") as f:
            json.dump(row, f)


# --------------------------------------------------------------------------- single stage
def thread_cost_ms(reps: int = 200) -> float:
    """Start and join of one Python thread (what the local backend adds per rank and step)."""
    import threading
    t0 = time.perf_counter()
    for _ in range(reps):
        t = threading.Thread(target=lambda: None, daemon=True)
        t.start()
        t.join()
    return 1e3 * (time.perf_counter() - t0) / reps


def plain_loop(model, opt: torch.optim.Optimizer, microbatches: int, clock: Clock | None = None) -> Callable:
    """A step of plain gradient accumulation over ``microbatches`` and ``opt``'s step; with ``clock``,
    its model calls, backwards and optimizer calls are timed."""
    forward = model if clock is None else clock.wrap("forward", model)
    if clock is not None:
        time_optimizer(opt, clock)

    def backward(loss: torch.Tensor) -> None:
        loss.backward() if clock is None else clock.wrap("backward", loss.backward)()

    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        total = 0.0
        for xm, ym in zip(x.chunk(microbatches), y.chunk(microbatches)):
            loss = forward(xm, ym)
            backward(loss / microbatches)
            total += float(loss.detach())
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total / microbatches
    return step


def _single_pair(s: Setup, microbatches: int, trace: bool = False) -> tuple:
    """(pipert Pipeline with P = 1 on the local backend, the plain model, its optimizer), same weights."""
    from pipert.models import LlamaModel, partition
    from pipert.pipeline import Pipeline
    from pipert.exec.instrument import Instrumentation
    cfg = model_config(s)
    pipe = Pipeline(partition(LlamaModel(cfg, seed=0), 1), "1f1b", stages=1, microbatches=microbatches,
                    backend="local", optimizer=sgd, instrument=Instrumentation(trace=trace))
    model = LlamaModel(cfg, seed=0)
    return pipe, model, sgd(model.parameters())


def single_stage(s: Setup, microbatches: int) -> dict:
    """pipert P = 1 (local backend) against a plain accumulation loop, alternating."""
    pipe, model, opt = _single_pair(s, microbatches)
    systems = {"pipert": pipe.step, "plain": plain_loop(model, opt, microbatches)}
    times: dict[str, list[float]] = {"pipert": [], "plain": []}
    cpu: dict[str, list[float]] = {"pipert": [], "plain": []}
    loss_diff = 0.0
    for i in range(s.warmup + s.steps):
        x, y = batch(s, microbatches, i)
        order = ("pipert", "plain") if i % 2 == 0 else ("plain", "pipert")
        out = {}
        for name in order:
            t0, c0 = time.perf_counter(), time.process_time()
            out[name] = systems[name](x, y)
            if i >= s.warmup:
                times[name].append(time.perf_counter() - t0)
                cpu[name].append(time.process_time() - c0)
        loss_diff = max(loss_diff, abs(out["pipert"] - out["plain"]) / abs(out["plain"]))
    return {"M": microbatches, "pipert_s": times["pipert"], "plain_s": times["plain"],
            "pipert_cpu_s": cpu["pipert"], "plain_cpu_s": cpu["plain"],
            "loss_rel_diff": loss_diff, "breakdown": _single_breakdown(s, microbatches)}


def _single_breakdown(s: Setup, microbatches: int) -> list[dict]:
    """Breakdown rows (not timed) of a traced pipert P = 1 and a plain loop with timed calls, fresh weights."""
    pipe, model, opt = _single_pair(s, microbatches, trace=True)
    _no_split_computes(pipe)
    clock = Clock()
    steps = breakdown_steps(s, microbatches, {"pipert": pipe.step, "plain": plain_loop(model, opt, microbatches, clock)},
                            {"pipert": lambda: pipert_parts(pipe.last_results[0].op_times), "plain": clock.take},
                            lambda: None)
    return _rows(dict(schedule="1f1b", P=1, M=microbatches, rank=0), steps)


# --------------------------------------------------------------------------- report
def stats(xs: list[float]) -> dict[str, float]:
    """Median, quartiles and a distribution-free 95% confidence interval of the median."""
    q = statistics.quantiles(xs, n=4)
    ys, n = sorted(xs), len(xs)
    k = max(int((n - 1.96 * n ** 0.5) / 2), 0)  # order statistics bounding the median (binomial, normal approx.)
    return {"median": statistics.median(xs), "p25": q[0], "p75": q[2], "min": min(xs),
            "ci_lo": ys[k], "ci_hi": ys[n - 1 - k]}


def paired_ratios(a: list[float], b: list[float]) -> dict[str, float]:
    """Per-step ratios a_i / b_i of adjacent steps: median and interquartile range."""
    return stats([x / y for x, y in zip(a, b)])


def verdict(ratio: dict[str, float], target: float) -> str:
    """'yes': the median ratio meets the target; 'no (noise)': it does not, but the target lies
    inside the median's 95% confidence interval; 'no': the whole interval misses it."""
    if ratio["median"] <= target:
        return "yes"
    return "no (noise)" if ratio["ci_lo"] <= target else "no"


def _row(kind: str, r: dict, other: str, target: float) -> dict:
    """One CSV row: medians and quartiles of wall and CPU time, paired ratios, verdict."""
    p, o = stats(r["pipert_s"]), stats(r[f"{other}_s"])
    q = paired_ratios(r["pipert_s"], r[f"{other}_s"])
    c = paired_ratios(r["pipert_cpu_s"], r[f"{other}_cpu_s"])
    return {"kind": kind, "schedule": r["schedule"], "P": r["P"], "V": r["V"], "M": r["M"], "other": other,
            "pipert_ms": 1e3 * p["median"], "pipert_p25_ms": 1e3 * p["p25"], "pipert_p75_ms": 1e3 * p["p75"],
            "other_ms": 1e3 * o["median"], "other_p25_ms": 1e3 * o["p25"], "other_p75_ms": 1e3 * o["p75"],
            "ratio": q["median"], "ratio_p25": q["p25"], "ratio_p75": q["p75"], "ratio_ci_lo": q["ci_lo"],
            "ratio_ci_hi": q["ci_hi"], "target": target,
            "met": verdict(q, target), "cpu_pipert_ms": 1e3 * statistics.median(r["pipert_cpu_s"]),
            "cpu_other_ms": 1e3 * statistics.median(r[f"{other}_cpu_s"]), "cpu_ratio": c["median"],
            "cpu_ratio_ci_lo": c["ci_lo"], "cpu_ratio_ci_hi": c["ci_hi"], "loss_rel_diff": r["loss_rel_diff"],
            "param_rel_diff": r["param_rel_diff"], "same_order": r.get("same_order", ""),
            "steps": len(r["pipert_s"])}


def _key(r: dict) -> tuple:
    return (r["schedule"], r["P"], r["M"])


def analysis(rows: list[dict], breakdown: list[dict], sync: list[dict] | None) -> list[str]:
    """Which targets were met and where the time goes; every figure and count is computed from
    the CSV rows (``vs_torch.csv``, ``vs_torch_breakdown.csv``, ``vs_torch_sync.csv``)."""
    vs = [r for r in rows if r["kind"] == "vs_torch_pipelining"]
    one = [r for r in rows if r["kind"] == "single_stage_vs_plain"]
    met = [r for r in vs if r["met"] == "yes"]
    noise = [r for r in vs if r["met"] == "no (noise)"]
    miss = [r for r in vs if r["met"] == "no"]

    def name(r: dict) -> str:
        return (f"{r['schedule']} P={r['P']} M={r['M']} "
                f"({r['ratio']:.3f} [{r['ratio_ci_lo']:.3f}, {r['ratio_ci_hi']:.3f}])")

    L = [f"- **vs torch.distributed.pipelining**: {len(met)} of {len(vs)} configurations meet ratio <= 1.0 "
         f"by the median; {len(noise)} miss it by the median but 1.0 lies inside the 95% interval: "
         f"{', '.join(map(name, noise)) or 'none'}; {len(miss)} miss it outright: "
         f"{', '.join(map(name, miss)) or 'none'}. Median of all {len(vs)} ratios: "
         f"{statistics.median(r['ratio'] for r in vs):.3f}; of the CPU-time ratios: "
         f"{statistics.median(r['cpu_ratio'] for r in vs):.3f}."]
    over = ", ".join(f"M={r['M']}: {100 * (r['ratio'] - 1):+.1f}%" for r in one)
    L.append(f"- **single stage**: overhead {over} "
             f"(target <= 5%: {'met' if all(r['met'] == 'yes' for r in one) else 'missed'}).")
    same = all(r["same_order"] for r in vs)
    L.append(f"- **Same work**: forward/backward order per rank {'equals' if same else 'DIFFERS from'} torch's in "
             f"{'every' if same else 'some'} configuration; losses and parameters agree to "
             f"{max(r['loss_rel_diff'] for r in vs):.1e} / {max(r['param_rel_diff'] for r in vs):.1e} (relative) "
             f"after {vs[0]['steps']} measured steps.")
    L += breakdown_analysis(breakdown)
    if sync:
        ar = {_key(r): r["allreduce_ms"] for r in sync}
        share = [100 * ar[_key(r)] / r["other_ms"] for r in vs if _key(r) in ar]
        L.append(f"- **Synchronisation**: pipert's `step` ends with one gloo all-reduce of two numbers (the mean "
                 f"loss on every rank); torch returns the losses on the last stage only. Measured: "
                 f"{statistics.median(ar.values()):.2f} ms median ({min(ar.values()):.2f}-{max(ar.values()):.2f}), "
                 f"{min(share):.1f}-{max(share):.1f}% of torch's step time.")
        gaps = [(r, (r["ratio"] - 1) * r["other_ms"], ar[_key(r)]) for r in vs if r["met"] != "yes" and _key(r) in ar]
        if gaps:
            L.append("- **Misses**: gap (median ratio - 1, times torch's step) against that all-reduce: "
                     + "; ".join(f"{r['schedule']} P={r['P']} M={r['M']}: {g:.1f} ms vs {a:.2f} ms"
                                 for r, g, a in gaps) + ".")
    else:
        L.append("- **Synchronisation**: per-configuration barrier and all-reduce times were not stored with "
                 "this run.")
    early = {_key(r): r for r in rows if r["kind"] == "early_recv_vs_torch_pipelining"}
    base = {_key(r): r for r in vs}
    if early:
        better = [k for k, e in early.items() if e["ratio"] < base[k]["ratio"]]
        clear = [k for k, e in early.items() if e["ratio_ci_hi"] < base[k]["ratio"]]
        listed = ", ".join(f"{k[0]} P={k[1]} M={k[2]}: {early[k]['ratio']:.3f} vs {base[k]['ratio']:.3f}"
                           for k in clear) or "none"
        L.append(f"- **Where receives are posted**: with every receive moved one compute earlier "
                 f"(`early_receives`) the ratio is lower in {len(better)} of {len(early)} configurations, with its "
                 f"whole 95% interval below the lowered placement's median in {len(clear)} ({listed}); median "
                 f"ratio to torch {statistics.median(e['ratio'] for e in early.values()):.3f} against "
                 f"{statistics.median(r['ratio'] for r in vs):.3f}.")
    spread = [100 * (r[f"{s}_p75_ms"] - r[f"{s}_p25_ms"]) / r[f"{s}_ms"] for r in vs for s in ("pipert", "other")]
    L.append(f"- **Noise**: step times spread by {min(spread):.0f}-{max(spread):.0f}% (p25-p75 over the median) "
             f"from step to step. Load averages are in the context above.")
    return L


def csv_rows(multi: list[dict], single: list[dict]) -> tuple[list[dict], list[dict], list[dict]]:
    """The three CSVs of a run: ratios, the breakdown (a row per rank, system and configuration) and
    synchronisation costs per configuration."""
    rows = [_row("vs_torch_pipelining", r, "torch", RATIO_TARGET) for r in multi]
    rows += [_row("early_recv_vs_torch_pipelining", dict(r, pipert_s=r["pipert_early_s"],
                  pipert_cpu_s=r["pipert_early_cpu_s"]), "torch", RATIO_TARGET)
             for r in multi if "pipert_early_s" in r]
    rows += [_row("single_stage_vs_plain", dict(r, schedule="1f1b", P=1, V=1, param_rel_diff=float("nan")),
                  "plain", 1 + OVERHEAD_TARGET) for r in single]
    rows = [{k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in row.items()} for row in rows]
    breakdown = [b for r in multi + single for b in r["breakdown"]]
    sync = [dict(schedule=r["schedule"], P=r["P"], M=r["M"], barrier_ms=r["barrier_ms"],
                 allreduce_ms=r["allreduce_ms"]) for r in multi]
    return rows, breakdown, sync


def _sibling(name: str) -> list[dict] | None:
    path = RESULTS / f"{name}.csv"
    return read_csv(path) if path.is_file() else None


def report(rows: list[dict], ctx: dict, rebuilt: bool = False) -> str:
    """The markdown report from ``vs_torch.csv`` (``rows``), its context and the breakdown and
    synchronisation CSVs beside it."""
    breakdown, sync = _sibling("vs_torch_breakdown") or [], _sibling("vs_torch_sync")
    L = report_header("pipert vs PyTorch (torch.distributed.pipelining, plain loop)", ctx, rebuilt) + [""]
    L += ["## pipert vs torch.distributed.pipelining", "",
          "Same units as stage modules; torch's last stage returns the logits and `loss_fn=lm_loss` "
          "computes the same mean cross-entropy pipert's last unit computes internally (same FLOPs). "
          "`loss diff` is the largest relative loss difference over all steps, `param diff` the largest "
          "relative parameter difference after the last step (float32).", "",
          "| schedule | P | V | M | pipert ms (p25-p75) | torch ms (p25-p75) | ratio [95% CI] | target <= 1.0 | "
          "CPU ratio [95% CI] | same F/B order | loss diff | param diff |",
          "|---|---:|---:|---:|---:|---:|---:|:---:|---:|:---:|---:|---:|"]
    for r in rows:
        if r["kind"] != "vs_torch_pipelining":
            continue
        L.append(f"| {r['schedule']} | {r['P']} | {r['V']} | {r['M']} | {r['pipert_ms']:.1f} "
                 f"({r['pipert_p25_ms']:.1f}-{r['pipert_p75_ms']:.1f}) | {r['other_ms']:.1f} "
                 f"({r['other_p25_ms']:.1f}-{r['other_p75_ms']:.1f}) | {r['ratio']:.3f} "
                 f"[{r['ratio_ci_lo']:.3f}, {r['ratio_ci_hi']:.3f}] | {r['met']} | {r['cpu_ratio']:.3f} "
                 f"[{r['cpu_ratio_ci_lo']:.3f}, {r['cpu_ratio_ci_hi']:.3f}] | {'yes' if r['same_order'] else 'NO'} | "
                 f"{r['loss_rel_diff']:.1e} | {r['param_rel_diff']:.1e} |")
    early = [r for r in rows if r["kind"] == "early_recv_vs_torch_pipelining"]
    if early:
        L += ["", "### A/B: receives posted one compute earlier", "",
              "pipert on the same schedule with every RECV moved before the compute that precedes it "
              "(`early_receives`; close to where torch's interleaved runtime posts them), timed in the same "
              "ABBA rotation as the two above.", "",
              "| schedule | P | M | pipert early-recv ms | torch ms | ratio to torch [95% CI] | pipert (as "
              "lowered) ratio | CPU ratio |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
        base = {_key(r): r["ratio"] for r in rows if r["kind"] == "vs_torch_pipelining"}
        for r in early:
            L.append(f"| {r['schedule']} | {r['P']} | {r['M']} | {r['pipert_ms']:.1f} | {r['other_ms']:.1f} | "
                     f"{r['ratio']:.3f} [{r['ratio_ci_lo']:.3f}, {r['ratio_ci_hi']:.3f}] | "
                     f"{base[_key(r)]:.3f} | {r['cpu_ratio']:.3f} |")
    L += ["", "## pipert with one stage vs a plain PyTorch loop", "",
          "pipert: `Pipeline(units, '1f1b', stages=1, microbatches=M, backend='local')`; plain: the same "
          "model, per micro-batch `(model(x, y) / M).backward()`, then `SGD.step()` and "
          "`zero_grad(set_to_none=True)`.", "",
          "| M | pipert ms (p25-p75) | plain ms (p25-p75) | overhead [95% CI] | target <= 5% | CPU overhead | "
          "loss diff |", "|---:|---:|---:|---:|:---:|---:|---:|"]
    for r in rows:
        if r["kind"] != "single_stage_vs_plain":
            continue
        L.append(f"| {r['M']} | {r['pipert_ms']:.1f} ({r['pipert_p25_ms']:.1f}-{r['pipert_p75_ms']:.1f}) | "
                 f"{r['other_ms']:.1f} ({r['other_p25_ms']:.1f}-{r['other_p75_ms']:.1f}) | "
                 f"{100 * (r['ratio'] - 1):+.1f}% [{100 * (r['ratio_ci_lo'] - 1):+.1f}%, "
                 f"{100 * (r['ratio_ci_hi'] - 1):+.1f}%] | {r['met']} | {100 * (r['cpu_ratio'] - 1):+.1f}% | "
                 f"{r['loss_rel_diff']:.1e} |")
    if breakdown:
        L += ["", "## Where the time goes (ms per step, mean over ranks)", "",
              "Breakdown steps, after the timed ones and not timed with them: fresh pipelines of the same model, "
              "the systems alternating as above. pipert runs traced (`Instrumentation(trace=True)`: its executor records "
              "each compute's wall and thread-CPU time, on whichever thread runs it); torch's `forward_one_chunk`, "
              "loss function, `backward_one_chunk` and optimizer, and the plain loop's model call, backward and "
              "optimizer, are timed around each call. step: barrier to barrier on each rank; forward, backward, "
              "optimizer: wall time of those computes; compute CPU: their CPU time; everything else: the step less "
              "the computes (waits for messages and peers, bubbles, the runtime's own work).", ""]
        L += breakdown_table(breakdown)
    L += ["", "## Analysis", ""] + analysis(rows, breakdown, sync) + [""]
    return "\n".join(L)


def setup_context(s: Setup) -> dict[str, str]:
    """The run's settings, as context lines of the report."""
    return {
        "model": f"LLaMA-style, hidden {s.hidden}, {s.layers} layers, 4 heads / 2 kv heads, ffn {s.hidden * 8 // 3}, "
                 f"vocab 256, float32; micro-batch {s.mb_size} x {s.seq} tokens; SGD lr {LR}",
        "per configuration (fresh gloo processes each)":
            f"{s.warmup} warm-up steps, then {s.steps} measured steps per system, alternating pipert/other in "
            f"ABBA order; a step is timed barrier to barrier on rank 0 (both sides pay the same barrier); ratio = "
            f"median over steps of pipert_i / other_i (adjacent steps) with a distribution-free 95% confidence "
            f"interval of that median; spread of step times = p25-p75; `no (noise)`: the median misses the target "
            f"but the target lies inside its 95% interval; CPU ratio: the same with process CPU time summed over "
            f"ranks (work done; less sensitive to other jobs than wall time)",
        "breakdown steps per system (after as many warm-up steps; not timed)": str(s.breakdown_steps)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=Setup.steps)
    ap.add_argument("--warmup", type=int, default=Setup.warmup)
    ap.add_argument("--quick", action="store_true", help="P=2 only, 8 steps (smoke test)")
    ap.add_argument("--from-csv", action="store_true", help="rebuild the report from the stored CSVs and context")
    args = ap.parse_args()
    if args.from_csv:
        print(f"wrote {rebuild('vs_torch', report)} from the stored CSVs")
        return
    s = Setup(steps=8 if args.quick else args.steps, warmup=args.warmup)
    from pipert.launch import launch
    ctx = context(extra={"run": f"gloo backend, {s.threads} intra-op thread(s) per process"})
    ctx["load average (1, 5, 15 min) before"] = ctx.pop("load average (1, 5, 15 min)")
    t0 = time.perf_counter()
    multi: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench-vs-torch-") as tmp:
        # fresh processes per configuration: pipelines and process groups of one configuration
        # never share a process with the next one
        for world in ((2,) if args.quick else (2, 4)):
            for schedule in SCHEDULE_NAMES:
                for m in (world, 2 * world):
                    path = os.path.join(tmp, f"p{world}-{schedule}-m{m}.json")
                    launch(multi_worker, world, (s, schedule, m, path), timeout=300.0)
                    multi.append(json.load(open(path)))
    torch.set_num_threads(s.threads)
    single = []
    for m in (4, 8):
        r = single_stage(s, m)
        single.append(r)
        print(f"  single stage M={m}: pipert {1e3 * statistics.median(r['pipert_s']):.1f} ms, "
              f"plain {1e3 * statistics.median(r['plain_s']):.1f} ms", flush=True)
    thread_ms = thread_cost_ms()
    wall = time.perf_counter() - t0
    ctx["load average (1, 5, 15 min) after"] = load_average()
    ctx["wall time of the whole benchmark"] = f"{wall:.0f} s"
    ctx.update(setup_context(s))
    ctx["local backend: start and join of one rank thread"] = f"{thread_ms:.3f} ms"
    rows, breakdown, sync = csv_rows(multi, single)
    write_csv(RESULTS / "vs_torch_breakdown.csv", breakdown, FIELDS)
    write_csv(RESULTS / "vs_torch_sync.csv", sync)
    write_results("vs_torch", rows, ctx, report)
    print(f"wrote {RESULTS / 'vs_torch.csv'} and {RESULTS / 'vs_torch.md'} ({wall:.0f} s)")


if __name__ == "__main__":
    main()
