"""Owner-side optimizer wrappers."""
from __future__ import annotations

from typing import Callable, Iterable

import torch
from torch import nn

__all__ = ["MasterWeightOptimizer", "needs_master_weights"]

_LOW = (torch.float16, torch.bfloat16)


def needs_master_weights(params: Iterable[nn.Parameter]) -> bool:
    return any(p.dtype in _LOW for p in params)


class MasterWeightOptimizer:
    """Keeps an fp32 master copy of low-precision parameters and steps on it.

    ``step()``: gradients are cast to fp32 into the masters, the inner optimizer updates
    the masters, and each working parameter is rebound (not copied in place) to the master
    cast back to its dtype, so graphs still referencing the old weights stay intact.
    """

    def __init__(self, params: Iterable[nn.Parameter], factory: Callable[[list], torch.optim.Optimizer]) -> None:
        self.params = list(params)
        self.masters = [nn.Parameter(p.detach().float().clone()) for p in self.params]
        self.inner = factory(self.masters)

    def step(self) -> None:
        for p, m in zip(self.params, self.masters):
            m.grad = None if p.grad is None else p.grad.detach().float()
        self.inner.step()
        with torch.no_grad():
            for p, m in zip(self.params, self.masters):
                p.data = m.detach().to(p.dtype)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def state_dict(self) -> dict:
        return {"inner": self.inner.state_dict(), "masters": [m.detach() for m in self.masters]}
