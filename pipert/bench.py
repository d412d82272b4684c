"""``pipert bench overlap``: does compute on the compute queue overlap messages on the send and
receive queues?

Two devices' queues (``pipert.device.streams.StreamSet``: pipert._C threads or Python threads
on a CPU, CUDA streams on a GPU): K GEMMs of n x n on device 0's compute queue, and K' messages
of b bytes from device 0's send queue to device 1's receive queue through a
``pipert.comm.links.LinkEmulator`` link (optional latency and bandwidth: injected delay).
Each part is timed alone and both together (host wall clock from issuing to the end of
``synchronize``, median of the repeats, run interleaved); perfect overlap takes max(compute, comm), none the
serial sum. ``overlap`` is the share of the possible saving realised:
(serial - both) / (serial - max).
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import asdict, dataclass


__all__ = ["OverlapResult", "measure_overlap", "register"]


@dataclass
class OverlapResult:
    """Seconds of each run (medians) and the settings that made them."""

    device: str
    streams: str
    gemm: int
    computes: int
    message_bytes: int
    messages: int
    latency: float
    bandwidth: float
    compute_s: float
    comm_s: float
    both_s: float

    @property
    def limit_s(self) -> float:
        return max(self.compute_s, self.comm_s)

    @property
    def serial_s(self) -> float:
        return self.compute_s + self.comm_s

    @property
    def overlap(self) -> float:
        """Share of the possible saving realised (1: both took max(compute, comm); 0: the sum)."""
        room = self.serial_s - self.limit_s
        return (self.serial_s - self.both_s) / room if room > 0 else 1.0

    def as_dict(self) -> dict:
        d = asdict(self)
        d["bandwidth"] = None if self.bandwidth == math.inf else self.bandwidth
        d.update(limit_s=self.limit_s, serial_s=self.serial_s, overlap=self.overlap)
        return d


def _parse_device(device: str) -> "torch.device":
    """``device`` as a torch device this machine has: cpu, or cuda[:i] with i below the GPU count."""
    import torch
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    allowed = "cpu" + (f", cuda or cuda:0..cuda:{n - 1}" if n else "")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"--device {device!r} is not a device; allowed: {allowed}") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"--device {device!r}: device type {dev.type!r} unsupported; allowed: {allowed}")
    if dev.type == "cuda" and not n:
        raise ValueError(f"--device {device}: no CUDA device here; allowed: cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= n:
        raise ValueError(f"--device {device}: this machine has {n} CUDA device(s); allowed: {allowed}")
    return dev


def measure_overlap(gemm: int = 512, computes: int = 8, message_bytes: int = 4 << 20, messages: int = 8,
                    latency: float = 0.0, bandwidth: float = math.inf, device: str = "cpu", repeats: int = 5,
                    backend: str | None = None) -> OverlapResult:
    """Time compute alone, messages alone and both together (module doc)."""
    import torch
    from .cost.topology import LinkSpec
    from .comm.links import LinkEmulator
    from .device.streams import StreamSet
    for name, v in (("gemm", gemm), ("computes", computes), ("messages", messages), ("repeats", repeats)):
        if v < 1:
            raise ValueError(f"--{name} must be >= 1, got {v}")
    if message_bytes < 1:
        raise ValueError(f"--message-bytes must be >= 1, got {message_bytes}")
    dev = _parse_device(device)
    a = torch.randn(gemm, gemm, device=dev)
    b = torch.randn(gemm, gemm, device=dev)
    src = torch.zeros(message_bytes, dtype=torch.uint8, device=dev)
    dsts = [torch.empty_like(src) for _ in range(messages)]
    s0 = StreamSet(dev, name="bench0", backend=backend)
    s1 = StreamSet(dev, name="bench1", backend=backend)
    em = LinkEmulator(2, links={(0, 1): LinkSpec(latency, bandwidth)})
    try:
        def run(compute: bool, comm: bool) -> float:
            em.reset()  # links free from now: the first message does not queue behind the last run's
            t0 = time.perf_counter()
            if compute:
                for _ in range(computes):
                    s0.compute.enqueue(lambda: torch.mm(a, b))
            if comm:
                for d in dsts:
                    em.enqueue_transfer(0, 1, message_bytes, s0.send, s1.recv, copy=(d, src))
            s0.synchronize()
            s1.synchronize()
            return time.perf_counter() - t0

        run(True, True)  # warm-up: allocator, threads, kernels
        kinds = ((True, False), (False, True), (True, True))
        samples: dict[tuple[bool, bool], list[float]] = {k: [] for k in kinds}
        for _ in range(repeats):  # interleaved, so that a slow spell of the machine hits all three
            for k in kinds:
                samples[k].append(run(*k))
        times = {k: statistics.median(v) for k, v in samples.items()}
    finally:
        s0.close()
        s1.close()
    return OverlapResult(str(dev), s0.backend, gemm, computes, message_bytes, messages, latency, bandwidth,
                         times[(True, False)], times[(False, True)], times[(True, True)])


def format_overlap(r: OverlapResult) -> str:
    from .linkflags import format_bandwidth, format_duration
    head = (f"pipert bench overlap ({r.device}, {r.streams} streams): {r.computes} x GEMM {r.gemm}, "
            f"{r.messages} messages x {r.message_bytes} B, latency {format_duration(r.latency)}, "
            f"bandwidth {format_bandwidth(r.bandwidth)}")
    rows = [("compute alone", r.compute_s), ("messages alone", r.comm_s), ("both together", r.both_s),
            ("limit max(compute, comm)", r.limit_s), ("serial sum", r.serial_s)]
    lines = [head, f"{'':26}{'ms':>10}"] + [f"{k:26}{v * 1e3:10.3f}" for k, v in rows]
    lines.append(f"{'overlap':26}{r.overlap * 100:9.0f}%  of the possible saving (serial - both) / (serial - limit)")
    return "\n".join(lines)


def cmd_overlap(args: argparse.Namespace) -> int:
    from .linkflags import parse_bandwidth, parse_duration
    r = measure_overlap(args.gemm, args.computes, args.message_bytes, args.messages,
                        parse_duration(args.latency, "--latency"), parse_bandwidth(args.bandwidth, "--bandwidth"),
                        args.device, args.repeats)
    print(json.dumps(r.as_dict()) if args.json else format_overlap(r))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("bench", help="microbenchmarks of the runtime on this machine")
    bs = b.add_subparsers(dest="bench", required=True, metavar="{overlap}")
    o = bs.add_parser("overlap", help="compute on the compute queue against messages on the send/recv queues")
    o.add_argument("--gemm", type=int, default=512, help="n of each n x n GEMM (default: 512)")
    o.add_argument("--computes", type=int, default=8, help="GEMMs on the compute queue (default: 8)")
    o.add_argument("--message-bytes", type=int, default=4 << 20, help="bytes per message (default: 4 MiB)")
    o.add_argument("--messages", type=int, default=8, help="messages on the send/recv queues (default: 8)")
    o.add_argument("--latency", default="0", help="injected latency per message, e.g. 1ms (default: 0)")
    o.add_argument("--bandwidth", default="inf", help="injected link bandwidth, e.g. 10Gbps (default: unlimited)")
    o.add_argument("--device", default="cpu", help="cpu or cuda[:i] (default: cpu)")
    o.add_argument("--repeats", type=int, default=5, help="runs per measurement, median kept (default: 5)")
    o.add_argument("--json", action="store_true", help="print one JSON object")
    o.set_defaults(fn=cmd_overlap)
