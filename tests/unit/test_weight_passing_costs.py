"""The weight-passing benchmark prices recomputation and the LM head as the papers' runtimes run
them (benchmarks/bench_weight_passing.py): a rerun covers the unit's transformer layers only, and
WeiPipe/TawPipe run the head's forward in the last unit's backward."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_weight_passing import Recompute  # noqa: E402

from pipert.cost.devices import DeviceSpec  # noqa: E402
from pipert.cost.transformer import TransformerCost, llama_like, partition_layers  # noqa: E402
from pipert.ir import Action, Op  # noqa: E402

P = 4


def _cost(loss_in_backward: bool) -> Recompute:
    model = llama_like(256, 2 * P, heads=4, seq=128, micro_batch=2, vocab=4096)
    return Recompute(TransformerCost(model, DeviceSpec.preset("a800"), partition_layers(model, P),
                                     loss_in_backward=loss_in_backward))


def _t(cost, op: Op, unit: int) -> float:
    return cost.compute_time(Action(op, unit, (0,)), 0)


def test_the_rerun_is_the_layers_forward_without_embedding_or_head():
    cost = _cost(False)
    base = cost.base
    mid = _t(base, Op.F, 1)            # two layers, neither embedding nor head: the layers' forward
    for u in range(P):                 # every unit holds two identical layers
        assert _t(cost, Op.B, u) - _t(base, Op.B, u) == pytest.approx(mid, rel=1e-12)
        assert _t(cost, Op.D, u) - _t(base, Op.D, u) == pytest.approx(mid, rel=1e-12)
    assert _t(base, Op.F, P - 1) > 1.5 * mid      # the head's forward is there, and not rerun
    assert _t(cost, Op.F, P - 1) == _t(base, Op.F, P - 1)


def test_the_head_runs_once_per_micro_batch_in_either_placement():
    act, wei = _cost(False), _cost(True)
    last = P - 1
    assert _t(wei, Op.F, last) == pytest.approx(_t(wei, Op.F, 1), rel=1e-12)   # WeiPipe: the head left F
    assert _t(wei, Op.B, last) > _t(act, Op.B, last)                           # ... for B
    whole = [_t(c, Op.F, last) + _t(c, Op.B, last) for c in (act, wei)]
    assert whole[0] == pytest.approx(whole[1], rel=1e-12)
