"""The validator lives with the simulator (one engine); this module re-exports it."""
from ..sim.errors import REASONS, ScheduleError
from ..sim.validate import Report, validate

__all__ = ["validate", "Report", "ScheduleError", "REASONS"]
