"""Emulation: all ranks of a schedule in one process with calibrated compute and delayed links."""
from .emulator import EmulationResult, emulate, scaled_link_emulator

__all__ = ["EmulationResult", "emulate", "scaled_link_emulator"]
