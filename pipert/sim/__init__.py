"""Validator, discrete-event simulator, metrics and exporters: one engine (docs/semantics.md)."""
from .errors import REASONS, ScheduleError
from .export import chrome_trace, gantt_png, text_grid, write_chrome_trace
from .simulate import SimResult, remember_simulation, simulate, simulate_once
from .validate import Report, validate

__all__ = ["REASONS", "ScheduleError", "Report", "validate", "SimResult", "simulate", "simulate_once",
           "remember_simulation", "chrome_trace", "write_chrome_trace", "gantt_png", "text_grid"]
