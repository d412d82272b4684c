"""Evaluating the planner's layouts in the order of their lower bounds, here or in forked workers.

Branch and bound: ``items`` are (bound, layout) sorted by bound; a layout is started only while its
bound is no more than the step of the ``top``-th best found (every later one's bound is no smaller,
so none of them can enter the top; a tie is still evaluated, so the top is the exhaustive one's), and while the time budget lasts once something ``wanted`` was
found (twice the budget once anything was). ``cheap`` items (the first ``top`` of them, in order)
are evaluated before the others, so that the cutoff the others are proven slower against is
finite from the start; evaluating a layout early changes no result: every layout left out still
has a bound no smaller than the final ``top``-th step. With
``jobs > 1`` up to ``2 * jobs`` layouts run at once in forked processes (the evaluation and the
items reach them through this module's state at fork time; only indices and results are
pickled), so the stop is checked as results arrive: the top found is the same, the count of
layouts simulated may differ.
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable

__all__ = ["run_in_order", "Outcome", "default_jobs"]

Outcome = tuple[Any, int, dict, bool]
"""(candidate or None when nothing fits, simulations run, failures by reason, whether it was
proven slower than the cutoff without its step simulated)."""
_JOB: tuple[Callable[[Any, float, float], Outcome], list] | None = None


def default_jobs() -> int:
    """Processes ``plan --auto`` simulates in when ``--jobs`` is not given: the cores this process
    may run on."""
    import os
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:      # no affinity on this platform
        return os.cpu_count() or 1


def _call(i: int, cutoff: float) -> Outcome:
    assert _JOB is not None
    evaluate, items = _JOB
    bound, lay = items[i]
    return evaluate(lay, bound, cutoff)


def run_in_order(items: list, evaluate: Callable[[Any, float, float], Outcome], top: int, time_budget: float,
                 t0: float, jobs: int = 1, wanted: Callable[[Any], bool] = lambda c: True,
                 cheap: Callable[[Any], bool] = lambda lay: False) -> tuple[list, dict[str, Any]]:
    """(candidates found, fastest first; counts: simulated, pruned_memory, pruned_bound, not_run,
    failed, and next_bound: the lowest bound of the layouts the time budget left out, None if none).
    ``items``: (bound, layout) sorted by bound; ``cheap(layout)``: whether it goes first (module doc)."""
    from .auto import _order
    found: list = []
    stats: dict[str, Any] = {"simulated": 0, "pruned_memory": 0, "pruned_bound": 0, "not_run": 0, "failed": {},
                             "next_bound": None}

    def merge(out: Outcome) -> None:
        cand, sims, failed, slower = out
        stats["simulated"] += sims
        for why, n in failed.items():
            stats["failed"][why] = stats["failed"].get(why, 0) + n
        if slower:
            stats["pruned_bound"] += 1
        elif cand is None and not failed:
            stats["pruned_memory"] += 1
        elif cand is not None:
            found.append(cand)
            found.sort(key=_order)

    def cutoff() -> float:
        """The step a layout must beat to enter the top (inf until ``top`` were found)."""
        return found[top - 1].step if len(found) >= top else math.inf

    first = [i for i, (_, lay) in enumerate(items) if cheap(lay)][:top]
    order = first + sorted(set(range(len(items))) - set(first))   # past ``first``: by bound

    def stop(k: int) -> bool:
        """Whether the search ends before the k-th item of ``order``."""
        bound = items[order[k]][0]
        if len(found) >= top and bound > found[top - 1].step * (1 + 1e-9):   # a tie may still enter
            if k < len(first):        # a cheap one early: later ones may have smaller bounds
                stats["pruned_bound"] += 1
                skipped.add(k)
                return False
            stats["pruned_bound"] += len(items) - k
            return True
        # past the budget once something ``wanted`` (a layout pipert train runs) was found; past
        # twice the budget once anything was
        spent = time.perf_counter() - t0
        if found and (spent > 2 * time_budget or spent > time_budget and any(wanted(c) for c in found)):
            stats["not_run"] = len(items) - k
            stats["next_bound"] = min(items[i][0] for i in order[k:])
            return True
        return False
    skipped: set[int] = set()
    if jobs <= 1:
        for k in range(len(items)):
            if stop(k):
                break
            if k not in skipped:
                merge(evaluate(items[order[k]][1], items[order[k]][0], cutoff()))
        return found, stats
    _forked(items, order, evaluate, jobs, stop, skipped, merge, cutoff, len(first))
    return found, stats


def _forked(items: list, order: list[int], evaluate: Callable, jobs: int, stop: Callable[[int], bool],
            skipped: set[int], merge: Callable[[Outcome], None], cutoff: Callable[[], float],
            cheap: int = 0) -> None:
    """Up to ``2 * jobs`` items of ``order`` at once; past the ``cheap`` first ones, an item is
    started only once the cutoff is finite or nothing else runs (as one process would reach it:
    an evaluation started with an infinite cutoff cannot prove its layout slower unsimulated)."""
    import gc
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    global _JOB
    _JOB = (evaluate, items)
    # A worker is a fork of this process: garbage still waiting for the collector here (e.g. a
    # dropped Pipeline in a reference cycle) is collected before the fork, or a worker's collector
    # would run its finalizers, which stop stream worker threads the worker does not have (a hang).
    gc.collect()
    try:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:
            pending: set = set()
            k, stopped = 0, False
            while pending or (k < len(items) and not stopped):
                while not stopped and k < len(items) and len(pending) < 2 * jobs:
                    if k >= cheap and pending and cutoff() == math.inf:
                        break
                    if stop(k):
                        stopped = True
                        break
                    if k not in skipped:
                        pending.add(pool.submit(_call, order[k], cutoff()))
                    k += 1
                if not pending:
                    break
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for f in done:
                    merge(f.result())
    finally:
        _JOB = None
