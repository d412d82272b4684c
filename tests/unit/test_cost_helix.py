"""The analytic transformer model prices HelixPipe's units and messages."""
import pytest

from pipert.cost.devices import DeviceSpec
from pipert.cost.transformer import ModelSpec, TransformerCost, partition_helix, partition_layers
from pipert.ir import Op, Payload
from pipert.schedules import build_schedule
from pipert.sim.simulate import simulate

SPEC = ModelSpec(layers=4, hidden=256, ffn=1024, heads=4, kv_heads=4, vocab=512, seq=2048, gated_mlp=False)
DEV = DeviceSpec.preset("h20")


def test_helix_units_cover_the_model_and_cost_the_same_work():
    helix = TransformerCost(SPEC, DEV, partition_helix(SPEC))
    whole = TransformerCost(SPEC, DEV, partition_layers(SPEC, 4))
    assert helix.num_units == 2 * SPEC.layers + 1
    for op in ("F", "B", "D", "W"):
        assert sum(helix.flops(u, op) for u in range(9)) == pytest.approx(sum(whole.flops(u, op) for u in range(4)))
    assert sum(helix.params(u) for u in range(9)) == sum(whole.params(u) for u in range(4))
    # attention units: QKV projection + causal attention; C units: no attention FLOPs
    T, h = SPEC.tokens, SPEC.hidden
    attn = 4 * SPEC.micro_batch * SPEC.seq ** 2 * h * 0.5
    for u in range(9):
        qkv = 2 * T * h * 3 * h
        assert helix.flops(u, "F") == (pytest.approx(qkv + attn) if u % 2 else pytest.approx(helix.flops(u, "W")))


def test_helix_messages_follow_the_paper():
    cost = TransformerCost(SPEC, DEV, partition_helix(SPEC))
    th = SPEC.tokens * SPEC.hidden * SPEC.dtype_bytes
    for u in range(8):          # C(l) -> A(l): norm output + residual; A(l) -> C(l+1): attention output + residual
        assert cost.message_bytes(Payload.ACT, u) == 2 * th == cost.message_bytes(Payload.GRAD, u)
    for l in range(4):
        assert cost.message_bytes(Payload.WEIGHT, 2 * l + 1) == 3 * SPEC.hidden ** 2 * SPEC.dtype_bytes


def test_recompute_without_attention_keeps_4bsh_per_layer():
    base = TransformerCost(SPEC, DEV, partition_helix(SPEC))
    rc = TransformerCost(SPEC, DEV, partition_helix(SPEC), recompute="no_attention")
    th = SPEC.tokens * SPEC.hidden * SPEC.dtype_bytes
    lse = SPEC.tokens * SPEC.heads * 4
    for l in range(4):   # A(l) keeps norm output, O, lse; C(l+1) keeps residual and O
        assert rc.memory("stash", 2 * l + 1) + rc.memory("stash", 2 * l + 2) == 4 * th + lse
        assert rc.memory("stash", 2 * l + 1) < base.memory("stash", 2 * l + 1)
    for u in range(9):   # backward reruns every matmul of the unit, never the attention core
        assert rc.flops(u, "B") == pytest.approx(base.flops(u, "B") + base.flops(u, "W"))
        assert rc.flops(u, "F") == base.flops(u, "F")
    with pytest.raises(ValueError, match="recompute='full'.*allowed: none, no_attention"):
        TransformerCost(SPEC, DEV, partition_helix(SPEC), recompute="full")


def test_helix_schedule_simulates_with_the_analytic_model():
    s = build_schedule("helixpipe-2fold", stages=2, microbatches=4, chunks=2)
    res = simulate(s, TransformerCost(SPEC, DEV, partition_helix(SPEC)))
    assert res.makespan > 0 and min(res.busy) > 0


@pytest.mark.parametrize("recompute", ["none", "no_attention"])
def test_loss_in_backward_moves_the_head_from_f_to_b(recompute):
    """HelixPipe's section 4: C(L)'s LM head and loss run in its backward. F loses the head's
    forward, B gains it once (under no_attention B reruns the whole forward anyway, so it gains
    nothing), the stash keeps no logits; no other unit changes."""
    base = TransformerCost(SPEC, DEV, partition_helix(SPEC), recompute=recompute)
    late = TransformerCost(SPEC, DEV, partition_helix(SPEC), recompute=recompute, loss_in_backward=True)
    last = 2 * SPEC.layers
    head = 2 * SPEC.tokens * SPEC.hidden * SPEC.vocab
    assert late.flops(last, "F") == pytest.approx(base.flops(last, "F") - head)
    gained = head if recompute == "none" else 0.0
    assert late.flops(last, "B") == pytest.approx(base.flops(last, "B") + gained)
    # the stash keeps the final norm's input ([T, h], as UnitRunner does) instead of its output
    # and the logits; under no_attention it is one tensor more beside the unit's inputs
    logits, norm_io = SPEC.tokens * SPEC.vocab * SPEC.dtype_bytes, SPEC.tokens * SPEC.hidden * SPEC.dtype_bytes
    kept = -logits - norm_io if recompute == "none" else norm_io
    assert late.memory("stash", last) == base.memory("stash", last) + kept
    for u in range(last):
        assert [late.unit_time(u, op) for op in "FBDW"] == [base.unit_time(u, op) for op in "FBDW"]
