"""TawPipe x data parallelism on gloo, P=2 stages x D=2 replicas (4 processes), float64, two steps,
against the single-process reference (loss, gradients and updated parameters within 1e-10): node
groups of two (BROADCAST/REDUCE in each replica) with the owners stepping last (``dp``) under
ZeRO-0, with the paper's early step under ZeRO-3 and NCCL's rules (nccl-sim), and one rank per
node (weights and sums by P2P) under ZeRO-1."""
from pipert.testing import Case, assert_exact

CASES = [
    Case("tawpipe", 2, 8, dp=2, options=(("ranks_per_node", 2), ("dp", 2)), steps=2),
    Case("tawpipe", 2, 8, dp=2, zero=3, options=(("ranks_per_node", 2),), rules="nccl", steps=2),
    Case("tawpipe", 2, 8, dp=2, zero=1, options=(("ranks_per_node", 1), ("dp", 2)), steps=2),
]


def test_tawpipe_with_replicas_matches_the_reference(run_gloo_cases):
    assert_exact(run_gloo_cases(CASES, 4))
