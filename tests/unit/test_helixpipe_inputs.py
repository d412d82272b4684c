"""The HelixPipe benchmark's model inputs that come from the authors' launch code
(docs/helixpipe.md, "Inputs against the authors' code"): Megatron's vocabulary padding, the
tied embedding counted once on the stage that holds both ends, the baselines' loss placement."""
import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from pipert.cost.devices import DeviceSpec  # noqa: E402
from pipert.schedules import build_schedule  # noqa: E402


def test_vocabulary_is_padded_as_megatron_pads_it():
    import bench_helixpipe as hp
    assert hp.padded_vocab(50257, 1) == 50304         # GPT-2 without TP: Megatron's well-known 50304
    assert hp.padded_vocab(50257, 8) == 51200         # 128 x 8 = 1024 divides 51200 = 50 x 1024
    assert hp.padded_vocab(51200, 8) == 51200
    assert hp.spec("3B", 131072).vocab == 51200


@pytest.mark.parametrize("tp", [1, 8])
def test_tied_matrix_counted_once_on_the_stage_with_embedding_and_head(tp):
    import bench_helixpipe as hp
    m = dataclasses.replace(hp.spec("1.3B", 4096), layers=4)
    sched = build_schedule("helixpipe-2fold", stages=2, microbatches=4, chunks=2)
    dev = DeviceSpec.preset("a800")
    tied = hp.state_bytes(sched, hp.cost_for(sched, m, dev, "none", tp=tp, sp=tp > 1))
    untied = hp.state_bytes(sched, hp.cost_for(sched, dataclasses.replace(m, tied_embedding=False), dev, "none",
                                               tp=tp, sp=tp > 1))
    assert untied[0] - tied[0] == pytest.approx(m.vocab * m.hidden / tp * hp.STATE_BYTES)   # stage 0: C(0) and C(L)
    assert tied[1] == untied[1]
    one = build_schedule("1f1b", stages=2, microbatches=4)    # embedding and head on different stages
    assert hp.state_bytes(one, hp.cost_for(one, m, dev, "none")) == \
        hp.state_bytes(one, hp.cost_for(one, dataclasses.replace(m, tied_embedding=False), dev, "none"))


def test_1f1b_computes_the_head_in_the_forward_and_zb_h1_in_the_backward():
    import bench_helixpipe as hp
    m, dev = hp.spec("1.3B", 8192), DeviceSpec.preset("h20")
    costs = {}
    for name in ("1f1b", "zb-h1"):
        sched = build_schedule(name, stages=4, microbatches=8)
        costs[name] = hp.method_cost(name, sched, m, dev, "none")
    last = costs["1f1b"].num_units - 1
    head_f = costs["1f1b"].unit_time(last, "F") - costs["zb-h1"].unit_time(last, "F")
    assert head_f > 0.05 * costs["1f1b"].unit_time(last, "F")
    assert costs["zb-h1"].unit_time(last, "D") - costs["1f1b"].unit_time(last, "D") == pytest.approx(head_f, rel=1e-9)
    assert costs["1f1b"].unit_time(0, "F") == costs["zb-h1"].unit_time(0, "F")
