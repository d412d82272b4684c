"""Where a step's time goes, from what each runtime records of its own computes.

A rank's step (barrier to barrier, on its own clock) splits into its computes (forward,
backward, optimizer step) and everything else: the step's wall time less the computes'. The
rest holds the waits for messages and peers, the pipeline's bubbles and the runtime's own work;
a compute's wait for a core counts inside the compute (its CPU seconds are recorded beside it).

pipert records its computes itself when traced (``Instrumentation(trace=True)`` ->
``StepResult.op_times``: wall and thread-CPU seconds of every compute, waits for received values
excluded), also those that run on ``pipert._C`` worker threads, which a profiler of the calling
thread cannot see. torch.distributed.pipelining records none: its stages' ``forward_one_chunk`` and
``backward_one_chunk``, the loss function and the optimizer are timed from outside by a
:class:`Clock`, as are the plain loop's calls.

The rows (``vs_torch_breakdown.csv``) hold one rank of one system in one configuration: means
over the breakdown steps in ms. Every figure of :func:`section` is computed from them.
"""
from __future__ import annotations

import statistics
import time
from collections import defaultdict
from typing import Any, Callable, Iterable

PARTS = ("forward", "backward", "optimizer")
OP_PART = {"F": "forward", "RECOMPUTE": "forward", "B": "backward", "D": "backward", "W": "backward",
           "OPT": "optimizer"}
"""pipert's compute ops -> the part of the step they count in."""
FIELDS = ["schedule", "P", "M", "system", "rank", "steps", "step_ms", "forward_ms", "backward_ms", "optimizer_ms",
          "compute_cpu_ms", "process_cpu_ms"]
"""Columns of ``vs_torch_breakdown.csv``."""


class Clock:
    """Wall and thread-CPU seconds of the calls it wraps, added up per part until ``take``."""

    def __init__(self) -> None:
        self.wall = dict.fromkeys(PARTS, 0.0)
        self.cpu = 0.0

    def wrap(self, part: str, fn: Callable) -> Callable:
        """``fn`` whose every call counts in ``part``."""
        def timed(*args: Any, **kwargs: Any) -> Any:
            w, c = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.wall[part] += time.perf_counter() - w
                self.cpu += time.thread_time() - c
        return timed

    def take(self) -> dict[str, float]:
        """Seconds per part and ``compute_cpu`` since the last ``take``; starts again from zero."""
        out = {**self.wall, "compute_cpu": self.cpu}
        self.wall, self.cpu = dict.fromkeys(PARTS, 0.0), 0.0
        return out


def pipert_parts(op_times: Iterable[tuple]) -> dict[str, float]:
    """Seconds per part and ``compute_cpu`` from one rank's ``StepResult.op_times`` (each piece of a
    split compute its own seconds)."""
    out = dict.fromkeys(PARTS, 0.0)
    cpu = 0.0
    for op, _, wall, thread_cpu, *_ in op_times:
        out[OP_PART[op]] += wall
        cpu += thread_cpu
    return {**out, "compute_cpu": cpu}


def time_torch_stages(stages: list, clock: Clock) -> None:
    """Every ``forward_one_chunk`` and ``backward_one_chunk`` of ``stages`` counted by ``clock``."""
    for st in stages:
        st.forward_one_chunk = clock.wrap("forward", st.forward_one_chunk)
        st.backward_one_chunk = clock.wrap("backward", st.backward_one_chunk)


def time_optimizer(opt: Any, clock: Clock) -> None:
    """``opt.step`` and ``opt.zero_grad`` counted by ``clock`` as the optimizer part."""
    opt.step = clock.wrap("optimizer", opt.step)
    opt.zero_grad = clock.wrap("optimizer", opt.zero_grad)


def rank_row(key: dict, steps: list[tuple[float, float, dict[str, float]]]) -> dict:
    """One CSV row: ``key`` (schedule, P, M, system, rank) and the means over ``steps`` of
    (step wall s, process CPU s, parts in s) in ms."""
    mean = lambda xs: round(1e3 * statistics.mean(xs), 3)  # noqa: E731
    return {**key, "steps": len(steps), "step_ms": mean([s[0] for s in steps]),
            **{f"{p}_ms": mean([s[2][p] for s in steps]) for p in PARTS},
            "compute_cpu_ms": mean([s[2]["compute_cpu"] for s in steps]),
            "process_cpu_ms": mean([s[1] for s in steps])}


def _compute(r: dict) -> float:
    return sum(r[f"{p}_ms"] for p in PARTS)


def _config(key: tuple) -> str:
    schedule, P, M = key
    return f"single stage M={M}" if P == 1 else f"{schedule} P={P} M={M}"


def summarise(rows: list[dict]) -> dict[tuple, dict[str, dict[str, float]]]:
    """(schedule, P, M) -> system -> means over ranks of step, parts, compute and everything else,
    with the smallest and largest everything else of one rank."""
    by: dict[tuple, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        by[(r["schedule"], r["P"], r["M"])][r["system"]].append(r)
    out: dict[tuple, dict[str, dict[str, float]]] = {}
    for key, systems in by.items():
        out[key] = {}
        for name, ranks in systems.items():
            other = [r["step_ms"] - _compute(r) for r in ranks]
            mean = {k: statistics.mean(r[k] for r in ranks)
                    for k in ("step_ms", "compute_cpu_ms", *(f"{p}_ms" for p in PARTS))}
            out[key][name] = {**mean, "compute_ms": statistics.mean(_compute(r) for r in ranks),
                              "other_ms": statistics.mean(other), "other_min_ms": min(other),
                              "other_max_ms": max(other)}
    return out


def table(rows: list[dict]) -> list[str]:
    """The breakdown per configuration and system, means over ranks."""
    L = ["| config | system | step ms | forward | backward | optimizer | compute CPU | everything else "
         "(ranks: min-max) |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for key, systems in summarise(rows).items():
        for name, s in systems.items():
            L.append(f"| {_config(key)} | {name} | {s['step_ms']:.1f} | {s['forward_ms']:.1f} | "
                     f"{s['backward_ms']:.1f} | {s['optimizer_ms']:.1f} | {s['compute_cpu_ms']:.1f} | "
                     f"{s['other_ms']:.1f} ({s['other_min_ms']:.1f}-{s['other_max_ms']:.1f}) |")
    return L


def _longer(d: float, its: str) -> str:
    """"X ms longer than <its>", "X ms shorter than <its>" or "as long as <its>" for a difference of d ms."""
    if d == 0:
        return f"as long as {its}"
    return f"{abs(d):.1f} ms {'longer' if d > 0 else 'shorter'} than {its}"


def analysis(rows: list[dict]) -> list[str]:
    """What the breakdown says, one sentence per comparison; pipert's step less the other's is split
    exactly into the computes' difference and everything else's (both from the same rows)."""
    if not rows:
        return ["- **Where the time goes**: not measured in this run (no `vs_torch_breakdown.csv` beside its "
                "CSV); re-run the benchmark to measure it."]
    summary = summarise(rows)
    L = []
    for other, label, its in (("torch", "torch.distributed.pipelining", "torch's"),
                              ("plain", "the plain loop", "the plain loop's")):
        pairs = [(key, s["pipert"], s[other]) for key, s in summary.items() if "pipert" in s and other in s]
        if not pairs:
            continue
        # shown to 0.1 ms: everything else is the step's difference less the computes', as shown
        step = round(statistics.mean(p["step_ms"] - o["step_ms"] for _, p, o in pairs), 1)
        compute = round(statistics.mean(p["compute_ms"] - o["compute_ms"] for _, p, o in pairs), 1)
        more = [_config(key) for key, p, o in pairs if p["other_ms"] > o["other_ms"]]
        L.append(f"- **Where the time goes, pipert vs {label}** (breakdown steps, mean over ranks and "
                 f"{len(pairs)} configuration(s)): pipert's step is {_longer(step, its)}; its computes take "
                 f"{compute:+.1f} ms and everything else {step - compute:+.1f} ms against {its}. Everything "
                 f"else is longer for pipert in {len(more)} of {len(pairs)}" + (f" ({', '.join(more)})." if more else "."))
    return L
