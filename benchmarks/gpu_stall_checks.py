"""The one-GPU checks of host stalls and stream ordering (issue 19), run by gpu_checks.py:

- race: the local transport between two streams of one GPU, the sender's stream running a long
  kernel before it writes what it sends (``pipert.comm.streamorder.slow_producer_check``):
  with pipert's events the receiver gets the final values; without them (the transport before
  its events, informational) it reads too early;
- vs-loop: pipert at P=1 (local backend) against a plain PyTorch loop with the same gradient
  accumulation and AdamW step on a real-size model, alternating, medians (goal: <= 2 % slower);
- host: in the one-GPU emulation (4 ranks on one GPU, local transport), the host seconds per step
  until every rank issued its whole step, against the step's time (its one wait ends when the GPU
  is done): below 1, the host runs ahead of the GPU;
- gap: k back-to-back delayed messages on one link (bench_delay's bandwidth cases), error per
  message with the wait kernels' chains off (before; informational) and on
  (``pipert.device.streams.Chain``).

Every check takes the device, so that tests run the same code on the CPU.
"""
from __future__ import annotations

import statistics
import time

import torch

from _common import bandwidth_messages

VS_LOOP = dict(model="medium", seq=512, mb_size=4, microbatches=8, warmup=3, steps=10)
HOST = dict(model="small", stages=4, microbatches=8, seq=256, steps=5)
HOST_SCHEDULES = ["1f1b", "zb-h1"]
GAP_TARGET = 0.5e-6  # seconds of error per message of a back-to-back run, chains on


def plan_lines(quick: bool) -> list[str]:
    """What these checks measure, one line per check group (gpu_checks.py numbers them)."""
    v, h = VS_LOOP, HOST
    return ["race: local transport between two streams, a producer that sleeps 50 ms before writing its "
            "message; with pipert's events and without (before)",
            f"vs-loop: pipert P=1 against a plain PyTorch loop, model {v['model']}, seq {v['seq']}, "
            f"{v['mb_size']} x {v['microbatches']} micro-batches, AdamW, median of {v['steps']} steps (goal <= 2 % slower)",
            f"host: host seconds per step against the step's time, {h['stages']} ranks on one GPU, model {h['model']}, "
            f"M={h['microbatches']}, " + ", ".join(HOST_SCHEDULES[:1] if quick else HOST_SCHEDULES),
            "gap: per-message error of back-to-back delayed messages (bench_delay's bandwidth cases) with the wait "
            f"kernels' chains off (before) and on (target {GAP_TARGET * 1e6:g} us per message)"]


def check_race(quick: bool, device: str = "cuda:0") -> list[dict]:
    from pipert.comm.streamorder import Unordered
    from pipert.tools.streamcheck import slow_producer_check
    rows = []
    for name, order in (("events (pipert)", None), ("no events (before)", Unordered())):
        t0 = time.perf_counter()
        sent, got = slow_producer_check(torch.device(device), order)
        err = abs(got - sent) / sent
        rows.append({"check": "race", "case": f"local transport, slow producer, {name}", "expected_s": 0.0,
                     "measured_s": time.perf_counter() - t0, "error": err, "target": 0.0,
                     "pass": err == 0.0 if order is None else "",
                     "note": f"sum sent {sent:g}, received {got:g}"})
    return rows


def check_vs_loop(quick: bool, device: str = "cuda:0", **overrides) -> list[dict]:
    from pipert.models import build_units
    from pipert.pipeline import Pipeline
    c = dict(VS_LOOP, **overrides)
    dev, M = torch.device(device), c["microbatches"]
    steps = 3 if quick else c["steps"]
    opt = lambda ps: torch.optim.AdamW(ps, lr=1e-4)  # noqa: E731
    pipe = Pipeline(build_units(c["model"], 1, seed=0, device=dev, max_seq=c["seq"]), "1f1b", stages=1,
                    microbatches=M, optimizer=opt)
    model = build_units(c["model"], 1, seed=0, device=dev, max_seq=c["seq"])[0]  # the same weights
    plain_opt = opt(model.parameters())

    def plain(x: torch.Tensor, y: torch.Tensor) -> float:
        total = torch.zeros((), device=dev)
        for xm, ym in zip(x.chunk(M), y.chunk(M)):
            loss = model(xm, ym)
            (loss / M).backward()
            total += loss.detach()
        plain_opt.step()
        plain_opt.zero_grad(set_to_none=True)
        return float(total) / M  # one read per step, as pipert

    times: dict[str, list[float]] = {"pipert": [], "plain": []}
    diff = 0.0
    g = torch.Generator().manual_seed(0)
    for i in range(c["warmup"] + steps):
        tokens = torch.randint(0, 256, (M * c["mb_size"], c["seq"] + 1), generator=g).to(dev)
        x, y = tokens[:, :-1], tokens[:, 1:]
        out = {}
        for name in (("pipert", "plain") if i % 2 == 0 else ("plain", "pipert")):
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
            out[name] = pipe.step(x, y) if name == "pipert" else plain(x, y)
            if i >= c["warmup"]:
                times[name].append(time.perf_counter() - t0)
        diff = max(diff, abs(out["pipert"] - out["plain"]) / abs(out["plain"]))
    p, q = statistics.median(times["pipert"]), statistics.median(times["plain"])
    return [{"check": "vs-loop", "case": f"P=1, model {c['model']}, seq {c['seq']}, {c['mb_size']} x {M} micro-batches",
             "expected_s": q, "measured_s": p, "error": p / q - 1, "target": 0.02, "pass": p <= 1.02 * q,
             "note": f"ratio {p / q:.3f} (medians of {steps} steps, alternating); largest loss difference "
                     f"{diff:.1e} (relative)"}]


def check_host(quick: bool, device: str = "cuda:0", **overrides) -> list[dict]:
    from pipert.models import build_units
    from pipert.pipeline import Pipeline
    from pipert.schedules import build_schedule
    c = dict(HOST, **overrides)
    dev, P, M = torch.device(device), c["stages"], c["microbatches"]
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 256, (2 * M, c["seq"] + 1), generator=g).to(dev)
    x, y = tokens[:, :-1], tokens[:, 1:]
    rows = []
    for name in HOST_SCHEDULES[:1] if quick else HOST_SCHEDULES:
        units = build_units(c["model"], P, seed=0, device=dev, max_seq=c["seq"])
        pipe = Pipeline(units, build_schedule(name, stages=P, microbatches=M),
                        optimizer=lambda ps: torch.optim.SGD(ps, lr=1e-3))
        pipe.step(x, y)  # warm-up
        walls, hosts = [], []
        for _ in range(c["steps"]):
            t0 = time.perf_counter()
            pipe.step(x, y)
            walls.append(time.perf_counter() - t0)
            hosts.append(max(r.issue_s for r in pipe.last_results.values()))
        wall, host = statistics.median(walls), statistics.median(hosts)
        rows.append({"check": "host", "case": f"{name}, {P} ranks on {device}, model {c['model']}, M={M}",
                     "expected_s": wall, "measured_s": host, "error": host / wall - 1, "target": 0.0,
                     "pass": host < wall,
                     "note": f"the host issued a step in {host / wall:.0%} of the step's time (expected: the step, "
                             f"which ends with the host's one wait for the device; measured: the host's issue time, "
                             f"slowest rank; medians of {c['steps']} steps)"})
    return rows


def check_gap(quick: bool, device: str = "cuda:0") -> list[dict]:
    from bench_delay import bench_bandwidth
    from pipert.device.streams import Chain, StreamSet
    rows = []
    with StreamSet(device, "r0") as a, StreamSet(device, "r1") as b:
        for chains in (False, True):
            Chain.enabled = chains
            try:
                found = bench_bandwidth(a, b, a.backend, quick)
            finally:
                Chain.enabled = True
            for r in found:
                k = bandwidth_messages(r["case"])
                per = r["median_err_s"] / k
                rows.append({"check": "gap", "case": f"{r['case']}, chains {'on' if chains else 'off (before)'}",
                             "expected_s": r["expected_s"], "measured_s": r["measured_s"], "error": per,
                             "target": GAP_TARGET, "pass": abs(per) <= GAP_TARGET if chains else "",
                             "note": f"error of the last arrival {r['median_err_s'] * 1e6:.1f} us over {k} messages"})
    return rows
