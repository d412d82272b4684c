"""Every GPU check of the runtime, one command, unchanged on any GPU machine:

    python benchmarks/gpu_checks.py [--quick] [--plan] [--out DIR]

1. delay: injected delays of 10 us to 100 ms on a CUDA stream (the one-thread wait kernels of
   pipert._C; ``torch.cuda._sleep`` without it) and k back-to-back messages over an emulated
   link: error against the requested delay (bench_delay's cases and targets);
2. overlap: GEMMs on the compute stream while messages move on the dedicated send/recv streams
   (device copies through a LinkEmulator link, without and with injected latency), against
   max(compute, comm) and the serial sum (``pipert bench overlap --device cuda``);
3. emulation: 4 ranks on one GPU (local transport, CUDA streams) training real units of the
   "small" model, 1F1B, ZB-H1 and crosspipe-greedy, without and with a 2-datacenter link of one
   forward's latency, measured step time against the simulator fed with the units' profiled times,
   its DAG timed with the ranks sharing the one GPU (the per-rank-GPU prediction in the note);
4. links: the stream path of DelayedTransport between two ranks (two GPUs: two processes over
   NCCL; one GPU: one process, send stream to receive stream, as NCCL refuses two ranks on one
   device), latencies of 10 us to 100 ms: error of the injected delay (pipert.tools.linkcheck);
5. train: ``pipert train --check`` on the GPU (local transport, CUDA streams) for every family of
   schedule and the passes that move memory (offload, recompute), float64: largest relative error of
   loss, gradients and updated parameters against the single-process reference step; and the
   chunked MLP's Triton kernels in float32 training.
6. nccl-1: ``pipert train --backend nccl -P 1 --check`` (one process, NCCL, world 1; float64);
7-10. race, vs-loop, host, gap: stream ordering of the local transport with a slow producer, pipert
   P=1 against a plain PyTorch loop, host time per step against the step's time in the one-GPU
   emulation, per-message gap of back-to-back delayed messages before and after the wait kernels'
   chains (gpu_stall_checks.py).

Writes DIR/gpu_checks.csv and DIR/gpu_checks.md (hardware, date, commit). Without a GPU it says so,
prints the plan and exits 0; ``--plan`` prints the plan anywhere without measuring.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

import gpu_stall_checks as stalls
from _common import RESULTS, bandwidth_messages, context, rebuild, report_header, write_results
from bench_delay import DELAYS, target

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

EMULATED = ["1f1b", "zb-h1", "crosspipe-greedy"]
OVERLAP = [dict(gemm=4096, computes=16, message_bytes=64 << 20, messages=16, latency=0.0),
           dict(gemm=4096, computes=16, message_bytes=64 << 20, messages=16, latency=1e-3)]
# (arguments of `pipert train`, dtype, target): the reference step runs the same units (the chunked
# MLP's Triton kernels too), so the runs differ from it by summation order only; float32 is given
# the slack of float32 sums.
TRAIN = [("--schedule 1f1b -P 4", "float64", 1e-10), ("--schedule gpipe -P 4", "float64", 1e-10),
         ("--schedule interleaved-1f1b -P 2 --chunks 2", "float64", 1e-10), ("--schedule zb-h1 -P 4", "float64", 1e-10),
         ("--schedule zb-v -P 2", "float64", 1e-10), ("--schedule weipipe-zb2 -P 4", "float64", 1e-10),
         ("--schedule tawpipe -P 4 --ranks-per-node 2", "float64", 1e-10),
         ("--schedule crosspipe-greedy -P 4 --dcs 2 --dc-latency 2ms", "float64", 1e-10),
         ("--schedule helixpipe-2fold -P 4 --recompute no_attention", "float64", 1e-10),
         ("--schedule pipemesh -P 2 --dp 2 --zero 3", "float64", 1e-10),
         ("--schedule 1f1b -P 4 --passes offload_stashes", "float64", 1e-10),
         ("--schedule zb-h1 -P 4 --passes offload_weights", "float64", 1e-10),
         ("--schedule 1f1b -P 4 --passes recompute", "float64", 1e-10),
         ("--schedule 1f1b -P 4 --mlp-chunk 32 --mlp-recompute", "float32", 1e-4)]
NCCL_SINGLE = ("--backend nccl -P 1", "float64", 1e-10)
FIELDS = ["check", "case", "expected_s", "measured_s", "error", "target", "pass", "note"]
INFO = ""
"""``pass`` of an informational row (no target; e.g. a measurement before a fix): not counted."""


def plan(quick: bool) -> list[str]:
    """What a run measures, one line per check group."""
    from bench_delay import BANDWIDTH_CASES
    return [f"delay: {len(DELAYS)} delays from {DELAYS[0] * 1e6:g} us to {DELAYS[-1] * 1e3:g} ms and "
            f"{len(BANDWIDTH_CASES)} bandwidth cases on cuda:0 streams" + (" (few repeats)" if quick else ""),
            f"overlap: {len(OVERLAP)} cases, GEMM {OVERLAP[0]['gemm']} x {OVERLAP[0]['computes']} against "
            f"{OVERLAP[0]['messages']} messages of {OVERLAP[0]['message_bytes'] >> 20} MiB, injected latency "
            + ", ".join(f"{c['latency'] * 1e3:g} ms" for c in OVERLAP),
            f"emulation: 4 ranks on cuda:0, model small, {', '.join(EMULATED)}, M=8, without and with a 2-DC link "
            f"of latency T_F",
            f"links: {len(DELAYS)} latencies from {DELAYS[0] * 1e6:g} us to {DELAYS[-1] * 1e3:g} ms between two ranks "
            f"on the stream path (NCCL with 2 GPUs, one process with 1)",
            f"train: {3 if quick else len(TRAIN)} runs of pipert train --check on cuda:0 (local transport), "
            f"largest relative error of loss, gradients and parameters against the reference step",
            f"nccl-1: pipert train {NCCL_SINGLE[0]} --check (one process, NCCL, world 1; {NCCL_SINGLE[1]})",
            *stalls.plan_lines(quick)]


def check_delay(quick: bool) -> list[dict]:
    from bench_delay import bench_bandwidth, bench_delays
    from pipert.device.streams import StreamSet
    rows = []
    with StreamSet("cuda:0", "r0") as a, StreamSet("cuda:0", "r1") as b:
        for r in bench_delays(a, quick) + bench_bandwidth(a, b, "cuda", quick):
            rows.append({"check": r["section"], "case": r["case"], "expected_s": r["expected_s"],
                         "measured_s": r["measured_s"], "error": r["median_err_s"], "target": r["target_s"],
                         "pass": r["pass"], "note": f"p95 |err| {r['p95_abs_err_s'] * 1e6:.1f} us" + _per_message(r)})
    return rows


def _per_message(row: dict) -> str:
    """Bandwidth rows (k back-to-back messages): the median error per message."""
    if row["section"] != "bandwidth":
        return ""
    k = bandwidth_messages(row["case"])
    return f"; {row['median_err_s'] / k * 1e6:.1f} us per message of {k}"


def check_overlap(quick: bool) -> list[dict]:
    from pipert.bench import measure_overlap
    rows = []
    for c in OVERLAP:
        r = measure_overlap(device="cuda:0", repeats=3 if quick else 7, **c)
        rows.append({"check": "overlap", "case": f"GEMM {r.gemm} x {r.computes} + {r.messages} x "
                     f"{r.message_bytes >> 20} MiB, latency {r.latency * 1e3:g} ms", "expected_s": r.limit_s,
                     "measured_s": r.both_s, "error": r.both_s / r.limit_s - 1, "target": 0.03,
                     "pass": r.both_s <= 1.03 * r.limit_s,
                     "note": f"compute {r.compute_s * 1e3:.2f} ms, comm {r.comm_s * 1e3:.2f} ms, serial "
                             f"{r.serial_s * 1e3:.2f} ms, overlap {r.overlap:.0%} of the possible saving"})
    return rows


def check_emulation(quick: bool) -> list[dict]:
    from pipert.cost import Links, LinkSpec, Topology
    from pipert.emulate.real import emulate_real
    from pipert.tools.profile import profile_units
    from pipert.models import build_units
    from pipert.pipeline import split_microbatches
    from pipert.schedules import build_schedule
    P, M = 4, 8
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 256, (2 * M, 257), generator=g).cuda()
    x, y = tokens[:, :-1], tokens[:, 1:]
    probe = build_units("small", P, seed=0, device="cuda", max_seq=256)
    cost = profile_units(probe, split_microbatches(x, M)[0], split_microbatches(y, M)[0])
    tf = max(p.times["F"] for p in cost)  # T_F: the longest unit forward
    del probe
    rows = []
    for name in EMULATED[:1] if quick else EMULATED:
        for lat in (0.0, tf):
            links = Links(Topology(P, num_dcs=2), {"inter_dc": LinkSpec(lat)}) if lat else None
            units = build_units("small", P, seed=0, device="cuda", max_seq=256)
            res = emulate_real(build_schedule(name, stages=P, microbatches=M), units, x, y, links=links,
                               steps=3 if quick else 5)
            # on a GPU the ranks' computes were measured sharing it: the prediction to read is the first
            rows.append({"check": "emulation", "case": f"{name}, 2-DC latency {lat * 1e3:.2f} ms",
                         "expected_s": res.predicted, "measured_s": res.step_seconds,
                         "error": res.error, "target": 0.10, "pass": abs(res.error) <= 0.10,
                         "note": f"T_F {tf * 1e3:.2f} ms; expected: the simulator fed with the step's own "
                                 f"measurements (pipert.tools.fidelity), the 4 ranks sharing the GPU"})
    return rows


def check_links(quick: bool) -> list[dict]:
    import tempfile

    from pipert.tools.linkcheck import measure_link_delays
    with tempfile.TemporaryDirectory() as tmp:
        found = measure_link_delays(DELAYS, 5 if quick else 20, Path(tmp) / "links.json")
    return [{"check": "links", "case": f"latency {r['delay_s'] * 1e6:g} us", "expected_s": r["delay_s"],
             "measured_s": r["delay_s"] + r["median_err_s"], "error": r["median_err_s"],
             "target": target(r["delay_s"]), "pass": r["p95_abs_err_s"] <= target(r["delay_s"]),
             "note": f"{r['where']}; p95 |err| {r['p95_abs_err_s'] * 1e6:.1f} us of {r['n']}"} for r in found]


def _not_measured(check: str, case: str, target: float, note: str) -> dict:
    """The row of a case that gave no measurement (``note`` says why)."""
    return {"check": check, "case": case, "expected_s": 0.0, "measured_s": 0.0, "error": float("nan"),
            "target": target, "pass": False, "note": note}


def check_train(quick: bool) -> list[dict]:
    return [_train_row(f"{args} --backend local", dtype, tol) for args, dtype, tol in (TRAIN[:3] if quick else TRAIN)]


def check_nccl_single(quick: bool) -> list[dict]:
    return [_train_row(NCCL_SINGLE[0], *NCCL_SINGLE[1:], check="nccl-1")]


def _train_row(args: str, dtype: str, tol: float, check: str = "train") -> dict:
    """One run of ``pipert train ARGS --check`` as a row: the largest relative error of loss,
    gradients and parameters against the reference step (a failed run: its exit and last line)."""
    import json
    import os
    import subprocess
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "pipert.cli", "train", *args.split(), "-M", "8", "--steps", "2", "--check",
           "--json", "--dtype", dtype]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    steps = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    case = f"{args.removesuffix(' --backend local')} ({dtype})"
    if done.returncode or not steps:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return _not_measured(check, case, tol, f"exit {done.returncode}: {why}")
    err = max(max(s.get("max_grad_rel_err", 0.0), s.get("max_param_rel_err", 0.0),
                  abs(s["loss"] - s["ref_loss"]) / abs(s["ref_loss"])) for s in steps)
    return {"check": check, "case": case, "expected_s": 0.0, "measured_s": time.perf_counter() - t0,
            "error": err, "target": tol, "pass": err <= tol,
            "note": f"{len(steps)} steps; largest relative error of loss, grads, params"}


UNITS = {"delay": "s", "bandwidth": "s", "links": "s", "gap": "s", "train": "abs", "nccl-1": "abs", "race": "abs"}
"""How a check's error and target read: seconds (us), an absolute error, else relative (%)."""


def report(rows: list[dict], ctx: dict, rebuilt: bool = False) -> str:
    lines = report_header("GPU checks", ctx, rebuilt) + ["",
             "| check | case | expected (ms) | measured (ms) | error | target | result | note |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        unit = UNITS.get(r["check"], "rel")
        err = {"s": f"{r['error'] * 1e6:.1f} us", "abs": f"{r['error']:.1e}"}.get(unit, f"{r['error']:+.1%}")
        us = f"{r['target'] * 1e6:.0f} us" if r["target"] >= 1e-6 else f"{r['target'] * 1e6:.1f} us"
        tgt = {"s": us, "abs": f"{r['target']:.0e}"}.get(unit, f"{r['target']:.0%}")
        if unit == "abs":  # an error, no times; measured_s holds the run's wall time
            times, note = "- | -", f"{r['note']}; run {r['measured_s']:.1f} s"
        else:
            times, note = f"{r['expected_s'] * 1e3:.3f} | {r['measured_s'] * 1e3:.3f}", r["note"]
        result = "info" if r["pass"] == INFO else "PASS" if r["pass"] else "MISS"
        lines.append(f"| {r['check']} | {r['case']} | {times} | {err} | {tgt} | {result} | {note} |")
    by: dict[str, list] = {}
    for r in rows:
        by.setdefault(r["check"], [])
        if r["pass"] != INFO:
            by[r["check"]].append(r["pass"])
    lines += [""] + [f"- {k}: {sum(v)} of {len(v)} within target" + (" (and informational rows)" if
                                                                        len(v) < sum(r["check"] == k for r in rows)
                                                                        else "") for k, v in by.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="few repeats, one emulated schedule")
    ap.add_argument("--plan", action="store_true", help="print what would be measured and exit")
    ap.add_argument("--out", default=str(RESULTS), help="folder of the CSV and the report")
    ap.add_argument("--from-csv", action="store_true", help="rebuild the report from the stored CSV and context")
    args = ap.parse_args(argv)
    if args.from_csv:
        print(f"wrote {rebuild('gpu_checks', report, Path(args.out))} from the stored CSV")
        return 0
    steps = plan(args.quick)
    if args.plan or not torch.cuda.is_available():
        if not args.plan:
            print("gpu_checks: no GPU here (torch.cuda.is_available() is False); nothing measured. "
                  "Run this command unchanged on a GPU machine. The plan:")
        print("\n".join(f"  {i + 1}. {s}" for i, s in enumerate(steps)))
        return 0
    from pipert import _ext
    ctx = context({"pipert._C": f"{_ext.HAVE_EXT} (CUDA {_ext.HAVE_EXT_CUDA})"})
    t0 = time.time()
    rows = []
    for check in (check_delay, check_overlap, check_emulation, check_links, check_train, check_nccl_single,
                  stalls.check_race, stalls.check_vs_loop, stalls.check_host, stalls.check_gap):
        try:
            part = check(args.quick)
        except Exception as e:  # one broken check must not hide the others' results
            part = [_not_measured(check.__name__.removeprefix("check_"), "did not run", 0.0,
                                  f"{type(e).__name__}: {e}")]
        for r in part:
            print(f"{r['check']:9s} {r['case']:55s} {'PASS' if r['pass'] else 'MISS'}  error {r['error']:.3g}  "
                  f"{r['note']}", flush=True)
        rows += part
    ctx["run time"] = f"{time.time() - t0:.0f} s"
    out = Path(args.out)
    write_results("gpu_checks", [{f: r.get(f, "") for f in FIELDS} for r in rows], ctx, report, out)
    print(f"wrote {out / 'gpu_checks.md'}; {sum(r['pass'] for r in rows)} of {len(rows)} within target")
    return 0


if __name__ == "__main__":
    sys.exit(main())
