"""Chooses between a Triton launch and the PyTorch reference for one call.

Invariant: a kernel is launched only where it can run — on a CUDA tensor when
Triton imports, or on a CPU tensor when Triton's interpreter is switched on
(``TRITON_INTERPRET=1`` in the environment at launch time). Everywhere else the
caller uses the PyTorch reference, and the first such fallback in a process
warns once.

``triton.jit`` decides between compiling and interpreting when it decorates a
function, so kernels are declared with :func:`kernel`, which decorates on first
launch, once per mode; importing this package before the variable is set
(e.g. by a test conftest) therefore does not matter.
"""
from __future__ import annotations

import contextlib
import os
import warnings

import torch

try:  # Triton is an optional extra ("pipert[kernels]").
    import triton  # noqa: F401
    import triton.language  # noqa: F401

    HAVE_TRITON = True
except ImportError:  # pragma: no cover - exercised only where Triton is absent
    HAVE_TRITON = False

__all__ = ["HAVE_TRITON", "BLOCK", "FLOAT_DTYPES", "interpret_enabled", "kernel", "use_triton",
           "device_of", "check_elementwise", "compute_dtype"]

# Elements per program of the elementwise kernels; a power of two.
BLOCK = 1024

_warned = False


def interpret_enabled() -> bool:
    """Whether Triton's interpreter is on (read from the environment at each call)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


class kernel:  # noqa: N801 - used as a decorator
    """A Triton kernel decorated with ``triton.jit`` at first launch, once per interpreter mode."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self._jitted: dict[bool, object] = {}

    def __getitem__(self, grid):
        mode = interpret_enabled()
        if mode not in self._jitted:
            self._jitted[mode] = triton.jit(self.fn)
        return self._jitted[mode][grid]


def use_triton(t: torch.Tensor) -> bool:
    """True when a Triton kernel can run on ``t``; warns once when its device rules it out.

    float64 always takes the reference (the kernels compute in float32), silently:
    it is the dtype of oracle runs, where exactness matters more than speed.
    """
    global _warned
    if t.dtype == torch.float64:
        return False
    ok = HAVE_TRITON and (t.is_cuda or (interpret_enabled() and t.device.type == "cpu"))
    if not ok and not _warned:
        _warned = True
        why = "Triton is not installed" if not HAVE_TRITON else (
            f"tensors are on {t.device.type} and TRITON_INTERPRET=1 is not set")
        warnings.warn(f"pipert.kernels: {why}; using the PyTorch reference for the "
                      "fused elementwise kernels (same results, unfused)", RuntimeWarning,
                      stacklevel=3)
    return ok


def device_of(t: torch.Tensor) -> contextlib.AbstractContextManager:
    """Makes ``t``'s GPU current: Triton launches on the current device, not the tensor's."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """Arithmetic dtype of the kernels and references: float64 for float64, else float32."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def check_elementwise(op: str, **tensors: torch.Tensor) -> None:
    """Raises unless all tensors share one shape, one float dtype, one device, and are contiguous.

    The elementwise kernels walk their operands as flat arrays, so contiguity is
    part of their contract; callers pass contiguous chunk buffers.
    """
    items = list(tensors.items())
    name0, t0 = items[0]
    if t0.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: {name0} has dtype {t0.dtype}; expected one of "
                        "float32, float16, bfloat16, float64")
    for name, t in items:
        if t.shape != t0.shape:
            raise ValueError(f"{op}: {name} has shape {tuple(t.shape)} but {name0} has "
                             f"{tuple(t0.shape)}")
        if t.dtype != t0.dtype:
            raise TypeError(f"{op}: {name} has dtype {t.dtype} but {name0} has {t0.dtype}")
        if t.device != t0.device:
            raise ValueError(f"{op}: {name} is on {t.device} but {name0} is on {t0.device}")
        if not t.is_contiguous():
            raise ValueError(f"{op}: {name} must be contiguous")
