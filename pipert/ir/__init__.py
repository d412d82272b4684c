"""Schedule IR: actions, schedules, placement, lowering and validation."""
from .action import (Action, Op, Payload, ScheduleFormatError, parse_action, COMPUTE_OPS, P2P_OPS, COLLECTIVE_OPS,
                     MEMORY_OPS, BACKWARD_OPS)
from .lowering import lower, add_optimizer_steps, order_recvs_by_send
from .schedule import Placement, Schedule

__all__ = ["Action", "Op", "Payload", "ScheduleFormatError", "parse_action", "Placement", "Schedule",
           "lower", "add_optimizer_steps", "order_recvs_by_send", "COMPUTE_OPS", "P2P_OPS", "COLLECTIVE_OPS", "MEMORY_OPS",
           "BACKWARD_OPS"]
