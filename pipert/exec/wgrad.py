"""W of the "intermediates" split in few autograd calls: parameter groups merged by level.

torch's ``stage_backward_weight`` runs one autograd call per parameter group; each call pays a
fixed cost and a walk of the whole graph below its intermediates, which dominates W for small
units (measured: the last unit of ``tiny`` cut in two, one thread, W took 7.3 ms in 20 calls, 4.6 ms
merged into 14; ``small`` 64.6 ms in 38, 53.4 in 26; ``medium`` 353 in 56, 339 in 38). Here the groups
of one D are merged into one call per *level*, where the level of a node
of the inputs' closure is the largest number of intermediates strictly above it on a path from
the outputs. Invariants that make a merged call exact and free of activation-gradient work:

- a node reachable from an intermediate ``I`` has a level above ``I``'s, so two intermediates
  of one level never reach each other;
- a group whose intermediates (all of them, before D dropped those no gradient reached) share
  one level is *flat*. A path from a root ``I`` of level ``k`` to a parameter ``p`` of a flat
  group of level ``k`` leaves the closure at an intermediate of ``p``, which is ``I`` itself
  (any other would be reachable from ``I``, so of a higher level). So the call computes each
  parameter's gradient only through its own intermediates, from the gradients D recorded, and
  no output of an intermediate toward the inputs is needed: the engine computes none;
- the parameter-side nodes of two groups are disjoint (groups sharing one would share the
  intermediates above it, and torch merges those), so freeing one call's graph spares the rest.

A group that is not flat (a parameter used at several depths) keeps its own call through
``stage_backward_weight``, whose hooks clamp what flows between its intermediates. That call runs
the activation-gradient chain between them, through other groups' intermediates, so it keeps the
graph (freed with the stash) for the calls after it.
"""
from __future__ import annotations

from typing import Any

import torch
from torch.autograd.graph import GradientEdge

__all__ = ["WeightCall", "group_depths", "plan_weight_calls", "run_weight_call"]

WeightCall = dict
"""{"groups": [...]} run by ``stage_backward_weight``, or {"edges", "grads", "params"} merged."""

MIXED = -1
"""The depth of a group whose intermediates do not share one level (or whose levels are unknown)."""


def _levels(closure: set, reverse: dict, inters: set) -> dict | None:
    """Level of every node of ``closure`` (see the module doc); None if the walk misses a node."""
    indeg = {n: sum(1 for p in reverse.get(n, ()) if p in closure) for n in closure}
    level = {n: 0 for n in closure}
    ready = [n for n, d in indeg.items() if d == 0]
    seen = 0
    while ready:
        n = ready.pop()
        seen += 1
        below = level[n] + (n in inters)
        for c, _ in n.next_functions:
            if c is None or c not in closure:
                continue
            if below > level[c]:
                level[c] = below
            indeg[c] -= 1
            if indeg[c] == 0:
                ready.append(c)
    return level if seen == len(closure) else None


def group_depths(groups: list[dict], closure: set, reverse: dict) -> list[int]:
    """Per group of torch's ``get_param_groups`` (intermediates under "intermediates"), the level
    that all its intermediates share, or ``MIXED``; ``closure`` is the inputs' closure."""
    level = _levels(closure, reverse, {i for g in groups for i in g["intermediates"]})
    if level is None:
        return [MIXED] * len(groups)
    depths = [{level[i] for i in g["intermediates"]} for g in groups]
    return [d.pop() if len(d) == 1 else MIXED for d in depths]


def plan_weight_calls(groups: list[dict], param_of: dict) -> list[WeightCall]:
    """The calls of W for ``groups`` (parameter nodes under "params", the intermediates a gradient
    reached under "intermediates", their captured gradients under "grads", the group's depth from
    ``group_depths`` under "depth"), in order of level; ``param_of`` maps a parameter's gradient
    accumulator to the parameter."""
    merged: dict[int, WeightCall] = {}
    calls: list[tuple[int, WeightCall]] = []
    for g in groups:
        k = g.pop("depth")
        if k == MIXED:
            calls.append((-1, {"groups": [g]}))
            continue
        call = merged.get(k)
        if call is None:
            call = merged[k] = {"edges": [], "grads": [], "params": []}
            calls.append((k, call))
        for grads, inter in zip(g["grads"], g["intermediates"]):
            for i, grad in enumerate(grads):
                if grad is not None:
                    call["edges"].append(GradientEdge(inter, i))
                    call["grads"].append(grad)
        call["params"].extend(param_of[a] for a in g["params"])
    return [c for _, c in sorted(calls, key=lambda kc: kc[0])]


def run_weight_call(call: WeightCall, params: list, helpers: Any) -> None:
    """Accumulate into ``.grad`` the parameter gradients of one call; a merged call frees its graph."""
    if "groups" in call:
        helpers.stage_backward_weight(iter(params), call["groups"], retain_graph=True)
    elif call["edges"]:
        torch.autograd.backward(call["edges"], call["grads"], inputs=call["params"])
