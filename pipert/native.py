"""The simulator's optional compiled loops: ``pipert._simc`` (csrc/simc/simc.c, built by setup.py
next to ``pipert._C``; plain Python C API, no torch).

``SIMC`` is the module, or None when it is not built or ``PIPERT_SIM_PURE=1`` is set; then the
engine runs its pure-Python loops and lowering builds its messages in Python, whose results the
compiled ones equal exactly (tests/unit/test_sim_native.py). The engine reads ``SIMC`` at every
run, so a test may switch it off; ``message_action`` is chosen once, at import.
"""
from __future__ import annotations

import os
from types import ModuleType
from typing import Any

__all__ = ["SIMC", "load_error", "node_arrays", "value_maps", "int_map"]

SIMC: ModuleType | None = None
load_error: str | None = None

if os.environ.get("PIPERT_SIM_PURE") == "1":
    load_error = "disabled by PIPERT_SIM_PURE=1"
else:
    try:
        from . import _simc as SIMC
    except ImportError as exc:  # not built: the pure-Python loops
        load_error = str(exc)


def node_arrays() -> tuple[Any, Any, Any, Any, Any]:
    """Empty (kind, dur, lat, succ, indeg) for a graph: pipert._simc's typed arrays where it is
    loaded (``walk`` and ``longest_path`` run on them directly), else Python lists. Both read and
    grow alike (len, [i], [i] = x, append, iteration, count, ``succ[p].append``; == compares
    contents), so the Builder and every consumer of a Graph run on either."""
    if SIMC is None:
        return [], [], [], [], []
    return SIMC.Ints(), SIMC.Floats(), SIMC.Floats(), SIMC.Succ(), SIMC.Ints()


def value_maps() -> tuple[Any, Any]:
    """Empty (have, live) for the walk of one rank (pipert.sim.values): pipert._simc's IntMap and
    FloatMap where it is loaded (``walk`` reads and changes them without an int object per key),
    else dicts. Both read and change alike ([k], [k] = x, del, in, get, pop, len); nothing
    iterates them."""
    if SIMC is None:
        return {}, {}
    return SIMC.IntMap(), SIMC.FloatMap()


def int_map() -> Any:
    """An empty int -> int map: pipert._simc's IntMap where it is loaded (as value_maps; it
    iterates in key order), else a dict."""
    return {} if SIMC is None else SIMC.IntMap()
