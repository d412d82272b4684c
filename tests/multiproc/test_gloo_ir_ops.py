"""Every op of the IR runs on gloo processes and trains exactly (float64, 1e-10 against the
single-process reference): folded micro-batches, RECOMPUTE on every unit, OFFLOAD/PREFETCH of
every stash and of units' weights between uses, a data-parallel replica pair with ALLREDUCE and
with REDUCESCATTER + ALLGATHER (ZeRO 1 and 3), W in sub-blocks (CrossPipe), torch's own
interleaved-zero-bubble programs (compute order lowered by pipert, and with torch's send/receive
positions). The cases (``pipert.testing.IR_OP_CASES`` and friends) also run on the local
transport in tests/unit/test_runtime_local.py."""
from pipert.testing import IR_OP_CASES, IR_OP_DP_CASES, IR_OP_TORCH_CASES, assert_exact


def test_ir_ops_on_two_ranks(run_gloo_cases):
    assert_exact(run_gloo_cases(IR_OP_CASES, 2))


def test_data_parallel_pair_on_four_ranks(run_gloo_cases):
    assert_exact(run_gloo_cases(IR_OP_DP_CASES, 4))


def test_torch_interleaved_zero_bubble_on_three_ranks(run_gloo_cases):
    assert_exact(run_gloo_cases(IR_OP_TORCH_CASES, 3))
