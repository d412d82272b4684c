"""Schedule generators and the registry that names them.

``build_schedule("1f1b", stages=4, microbatches=8)`` builds a registered family;
``available()`` lists the names. New families call :func:`register` (usually here, at
import time) with a pure ``build(config, **options) -> Schedule``.
"""
from .classic import check_1f1b, check_gpipe, check_interleaved, gpipe, interleaved_1f1b, one_f_one_b
from .registry import (Family, PipelineConfig, assemble, available, build_schedule, family, order_recvs_by_send,
                       register, require_chunks, require_microbatches_at_least_stages)
from .zero_bubble import check_zb_h1, check_zb_v, zb_h1, zb_v

__all__ = ["Family", "PipelineConfig", "assemble", "available", "build_schedule", "family", "register",
           "order_recvs_by_send", "require_chunks", "require_microbatches_at_least_stages",
           "gpipe", "one_f_one_b", "interleaved_1f1b", "zb_h1", "zb_v"]

register("gpipe", gpipe, "GPipe: all forwards, then all backwards", check=check_gpipe,
         constraints="V = 1; any M >= 1")
register("1f1b", one_f_one_b, "1F1B (PipeDream-flush): warm-up, one forward one backward, cool-down",
         check=check_1f1b, constraints="V = 1; any M >= 1")
register("interleaved-1f1b", interleaved_1f1b,
         "Megatron interleaved 1F1B: V chunks per rank, looping placement u -> u mod P",
         default_chunks=2, min_chunks=2, max_chunks=None, check=check_interleaved,
         constraints="V >= 2; any M >= 1")
register("zb-h1", zb_h1, "Zero Bubble H1: 1F1B with backward split into D/W, W deferred into the cool-down",
         split_backward=True, check=check_zb_h1, constraints="V = 1; any M >= 1")
register("zb-v", zb_v, "Zero Bubble V: 2 chunks per rank in a V shape, D/W split, 1F1B-like memory",
         split_backward=True, default_chunks=2, min_chunks=2, max_chunks=2, check=check_zb_v,
         constraints="V = 2; any M >= 1")
from . import tawpipe, weipipe
from . import crosspipe
from . import helixpipe
from .pipemesh import check_pipemesh, pipemesh

register("pipemesh", pipemesh, "PipeMesh elastic schedule: enqueue/dequeue group sequences over V chunks per rank "
         "(options enqueue, dequeue, units_per_chunk, max_live_passes)", default_chunks=2, min_chunks=1,
         max_chunks=None, check=check_pipemesh,
         constraints="any V >= 1; M >= P; enqueue/dequeue: integers >= P summing to M (default P, P, ...)")
