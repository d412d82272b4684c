"""Delay injection benchmark: delay accuracy, bandwidth emulation, compute/communication overlap.

    python benchmarks/bench_delay.py [--device cpu|cuda] [--backend ext python] [--quick]

Writes benchmarks/results/delay_<device>.csv and .md with hardware, date and commit.
Targets (CPU; from the issue): error <= max(100 us, 2%) for delays from 10 us to 100 ms and
for k back-to-back messages of b bytes (expected k*b/bandwidth + latency); with compute on
the compute stream and messages on send/recv, step <= 1.03 * max(compute, communication).
A delay row passes when its p95 error is within target; bandwidth and overlap rows use the
median of their repetitions. CPU spans run from the host issuing the work (host clock just
before) to the real completion event; CUDA spans are between device events. Bandwidth rows
queue the k messages behind a 5 ms gate on the send stream so that all are ready together.
"issue" rows report the host cost per call (no target).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

from _common import RESULTS, context, rebuild, report_header, write_results

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipert import _ext  # noqa: E402
from pipert.comm.links import LinkEmulator, LinkSpec
from pipert.device.streams import StreamSet, clock

DELAYS = [10e-6, 30e-6, 100e-6, 300e-6, 1e-3, 3e-3, 10e-3, 30e-3, 100e-3]
# (latency s, bandwidth B/s, message bytes, k messages)
BANDWIDTH_CASES = [(100e-6, 10e9, 100e3, 50), (1e-3, 1e9, 1e6, 10), (5e-3, 100e6, 1e6, 8), (20e-6, 1e9, 64e3, 100)]
# (compute s, communication s) targets
OVERLAP_CASES = [(5e-3, 5e-3), (10e-3, 5e-3), (5e-3, 10e-3), (20e-3, 20e-3)]


def target(expected: float) -> float:
    return max(100e-6, 0.02 * expected)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def span(dev: StreamSet, t0: float, start, end) -> float:
    """Seconds from the host issuing `start` (CPU: host clock t0, taken just before) to the real
    completion of `end`; on CUDA, between the two device events."""
    if dev.backend == "cuda":
        return start.elapsed_time(end)
    return end.time - t0


def bench_delays(dev: StreamSet, quick: bool) -> list[dict]:
    rows = []
    s = dev.send
    for d in DELAYS:
        n = 5 if quick else (50 if d <= 1e-3 else 20 if d <= 10e-3 else 8)
        rel, dl = [], []
        for _ in range(n):
            e0 = s.record()
            t0 = clock()
            s.enqueue_delay(d)
            e1 = s.record()
            e1.synchronize()
            rel.append(span(dev, t0, e0, e1) - d)
            if dev.backend != "cuda":  # absolute deadlines: error of the completion time
                deadline = clock() + d
                s.enqueue_delay_until(deadline)
                e = s.record()
                e.synchronize()
                dl.append(e.time - deadline)
        for mode, errs in (("relative", rel), ("deadline", dl)):
            if not errs:
                continue
            p95 = pct([abs(e) for e in errs], 0.95)
            rows.append({"section": "delay", "case": f"{mode} {d * 1e6:g} us", "expected_s": d,
                         "measured_s": d + statistics.median(errs), "median_err_s": statistics.median(errs),
                         "p95_abs_err_s": p95, "max_abs_err_s": max(abs(e) for e in errs),
                         "target_s": target(d), "n": n, "pass": p95 <= target(d)})
    return rows


GATE = 5e-3  # bandwidth rows: the send stream waits this long first, so all k messages are ready together


def bench_bandwidth(a: StreamSet, b: StreamSet, backend: str, quick: bool) -> list[dict]:
    """k back-to-back messages: queued behind a GATE delay on the send stream, so that all are
    ready when it ends (the host issues them meanwhile); expected = GATE + k*b/bw + latency."""
    rows = []
    for lat, bw, nbytes, k in BANDWIDTH_CASES:
        expected = k * nbytes / bw + lat
        errs = []
        for _ in range(3 if quick else 7):
            em = LinkEmulator(2, LinkSpec(lat, bw), backend=backend if backend != "cuda" else None)
            a.synchronize()
            b.synchronize()
            t0 = clock()
            start = a.send.record()
            a.send.enqueue_delay(GATE)
            trs = [em.enqueue_transfer(0, 1, nbytes, a.send, b.recv, rendezvous=False) for _ in range(k)]
            trs[-1].arrived.synchronize()
            errs.append(span(a, t0, start, trs[-1].arrived) - GATE - expected)
        med = statistics.median(errs)
        rows.append({"section": "bandwidth", "case": f"{k} x {nbytes / 1e3:g} kB @ {bw / 1e9:g} GB/s + {lat * 1e6:g} us",
                     "expected_s": expected, "measured_s": expected + med, "median_err_s": med,
                     "p95_abs_err_s": pct([abs(e) for e in errs], 0.95), "max_abs_err_s": max(abs(e) for e in errs),
                     "target_s": target(expected), "n": len(errs), "pass": abs(med) <= target(expected)})
    return rows


def bench_issue(a: StreamSet, b: StreamSet, backend: str) -> list[dict]:
    """Host cost of issuing: per stream op (record/wait/enqueue/delay, batched with issue()) and
    per enqueue_transfer call; informational (no target)."""
    n = 2000
    noop = lambda: None  # noqa: E731
    ev = a.event()
    a.synchronize()
    t0 = clock()
    a.issue([op for _ in range(n // 4) for op in (("record", a.compute, ev), ("wait", a.send, ev),
                                                  ("run", a.compute, noop), ("delay", a.recv, 0.0))])
    per_op = (clock() - t0) / n
    a.synchronize()
    em = LinkEmulator(2, LinkSpec(0.0, 1e12), backend=backend if backend != "cuda" else None)
    t0 = clock()
    for _ in range(n // 4):
        em.enqueue_transfer(0, 1, 1.0, a.send, b.recv, rendezvous=False)
    per_tr = (clock() - t0) / (n // 4)
    a.synchronize()
    b.synchronize()
    return [{"section": "issue", "case": name, "expected_s": 0.0, "measured_s": t, "median_err_s": t,
             "p95_abs_err_s": "", "max_abs_err_s": "", "target_s": "", "n": n, "pass": True,
             "note": f"host time per call: {t * 1e6:.1f} us"}
            for name, t in (("stream op via issue()", per_op), ("enqueue_transfer", per_tr))]


def _compute_fn(seconds: float, device: torch.device):
    """A real compute callable (matmuls) calibrated to take about `seconds` alone."""
    n = 256
    x = torch.randn(n, n, device=device)
    y = torch.randn(n, n, device=device)

    def run(iters: int) -> None:
        z = x
        for _ in range(iters):
            z = torch.mm(z, y).tanh_()

    def timed(iters: int) -> float:
        t0 = clock()
        run(iters)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return clock() - t0

    iters = 10
    for _ in range(3):  # rescale to the target; the median resists a busy moment
        per = statistics.median(timed(iters) for _ in range(3)) / iters
        iters = max(1, round(seconds / per))
    return lambda: run(iters)


def bench_overlap(a: StreamSet, b: StreamSet, backend: str, quick: bool) -> list[dict]:
    rows = []
    reps = 3 if quick else 7
    for comp_s, comm_s in OVERLAP_CASES:
        work = _compute_fn(comp_s, a.device)
        lat = 1e-3
        k, bw = 4, 1e9
        nbytes = (comm_s - lat) / k * bw  # comm = k * nbytes / bw + lat

        def step(compute: bool, comm: bool) -> float:
            em = LinkEmulator(2, LinkSpec(lat, bw), backend=backend if backend != "cuda" else None)
            a.synchronize()
            b.synchronize()
            t0 = clock()
            start = a.compute.record()
            a.send.wait(start)  # both start together
            ends = []
            if compute:
                a.compute.enqueue(work)
                ends.append(a.compute.record())
            if comm:
                trs = [em.enqueue_transfer(0, 1, nbytes, a.send, b.recv, rendezvous=False) for _ in range(k)]
                ends.append(trs[-1].arrived)
            for e in ends:
                e.synchronize()
            return max(span(a, t0, start, e) for e in ends)

        runs = [(step(True, False), step(False, True), step(True, True)) for _ in range(reps)]  # interleaved
        comp, comm, both = (statistics.median(r[i] for r in runs) for i in range(3))
        ratio = both / max(comp, comm)
        rows.append({"section": "overlap", "case": f"compute {comp_s * 1e3:g} ms + comm {comm_s * 1e3:g} ms",
                     "expected_s": max(comp, comm), "measured_s": both, "median_err_s": both - max(comp, comm),
                     "p95_abs_err_s": "", "max_abs_err_s": "", "target_s": 0.03 * max(comp, comm), "n": reps,
                     "pass": ratio <= 1.03 and min(comp, comm) >= 1e-3,
                     "note": f"compute alone {comp * 1e3:.2f} ms, comm alone {comm * 1e3:.2f} ms, ratio {ratio:.3f}"})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--backend", nargs="*", default=None, help="CPU backends (ext, python); default both")
    ap.add_argument("--quick", action="store_true", help="few repetitions (smoke run)")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--from-csv", action="store_true", help="rebuild the report from the stored CSV and context")
    args = ap.parse_args()
    if args.from_csv:
        print(f"wrote {rebuild(f'delay_{args.device}', report, Path(args.out))} from the stored CSV")
        return
    if args.device == "cuda":
        backends = ["cuda"]
    else:
        backends = args.backend or (["ext", "python"] if _ext.HAVE_EXT else ["python"])
    torch.set_num_threads(1)  # compute on one core; the other runs the stream threads

    rows = []
    for be in backends:
        dev = "cuda:0" if be == "cuda" else "cpu"
        with StreamSet(dev, "r0", backend=be) as a, StreamSet(dev, "r1", backend=be) as b:
            for r in bench_delays(a, args.quick) + bench_bandwidth(a, b, be, args.quick) + \
                    bench_overlap(a, b, be, args.quick) + bench_issue(a, b, be):
                r["backend"] = be
                rows.append(r)
                tgt = f"{r['target_s'] * 1e6:7.1f} us" if r["target_s"] != "" else "      -   "
                print(f"[{be}] {r['section']:9s} {r['case']:40s} expected {r['expected_s'] * 1e3:9.3f} ms  "
                      f"err {r['median_err_s'] * 1e6:9.1f} us  target {tgt}  "
                      f"{'PASS' if r['pass'] else 'MISS'} {r.get('note', '')}", flush=True)

    ctx = context(extra={"pipert._C": f"{_ext.HAVE_EXT} (CUDA {_ext.HAVE_EXT_CUDA})"})
    write_results(f"delay_{args.device}", [{k: r.get(k, "") for k in FIELDS} for r in rows], ctx,
                  report, Path(args.out))
    judged = [r for r in rows if r["section"] != "issue"]
    print(f"{sum(r['pass'] for r in judged)}/{len(judged)} within target; wrote {args.out}/delay_{args.device}.md")


FIELDS = ["backend", "section", "case", "expected_s", "measured_s", "median_err_s", "p95_abs_err_s",
          "max_abs_err_s", "target_s", "n", "pass", "note"]


def report(rows: list[dict], ctx: dict, rebuilt: bool = False) -> str:
    """The markdown report from the CSV rows and the context."""
    us = lambda x: f"{x * 1e6:.1f}" if isinstance(x, float) else ""  # noqa: E731
    device = "cuda" if any(r["backend"] == "cuda" for r in rows) else "cpu"
    lines = report_header(f"Delay injection benchmark ({device})", ctx, rebuilt)
    lines += ["", "Targets: error <= max(100 us, 2%); overlap step <= 1.03 x max(compute, comm). "
              "Delay rows pass on p95 |error|, the others on the median.",
              "Reading: the median error is the bias of the mechanism, p95 and max its tail. Overlap compares medians of "
              "interleaved runs of compute alone, communication alone and both; compute is real matmuls on one "
              "thread.", "",
              "| backend | section | case | expected (ms) | median err (us) | p95 abs err (us) | max abs err (us) "
              "| target (us) | result | note |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["section"] == "issue":
            lines.append(f"| {r['backend']} | issue | {r['case']} | | | | | | info | {r['note']} |")
            continue
        lines.append(f"| {r['backend']} | {r['section']} | {r['case']} | {r['expected_s'] * 1e3:.3f} | "
                     f"{us(r['median_err_s'])} | {us(r['p95_abs_err_s'])} | {us(r['max_abs_err_s'])} | "
                     f"{us(r['target_s'])} | {'pass' if r['pass'] else 'MISS'} | {r.get('note', '')} |")
    judged = [r for r in rows if r["section"] != "issue"]
    passed = sum(r["pass"] for r in judged)
    return "\n".join(lines + ["", f"{passed} of {len(judged)} rows within target.", ""])


if __name__ == "__main__":
    main()
