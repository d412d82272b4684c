"""torch.distributed.pipelining on pipert's units: the comparison side of bench_vs_torch.

Both runtimes get the same modules. pipert's last ``LlamaUnit`` computes
``lm_loss(logits, targets)`` when given targets and returns the logits when not; torch's
last stage calls it without targets and applies ``loss_fn=lm_loss`` to the logits, so the
two sides run the same operations (same FLOPs) per micro-batch. Gradient scaling differs
only in where 1/M enters: pipert seeds each micro-batch's backward with 1/M, torch divides
the accumulated gradients by M after the last backward (``scale_grads=True``).

Placement matches pipert's classic generators: GPipe/1F1B put stage s on rank s,
interleaved 1F1B puts stage s on rank ``s mod P`` (torch's default looping placement).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

from pipert.models import lm_loss

__all__ = ["TorchPipe", "SCHEDULES"]

# pipert schedule name -> (torch schedule class, chunks per rank)
SCHEDULES = {
    "gpipe": (ScheduleGPipe, 1),
    "1f1b": (Schedule1F1B, 1),
    "interleaved-1f1b": (ScheduleInterleaved1F1B, 2),
}


@dataclass
class TorchPipe:
    """One rank's torch pipeline: its stages, the schedule and an optimizer over its stages."""

    schedule: object
    stages: list
    optimizer: torch.optim.Optimizer
    is_first: bool
    is_last: bool

    @staticmethod
    def build(units: Sequence[nn.Module], schedule_name: str, microbatches: int, lr: float,
              loss_fn: Callable = lm_loss) -> "TorchPipe":
        """Stages of this rank from ``units`` (all P*V of them; only this rank's are used); ``loss_fn``
        computes ``lm_loss`` (a timed wrapper of it, say)."""
        rank, world = dist.get_rank(), dist.get_world_size()
        cls, chunks = SCHEDULES[schedule_name]
        num_stages = world * chunks
        if len(units) != num_stages:
            raise ValueError(f"{schedule_name}: {num_stages} stages expected, got {len(units)} units")
        ids = [c * world + rank for c in range(chunks)]  # looping placement: stage s on rank s mod P
        stages = [PipelineStage(units[s], s, num_stages, torch.device("cpu")) for s in ids]
        params = [p for s in ids for p in units[s].parameters()]
        if chunks == 1:
            sched = cls(stages[0], microbatches, loss_fn=loss_fn)
        else:
            sched = cls(stages, microbatches, loss_fn=loss_fn)
        opt = torch.optim.SGD(params, lr=lr)
        return TorchPipe(sched, stages, opt, is_first=0 in ids, is_last=num_stages - 1 in ids)

    def traced_step(self, x: torch.Tensor, y: torch.Tensor) -> list[str]:
        """One step that records the forwards and backwards this rank ran, in order (``2F0``:
        stage 2, forward, micro-batch 0). Traced from the stages, not read from
        ``pipeline_order``, which for 1F1B does not match what the schedule executes."""
        order: list[str] = []

        def wrap(stage, name: str, tag: str) -> None:
            fn = getattr(stage, name)

            def traced(mb, *args, **kwargs):
                order.append(f"{stage.stage_index}{tag}{mb}")
                return fn(mb, *args, **kwargs)
            setattr(stage, name, traced)

        for st in self.stages:
            wrap(st, "forward_one_chunk", "F")
            wrap(st, "backward_one_chunk", "B")
        try:
            self.step(x, y, [])
        finally:
            for st in self.stages:
                del st.forward_one_chunk, st.backward_one_chunk  # back to the class methods
        return order

    def step(self, x: torch.Tensor, y: torch.Tensor, losses: list) -> None:
        """One training step: the schedule (forward, backward) then the optimizer."""
        args = (x,) if self.is_first else ()
        if self.is_last:
            self.schedule.step(*args, target=y, losses=losses)
        else:
            self.schedule.step(*args)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
