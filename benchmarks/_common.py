"""What every benchmark report records: machine, date, commit, versions, load; CSV writing."""
from __future__ import annotations

import csv
import datetime
import os
import platform
import subprocess
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def context() -> dict[str, str]:
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=here,
                                check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, cwd=here).stdout
        commit += " (+ uncommitted changes)" if dirty.strip() else ""
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    import torch
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a"
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    return {"date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": commit,
            "machine": f"{platform.machine()}, {os.cpu_count()} logical CPUs, {platform.processor() or 'cpu'}",
            "gpu": gpu, "os": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "load average (1, 5, 15 min)": load}


def context_markdown(ctx: dict[str, str]) -> str:
    return "\n".join(f"- {k}: {v}" for k, v in ctx.items())


def write_csv(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
