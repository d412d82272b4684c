"""Exporters of a SimResult: Chrome trace JSON (Perfetto), PNG Gantt chart, text grid."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..ir.action import Op
from ..ir.semantics import COMM_OPS
from .keys import QUEUES

__all__ = ["chrome_trace", "write_chrome_trace", "draw_gantt", "gantt_png", "plot_gantt", "text_grid", "OP_COLORS"]

# colour per op in the Gantt chart; every SEND/RECV/collective is "comm"
OP_COLORS = {"F": "#4C72B0", "B": "#55A868", "D": "#8DD3C7", "W": "#DD8452", "OPT": "#8172B3",
             "RECOMPUTE": "#A1C9F4", "comm": "#9E9E9E"}


def chrome_trace(result: Any, us_per_unit: float = 1e6) -> dict:
    """Trace-event JSON object: pid = rank, tid = queue (0 compute, 1 send, 2 recv), one
    complete ("X") event per action, named by its text form. ``us_per_unit`` converts the
    cost model's time unit to microseconds (1e6 for seconds)."""
    ev: list[dict] = []
    for r in range(result.schedule.num_ranks):
        ev.append({"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": f"rank {r}"}})
        ev.append({"ph": "M", "name": "process_sort_index", "pid": r, "tid": 0, "args": {"sort_index": r}})
        for tid, q in enumerate(QUEUES):
            ev.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": q}})
    for r, q, a, s, e in result.events:
        ev.append({"name": str(a), "cat": a.op.value, "ph": "X", "pid": r, "tid": QUEUES.index(q),
                   "ts": s * us_per_unit, "dur": (e - s) * us_per_unit})
    return {"traceEvents": ev, "displayTimeUnit": "ms",
            "otherData": {"schedule": result.schedule.name, "makespan": result.makespan,
                          "bubble_ratio": result.bubble_ratio, "us_per_unit": us_per_unit}}


def write_chrome_trace(result: Any, path: str | Path, us_per_unit: float = 1e6) -> Path:
    """Write ``chrome_trace(result)`` to ``path`` (open it in ui.perfetto.dev or chrome://tracing)."""
    p = Path(path)
    p.write_text(json.dumps(chrome_trace(result, us_per_unit)))
    return p


def _color_key(op: Op) -> str | None:
    if op.value in OP_COLORS:
        return op.value
    if op in COMM_OPS:
        return "comm"
    return None  # WAIT and memory ops take no time and are not drawn


def draw_gantt(ax: Any, result: Any, legend: bool = True, labels: bool | None = None) -> None:
    """Draw the Gantt chart of ``result`` on matplotlib axes ``ax``, one row per rank:
    compute as tall bars, sends and receives as thin bars under them. ``labels`` writes
    micro-batch numbers into compute bars (default: when there are few)."""
    from matplotlib.patches import Patch

    P = result.schedule.num_ranks
    bars: dict[tuple[str, str], dict[int, list[tuple[float, float]]]] = {}
    texts: list[tuple[float, int, str]] = []
    if labels is None:
        labels = sum(1 for e in result.events if e[1] == "compute") <= 300
    for r, q, a, s, e in result.events:
        key = _color_key(a.op)
        if key is None or e <= s:
            continue
        bars.setdefault((key, q), {}).setdefault(r, []).append((s, e - s))
        if labels and q == "compute" and a.mb:
            texts.append((s + (e - s) / 2, r, ",".join(map(str, a.mb))))
    lane = {"compute": (-0.38, 0.56), "send": (0.2, 0.08), "recv": (0.3, 0.08)}
    for (key, q), by_rank in bars.items():
        y0, h = lane[q]
        for r, spans in by_rank.items():
            ax.broken_barh(spans, (r + y0, h), facecolors=OP_COLORS[key],
                           edgecolor="white" if q == "compute" else "none", linewidth=0.3)
    for x, r, t in texts:
        ax.text(x, r - 0.1, t, ha="center", va="center", fontsize=6, color="white")
    ax.set_ylim(P - 0.5, -0.5)
    ax.set_yticks(range(P))
    ax.set_yticklabels([f"rank {r}" for r in range(P)], fontsize=8 if P <= 32 else 5)
    ax.set_xlim(0, result.makespan * 1.01 if result.makespan > 0 else 1)
    ax.grid(axis="x", alpha=0.3)
    if legend:
        present = sorted({k for k, _ in bars}, key=list(OP_COLORS).index)
        ax.legend(handles=[Patch(color=OP_COLORS[k], label=k) for k in present], loc="center left",
                  bbox_to_anchor=(1.005, 0.5), fontsize=8, frameon=False)


def gantt_png(result: Any, path: str | Path, title: str | None = None, labels: bool | None = None) -> Path:
    """Write the Gantt chart of ``result`` as a PNG titled with the schedule name, makespan
    and bubble ratio."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(14, min(1.6 + 0.45 * result.schedule.num_ranks, 30)), dpi=110)
    draw_gantt(ax, result, legend=True, labels=labels)
    ax.set_xlabel("time")
    ax.set_title(title or f"{result.schedule.name}: makespan {result.makespan:g}, "
                          f"bubble ratio {result.bubble_ratio:.1%}")
    fig.tight_layout()
    p = Path(path)
    fig.savefig(p)
    plt.close(fig)
    return p


plot_gantt = gantt_png


def text_grid(result: Any, step: float | None = None, width: int = 10, max_rows: int = 500) -> str:
    """Time-aligned grid of compute actions: one column per rank, row k covers
    ``[k*step, (k+1)*step)`` and shows the compute action running at the row's middle
    (``.`` when idle). ``step`` defaults to the shortest compute duration."""
    P = result.schedule.num_ranks
    per_rank: list[list[tuple[float, float, str]]] = [[] for _ in range(P)]
    for r, q, a, s, e in result.events:
        if q == "compute" and e > s:
            per_rank[r].append((s, e, str(a)))
    durs = [e - s for evs in per_rank for s, e, _ in evs]
    if not durs:
        return "(no compute)"
    if step is None:
        step = min(durs)
    if not step > 0:
        raise ValueError(f"text grid step must be > 0, got {step}")
    rows = math.ceil(result.makespan / step - 1e-9)
    tw = max(len(f"{rows * step:g}"), 4)
    lines = [(f"{'time':>{tw}} | " + " ".join(f"{'rank ' + str(r):<{width}}" for r in range(P))).rstrip()]
    ptr = [0] * P
    for k in range(min(rows, max_rows)):
        mid = (k + 0.5) * step
        cells = []
        for r in range(P):
            evs, j = per_rank[r], ptr[r]
            while j < len(evs) and evs[j][1] <= mid:
                j += 1
            ptr[r] = j
            cell = evs[j][2] if j < len(evs) and evs[j][0] <= mid else "."
            cells.append(f"{cell[:width]:<{width}}")
        lines.append(f"{k * step:>{tw}g} | " + " ".join(cells).rstrip())
    if rows > max_rows:
        lines.append(f"... ({rows - max_rows} more rows; pass a larger step or max_rows)")
    return "\n".join(lines)
