"""Schedule files: pipert's JSON, and torch.distributed.pipelining's CSV and JSON forms.

=================  ==========================================================================
``*.json``         pipert's schedule (``"format": "pipert.schedule"``), or torch's per-rank
                   orders as JSON: a list (one entry per rank) of lists of action strings, or
                   an object ``{"0": [...], "1": [...]}``; ``null`` entries are bubbles
``*.csv``          torch's ``_dump_csv``: one rank a row, one action a cell, empty cells bubbles
=================  ==========================================================================

Torch orders are compute-only (lowered by pipert) or carry their own SEND_*/RECV_* actions
(kept where they stand); see :mod:`pipert.ir.torch_format`. Torch writes FSDP hooks
(UNSHARD, RESHARD) into every order with communication; pipert's stages are unsharded, so the
loader drops them by default (REDUCE_GRAD is checked and dropped). A loaded file keeps its
shape: rank count, units, micro-batches and placement are the file's.

Exported orders with communication are torch's ``compute_comms`` form, which
``_PipelineScheduleRuntime._load_csv(path, format="compute_comms")`` runs; torch's receives
block, so receives go where it does not stall (RECEIVES).
"""
from __future__ import annotations

import json
from pathlib import Path

from .action import ScheduleFormatError
from .passes import receives_at_consumer
from .schedule import FORMAT_NAME, Schedule
from .torch_format import from_torch, read_torch_csv, to_torch, write_torch_csv
from .torch_receives import receives_for_torch

__all__ = ["SCHEDULE_FILE_SUFFIXES", "EXPORT_FORMATS", "RECEIVES", "is_schedule_file", "load_schedule",
           "dump_schedule"]

SCHEDULE_FILE_SUFFIXES = (".json", ".csv")
EXPORT_FORMATS = ("json", "text", "torch-csv", "torch-json")
RECEIVES = {"program": "where the program posts it (pipert: a compute early), moved to its consumer only where "
                       "torch's blocking receives would stall",
            "consumer": "every receive right before the compute that reads it"}
"""Where an exported torch order with communication places its receives (the first: the default)."""


def is_schedule_file(name: str) -> bool:
    """True if ``name`` names a schedule file (by its suffix) rather than a registered schedule."""
    return Path(name).suffix.lower() in SCHEDULE_FILE_SUFFIXES


def load_schedule(path: str | Path, fsdp: str = "drop") -> Schedule:
    """The schedule in ``path`` (a form of the module doc); ScheduleFormatError naming the
    file and what is wrong otherwise. ``fsdp`` is passed to :func:`from_torch`."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in SCHEDULE_FILE_SUFFIXES:
        raise ScheduleFormatError(f"schedule file {str(p)!r}: suffix {suffix or '(none)'!r} unknown; allowed: "
                                  f"{', '.join(SCHEDULE_FILE_SUFFIXES)}")
    if not p.is_file():
        raise ScheduleFormatError(f"schedule file {str(p)!r} does not exist")
    text = p.read_text()
    if suffix == ".csv":
        return _from_torch(read_torch_csv(text), p, fsdp)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ScheduleFormatError(f"{p}: not valid JSON ({e})") from None
    if isinstance(data, dict) and "format" in data:
        return Schedule.from_dict(data, str(p))
    if isinstance(data, dict) and all(isinstance(k, str) and k.isdigit() for k in data):
        data = {int(k): v for k, v in data.items()}
    if isinstance(data, (list, dict)) and all(isinstance(v, list) for v in
                                              (data.values() if isinstance(data, dict) else data)):
        return _from_torch(data, p, fsdp)
    raise ScheduleFormatError(f"{p}: expected pipert's schedule object (\"format\": {FORMAT_NAME!r}) or torch's "
                              f"orders (a list per rank of action strings, or {{\"0\": [...], ...}})")


def _from_torch(orders: list | dict, path: Path, fsdp: str) -> Schedule:
    if not orders:
        raise ScheduleFormatError(f"{path}: no ranks")
    try:
        return from_torch(orders, name=path.stem, fsdp=fsdp)
    except ScheduleFormatError as e:
        raise ScheduleFormatError(f"{path}: {e}") from None


def dump_schedule(schedule: Schedule, fmt: str, comms: bool = False, receives: str = "program") -> str:
    """``schedule`` as text in ``fmt`` (one of EXPORT_FORMATS): pipert's JSON, a readable grid
    (``text``: every action, one column per rank; not a load format), or torch's CSV/JSON
    (compute only, or with its transfers when ``comms``, receives placed as ``receives`` says:
    a key of RECEIVES)."""
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"--format {fmt!r} unknown; allowed: {', '.join(EXPORT_FORMATS)}")
    if receives not in RECEIVES:
        raise ValueError(f"--receives {receives!r} unknown; allowed: {', '.join(RECEIVES)}")
    if comms and not fmt.startswith("torch"):
        raise ValueError(f"--comms applies to the torch formats only; --format {fmt} always holds every action")
    if fmt == "json":
        return schedule.to_json(indent=1) + "\n"
    if fmt == "text":
        width = 2 + max((len(str(a)) for _, _, a in schedule), default=0)
        return schedule.grid(compute_only=False, width=width) + "\n"
    if comms:
        schedule = receives_for_torch(schedule if receives == "program" else receives_at_consumer(schedule))
    rows = to_torch(schedule, comms=comms)
    if fmt == "torch-csv":
        return write_torch_csv(rows)
    return json.dumps(rows) + "\n"
