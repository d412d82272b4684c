"""Autograd mechanics of one unit: the F, B, D, W and RECOMPUTE ops the executor calls.

A ``UnitRunner`` wraps one unit module (contract: ``pipert.models.partition``) and keeps a
stash per micro-batch between its forward and its backward:

- ``forward(mb, x)`` (F) runs the unit with autograd recording and returns its output
  detached, ready to send; the last unit takes ``targets`` and returns its loss (detached,
  the unscaled mean over its tokens). Inputs of a non-first unit are detached from whatever
  produced them and their floating tensors are made leaves that require grad, so the graph
  of a unit ends at its own inputs. ``keep_graph=False`` records nothing and keeps only the
  inputs; ``recompute(mb)`` (RECOMPUTE) later rebuilds the graph.
- ``backward(mb, grad)`` (B) computes the input gradient and accumulates every parameter's
  ``.grad``; it frees the stash.
- ``backward_input(mb, grad)`` (D) computes only the input gradient and keeps what the
  weight gradient needs; ``backward_weight(mb)`` (W) accumulates the parameter gradients of
  that micro-batch into ``.grad`` and frees the stash. D then W gives the same gradients as
  B (up to floating-point summation order).

Gradients: ``grad`` has the structure of the unit's output (Tensor or tuple; ``None``
entries allowed for outputs that received no gradient). The returned input gradient has the
structure of the input; a floating input that the unit does not use gets zeros, a
non-floating input gets ``None``; the first unit returns ``None`` (its input is data).

Relays: a unit whose class sets ``relays = {i: j}`` returns its input ``i`` unchanged as output
``j`` and uses it for nothing else (HelixPipe's residual through the attention unit). The runner
keeps no copy of a relayed input (only its shape, as a zero-stride placeholder that counts no
bytes) and hands the gradient of output ``j`` back as the gradient of input ``i``. The first
forward checks that output ``j`` is input ``i`` and that no graph of the unit holds input ``i``.

Loss in backward (``loss_in_backward=True``, what a program's ``meta["loss_in_backward"]`` asks
for: HelixPipe's section 4): the last unit's F runs only ``module.forward_trunk(x)`` (its forward up
to the final norm's input, recomputed as its forward would be) and keeps that tensor instead of the
logits' graph; its first backward (B or D) runs ``module.head_loss(h, targets)`` (final norm, LM
head, cross-entropy) with autograd recording, then differentiates the whole. The loss value is then
produced by that backward: :meth:`pop_loss` hands it over (``forward`` returns None). An F without
its graph (a RECOMPUTE follows) computes nothing; the RECOMPUTE runs the trunk.

Loss scaling: the last unit's backward seeds its loss with ``loss_scale`` (default: the
constructor's, 1.0). The executor passes ``1/M`` so that the accumulated gradients are
those of the mean over M micro-batches, matching ``pipert.tools.reference``. Other units
ignore ``loss_scale``. An explicit ``grad`` for the last unit replaces the seed.

D/W split (``split="intermediates"``, the default when available): the method of
``torch.distributed.pipelining`` (zero-bubble). D walks the autograd graph once to find,
for each parameter, the nodes where its path joins the path from the inputs to the outputs
("intermediates"), records the gradients flowing into those nodes while computing the
input gradient, and drops the graph above them. That analysis depends only on the graph's
structure: it is computed once per structure and reused by the micro-batches that share it, after
one walk that checks the structure (``pipert.exec.dgraph``). W restarts autograd from the recorded
nodes, so it does only the weight-gradient work. Each autograd call pays a fixed cost and a walk
of the graph below its roots (CPU, one thread: about 0.3 ms + 1.3 us per node), so W merges the
parameter groups into one call per level of their intermediates (``pipert.exec.wgrad``: why that
is exact) instead of torch's one call per group. Outputs that do not depend on the inputs
(every output of the first unit) are kept whole and differentiated in W; a unit none of whose
inputs needs a gradient (the first) walks no graph in D, which only keeps its outputs, and its W
costs one B. D is written here on torch's graph helpers rather than calling
``stage_backward_input``, which detaches outputs in place (an error for view outputs such as the
q/k/v of a pre-attention unit) and drops the gradient of outputs independent of the inputs.
``split="retain"`` (the fallback when the torch helpers do not
import) keeps the whole graph after D and runs W as a second backward from the outputs to
the parameters: simple, but W repeats the activation-gradient chain, so D + W costs about
B + D. Memory between D and W: "intermediates" keeps the graph below the recorded nodes
(what W needs) and frees the rest; "retain" keeps the whole graph of the unit.
"""
from __future__ import annotations

import functools
import inspect
import weakref
from dataclasses import dataclass
from typing import Any, Union

import torch
from torch import Tensor, nn
from torch.autograd.graph import get_gradient_edge

from .dgraph import DAnalyses
from .wgrad import plan_weight_calls, run_weight_call

__all__ = ["UnitRunner", "Activation", "unit_runner"]

Activation = Union[Tensor, tuple[Tensor, ...]]


@functools.cache  # depends only on the installed torch; the executor builds runners every step
def _split_helpers() -> Any:
    """The torch zero-bubble graph helpers, or None when this torch has none."""
    try:
        from torch.distributed.pipelining import _backward as helpers
        arity = {"_get_grad_fn_or_grad_acc": 1, "construct_reverse_graph": 1, "reverse_closure": 3,
                 "get_param_groups": 3}
        for name, n in arity.items():  # the signatures this module was written against
            if len(inspect.signature(getattr(helpers, name)).parameters) != n:
                return None
        if "param_groups" not in inspect.signature(helpers.stage_backward_weight).parameters:
            return None
        return helpers
    except Exception:  # noqa: BLE001 - any failure selects the fallback
        return None


@dataclass(frozen=True)
class _Root:
    """One output of a forward, kept for its backward without its tensor: the autograd edge
    (None when the output needs no gradient) and what a gradient for it must look like."""

    edge: Any
    shape: torch.Size
    dtype: torch.dtype
    device: torch.device

    @staticmethod
    def of(t: Tensor) -> "_Root":
        return _Root(get_gradient_edge(t) if t.requires_grad else None, t.shape, t.dtype, t.device)


@dataclass
class _Entry:
    """What one micro-batch keeps between its forward and its (last) backward."""

    inputs: tuple[Tensor, ...]        # leaves the module consumed (floating ones require grad unless first)
    single: bool                      # the input activation was one Tensor, not a tuple
    targets: Tensor | None
    outputs: tuple["_Root", ...] | None = None  # graph roots; None while awaiting RECOMPUTE or after D
    groups: list | None = None        # after D (intermediates): W's autograd calls (exec/wgrad.py)
    rest: tuple[list, list] | None = None  # after D: (outputs, grads) that W must differentiate whole
    input_done: bool = False          # D ran; only W may follow
    w_pieces_done: int = 0            # pieces of W run so far
    relayed: dict | None = None       # input position -> output position passed through (see Relays)
    head_input: Tensor | None = None  # loss in backward: the trunk's output (with its graph) until B/D


def _as_tuple(x: Activation) -> tuple[tuple[Tensor, ...], bool]:
    if isinstance(x, Tensor):
        return (x,), True
    if isinstance(x, (tuple, list)) and all(isinstance(t, Tensor) for t in x):
        return tuple(x), False
    raise TypeError(f"an activation is a Tensor or a tuple of Tensors, got {type(x).__name__}")


class UnitRunner:
    """Runs F/B/D/W/RECOMPUTE of one unit for any number of in-flight micro-batches."""

    def __init__(self, module: nn.Module, is_first: bool, is_last: bool, *,
                 loss_scale: float = 1.0, split: str = "auto", loss_in_backward: bool = False) -> None:
        if split not in ("auto", "intermediates", "retain"):
            raise ValueError(f"split={split!r}; allowed: 'auto', 'intermediates', 'retain'")
        self.loss_in_backward = bool(loss_in_backward and is_last)
        """The last unit's head and loss run in its backward (see the module doc)."""
        if self.loss_in_backward and not all(callable(getattr(module, f, None)) for f in ("forward_trunk", "head_loss")):
            raise TypeError(f"loss in backward: the last unit ({type(module).__name__}) must provide forward_trunk(x) "
                            f"and head_loss(x, targets), as pipert.models' units do; a unit that computes its loss "
                            f"only in its forward needs the program's loss in forward (pipert train --loss-in-forward)")
        self._losses: dict[int, Tensor] = {}
        self.module = module
        self.is_first = is_first
        self.is_last = is_last
        self.loss_scale = loss_scale
        self._helpers = _split_helpers() if split != "retain" else None
        if split == "intermediates" and self._helpers is None:
            raise RuntimeError("split='intermediates' needs torch.distributed.pipelining._backward")
        self.split = "intermediates" if self._helpers is not None else "retain"
        self._stash: dict[int, _Entry] = {}
        self._analyses = DAnalyses(self._helpers) if self._helpers is not None else None
        """D's graph analysis by structure, shared by the micro-batches (``pipert.exec.dgraph``)."""

    # ------------------------------------------------------------------ queries
    def stashed(self) -> list[int]:
        """Micro-batches with a stash (forward done, last backward not yet run)."""
        return sorted(self._stash)

    def has_stash(self, mb: int) -> bool:
        """Whether micro-batch ``mb`` holds the stash its first backward reads: its forward ran
        with its graph (or a RECOMPUTE rebuilt it) and no B or D has run yet."""
        entry = self._stash.get(mb)
        return entry is not None and (entry.outputs is not None or entry.head_input is not None) \
            and not entry.input_done

    def awaiting_weight(self) -> list[int]:
        """Micro-batches whose D ran and whose W has not."""
        return sorted(m for m, e in self._stash.items() if e.input_done)

    def clear(self) -> None:
        """Drop every stash (e.g. after a failed step)."""
        self._stash.clear()
        self._losses.clear()

    def pop_loss(self, mb: int) -> Tensor | None:
        """Loss in backward: the loss of micro-batch ``mb`` (detached, 0-d) once its first backward
        ran, handed over once; None otherwise (and always when the loss comes out of ``forward``)."""
        return self._losses.pop(mb, None)

    def drop(self, mb: int) -> None:
        """FREE of a stash: forget what micro-batch ``mb`` kept (its backward can no longer run)."""
        if self._stash.pop(mb, None) is None:
            raise RuntimeError(f"FREE stash of micro-batch {mb}: nothing stashed (stashed: {self.stashed()})")

    def held_inputs(self) -> dict[int, tuple[Tensor, ...]]:
        """Micro-batch -> the tensors its stash entry keeps itself (until its last backward): the
        inputs, and under loss in backward the head's input and the targets until the first backward."""
        return {m: e.inputs + (() if e.head_input is None else (e.head_input, e.targets))
                for m, e in self._stash.items()}

    # ------------------------------------------------------------------ forward
    def forward(self, mb: int, inputs: Activation, targets: Tensor | None = None, *,
                keep_graph: bool = True) -> Activation:
        """F: run the unit on ``inputs``; return the detached output, or the loss if last (None
        under loss in backward)."""
        if mb in self._stash:
            raise RuntimeError(f"forward of micro-batch {mb}: it is already stashed (forward twice?)")
        if self.is_last and targets is None:
            raise ValueError(f"forward of micro-batch {mb}: the last unit needs targets")
        xs, single = _as_tuple(inputs)
        leaves = tuple(self._leaf(t) for t in xs)
        relays = getattr(self.module, "relays", None) or None
        entry = _Entry(leaves, single, targets, relayed=relays)
        out = self._run(entry, record=keep_graph)
        if relays:
            outs = (out,) if isinstance(out, Tensor) else out
            for i, j in relays.items():
                if j >= len(outs) or outs[j].data_ptr() != leaves[i].data_ptr():
                    raise TypeError(f"{type(self.module).__name__}.relays says input {i} is returned as output "
                                    f"{j} unchanged, but it is not")
            entry.inputs = tuple(t.detach().new_zeros(()).expand(t.shape) if i in relays else t
                                 for i, t in enumerate(leaves))
            used = [weakref.ref(leaves[i]) for i in relays]
            del leaves  # now only a graph that uses a relayed input still holds it
            if any(r() is not None for r in used):
                raise TypeError(f"{type(self.module).__name__}.relays names an input that the unit also uses; "
                                f"a relayed input must only be passed through")
        self._stash[mb] = entry
        return out

    def evaluate(self, inputs: Activation, targets: Tensor | None = None) -> Activation:
        """F of an evaluation program: the unit's output without a graph or a stash (the last unit's
        loss given ``targets``, its outputs without)."""
        xs, single = _as_tuple(inputs)
        x = xs[0] if single else xs
        with torch.no_grad():
            if self.is_last:
                return self.module(x, targets)
            return self.module(x)

    def recompute(self, mb: int) -> None:
        """RECOMPUTE: rebuild the graph of a forward that ran with ``keep_graph=False``."""
        entry = self._get(mb, "RECOMPUTE")
        if entry.outputs is not None or entry.head_input is not None or entry.input_done:
            raise RuntimeError(f"RECOMPUTE of micro-batch {mb}: its graph is already present")
        self._run(entry, record=True)

    def _leaf(self, t: Tensor) -> Tensor:
        t = t.detach()
        if not self.is_first and (t.is_floating_point() or t.is_complex()):
            t.requires_grad_(True)
        return t

    def _run(self, entry: _Entry, record: bool) -> Activation:
        x = entry.inputs[0] if entry.single else entry.inputs
        if self.loss_in_backward:  # the trunk only; without a graph there is nothing to keep
            if record:
                with torch.enable_grad():
                    entry.head_input = self.module.forward_trunk(x)
            return None
        with torch.set_grad_enabled(record):
            out = self.module(x, entry.targets) if self.is_last else self.module(x)
        if self.is_last:
            if not isinstance(out, Tensor) or out.numel() != 1:
                raise TypeError("the last unit must return a scalar loss tensor")
            if record:
                entry.outputs = (_Root.of(out),)
            return out.detach()
        outs, single = _as_tuple(out)
        if record:  # graph roots without the output tensors: their storage goes with the sent value
            passed = set((entry.relayed or {}).values())  # relayed outputs: their gradient goes straight back
            entry.outputs = tuple(_Root(None, o.shape, o.dtype, o.device) if j in passed else _Root.of(o)
                                  for j, o in enumerate(outs))
        detached = tuple(o.detach() for o in outs)
        return detached[0] if single else detached

    # ------------------------------------------------------------------ backward
    def backward(self, mb: int, grad_output: Activation | None = None, *,
                 loss_scale: float | None = None) -> Activation | None:
        """B: return the input gradient and accumulate the parameter gradients; frees the stash."""
        entry = self._ready(mb, "B")
        outs, grads = self._roots(mb, entry, grad_output, loss_scale)
        del self._stash[mb]
        if outs:
            torch.autograd.backward(outs, grads)
        return self._input_grads(entry, [t.grad for t in entry.inputs], grad_output)

    def backward_input(self, mb: int, grad_output: Activation | None = None, *,
                       loss_scale: float | None = None) -> Activation | None:
        """D: return the input gradient; keep what ``backward_weight(mb)`` needs."""
        entry = self._ready(mb, "D")
        outs, grads = self._roots(mb, entry, grad_output, loss_scale)
        wanted = [t for t in entry.inputs if t.requires_grad]
        if self.split == "retain":
            got = self._grad(outs, wanted, grads, retain=True)
            entry.rest = (outs, grads)
        else:
            got = self._input_grads_capturing(entry, outs, grads, wanted)
        entry.outputs, entry.input_done = None, True
        it = iter(got)
        return self._input_grads(entry, [next(it) if t.requires_grad else None for t in entry.inputs], grad_output)

    def backward_weight(self, mb: int, piece: tuple[int, int] | None = None) -> None:
        """W: accumulate the parameter gradients of ``mb`` (after its D); frees the stash.

        ``piece=(j, n)`` runs the j-th of n pieces: the j-th contiguous share of W's autograd
        calls (``pipert.exec.wgrad``) and of the parameters of outputs differentiated whole; the stash is freed
        by the last piece. Pieces must run in order 0..n-1."""
        entry = self._stash.get(mb)
        if entry is None or not entry.input_done:
            raise RuntimeError(f"W of micro-batch {mb}: no D ran for it (stashed: {self.stashed()}, "
                               f"awaiting W: {self.awaiting_weight()})")
        j, n = piece if piece is not None else (0, 1)
        if j != entry.w_pieces_done:
            raise RuntimeError(f"W of micro-batch {mb}: piece {j}/{n} after {entry.w_pieces_done} pieces")
        last = j == n - 1
        params = [p for p in self.module.parameters() if p.requires_grad]
        if entry.rest is not None and entry.rest[0]:
            outs, grads = entry.rest
            lo, hi = _share(len(params), j, n)
            mine = params[lo:hi]
            if mine:  # accumulates into .grad in the engine (an unreached parameter keeps its .grad)
                torch.autograd.backward(outs, grads, inputs=mine, retain_graph=bool(entry.groups) or not last)
        if entry.groups:
            lo, hi = _share(len(entry.groups), j, n)
            for call in entry.groups[lo:hi]:
                run_weight_call(call, params, self._helpers)  # frees the graph below
        entry.w_pieces_done = j + 1
        if last:
            del self._stash[mb]

    # ------------------------------------------------------------------ helpers
    def _get(self, mb: int, op: str) -> _Entry:
        entry = self._stash.get(mb)
        if entry is None:
            raise RuntimeError(f"{op} of micro-batch {mb}: nothing stashed (stashed: {self.stashed()})")
        return entry

    def _ready(self, mb: int, op: str) -> _Entry:
        entry = self._get(mb, op)
        if entry.input_done:
            raise RuntimeError(f"{op} of micro-batch {mb}: its D already ran; only W may follow")
        if entry.head_input is not None:
            self._head_forward(mb, entry)
        if entry.outputs is None:
            raise RuntimeError(f"{op} of micro-batch {mb}: forward ran without a graph; RECOMPUTE first")
        return entry

    def _head_forward(self, mb: int, entry: _Entry) -> None:
        """Loss in backward: the head and loss on the kept trunk output, recorded; its root replaces
        the trunk's and the loss waits in ``pop_loss``."""
        with torch.enable_grad():
            loss = self.module.head_loss(entry.head_input, entry.targets)
        if not isinstance(loss, Tensor) or loss.numel() != 1:
            raise TypeError("head_loss of the last unit must return a scalar loss tensor")
        entry.outputs, entry.head_input = (_Root.of(loss),), None
        self._losses[mb] = loss.detach()

    def _roots(self, mb: int, entry: _Entry, grad_output: Activation | None,
               loss_scale: float | None) -> tuple[list[Tensor], list[Tensor]]:
        """Outputs to differentiate and their seeds, skipping those without grad."""
        outs = entry.outputs
        if self.is_last and grad_output is None:
            scale = self.loss_scale if loss_scale is None else loss_scale
            o = outs[0]
            grads: tuple = (torch.full(o.shape, scale, dtype=o.dtype, device=o.device),)
        elif grad_output is None:
            raise ValueError(f"backward of micro-batch {mb}: a non-last unit needs the output gradient")
        elif isinstance(grad_output, Tensor):
            grads = (grad_output,)
        else:
            grads = tuple(grad_output)
        if len(grads) != len(outs):
            raise ValueError(f"backward of micro-batch {mb}: {len(grads)} gradient(s) for {len(outs)} output(s)")
        keep_o, keep_g = [], []
        for i, (o, g) in enumerate(zip(outs, grads)):
            if g is None or o.edge is None:
                continue
            if g.shape != o.shape:
                raise ValueError(f"backward of micro-batch {mb}: gradient {i} has shape {tuple(g.shape)}, "
                                 f"output has {tuple(o.shape)}")
            keep_o.append(o.edge)
            keep_g.append(g.to(o.dtype))
        return keep_o, keep_g

    @staticmethod
    def _grad(outs: list[Tensor], wrt: list[Tensor], grads: list[Tensor], retain: bool) -> tuple:
        if not outs or not wrt:
            return tuple(None for _ in wrt)
        return torch.autograd.grad(outs, wrt, grads, retain_graph=retain, allow_unused=True)

    def _input_grads(self, entry: _Entry, grads: list[Tensor | None],
                     grad_output: Activation | None) -> Activation | None:
        if self.is_first:
            return None
        res = [None if not t.requires_grad else (torch.zeros_like(t) if g is None else g)
               for t, g in zip(entry.inputs, grads)]
        for i, j in (entry.relayed or {}).items():
            g = grad_output if isinstance(grad_output, Tensor) else grad_output[j]
            res[i] = torch.zeros(entry.inputs[i].shape, dtype=entry.inputs[i].dtype,
                                 device=entry.inputs[i].device) if g is None else g
        return res[0] if entry.single else tuple(res)

    def _input_grads_capturing(self, entry: _Entry, outs: list[Tensor], grads: list[Tensor],
                               wanted: list[Tensor]) -> tuple:
        """D by the torch zero-bubble method; fills ``entry.groups`` and ``entry.rest``."""
        if not wanted:  # no input needs a gradient (the first unit): nothing to split, W differentiates all
            entry.rest, entry.groups = (outs, grads), []
            return ()
        node = self._helpers._get_grad_fn_or_grad_acc
        params = [p for p in self.module.parameters() if p.requires_grad]
        param_of = {node(p): p for p in params}
        dep, groups = self._analyses(outs, [node(t) for t in wanted], list(param_of))
        indep = [i for i in range(len(outs)) if i not in dep]
        entry.rest = ([outs[i] for i in indep], [grads[i] for i in indep])
        handles = []
        try:
            for group in groups:
                for i, inter in enumerate(group["intermediates"]):
                    handles.append(inter.register_prehook(_capture(group, i)))
            got = self._grad([outs[i] for i in dep], wanted, [grads[i] for i in dep], retain=True)
        finally:
            for handle in handles:
                handle.remove()
        kept = []
        for group in groups:  # W restarts only from intermediates that a gradient reached
            seen = group.pop("captured", {})
            if seen:
                group["intermediates"] = [group["intermediates"][i] for i in sorted(seen)]
                group["grads"] = [seen[i] for i in sorted(seen)]
                kept.append(group)
        entry.groups = plan_weight_calls(kept, param_of)
        return got


def _share(count: int, j: int, n: int) -> tuple[int, int]:
    """[lo, hi) of the j-th of n contiguous shares of ``count`` items."""
    return count * j // n, count * (j + 1) // n


def _capture(group: dict, i: int):
    """Pre-hook recording the gradient that flows into intermediate ``i`` of ``group``."""
    def hook(grad_outputs):
        group.setdefault("captured", {})[i] = grad_outputs
    return hook


def unit_runner(module: nn.Module, unit: int, num_units: int, meta: dict, **kwargs: Any) -> UnitRunner:
    """The runner of ``unit`` of a program with ``num_units`` units and ``meta`` (a Program's or a
    Schedule's): the last unit's loss runs in its backward when ``meta["loss_in_backward"]`` says so."""
    return UnitRunner(module, is_first=(unit == 0), is_last=(unit == num_units - 1),
                      loss_in_backward=bool(meta.get("loss_in_backward", False)), **kwargs)
