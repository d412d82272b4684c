"""D's graph analysis, computed once per graph structure and reused by the micro-batches that share it.

D of the "intermediates" split (``pipert.exec.unit``) needs, for each micro-batch: which outputs
depend on the inputs, torch's parameter groups (the nodes where each parameter's paths join the
inputs' closure: "intermediates") and the level of every group (``pipert.exec.wgrad``). All of it is
a function of the graph's *structure* alone: the nodes reachable from the outputs, the edges between
them, and which of them are the outputs, the inputs and the parameters' accumulators. A unit builds a
new graph for every micro-batch (new nodes, new tensors) whose structure is usually the same.

``walk`` numbers the nodes of a graph breadth-first from the outputs, children in ``next_functions``
order, and writes its *signature*: per node in that order its type, its number of edges and the
numbers of their ends; then the outputs (number, output_nr), inputs and parameters by number (-1 for
a parameter the graph does not reach). Invariant: two graphs with equal signatures are isomorphic
under "node i <-> node i", with the same outputs, inputs and parameters at the same numbers. An
analysis stored by number therefore *is* the analysis of every graph with that signature, and
``DAnalyses`` keys its entries by the full signature, checked on every call (one walk): a graph that
differs anywhere (a data-dependent branch, train vs eval, recompute on or off, another output
receiving no gradient) gets its own entry; one that differs only in its tensors (shapes, dtype,
values) shares it. An entry holds numbers only, never a node or a tensor.

Cost per micro-batch (one thread, medians of 60, interleaved with the analysis of every call that
this replaces, load 3.7, autogroup -20): tiny cut in 2, last unit (176 nodes) 1.17 -> 0.55 ms; tiny
cut in 4, unit 1: 0.54 -> 0.26; small cut in 2, last unit (336 nodes): 2.14 -> 0.98; small cut in 4,
unit 1: 1.05 -> 0.53. What remains is mostly the walk, about 1.3-1.8 us a node, most of it torch
creating the Python object of each node at its first visit: a walk that touches fewer nodes than
the graph cannot check its structure, so a further cut needs the walk in C++.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .wgrad import group_depths

__all__ = ["DAnalyses", "walk"]

Node = Any  # torch.autograd.graph.Node


def walk(roots: list[Node]) -> tuple[list[Node], dict, list]:
    """(nodes in breadth-first order from ``roots``, node -> its number, the structure signature)."""
    number: dict = {}
    order: list[Node] = []
    for n in roots:
        if n not in number:
            number[n] = len(order)
            order.append(n)
    sig: list = []
    k = 0
    while k < len(order):
        n = order[k]
        k += 1
        edges = n.next_functions
        sig.append(type(n))
        sig.append(len(edges))
        for c, _ in edges:
            if c is None:
                sig.append(-1)
                continue
            j = number.get(c)
            if j is None:
                j = number[c] = len(order)
                order.append(c)
            sig.append(j)
    return order, number, sig


@dataclass(frozen=True)
class _Analysis:
    """D's analysis of one structure, by node number (see the module doc)."""

    dep: tuple[int, ...]  # positions, among the outputs, of those that depend on the inputs
    groups: tuple[tuple[tuple[int, ...], tuple[int, ...], int], ...]
    """Per parameter group: (parameter positions, intermediate numbers, depth from group_depths)."""


class DAnalyses:
    """The analyses of one unit's graphs, by structure signature (at most ``size``, oldest dropped)."""

    def __init__(self, helpers: Any, size: int = 8) -> None:
        self._h = helpers
        self._size = size
        self._entries: dict[tuple, _Analysis] = {}
        self.hits = 0
        """Calls answered from a stored analysis."""
        self.misses = 0
        """Calls that analysed their graph (and stored the result)."""

    def __call__(self, outs: list, inputs: list[Node], params: list[Node]) -> tuple[list[int], list[dict]]:
        """For the output edges ``outs`` (GradientEdge), the input nodes ``inputs`` and the parameter
        accumulators ``params``: (positions of the outputs that depend on the inputs, parameter groups
        as dicts with "params" (accumulators), "intermediates" (nodes, each group's all) and "depth")."""
        out_nodes = [o.node for o in outs]
        order, number, sig = walk(out_nodes)
        key = (tuple(sig), tuple((number[o.node], o.output_nr) for o in outs),
               tuple(number.get(n, -1) for n in inputs), tuple(number.get(n, -1) for n in params))
        found = self._entries.get(key)
        if found is None:
            self.misses += 1
            found = self._analyse(out_nodes, inputs, params, number)
            if len(self._entries) >= self._size:
                del self._entries[next(iter(self._entries))]
            self._entries[key] = found
        else:
            self.hits += 1
        groups = [{"params": {params[i] for i in ps}, "intermediates": [order[j] for j in js], "depth": depth}
                  for ps, js, depth in found.groups]
        return list(found.dep), groups

    def _analyse(self, out_nodes: list[Node], inputs: list[Node], params: list[Node], number: dict) -> _Analysis:
        """The analysis by torch's helpers, stored by node number."""
        h = self._h
        reverse = h.construct_reverse_graph(out_nodes)
        in_closure, _ = h.reverse_closure(inputs, set(), reverse)
        # an output whose node is outside the inputs' closure does not depend on the inputs:
        # no intermediate can carry its gradient, so W differentiates it whole
        dep = tuple(i for i, n in enumerate(out_nodes) if n in in_closure)
        groups = h.get_param_groups(inputs, params, reverse) if dep else []
        for g in groups:
            g["intermediates"] = sorted(g["intermediates"], key=number.__getitem__)
        position = {n: i for i, n in enumerate(params)}
        depths = group_depths(groups, in_closure, reverse)
        return _Analysis(dep, tuple((tuple(sorted(position[p] for p in g["params"])),
                                     tuple(number[i] for i in g["intermediates"]), d)
                                    for g, d in zip(groups, depths)))
