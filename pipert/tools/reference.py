"""The single-process oracle: one training step of the same units without pipelining.

``reference_step`` splits the batch into M equal micro-batches along dim 0, runs the unit
chain on each with plain autograd, accumulates the gradients of ``loss_m / M`` (so the
gradient is that of the mean of the per-micro-batch mean losses, which equals the
full-batch token mean since micro-batches are equal in size), then takes one optimizer step
with one optimizer per unit (as the executor's ``OPT u`` does). It does not use
``UnitRunner``, so it checks the runtime rather than repeating it.

Names: parameter ``name`` of unit ``u`` is ``unit{u}.{name}``; a pipelined run that reports
gradients or parameters under ``unit_param_names`` compares to the result dictionaries
directly. Float32 results differ from a pipelined run by summation order only (~1e-6
relative); compare float64 models tightly.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import Tensor, nn

__all__ = ["grouped_reference_step", 
    "ReferenceResult", "reference_step", "unit_param_names", "named_unit_parameters",
    "split_microbatches", "default_optimizer", "OptimizerFactory", "rel_err"]

OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]


def default_optimizer(params: list[nn.Parameter]) -> torch.optim.Optimizer:
    """SGD with lr 0.1: the update is proportional to the gradient, so a wrong gradient
    scale shows in ``params_after`` (Adam's first step would hide it)."""
    return torch.optim.SGD(params, lr=0.1)


@dataclass
class ReferenceResult:
    """What one reference step produced."""

    loss: float
    """Mean of the per-micro-batch mean losses."""
    losses: list[float]
    """Per-micro-batch mean losses, in micro-batch order."""
    grads: dict[str, Tensor]
    """Accumulated gradient of ``loss`` per parameter (``unit{u}.{name}``), before the step;
    zeros for parameters the loss does not reach."""
    params_after: dict[str, Tensor]
    """Parameter values after the optimizer step."""


def named_unit_parameters(units: Sequence[nn.Module]) -> dict[str, nn.Parameter]:
    """``unit{u}.{name}`` -> parameter, in unit order; raises if two units share a parameter."""
    out: dict[str, nn.Parameter] = {}
    owner: dict[int, str] = {}
    for u, unit in enumerate(units):
        for name, p in unit.named_parameters():
            key = f"unit{u}.{name}"
            if id(p) in owner:
                raise ValueError(f"parameter {key} is the same tensor as {owner[id(p)]}; "
                                 f"units must own disjoint parameters")
            owner[id(p)] = key
            out[key] = p
    return out


def unit_param_names(units: Sequence[nn.Module]) -> list[str]:
    """The names a pipelined run reports for the parameters of ``units``, in unit order."""
    return list(named_unit_parameters(units))


def split_microbatches(tokens: Tensor, targets: Tensor, num_microbatches: int) -> list[tuple[Tensor, Tensor]]:
    """Equal split along dim 0: ``[(tokens_m, targets_m)]``; the batch must divide evenly."""
    if num_microbatches < 1:
        raise ValueError(f"num_microbatches must be >= 1, got {num_microbatches}")
    b = tokens.shape[0]
    if b % num_microbatches:
        raise ValueError(f"batch of {b} does not split into {num_microbatches} equal micro-batches")
    if targets.shape[0] != b:
        raise ValueError(f"tokens have batch {b}, targets {targets.shape[0]}")
    return list(zip(tokens.chunk(num_microbatches), targets.chunk(num_microbatches)))


def reference_step(model_or_units: nn.Module | Sequence[nn.Module], batch_tokens: Tensor, targets: Tensor,
                   num_microbatches: int, optimizer_factory: OptimizerFactory | None = None, *,
                   optimizer: torch.optim.Optimizer | None = None, copy_units: bool = True) -> ReferenceResult:
    """One unpipelined training step (see the module docstring).

    ``model_or_units``: a list of units (``pipert.models.partition`` contract) or one module
    taken as a single unit (``module(tokens, targets) -> loss``, e.g. a ``LlamaModel``).
    ``optimizer_factory``: builds one optimizer per unit from its parameters (default
    ``default_optimizer``); the step runs on a deep copy unless ``copy_units=False``, so the
    caller's parameters stay as they were.
    ``optimizer``: instead, an existing optimizer over the units' parameters; the step then
    runs in place on the units (``copy_units`` is ignored), so a multi-step reference keeps
    its optimizer state (momentum, Adam moments) across calls.
    """
    units = [model_or_units] if isinstance(model_or_units, nn.Module) else list(model_or_units)
    if not units:
        raise ValueError("no units")
    if optimizer is not None and optimizer_factory is not None:
        raise ValueError("pass optimizer_factory or optimizer, not both")
    if copy_units and optimizer is None:
        units = copy.deepcopy(units)  # one call keeps sharing between units as it was
    named = named_unit_parameters(units)
    for p in named.values():
        p.grad = None
    if optimizer is not None:
        owned = {id(p) for p in named.values()}
        if any(id(p) not in owned for g in optimizer.param_groups for p in g["params"]):
            raise ValueError("optimizer holds tensors that are not parameters of these units")
        optimizers = [optimizer]
    else:
        factory = optimizer_factory or default_optimizer
        optimizers = [factory(ps) for ps in ([p for p in u.parameters() if p.requires_grad] for u in units) if ps]
    losses = []
    for tok, tgt in split_microbatches(batch_tokens, targets, num_microbatches):
        x = tok
        for unit in units[:-1]:
            x = unit(x)
        loss = units[-1](x, tgt)
        (loss / num_microbatches).backward()
        losses.append(float(loss.detach()))
    grads = {k: (torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()) for k, p in named.items()}
    for opt in optimizers:
        opt.step()
    params_after = {k: p.detach().clone() for k, p in named.items()}
    return ReferenceResult(sum(losses) / len(losses), losses, grads, params_after)


def grouped_reference_step(units: Sequence[nn.Module], batch_tokens: Tensor, targets: Tensor, num_microbatches: int,
                           update_every: int, optimizer: torch.optim.Optimizer) -> tuple[ReferenceResult, float]:
    """The reference of a step that updates every ``update_every`` micro-batches (e.g. WeiPipe-zb2):
    one in-place reference step per group of micro-batches, in order, with ``optimizer``.
    Returns the last group's result (its gradients and the parameters after the step's last
    update) and the mean loss over all groups."""
    if update_every < 1 or num_microbatches % update_every:
        raise ValueError(f"update_every={update_every} must divide the {num_microbatches} micro-batches")
    groups = num_microbatches // update_every
    xs, ys = batch_tokens.chunk(groups), targets.chunk(groups)
    losses = []
    for g in range(groups):
        ref = reference_step(units, xs[g], ys[g], update_every, optimizer=optimizer)
        losses.append(float(ref.loss))
    return ref, sum(losses) / groups


def rel_err(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """max over tensors of max|a-b| / scale, scale = max(max|b|, 1e-4 * the largest max|b| of all
    tensors) (b is the reference; keys must agree). The floor keeps a tensor whose exact value is
    zero (e.g. the gradient of a key bias, which softmax cancels) from dividing rounding noise by
    rounding noise."""
    if set(a) != set(b):
        missing, extra = sorted(set(b) - set(a))[:3], sorted(set(a) - set(b))[:3]
        raise AssertionError(f"parameter names differ: missing {missing}, unexpected {extra}")
    largest = max((ref.double().abs().max().item() for ref in b.values() if ref.numel()), default=0.0)
    worst = 0.0
    for k, ref in b.items():
        diff = (a[k].double().cpu() - ref.double().cpu()).abs().max().item()
        worst = max(worst, diff / max(ref.double().abs().max().item(), 1e-4 * largest, 1e-300))
    return worst
