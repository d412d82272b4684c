"""Memory formulas of the chunked MLP, and the chunk size that fits a budget.

Notation: ``N`` tokens (all leading dims of the input flattened), hidden ``h``,
ffn ``f``, chunk ``c`` rows, ``b`` bytes per element of the compute dtype.

Saved for backward, excluding the weights (they are parameters, saved by
reference and not duplicated)::

    activation  mode                     saved activations
    swiglu      chunked temporaries      (h + 2f) N b     x, gate and up pre-activations
    swiglu      recompute                 h N b           x
    gelu        chunked temporaries      (h + f) N b      x, fc pre-activation
    gelu        recompute                 h N b           x

Chunk temporaries (live only while one chunk is processed, reused across
chunks; the largest of forward, backward and the W pass)::

    swiglu  3 c f b     backward: dh (overwritten by dgate), dup, activation
                        (recompute: the recomputed gate and up buffers take the
                        activation and dup in place, so still three)
    gelu    2 c f b     backward: dact (overwritten by dz), activation
                        (recompute: the recomputed z takes the activation in place)

The unchunked PyTorch MLP saves more, and its backward holds whole-sequence
``[N, f]`` temporaries; see docs/kernels.md for the comparison.
"""
from __future__ import annotations

import torch

__all__ = ["saved_activation_bytes", "chunk_temp_bytes", "chunk_size_for_budget", "ACTIVATIONS"]

ACTIVATIONS = ("swiglu", "gelu")
# ffn-wide [c, f] buffers live at once, per activation
_TEMP_BUFFERS = {"swiglu": 3, "gelu": 2}
# ffn-wide [N, f] tensors saved in the chunked-temporaries mode, per activation
_SAVED_FFN = {"swiglu": 2, "gelu": 1}


def _bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _check(activation: str, *ints: int) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
    for v in ints:
        if not isinstance(v, int) or v < 0:
            raise ValueError(f"sizes must be non-negative ints, got {v!r}")


def saved_activation_bytes(tokens: int, hidden: int, ffn: int, dtype: torch.dtype, *,
                           activation: str = "swiglu", recompute: bool = False) -> int:
    """Bytes the chunked MLP saves for backward, weights excluded (table above)."""
    _check(activation, tokens, hidden, ffn)
    width = hidden if recompute else hidden + _SAVED_FFN[activation] * ffn
    return tokens * width * _bytes(dtype)


def chunk_temp_bytes(chunk: int, ffn: int, dtype: torch.dtype, *,
                     activation: str = "swiglu") -> int:
    """Peak bytes of the per-chunk temporaries (the same in both modes)."""
    _check(activation, chunk, ffn)
    return _TEMP_BUFFERS[activation] * chunk * ffn * _bytes(dtype)


def chunk_size_for_budget(budget_bytes: int, hidden: int, ffn: int, dtype: torch.dtype, *,
                          activation: str = "swiglu", multiple: int = 128) -> int:
    """Largest chunk, a multiple of ``multiple`` rows, whose temporaries fit ``budget_bytes``.

    ``hidden`` is accepted for symmetry with the other formulas: the temporaries
    are all ffn-wide, because input and output chunks are views of the whole tensors.
    Raises ValueError when not even ``multiple`` rows fit.
    """
    _check(activation, budget_bytes, hidden, ffn, multiple)
    if multiple < 1 or ffn < 1:
        raise ValueError("multiple and ffn must be at least 1")
    per_row = chunk_temp_bytes(1, ffn, dtype, activation=activation)
    rows = (budget_bytes // per_row) // multiple * multiple
    if rows < multiple:
        raise ValueError(f"a budget of {budget_bytes} bytes holds fewer than {multiple} rows "
                         f"({per_row} bytes per row for {activation}, ffn={ffn}, {dtype})")
    return rows
