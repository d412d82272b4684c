"""Every op of the IR runs on gloo processes and trains exactly (float64, 1e-10 against the
single-process reference): folded micro-batches, RECOMPUTE on every unit, OFFLOAD/PREFETCH of
every stash and of units' weights between uses, a data-parallel replica pair with REDUCESCATTER + ALLGATHER (ZeRO 1 and 3) and
with ALLREDUCE, W in sub-blocks (CrossPipe); torch's own interleaved-zero-bubble programs
(compute order lowered by pipert, and with torch's send/receive positions)."""
from pipert.testing import Case

P2 = [
    Case("1f1b", 2, 8, fold=2, steps=2),                              # two micro-batches per op
    Case("1f1b", 2, 8, fold=2, passes=("expand_folds",)),             # ... expanded, one message each
    Case("1f1b", 2, 4, passes=("recompute",), steps=2),               # RECOMPUTE on every unit
    Case("zb-h1", 2, 4, passes=("recompute",)),
    Case("1f1b", 2, 4, passes=("offload_stashes",), steps=2),         # OFFLOAD/PREFETCH of every stash
    Case("zb-v", 2, 4, passes=("offload_stashes",)),
    Case("zb-v", 2, 4, passes=("offload_weights",), steps=2),        # OFFLOAD/PREFETCH of units' weights
    Case("crosspipe-greedy", 2, 4),                                   # W pieces
]
DP = [
    Case("1f1b", 2, 8, dp=2, steps=2),                                # ALLREDUCE of weight gradients
    Case("1f1b", 2, 8, dp=2, zero=1, steps=2),                        # REDUCESCATTER + ALLGATHER
    Case("zb-h1", 2, 8, dp=2, zero=3, steps=2),                       # ZeRO-3: gather before use, free after
]


def _check(results):
    for r in results:
        assert "error" not in r, r
        label = str(r["case"])
        assert r["loss_err"] <= 1e-12, label
        assert r["grad_err"] <= 1e-10, label
        assert r["param_err"] <= 1e-10, label


def test_ir_ops_on_two_ranks(run_gloo_cases):
    _check(run_gloo_cases(P2, 2))


def test_data_parallel_pair_on_four_ranks(run_gloo_cases):
    _check(run_gloo_cases(DP, 4))


TORCH = [
    Case("torch:ScheduleInterleavedZeroBubble", 3, 4, chunks=2, steps=2),
    Case("torch:ScheduleInterleavedZeroBubble", 3, 4, chunks=2, options=(("comms", True),), steps=2),
]


def test_torch_interleaved_zero_bubble_on_three_ranks(run_gloo_cases):
    _check(run_gloo_cases(TORCH, 3))
