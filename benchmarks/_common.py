"""What every benchmark report records: machine, date, commit, versions, load; CSV writing.

A benchmark writes its measurements to ``results/NAME.csv`` and its context (date, commit,
machine, settings) to ``results/NAME.context.json``; its markdown report is a function of those
two files, so ``--from-csv`` rebuilds it without measuring again. A context whose commit carries
``DIRTY`` was measured on a tree with uncommitted changes: its report says so at the top, and
``readme_figures.py`` does not cite it.
"""
from __future__ import annotations

import csv
import datetime
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Callable

RESULTS = Path(__file__).resolve().parent / "results"
DIRTY = "(+ uncommitted changes)"
"""Appended to the commit of a context taken on a tree with uncommitted changes."""


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


def bandwidth_messages(case: str) -> int:
    """k of a bandwidth case of bench_delay, named "k x N kB @ B GB/s + L us"."""
    return int(case.split(" x ")[0])


def current_commit() -> str:
    """HEAD of the repository, with ``DIRTY`` appended when tracked or untracked files outside
    ``benchmarks/results/`` differ from it ("unknown" outside a git checkout). ``PIPERT_SOURCE_COMMIT``,
    when set, names the clean commit a copied tree was taken from instead (a GPU machine receives the
    working tree, with a ``.git`` that need not match it)."""
    here = Path(__file__).resolve().parent
    if os.environ.get("PIPERT_SOURCE_COMMIT"):
        return os.environ["PIPERT_SOURCE_COMMIT"]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=here,
                                check=True).stdout.strip()
        status = subprocess.run(["git", "status", "--porcelain", "--", ".", ":!benchmarks/results"], capture_output=True,
                                text=True, cwd=here.parent).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{commit} {DIRTY}" if status.strip() else commit


def scheduling_group() -> str:
    """This session's scheduling group and its nice value (Linux autogroups: other sessions' nice
    values do not lower them against this one; a measurement may raise its own group)."""
    try:
        return Path("/proc/self/autogroup").read_text().strip()
    except OSError:
        return "unknown"


def is_clean(ctx: dict[str, str]) -> bool:
    """The context was taken at a known commit with no uncommitted changes."""
    commit = ctx.get("commit", "unknown")
    return commit != "unknown" and DIRTY not in commit


def context(extra: dict | None = None) -> dict[str, str]:
    """Date, commit, machine, GPU, OS, Python and torch versions, load average; then ``extra``
    (a script's own fields, e.g. other library versions; a key already present is replaced)."""
    commit = current_commit()
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


def save_context(name: str, ctx: dict[str, str], folder: Path = RESULTS) -> None:
    """``ctx`` beside the CSV of report ``name`` (``NAME.context.json``)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / f"{name}.context.json").write_text(json.dumps(ctx, indent=1) + "\n")


def load_context(name: str, folder: Path = RESULTS) -> dict[str, str]:
    """The context stored with report ``name``."""
    path = Path(folder) / f"{name}.context.json"
    if not path.is_file():
        raise SystemExit(f"--from-csv: {path} does not exist; run the benchmark to measure (it writes the CSV "
                         f"and its context)")
    return json.loads(path.read_text())


def report_header(title: str, ctx: dict[str, str], rebuilt: bool = False) -> list[str]:
    """Title, a warning when the measurement's tree was dirty, and the context list; with
    ``rebuilt`` the commit that rebuilt the report from the stored CSV is listed too."""
    lines = [f"# {title}", ""]
    if not is_clean(ctx):
        lines += [f"> **WARNING: measured on a tree with uncommitted changes (commit {ctx.get('commit')}).** "
                  f"The code that produced these numbers is not in any commit; README does not cite them. "
                  f"Re-run the benchmark at a clean commit.", ""]
    lines.append(context_markdown(ctx))
    if rebuilt:
        lines.append(f"- report rebuilt from the stored CSV at commit {current_commit()}")
    return lines


def read_csv(path: Path) -> list[dict]:
    """Rows of a CSV written by ``write_csv``, numbers as int or float, 'True'/'False' as bool."""
    def value(v: str):
        if v in ("True", "False"):
            return v == "True"
        for kind in (int, float):
            try:
                return kind(v)
            except ValueError:
                pass
        return v
    with open(path, newline="") as f:
        return [{k: value(v) for k, v in row.items()} for row in csv.DictReader(f)]


def write_csv(path: Path, rows: list[dict], fields: list[str] | None = None) -> None:
    """One row per dict, columns ``fields`` (default: the first row's keys); with ``fields``,
    keys not among them are left out and missing ones written empty."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields or list(rows[0]), extrasaction="ignore" if fields else "raise")
        w.writeheader()
        w.writerows(rows)


Report = Callable[[list[dict], dict, bool], str]
"""``report(rows, ctx, rebuilt)``: a benchmark's markdown from its CSV rows and context."""


def write_results(name: str, rows: list[dict], ctx: dict[str, str], report: Report, folder: Path = RESULTS) -> None:
    """``NAME.csv``, ``NAME.context.json`` and ``NAME.md`` (built from the first two) in ``folder``."""
    write_csv(Path(folder) / f"{name}.csv", rows)
    save_context(name, ctx, folder)
    rebuild(name, report, folder, rebuilt=False)


def finish(name: str, rows: list[dict], ctx: dict[str, str], report: Report, started: float) -> None:
    """Adds the run time (since ``started``, a ``time.time()``) and the load at the end to ``ctx``,
    then writes the results (:func:`write_results`)."""
    import time
    ctx["run time"] = f"{time.time() - started:.0f} s"
    ctx["load average at the end (1, 5, 15 min)"] = load_average()
    write_results(name, rows, ctx, report)
    print(f"wrote results/{name}.md")


def rebuild(name: str, report: Report, folder: Path = RESULTS, rebuilt: bool = True) -> Path:
    """``NAME.md`` from the stored ``NAME.csv`` and ``NAME.context.json`` (``--from-csv``)."""
    path = Path(folder) / f"{name}.md"
    path.write_text(report(read_csv(Path(folder) / f"{name}.csv"), load_context(name, folder), rebuilt))
    return path
