"""ScheduleError: one broken rule of docs/semantics.md, located at a rank and action index."""
from __future__ import annotations

from ..ir.action import Action

__all__ = ["ScheduleError", "REASONS", "STRUCTURAL"]

# reason code -> what it means
REASONS = {
    "missing_input": "a consumed value is never produced on the consumer's rank",
    "input_later": "a consumed value is produced only later in the consumer's rank list",
    "duplicate": "a (unit, micro-batch) is computed twice (F, B/D or W)",
    "missing_compute": "a (unit, micro-batch) lacks its F, its B/D, or the W after its D",
    "unmatched_send": "a SEND has no RECV at the same FIFO position of its directed link",
    "unmatched_recv": "a RECV has no SEND at the same FIFO position of its directed link",
    "mismatch": "a matched SEND/RECV pair disagrees on payload, unit, micro-batches or tag",
    "bad_peer": "a SEND/RECV names itself or a rank outside the schedule",
    "bad_index": "a unit or micro-batch index outside the schedule",
    "sub_block": "sub-blocks of one compute are not consecutive pieces 0..N-1 in order",
    "wait": "a WAIT completes no earlier SEND/RECV with the same fields",
    "collective": "a collective is not posted identically, in the same order, by every member",
    "wgrad": "an OPT off its owner, or weight-grad contributions missing or double-counted",
    "memory": "a rank's running memory exceeds the limit",
    "deadlock": "the action graph has a cycle",
}

# reasons after which the action graph is incomplete, so timing (and deadlock) cannot be checked
STRUCTURAL = frozenset({"unmatched_send", "unmatched_recv", "bad_peer", "bad_index", "collective", "wait"})


class ScheduleError(ValueError):
    """A schedule breaks a rule; ``rank``/``index`` locate the action (index -1: the rank as a whole)."""

    def __init__(self, rank: int, index: int, action: Action | None, reason: str, detail: str) -> None:
        self.rank = rank
        self.index = index
        self.action = action
        self.reason = reason
        self.detail = detail
        where = f"rank {rank}" if index < 0 else f"rank {rank}, action {index}"
        if action is not None:
            where += f" ({action})"
        super().__init__(f"{where}: {detail}")

    @property
    def sort_key(self) -> tuple[int, int]:
        """Errors sort by rank, then index; rank-level errors (index -1) last on their rank."""
        return (self.rank, self.index if self.index >= 0 else 1 << 62)
