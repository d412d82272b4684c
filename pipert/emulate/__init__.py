"""Emulation: all ranks of a schedule in one process with calibrated compute and delayed links.

The exports load the emulator (and torch) on first access, so ``pipert.emulate.cli`` can
register its command without them.
"""
from __future__ import annotations

from typing import Any

__all__ = ["EmulationResult", "emulate", "scaled_link_emulator"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'pipert.emulate' has no attribute {name!r}")
    from . import emulator
    return getattr(emulator, name)
