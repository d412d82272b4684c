"""Drop-in ``nn.Module`` MLPs built on the chunked functions.

Parameter names match the built-in model (``pipert.models.llama``) and Meta's
LLaMA checkpoints, so state dicts load unchanged: SwiGLU uses ``w1`` (gate),
``w3`` (up), ``w2`` (down); GeLU uses ``fc``/``proj``. ``from_linears`` wraps
existing ``nn.Linear`` modules without copying, and ``ChunkedSwiGLUMLP.factory``
returns an ``mlp_factory`` for the built-in model.

Weight-gradient deferral, for zero-bubble W passes: a forward run inside
``defer_weight_grads(queue)`` defers into that queue; otherwise, with
``deferred_wgrad=True``, into the module's own ``weight_grad_queue``, drained by
``flush_weight_grads()``.
"""
from __future__ import annotations

import torch
from torch import nn

from typing import Any, Callable

from .chunked_mlp import chunked_gelu_mlp, chunked_swiglu_mlp
from .chunked_tp import tp_chunked_gelu_mlp, tp_chunked_swiglu_mlp
from .mlp_memory import chunk_size_for_budget
from .wgrad import WeightGradQueue, current_weight_grad_queue

__all__ = ["ChunkedSwiGLUMLP", "ChunkedGeluMLP"]


class _ChunkedMLPBase(nn.Module):
    _activation = ""
    tp: Any = None
    """Tensor parallelism (``pipert.models.tp.TensorParallel``, set by ``shard_units``): the first
    linear(s) column-parallel, the last row-parallel (``chunked_tp.py``); None: the whole MLP."""

    def _sharded(self) -> bool:
        return self.tp is not None and self.tp.size > 1

    def _setup(self, ffn: int, dtype: torch.dtype | None, chunk_size: int | None,
               memory_budget: int | None, recompute: bool, deferred_wgrad: bool) -> None:
        if memory_budget is not None:
            chunk_size = chunk_size_for_budget(memory_budget, 0, ffn,
                                               dtype or torch.get_default_dtype(),
                                               activation=self._activation)
        self.chunk_size = chunk_size
        self.recompute = recompute
        self.deferred_wgrad = deferred_wgrad
        self.weight_grad_queue = WeightGradQueue()

    def _queue(self) -> WeightGradQueue | None:
        ctx = current_weight_grad_queue()
        if ctx is not None:
            return ctx
        return self.weight_grad_queue if self.deferred_wgrad else None

    def flush_weight_grads(self) -> int:
        """Runs the queued weight-gradient work (the W pass); returns how many backwards ran."""
        return self.weight_grad_queue.flush()

    def extra_repr(self) -> str:
        return (f"chunk_size={self.chunk_size}, recompute={self.recompute}, "
                f"deferred_wgrad={self.deferred_wgrad}")


class ChunkedSwiGLUMLP(_ChunkedMLPBase):
    """``w2(silu(w1(x)) * w3(x))`` (down, gate, up), chunked over tokens.

    ``chunk_size`` rows per chunk (None: whole sequence), or ``memory_budget`` bytes
    for the chunk temporaries (overrides ``chunk_size``). ``recompute`` saves only
    the input. ``deferred_wgrad`` queues weight grads for ``flush_weight_grads()``.
    """

    _activation = "swiglu"

    def __init__(self, hidden: int, ffn: int, *, chunk_size: int | None = 4096,
                 memory_budget: int | None = None, recompute: bool = False,
                 deferred_wgrad: bool = False, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        kw = {"bias": False, "device": device, "dtype": dtype}
        self.w1 = nn.Linear(hidden, ffn, **kw)  # gate
        self.w3 = nn.Linear(hidden, ffn, **kw)  # up
        self.w2 = nn.Linear(ffn, hidden, **kw)  # down
        self._setup(ffn, dtype, chunk_size, memory_budget, recompute, deferred_wgrad)

    @classmethod
    def from_linears(cls, gate: nn.Linear, up: nn.Linear, down: nn.Linear,
                     **kwargs: Any) -> "ChunkedSwiGLUMLP":
        """Wraps existing bias-free linears (shared, not copied)."""
        for name, lin in (("gate", gate), ("up", up), ("down", down)):
            if lin.bias is not None:
                raise ValueError(f"{name} has a bias; the SwiGLU MLP is bias-free")
        w = gate.weight
        mlp = cls(w.shape[1], w.shape[0], device="meta", dtype=w.dtype, **kwargs)
        mlp.w1, mlp.w3, mlp.w2 = gate, up, down
        return mlp

    @classmethod
    def factory(cls, **kwargs: Any) -> Callable[[Any], "ChunkedSwiGLUMLP"]:
        """An ``mlp_factory`` for the built-in model: reads ``cfg.hidden``, ``cfg.ffn``,
        ``cfg.torch_dtype``; ``kwargs`` go to the constructor (chunk_size, recompute, ...)."""
        return lambda cfg: cls(cfg.hidden, cfg.ffn, dtype=cfg.torch_dtype, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._sharded():
            return tp_chunked_swiglu_mlp(x, self.w1.weight, self.w3.weight, self.w2.weight, self.tp,
                                         chunk_size=self.chunk_size, recompute=self.recompute,
                                         weight_grad_queue=self._queue())
        return chunked_swiglu_mlp(x, self.w1.weight, self.w3.weight, self.w2.weight,
                                  chunk_size=self.chunk_size, recompute=self.recompute,
                                  weight_grad_queue=self._queue())


class ChunkedGeluMLP(_ChunkedMLPBase):
    """``proj(gelu(fc(x)))`` of GPT-style models, chunked over tokens.

    ``bias`` adds biases to both linears; ``approximate`` as in ``nn.GELU``.
    Other arguments as in :class:`ChunkedSwiGLUMLP`.
    """

    _activation = "gelu"

    def __init__(self, hidden: int, ffn: int, *, bias: bool = True, approximate: str = "none",
                 chunk_size: int | None = 4096, memory_budget: int | None = None,
                 recompute: bool = False, deferred_wgrad: bool = False,
                 device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
        self.fc = nn.Linear(hidden, ffn, bias=bias, device=device, dtype=dtype)
        self.proj = nn.Linear(ffn, hidden, bias=bias, device=device, dtype=dtype)
        self.approximate = approximate
        self._setup(ffn, dtype, chunk_size, memory_budget, recompute, deferred_wgrad)

    @classmethod
    def from_linears(cls, fc: nn.Linear, proj: nn.Linear, **kwargs: Any) -> "ChunkedGeluMLP":
        """Wraps existing linears (shared, not copied); both with or both without bias."""
        if (fc.bias is None) != (proj.bias is None):
            raise ValueError("fc and proj must both have a bias or both have none")
        w = fc.weight
        mlp = cls(w.shape[1], w.shape[0], bias=fc.bias is not None, device="meta",
                  dtype=w.dtype, **kwargs)
        mlp.fc, mlp.proj = fc, proj
        return mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._sharded():
            return tp_chunked_gelu_mlp(x, self.fc.weight, self.fc.bias, self.proj.weight, self.proj.bias,
                                       self.tp, approximate=self.approximate, chunk_size=self.chunk_size,
                                       recompute=self.recompute, weight_grad_queue=self._queue())
        return chunked_gelu_mlp(x, self.fc.weight, self.fc.bias, self.proj.weight,
                                self.proj.bias, approximate=self.approximate,
                                chunk_size=self.chunk_size, recompute=self.recompute,
                                weight_grad_queue=self._queue())

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}, " + super().extra_repr()
