"""What every benchmark report records: machine, date, commit, versions, load; CSV writing."""
from __future__ import annotations

import csv
import datetime
import os
import platform
import subprocess
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else what platform knows of it."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def load_average() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"


def context(extra: dict | None = None) -> dict[str, str]:
    """Date, commit, machine, GPU, OS, Python and torch versions, load average; then ``extra``
    (a script's own fields, e.g. other library versions; a key already present is replaced)."""
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=here,
                                check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, cwd=here).stdout
        commit += " (+ uncommitted changes)" if dirty.strip() else ""
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    import torch
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    ctx = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": commit,
           "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs, {cpu_model()}",
           "gpu": gpu, "os": platform.platform(), "python": platform.python_version(),
           "torch": torch.__version__, "load average (1, 5, 15 min)": load_average()}
    ctx.update({k: str(v) for k, v in (extra or {}).items()})
    return ctx


def context_markdown(ctx: dict[str, str]) -> str:
    return "\n".join(f"- {k}: {v}" for k, v in ctx.items())


def write_csv(path: Path, rows: list[dict], fields: list[str] | None = None) -> None:
    """One row per dict, columns ``fields`` (default: the first row's keys); with ``fields``,
    keys not among them are left out and missing ones written empty."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields or list(rows[0]), extrasaction="ignore" if fields else "raise")
        w.writeheader()
        w.writerows(rows)
