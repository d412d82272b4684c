"""CrossPipe: delay-aware, memory-bounded pipeline schedules for cross-datacenter training.

- :mod:`.model`    the problem (placement from a traversal pattern, per-unit times and
  memory, per-message link occupancy and latency, memory limit);
- :mod:`.greedy`   CrossUDSub (paper Algorithm 1) for any pattern (UD, Wave, Loop);
- :mod:`.solver`   the paper's constraint model in OR-Tools CP-SAT;
- :mod:`.lowering` compute orders + receive positions -> a pipert Schedule;
- :mod:`.build`    registry builders and the default memory limit;
- :mod:`.select`   candidate ranking and the cross-DC pipeline-vs-data-parallel comparison;
- :mod:`.dp`       the DP-overlap operations: replication policy ``crosspipe-overlap``.

Registered names: ``crosspipe-greedy`` (UD), ``crosspipe-wave`` (Wave greedy),
``crosspipe-optimal`` (CP-SAT; ``pattern=`` ud/wave/loop). See docs/crosspipe.md.
"""
from . import dp  # noqa: F401  (registers the crosspipe-overlap replication policy)
from .build import (COUNTERPART, best_hint, build_greedy, build_optimal, build_wave, default_memory_limit,
                    make_problem, resolve_system, schedule_as_hint)
from .greedy import GreedyConfig, GreedyResult, greedy_best, greedy_schedule
from .lowering import lower_crosspipe, place_receives
from .model import PATTERNS, ChunkScaledCost, CrossPipeProblem, pattern_chunks, pattern_units, problem_from_cost
from .solver import SolverConfig, SolverResult, solve

__all__ = ["COUNTERPART", "PATTERNS", "ChunkScaledCost", "CrossPipeProblem", "GreedyConfig", "GreedyResult",
           "SolverConfig", "SolverResult", "best_hint", "build_greedy", "build_optimal", "build_wave",
           "default_memory_limit", "greedy_best", "greedy_schedule", "lower_crosspipe", "make_problem",
           "pattern_chunks", "pattern_units", "place_receives", "problem_from_cost", "resolve_system",
           "schedule_as_hint", "solve", "register_crosspipe"]


def register_crosspipe() -> None:
    """Register the three CrossPipe families (idempotent)."""
    from ..registry import available, register
    if "crosspipe-greedy" in available():
        return
    register("crosspipe-greedy", build_greedy,
             "CrossPipe greedy (CrossUDSub): delay- and memory-aware order on the 1F1B placement",
             split_backward=True, constraints="V = 1; any M >= 1")
    register("crosspipe-wave", build_wave,
             "CrossPipe greedy on the V-shape (ZB-V) placement, 2 chunks per rank",
             split_backward=True, default_chunks=2, min_chunks=2, max_chunks=2, constraints="V = 2; any M >= 1")
    register("crosspipe-optimal", build_optimal,
             "CrossPipe optimum: CP-SAT on the paper's constraint model, hinted by the greedy",
             split_backward=True, default_chunks=1, min_chunks=1, max_chunks=None,
             constraints="pattern ud: V = 1, wave: V = 2, loop: V >= 2; solve time grows fast with P*M")


register_crosspipe()
