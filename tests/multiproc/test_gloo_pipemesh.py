"""Pipeline x data parallelism on gloo, P=2 stages x D=2 replicas (4 processes), float64, against
the single-process reference (loss, gradients and updated parameters within 1e-10):

- plain data parallelism (gradients all-reduced before the optimizer) over schedules of every
  kind: one chunk per rank, interleaved, V-shaped, weight passing, W in pieces;
- ``pipemesh`` with mixed ZeRO-1/2/3 inside every chunk (PipeMesh's bucketed gathers and
  reduce-scatters beside the passes, accumulation after the reduce-scatter, the optimizer on
  shards), with selective recomputation (PyTorch SAC: projections and attention kept, norms and
  activations recomputed) and with whole-unit RECOMPUTE;
- ``pipemesh`` with ZeRO stages per parameter inside every unit (norms 0, MLP 3, attention 2,
  the rest 1: each class gathered, freed and reduce-scattered on its own), with one gathered copy
  of the ZeRO-3 weights and with separate forward and backward copies."""
from pipert.testing import Case, assert_exact

PLAIN_DP = [Case(name, 2, 8, dp=2) for name in ("gpipe", "interleaved-1f1b", "zb-v", "weipipe-interleave",
                                                  "crosspipe-greedy")]

MIXED = (3, 2, 1, 3, 3, 2, 1, 3, 2, 3, 2, 3)  # per unit; 3 units per chunk, P=2, V=2
_PM = (("units_per_chunk", 3), ("enqueue", (4,)), ("dequeue", (2, 2)))
PIPEMESH = [
    Case("pipemesh", 2, 8, chunks=2, dp=2, zero=MIXED, options=_PM, steps=2),
    Case("pipemesh", 2, 8, chunks=2, dp=2, zero=MIXED, options=_PM, save_ops=("projection", "attention")),
    Case("pipemesh", 2, 8, chunks=2, dp=2, zero=3, passes=("recompute",)),
]


PER_PARAMETER = [Case("pipemesh", 2, 8, chunks=2, dp=2, zero="0:norm,3:mlp,2:attn.w,1",
                      options=(("enqueue", (4,)), ("dequeue", (2, 2))), steps=2, zero3_buffers=z3b) for z3b in (1, 2)]


def test_plain_data_parallel_over_schedules(run_gloo_cases):
    assert_exact(run_gloo_cases(PLAIN_DP, 4))


def test_pipemesh_mixed_zero_and_recompute(run_gloo_cases):
    assert_exact(run_gloo_cases(PIPEMESH, 4))


def test_pipemesh_zero_per_parameter(run_gloo_cases):
    assert_exact(run_gloo_cases(PER_PARAMETER, 4))
