"""Exposed data-parallel time of PipeMesh's communication schedule in the simulator against the
paper's Eqs. 2-5 (pipert.planner.pipemesh.exposed_dp), on a worked example small enough to time
by hand (docs/pipemesh.md, "Exposed DP time: simulator vs Eqs. 2-5")."""
from __future__ import annotations

import pytest

from pipert.cost.topology import Links, LinkSpec, Topology
from pipert.cost.uniform import UniformCost
from pipert.planner.pipemesh import Components, Sharding, exposed_dp
from pipert.schedules import build_schedule
from pipert.schedules.data_parallel import replicate
from pipert.sim import simulate

# P = 2 stages, D = 2 replicas, M = 3 chunks per stage, B = 8 micro-batches, e = d = (4, 4);
# per chunk and micro-batch C^fwd = 1, C^bwd = 2; C_DP = 4 (a chunk's all-gather or
# reduce-scatter); k = 4 units per chunk, so one unit's collective (1) fits one forward pass.
P, D, M, B, K = 2, 2, 3, 8, 4
FWD, BWD, C_DP = 1.0, 2.0, 4.0


def _exposed(zero: int) -> tuple[float, float]:
    """(simulated step - simulated pipeline without collectives, the pipeline's makespan)."""
    s = build_schedule("pipemesh", stages=P, microbatches=B, chunks=M, enqueue=(4, 4), dequeue=(4, 4),
                       units_per_chunk=K)
    cost = UniformCost(tf=FWD / K, tb=BWD / K, weight_bytes=1.0)
    # a ring all-gather of one unit's 1 byte over D ranks moves (D-1)/D bytes per link: C_DP / K
    link = LinkSpec(0.0, (D - 1) / D * K / C_DP)
    pipe = simulate(s, cost, Links(Topology(P, ranks_per_node=1), {}))
    step = simulate(replicate(s, D, [zero] * s.num_units), cost,
                    Links(Topology(P * D, ranks_per_node=P), {"inter_node": link}))
    return step.makespan - pipe.makespan, pipe.makespan


@pytest.mark.parametrize("zero", [2, 3])
def test_worked_example_exposes_eq2s_floor_less_the_first_chunks_own_overlap(zero):
    """Eqs. 2-5: D_o = 2 C_DP + (M-1)(H(C_DP, e_1 C^fwd) + H(C_DP, d_S C^bwd)) = 8 + 2(0 + 0);
    D_g = (S-1) M H(C_DP, B_Z2 C^bwd) = 0 with B_Z2 = 2; with ZeRO-3 also D_p^fwd =
    (R-1) M H(C_DP, 4 C^fwd) = 0 and D_p^bwd = (SM-1) H(C_DP, B_Z3^bwd C^bwd) = 0 with B_Z3^bwd =
    d - B_Z2 = 2: T_DP = 2 C_DP = 8. The pipeline alone takes (MB + P - 1)(C^fwd + C^bwd) = 75.

    By hand, in the simulator: every bucket (one unit, 1) fits the pass it is placed beside and
    the link carries at most one forward pass's worth per forward pass and two per backward pass,
    so no collective in the step's middle delays a pass. Only the ends are exposed: the first
    chunk's k gathers run back to back from time 0 and its unit j runs after gather j, so the
    first pass ends C_DP + C^fwd/k = 4.25 instead of C^fwd = 1 (exposed C_DP - (k-1) C^fwd/k =
    3.25; Eq. 2 charges all of C_DP); the last chunk's k reduce-scatters follow the last
    backward (exposed C_DP = 4). Total 7.25 = 2 C_DP - (k-1) C^fwd / k."""
    c = Components(P, D, M, B, FWD, BWD, C_DP, 0.0, 1.0)
    sh = Sharding(1.0, 1.0 if zero == 3 else 0.0, 2, 4 if zero == 3 else 0, 2 if zero == 3 else 0)
    eq = exposed_dp(c, (4, 4), (4, 4), sh)
    assert eq == {"D_o": 8.0, "D_g": 0.0, "D_p_fwd": 0.0, "D_p_bwd": 0.0}
    sim, pipe = _exposed(zero)
    assert pipe == (M * B + P - 1) * (FWD + BWD)
    assert sim == 2 * C_DP - (K - 1) * FWD / K == sum(eq.values()) - (K - 1) * FWD / K
