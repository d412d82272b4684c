"""``pipert compare``: every applicable schedule on one scenario, ranked by makespan."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .ir.schedule import Schedule
from .scenario import Scenario

__all__ = ["Row", "compare", "print_ranking", "plot_comparison"]


@dataclass
class Row:
    """One schedule's outcome on the scenario."""

    name: str
    makespan: float | None = None
    bubble_ratio: float | None = None
    peak_memory: float | None = None
    comm_bytes: float | None = None
    skipped: str = ""
    result: Any = None

    def as_dict(self) -> dict:
        return {"schedule": self.name, "makespan": self.makespan, "bubble_ratio": self.bubble_ratio,
                "peak_memory": self.peak_memory, "comm_bytes": self.comm_bytes, "skipped": self.skipped}


def compare(sc: Scenario, names: list[str] | None = None, files: list[Schedule] = ()) -> list[Row]:
    """Simulate each schedule (the loaded ``files`` first, then the registered ``names``, default
    all); those that cannot run on the scenario are kept with the reason.

    Uniform times are per stage here (``Scenario.per_stage``): a V-chunk schedule's units
    take 1/V of them, so all schedules train the same model."""
    from .schedules import available
    sc.per_stage = True
    from .sim import ScheduleError, simulate
    rows = []
    for item in [*files, *(names or available())]:
        name = f"{item.name} (file)" if isinstance(item, Schedule) else item
        try:
            sched = item if isinstance(item, Schedule) else sc.build(item)
            res = simulate(sched, sc.cost_for(sched), links=sc.links, topology=sc.topology,
                           memory_limit=sc.memory_limit, nic_bandwidth=sc.nic_bandwidth)
        except (ValueError, ScheduleError) as e:
            rows.append(Row(name, skipped=str(e).splitlines()[0]))
            continue
        rows.append(Row(name, res.makespan, res.bubble_ratio, max(res.peak_memory),
                        sum(res.comm_bytes.values()), result=res))
    ran = sorted((r for r in rows if not r.skipped), key=lambda r: (r.makespan, r.name))
    return ran + [r for r in rows if r.skipped]


def print_ranking(rows: list[Row], sc: Scenario) -> None:
    links = "free links" if sc.links is None else f"{sc.topology.num_dcs} DC(s)"
    tp = f" T={sc.tp}{' SP' if sc.sp else ''}" if sc.tp > 1 else ""
    nic = "" if sc.nic_bandwidth is None else f"; shared NIC: {sc.describe_nic()}"
    print(f"P={sc.stages} M={sc.microbatches}{tp} cost={type(sc.cost).__name__} {links}{nic}")
    head = f"{'rank':<5}{'schedule':<22}{'makespan':>12}{'vs best':>9}{'bubble':>9}{'peak mem':>10}{'comm':>12}"
    print(head)
    print("-" * len(head))
    best = next((r.makespan for r in rows if not r.skipped), None)
    k = 0
    for r in rows:
        if r.skipped:
            print(f"{'-':<5}{r.name:<22}  skipped: {r.skipped}")
            continue
        k += 1
        print(f"{k:<5}{r.name:<22}{r.makespan:>12.5g}{r.makespan / best:>8.3f}x{r.bubble_ratio:>9.3f}"
              f"{r.peak_memory:>10.4g}{r.comm_bytes:>12.4g}")


def plot_comparison(rows: list[Row], sc: Scenario, path: str) -> None:
    """One Gantt chart per simulated schedule, stacked, sharing the time axis."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from .sim.export import draw_gantt
    ran = [r for r in rows if not r.skipped]
    if not ran or not path:
        return
    spans = [r.makespan for r in ran]
    share = max(spans) <= 2 * min(spans)  # a common time axis only while no chart would be squashed
    fig, axes = plt.subplots(len(ran), 1, figsize=(12, 1.1 + 0.32 * sc.stages * len(ran)), sharex=share,
                             squeeze=False)
    for ax, r in zip(axes[:, 0], ran):
        draw_gantt(ax, r.result, legend=True)
        ax.set_title(f"{r.name}: makespan {r.makespan:.4g}, bubble {r.bubble_ratio:.3f}", fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("time (cost-model units)" + ("" if share else "; each chart has its own time axis"))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
