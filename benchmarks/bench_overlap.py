"""Overlap of compute and communication on the executor's queues (`pipert bench overlap`).

GEMMs on the compute queue against messages on the send/recv queues, without and with injected
latency; the number of GEMMs is calibrated first so that compute alone takes about as long as
the messages alone (where overlap matters most, and a shared machine's speed varies); measured time against the
limit max(compute, comm) and the serial sum. CPU streams: pipert._C threads and the Python
fallback; on a GPU, CUDA streams (``--device cuda``).

Writes results/overlap_<device>.csv, .context.json and .md (hardware, date, commit);
``--from-csv`` rebuilds the report from the first two.
    python benchmarks/bench_overlap.py [--device cpu|cuda] [--repeats 7] [--from-csv]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

from _common import context, rebuild, report_header, write_results

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipert import _ext  # noqa: E402
from pipert.bench import measure_overlap  # noqa: E402

# (gemm n, message bytes, messages, latency s)
CASES = {"cpu": [(256, 1 << 20, 16, 0.0), (256, 1 << 20, 16, 1e-3), (512, 4 << 20, 8, 0.0), (512, 4 << 20, 8, 2e-3)],
         "cuda": [(4096, 64 << 20, 16, 0.0), (4096, 64 << 20, 16, 1e-3), (8192, 256 << 20, 8, 0.0)]}
FIELDS = ["streams", "gemm", "computes", "message_bytes", "messages", "latency", "compute_s", "comm_s", "both_s",
          "limit_s", "serial_s", "overlap"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--from-csv", action="store_true", help="rebuild the report from the stored CSV and context")
    args = ap.parse_args(argv)
    name = f"overlap_{args.device}"
    if args.from_csv:
        print(f"wrote {rebuild(name, report)}")
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench_overlap: --device cuda but no GPU here; nothing measured")
        return 0
    torch.set_num_threads(1)  # one core computes; the other serves the communication threads
    ctx = context({"pipert._C": f"{_ext.HAVE_EXT} (CUDA {_ext.HAVE_EXT_CUDA})", "torch threads": 1,
                   "repeats": args.repeats, "device": args.device})
    backends = [None] if args.device == "cuda" else (["ext", "python"] if _ext.HAVE_EXT else ["python"])
    rows = []
    for be in backends:
        for n, b, km, lat in CASES[args.device]:
            probe = measure_overlap(n, 1, b, km, lat, device=args.device, repeats=3, backend=be)
            k = max(1, round(probe.comm_s / probe.compute_s))  # compute alone ~ comm alone
            r = measure_overlap(n, k, b, km, lat, device=args.device, repeats=args.repeats, backend=be).as_dict()
            rows.append({f: r[f] for f in FIELDS})
            print({f: rows[-1][f] for f in ("streams", "gemm", "latency", "compute_s", "comm_s", "both_s",
                                             "overlap")}, flush=True)
    write_results(name, rows, ctx, report)
    print(f"wrote results/{name}.md")
    return 0


def report(rows: list[dict], ctx: dict, rebuilt: bool = False) -> str:
    lines = report_header(f"Compute/communication overlap on the executor's queues ({ctx['device']})", ctx, rebuilt)
    balance = [r["compute_s"] / r["comm_s"] for r in rows]
    lines += ["", f"GEMM counts calibrated for compute alone to take about as long as the messages alone; measured "
             f"compute / comm {min(balance):.2f}-{max(balance):.2f}. Medians of {ctx['repeats']} interleaved runs of each part alone and both together (host wall clock "
             "from issuing to synchronize). overlap = (serial - both) / (serial - limit): 100% when both took "
             "max(compute, comm), 0% when they took the serial sum.", "",
             "| streams | GEMM n x count | messages | latency ms | compute ms | comm ms | both ms | limit ms | "
             "serial ms | both / limit | overlap |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['streams']} | {r['gemm']} x {r['computes']} | {r['messages']} x "
                     f"{r['message_bytes'] >> 20} MiB | {r['latency'] * 1e3:g} | {r['compute_s'] * 1e3:.2f} | "
                     f"{r['comm_s'] * 1e3:.2f} | {r['both_s'] * 1e3:.2f} | {r['limit_s'] * 1e3:.2f} | "
                     f"{r['serial_s'] * 1e3:.2f} | {r['both_s'] / r['limit_s']:.2f} | {r['overlap']:.0%} |")
    lines.append("")
    for be in dict.fromkeys(r["streams"] for r in rows):
        mine = [r for r in rows if r["streams"] == be]
        med = statistics.median(r["overlap"] for r in mine)
        worst = max(mine, key=lambda r: r["both_s"] / r["limit_s"])
        lines.append(f"- {be} streams: median overlap {med:.0%} of the possible saving over {len(mine)} cases; "
                     f"the farthest from the limit is GEMM {worst['gemm']} with {worst['latency'] * 1e3:g} ms latency "
                     f"at {worst['both_s'] / worst['limit_s']:.2f} x max(compute, comm), "
                     f"{worst['both_s'] / worst['serial_s']:.2f} x the serial sum.")
    fast = [r for r in rows if r["both_s"] < r["limit_s"]]
    if fast:
        worst = min(r["both_s"] / r["limit_s"] for r in fast)
        lines.append(f"- {len(fast)} of {len(rows)} cases took less together than the slower part alone (down to "
                     f"{worst:.2f} x): the parts' own times vary between runs by at least {1 - worst:.0%} on this "
                     f"machine (load average in the context above), which bounds how far any row can be read.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
