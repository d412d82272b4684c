"""Benchmark: chunked MLP forward+backward against PyTorch, time and peak memory (issue #7).

Side by side in one run, per sequence length: the unchunked PyTorch MLP,
PyTorch chunks (torch.cat of per-chunk MLPs), PyTorch chunks under
torch.utils.checkpoint, and pipert.kernels' chunked MLP in both memory modes at
several chunk sizes. Writes benchmarks/results/chunked_mlp.csv and .md with the
GPU, date, commit and versions (``--quick``: small shapes, ``_quick`` files).

Needs CUDA. ``--dry-run`` instead runs every variant once at a tiny shape on
the CPU, checks it against the unchunked MLP, and writes nothing.

    python benchmarks/bench_chunked_mlp.py            # bf16, h 4096, ffn 14336, 32k/64k/128k
    python benchmarks/bench_chunked_mlp.py --quick
    python benchmarks/bench_chunked_mlp.py --dry-run
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

if str(Path(__file__).resolve().parent) not in sys.path:  # also when loaded by path (tests)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import RESULTS, context, rebuild, report_header, write_results  # noqa: E402
from pipert.kernels import (chunked_gelu_mlp, chunked_swiglu_mlp, gelu_mlp_reference,
                            swiglu_mlp_reference)

GIB = 2 ** 30
# Targets of issue #7, as ratios to the unchunked PyTorch MLP of the same run.
TARGET_A_TIME, TARGET_B_TIME = 1.03, 1.25
CKPT_CHUNK, TORCH_CHUNK = 4096, 16384


@dataclass
class Variant:
    name: str
    kind: str  # "torch", "torch-chunks", "torch-ckpt", "ours-a", "ours-b"
    chunk: int | None
    fn: Callable[..., torch.Tensor]


def variants(activation: str, chunks: list[int], torch_chunk: int, ckpt_chunk: int
             ) -> list[Variant]:
    ref = swiglu_mlp_reference if activation == "swiglu" else gelu_mlp_reference
    ours = chunked_swiglu_mlp if activation == "swiglu" else chunked_gelu_mlp

    def torch_chunks(c: int, ckpt: bool) -> Callable[..., torch.Tensor]:
        def run(x: torch.Tensor, *w: torch.Tensor) -> torch.Tensor:
            parts = [checkpoint(ref, xc, *w, use_reentrant=False) if ckpt else ref(xc, *w)
                     for xc in x.split(c)]
            return torch.cat(parts)
        return run

    out = [Variant("torch unchunked", "torch", None, ref),
           Variant(f"torch chunks {torch_chunk}", "torch-chunks", torch_chunk,
                   torch_chunks(torch_chunk, False)),
           Variant(f"torch chunks {ckpt_chunk} + checkpoint", "torch-ckpt", ckpt_chunk,
                   torch_chunks(ckpt_chunk, True))]
    for recompute, kind in ((False, "ours-a"), (True, "ours-b")):
        for c in chunks:
            fn = (lambda c, r: lambda x, *w: ours(x, *w, chunk_size=c, recompute=r))(c, recompute)
            out.append(Variant(f"ours ({kind[-1]}) {c}", kind, c, fn))
    return out


def make_inputs(n: int, h: int, f: int, activation: str, dtype: torch.dtype,
                device: torch.device) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(0)
    rnd = lambda *s, scale=1.0: (torch.randn(*s, generator=gen, device=device, dtype=dtype)  # noqa: E731
                                 * scale)
    if activation == "swiglu":
        w = [rnd(f, h, scale=h ** -0.5), rnd(f, h, scale=h ** -0.5), rnd(h, f, scale=f ** -0.5)]
    else:
        w = [rnd(f, h, scale=h ** -0.5), rnd(f), rnd(h, f, scale=f ** -0.5), rnd(h)]
    return rnd(n, h), [p.requires_grad_() for p in w], rnd(n, h)


def fwd_bwd(v: Variant, x: torch.Tensor, w: list[torch.Tensor], dy: torch.Tensor) -> None:
    x.grad = None
    for p in w:
        p.grad = None
    v.fn(x, *w).backward(dy)


def measure(v: Variant, x: torch.Tensor, w: list[torch.Tensor], dy: torch.Tensor,
            warmup: int, iters: int) -> tuple[float, int]:
    """(median fwd+bwd milliseconds over ``iters``, peak bytes above the inputs)."""
    for _ in range(warmup):
        fwd_bwd(v, x, w, dy)
    x.grad = None
    for p in w:
        p.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fwd_bwd(v, x, w, dy)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        x.grad = None
        for p in w:
            p.grad = None
        start.record()
        v.fn(x, *w).backward(dy)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), peak


def model_flops(n: int, h: int, f: int, activation: str) -> float:
    """Forward + backward FLOPs of the GEMMs, recompute not counted (3x forward)."""
    gemms = 3 if activation == "swiglu" else 2
    return 3 * gemms * 2.0 * n * h * f


def judge(r: dict, base: dict, ckpt: dict | None, f: int, bytes_per: int) -> tuple[str, str]:
    """(target text, PASS/MISS) of one of our rows against the issue's targets."""
    if r["kind"] == "ours-a":
        limit = base["peak"] - (r["n"] - min(r["chunk"], r["n"])) * f * bytes_per
        ok = r["time_ratio"] <= TARGET_A_TIME and r["peak"] <= limit
        return (f"time <= {TARGET_A_TIME}x, peak <= {limit / GIB:.2f} GiB "
                "(unchunked - whole-seq intermediate + one chunk's)", "PASS" if ok else "MISS")
    if r["kind"] == "ours-b":
        limit = ckpt["peak"] if ckpt else float("inf")
        ok = r["time_ratio"] <= TARGET_B_TIME and r["peak"] <= limit
        return (f"time <= {TARGET_B_TIME}x, peak <= {limit / GIB:.2f} GiB (torch ckpt chunks)",
                "PASS" if ok else "MISS")
    return "", ""


def run(args: argparse.Namespace) -> list[dict]:
    dev, dtype = torch.device("cuda"), getattr(torch, args.dtype)
    rows = []
    for n in args.seqs:
        x, w, dy = make_inputs(n, args.hidden, args.ffn, args.activation, dtype, dev)
        x.requires_grad_()
        by_kind: dict[str, dict] = {}
        for v in variants(args.activation, args.chunks, args.torch_chunk, args.ckpt_chunk):
            r = {"n": n, "variant": v.name, "kind": v.kind, "chunk": v.chunk or n}
            try:
                ms, peak = measure(v, x, w, dy, args.warmup, args.iters)
                r.update(ms=ms, peak=peak, status="ok",
                         tflops=model_flops(n, args.hidden, args.ffn, args.activation) / ms / 1e9)
            except torch.cuda.OutOfMemoryError:
                r.update(ms=float("nan"), peak=float("nan"), tflops=float("nan"), status="OOM")
            torch.cuda.empty_cache()
            by_kind.setdefault(v.kind, r)
            rows.append(r)
            print(f"seq {n:>7} {v.name:<32} {r['ms']:9.2f} ms {r['peak'] / GIB:7.2f} GiB "
                  f"{r['tflops']:7.1f} TFLOP/s {r['status']}", flush=True)
        base, ckpt = by_kind["torch"], by_kind.get("torch-ckpt")
        for r in rows:
            if r["n"] != n:
                continue
            r["time_ratio"] = r["ms"] / base["ms"]
            r["target"], r["verdict"] = ("", "")
            if r["status"] == "ok" and base["status"] == "ok":
                r["target"], r["verdict"] = judge(r, base, ckpt, args.ffn, x.element_size())
        del x, w, dy
        torch.cuda.empty_cache()
    return rows


def write(rows: list[dict], args: argparse.Namespace, stem: str, gpu: str) -> None:
    """``STEM.csv``, ``STEM.context.json`` and ``STEM.md`` (built from the first two) in ``--out-dir``."""
    csv_rows = [{"n": r["n"], "variant": r["variant"], "chunk": r["chunk"], "ms": f"{r['ms']:.3f}",
                 "tflops": f"{r['tflops']:.1f}", "peak_gib": f"{r['peak'] / GIB:.3f}",
                 "time_ratio": f"{r['time_ratio']:.3f}", "target": r["target"], "verdict": r["verdict"],
                 "status": r["status"]} for r in rows]
    ctx = context(extra={
        "gpu": gpu, "triton": _triton_version(), "CUDA": torch.version.cuda,
        "shape": f"{args.activation}, {args.dtype}, hidden {args.hidden}, ffn {args.ffn}; median of {args.iters} "
                 f"fwd+bwd after {args.warmup} warm-up",
        "time": "CUDA events around forward+backward; peak: max_memory_allocated above the inputs, weights and "
                "output grad (weight grads set to None before each run)",
        "TFLOP/s": "model FLOPs (GEMMs, 3x forward), recompute not counted",
        "targets": "mode (a) <= 1.03x unchunked time with peak <= unchunked peak minus the whole-sequence "
                   "intermediate plus one chunk's; mode (b) <= 1.25x at a peak no higher than torch chunks of "
                   f"{args.ckpt_chunk} + checkpoint"})
    write_results(stem, csv_rows, ctx, report, Path(args.out_dir))


def report(rows: list[dict], ctx: dict, rebuilt: bool = False) -> str:
    """The markdown report from the CSV rows and the context."""
    lines = report_header("Chunked MLP benchmark (issue #7)", ctx, rebuilt) + [
        "", "| seq | variant | ms | TFLOP/s | peak GiB | x unchunked | target | verdict |",
        "|---:|---|---:|---:|---:|---:|---|---|"]
    for r in rows:
        ms = f"{r['ms']:.2f}" if r["status"] == "ok" else r["status"]
        lines.append(f"| {r['n']} | {r['variant']} | {ms} | {r['tflops']:.0f} | {r['peak_gib']:.2f} | "
                     f"{r['time_ratio']:.3f} | {r['target']} | {r['verdict']} |")
    misses = [r for r in rows if r["verdict"] == "MISS"]
    lines += ["", f"{len(misses)} target(s) missed:" if misses else "All targets met."]
    lines += [f"- seq {r['n']}, {r['variant']}: " + ", ".join(exceeded(r)) for r in misses]
    return "\n".join(lines + [""])


def bounds(target: str) -> tuple[float | None, float | None]:
    """(time ratio, peak GiB) bounds of a row from its target text ("time <= Rx, peak <= G GiB ..."),
    None for a bound the text does not name."""
    found = [re.search(pattern, target) for pattern in (r"<= ([\d.]+)x", r"peak <= ([\d.]+) GiB")]
    return tuple(float(m.group(1)) if m else None for m in found)  # type: ignore[return-value]


def exceeded(r: dict) -> list[str]:
    """Which bounds of its target a row exceeds, with the measured value beside each."""
    time_bound, peak_bound = bounds(r["target"])
    out = [f"time {r['time_ratio']:.3f}x above {time_bound:g}x"] if time_bound and r["time_ratio"] > time_bound else []
    if peak_bound and r["peak_gib"] > peak_bound:
        out.append(f"peak {r['peak_gib']:.2f} GiB above {peak_bound:.2f} GiB")
    return out or [f"no bound of its target ({r['target']}) exceeded by the stored figures"]


def _triton_version() -> str:
    try:
        import triton
        return triton.__version__
    except ImportError:
        return "absent"


def dry_run(args: argparse.Namespace) -> int:
    """Every variant once on the CPU at a tiny shape, checked against the unchunked MLP."""
    n, h, f = 300, 32, 80
    x, w, dy = make_inputs(n, h, f, args.activation, torch.float32, torch.device("cpu"))
    x.requires_grad_()
    vs = variants(args.activation, [64, 128], 128, 64)
    results = []
    for v in vs:
        fwd_bwd(v, x, w, dy)
        results.append([x.grad.clone()] + [p.grad.clone() for p in w])
    for v, res in zip(vs, results):
        err = max(float((a - b).abs().max()) for a, b in zip(res, results[0]))
        print(f"dry run: {v.name:<32} max |grad - unchunked| = {err:.2e}")
        if err > 1e-4:
            print("dry run: mismatch", file=sys.stderr)
            return 1
    print(f"dry run ok; on a GPU this would run seqs {args.seqs}, chunks {args.chunks}, "
          f"{args.activation} {args.dtype} h={args.hidden} f={args.ffn}")
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seqs", type=int, nargs="+", default=[32768, 65536, 131072])
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--ffn", type=int, default=14336)
    p.add_argument("--chunks", type=int, nargs="+", default=[4096, 8192, 16384])
    p.add_argument("--torch-chunk", type=int, default=TORCH_CHUNK)
    p.add_argument("--ckpt-chunk", type=int, default=CKPT_CHUNK)
    p.add_argument("--activation", choices=["swiglu", "gelu"], default="swiglu")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--out-dir", default=str(RESULTS))
    p.add_argument("--quick", action="store_true",
                   help="small shapes (seqs 4096 8192, hidden 1024, ffn 3584, chunks 1024 2048)")
    p.add_argument("--dry-run", action="store_true",
                   help="CPU check of every variant at a tiny shape; writes nothing")
    p.add_argument("--from-csv", action="store_true", help="rebuild the report from the stored CSV and context")
    args = p.parse_args(argv)
    if args.quick:
        args.seqs, args.hidden, args.ffn, args.chunks = [4096, 8192], 1024, 3584, [1024, 2048]
        args.torch_chunk, args.ckpt_chunk = 2048, 1024
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        return dry_run(args)
    if args.from_csv:
        print(f"wrote {rebuild('chunked_mlp_quick' if args.quick else 'chunked_mlp', report, Path(args.out_dir))}")
        return 0
    if not torch.cuda.is_available():
        print("bench_chunked_mlp: needs a CUDA GPU (use --dry-run for a CPU check)",
              file=sys.stderr)
        return 2
    rows = run(args)
    write(rows, args, "chunked_mlp_quick" if args.quick else "chunked_mlp",
          torch.cuda.get_device_name())
    print(f"wrote {args.out_dir}/chunked_mlp{'_quick' if args.quick else ''}.csv and .md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
