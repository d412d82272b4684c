"""pipert.kernels: Triton kernels, each beside its PyTorch reference, and the modules built on them.

Chunked MLP (issue #7): :func:`chunked_swiglu_mlp`, :func:`chunked_gelu_mlp` and the
drop-in modules :class:`ChunkedSwiGLUMLP`, :class:`ChunkedGeluMLP`. See docs/kernels.md.
On a CPU the Triton kernels run only under ``TRITON_INTERPRET=1`` (set before this
import); otherwise the PyTorch references run instead, with one warning.
"""
from .chunked_mlp import (chunked_gelu_mlp, chunked_swiglu_mlp, gelu_mlp_reference,
                          swiglu_mlp_reference)
from .chunked_tp import tp_chunked_gelu_mlp, tp_chunked_swiglu_mlp
from .gelu import gelu_backward, gelu_backward_reference, gelu_forward, gelu_reference
from .mlp_memory import chunk_size_for_budget, chunk_temp_bytes, saved_activation_bytes
from .mlp_modules import ChunkedGeluMLP, ChunkedSwiGLUMLP
from .swiglu import (swiglu_backward, swiglu_backward_reference, swiglu_forward,
                     swiglu_reference)
from .wgrad import WeightGradQueue, current_weight_grad_queue, defer_weight_grads

__all__ = [
    "chunked_swiglu_mlp",
    "chunked_gelu_mlp",
    "swiglu_mlp_reference",
    "gelu_mlp_reference",
    "tp_chunked_swiglu_mlp",
    "tp_chunked_gelu_mlp",
    "ChunkedSwiGLUMLP",
    "ChunkedGeluMLP",
    "WeightGradQueue",
    "defer_weight_grads",
    "current_weight_grad_queue",
    "saved_activation_bytes",
    "chunk_temp_bytes",
    "chunk_size_for_budget",
    "swiglu_forward",
    "swiglu_backward",
    "swiglu_reference",
    "swiglu_backward_reference",
    "gelu_forward",
    "gelu_backward",
    "gelu_reference",
    "gelu_backward_reference",
]
