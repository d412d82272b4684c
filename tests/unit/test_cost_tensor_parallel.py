"""Tensor and sequence parallelism in the analytic model, against Korthikanti et al. 2022
("Reducing Activation Recomputation in Large Transformer Models"): collectives per layer (section
4.2.2), ring costs, per-device compute and parameters, activation memory (Table 2)."""
from __future__ import annotations

import pytest

from pipert.cost.devices import DeviceSpec
from pipert.cost.topology import LinkSpec
from pipert.cost.transformer import ModelSpec, TransformerCost, partition_helix, partition_layers

A100 = DeviceSpec.preset("a100")
BW = 100e9
LINK = LinkSpec(0.0, BW)


def gpt(**kw) -> ModelSpec:
    """A GPT layer as Korthikanti's paper counts it: ffn = 4h, MHA, dropout, 2-byte activations."""
    base = dict(layers=4, hidden=1024, ffn=4096, heads=16, kv_heads=16, vocab=32768, seq=2048, micro_batch=2,
                gated_mlp=False, dropout=True, flash=False)
    base.update(kw)
    return ModelSpec(**base)


def cost(m: ModelSpec, tp: int = 1, sp: bool = False, link: LinkSpec = LINK, **kw) -> TransformerCost:
    return TransformerCost(m, A100, partition_layers(m, m.layers), tp=tp, sp=sp, tp_link=link, **kw)


MID = 1   # units 1 and 2 are one decoder layer each: no embedding, no head


@pytest.mark.parametrize("t", [2, 4, 8])
def test_collectives_per_layer_are_megatrons(t):
    m = gpt()
    nbytes = m.micro_batch * m.seq * m.hidden * 2                  # b*s*h elements of 2 bytes
    allreduce = 2 * (t - 1) / t * nbytes / BW                      # ring all-reduce
    gather = (t - 1) / t * nbytes / BW                             # ring all-gather = reduce-scatter
    tp_only, with_sp = cost(m, t), cost(m, t, sp=True)
    # TP only: 2 all-reduces forward, 2 backward
    assert sorted(op for op, _ in tp_only.collectives_of(tp_only.units[MID], "F")) == ["allreduce"] * 2
    assert sorted(op for op, _ in tp_only.collectives_of(tp_only.units[MID], "D")) == ["allreduce"] * 2
    assert tp_only.tp_comm_time(MID, "F") == pytest.approx(2 * allreduce, rel=1e-12)
    assert tp_only.tp_comm_time(MID, "D") == pytest.approx(2 * allreduce, rel=1e-12)
    # TP + SP: 2 all-gathers + 2 reduce-scatters forward, the same backward, each b*s*h/T per shard
    for phase in ("F", "D"):
        ops = sorted(op for op, _ in with_sp.collectives_of(with_sp.units[MID], phase))
        assert ops == ["allgather", "allgather", "reducescatter", "reducescatter"]
        assert all(b == nbytes for _, b in with_sp.collectives_of(with_sp.units[MID], phase))
        assert with_sp.tp_comm_time(MID, phase) == pytest.approx(4 * gather, rel=1e-12)
    # SP moves the same bytes as TP alone: an all-reduce is a reduce-scatter + an all-gather
    assert with_sp.tp_comm_time(MID, "F") == pytest.approx(tp_only.tp_comm_time(MID, "F"), rel=1e-12)
    for c in (tp_only, with_sp):
        assert c.tp_comm_time(MID, "RECOMPUTE") == c.tp_comm_time(MID, "F")
        assert c.tp_comm_time(MID, "B") == c.tp_comm_time(MID, "D")
        assert c.tp_comm_time(MID, "OPT") == 0
    # a split W gathers the sequence shards of its two column-parallel inputs (QKV, MLP) under SP
    assert tp_only.tp_comm_time(MID, "W") == 0
    assert with_sp.tp_comm_time(MID, "W") == pytest.approx(2 * gather, rel=1e-12)


def test_collective_latency_per_ring_step_and_no_tp_is_free():
    m, lat, t = gpt(), 3e-6, 8
    nbytes = m.micro_batch * m.seq * m.hidden * 2
    c = cost(m, t, link=LinkSpec(lat, BW))
    assert c.tp_comm_time(MID, "F") == pytest.approx(2 * (2 * (t - 1) / t * nbytes / BW + 2 * (t - 1) * lat))
    one = cost(m)
    assert all(one.tp_comm_time(u, op) == 0 for u in range(m.layers) for op in "FBDW")
    # recomputation reruns the forward, collectives included, before the backward
    rc = cost(m, t, link=LinkSpec(lat, BW), recompute="no_attention")
    assert rc.tp_comm_time(MID, "D") == pytest.approx(c.tp_comm_time(MID, "D") + c.tp_comm_time(MID, "F"))


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("t", [2, 8])
def test_compute_and_parameters_divide_by_t(t, sp):
    m = gpt()
    one, par = cost(m, elementwise=False), cost(m, t, sp=sp, elementwise=False)
    h = m.hidden
    for op in ("F", "B", "D", "W", "RECOMPUTE"):
        assert par.flops(MID, op) == pytest.approx(one.flops(MID, op) / t, rel=1e-12)
        assert par.unit_time(MID, op) == pytest.approx(one.unit_time(MID, op) / t + par.tp_comm_time(MID, op),
                                                       rel=1e-12)
    # weights of the sharded matrices divide by T; the two norms' weights are whole on every device
    assert par.params(MID) == pytest.approx((m.params_per_layer - 2 * h) / t + 2 * h, rel=1e-12)
    assert par.memory("weight", MID) == par.params(MID) * m.dtype_bytes
    # embedding and head: vocabulary-parallel
    assert par.params(0) - par.params(MID) == pytest.approx(m.vocab * h / t, rel=1e-12)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_activation_memory_is_korthikantis_table_2(t):
    m = gpt()
    s, b, h, a = m.seq, m.micro_batch, m.hidden, m.heads
    sbh = s * b * h
    assert cost(m).memory("stash", MID) == pytest.approx(sbh * (34 + 5 * a * s / h), rel=1e-12)
    assert cost(m, t).memory("stash", MID) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)), rel=1e-12)
    assert cost(m, t, sp=True).memory("stash", MID) == pytest.approx(sbh / t * (34 + 5 * a * s / h), rel=1e-12)


@pytest.mark.parametrize("t", [2, 8])
def test_boundary_messages_under_sp_are_the_local_shard(t):
    m = gpt(flash=True, dropout=False)
    th = m.tokens * m.hidden * m.dtype_bytes
    for units in (partition_layers(m, 2), partition_helix(m)):
        one = TransformerCost(m, A100, units)
        tp = TransformerCost(m, A100, units, tp=t)
        sp = TransformerCost(m, A100, units, tp=t, sp=True)
        for u in range(len(units) - 1):
            assert sp.message_bytes("act", u, 3) == pytest.approx(one.message_bytes("act", u, 3) / t, rel=1e-12)
            assert sp.message_bytes("grad", u) == pytest.approx(one.message_bytes("grad", u) / t, rel=1e-12)
            if units[u].kind == "layers":   # without SP every device sends its whole [s, b, h] copy
                assert tp.message_bytes("act", u) == one.message_bytes("act", u) == th
    # HelixPipe's A(l) -> C(l+1): the attention output is split by heads even without SP
    helix = partition_helix(m)
    assert TransformerCost(m, A100, helix, tp=t).message_bytes("act", 1) == pytest.approx(th + th / t)


def test_embedding_and_head_collectives():
    m, t = gpt(), 4
    c, s = cost(m, t), cost(m, t, sp=True)
    last = m.layers - 1
    ops = lambda cm, u, ph: [op for op, _ in cm.collectives_of(cm.units[u], ph)]   # noqa: E731
    # unit 0 = embedding + layer 0: the lookup's partial sums reduced first
    assert ops(c, 0, "F")[0] == "allreduce" and ops(s, 0, "F")[0] == "reducescatter"
    # the last unit ends in the head: cross-entropy's 3 all-reduces of b*s fp32 numbers
    assert c.collectives_of(c.units[last], "F")[-3:] == [("allreduce", m.tokens * 4.0)] * 3


@pytest.mark.parametrize("kw,t,sp,pattern", [
    ({}, 3, False, "heads=16"), (dict(kv_heads=4), 8, False, "kv_heads=4"), (dict(ffn=4098), 4, False, "ffn=4098"),
    (dict(vocab=50257), 2, False, "vocab=50257"), (dict(seq=2050), 4, True, "seq=2050")])
def test_bad_tp_sizes_name_the_size(kw, t, sp, pattern):
    with pytest.raises(ValueError, match=f"tp={t}.*{pattern}.*allowed"):
        cost(gpt(**kw), t, sp=sp)
    with pytest.raises(ValueError, match="tp=0"):
        cost(gpt(), 0)


@pytest.mark.parametrize("name,billions", [("gpt-1.3b", 1.3), ("gpt-3b", 3.0), ("gpt-7b", 7.0), ("gpt3-58b", 58.0),
                                           ("llama2-55b", 55.0)])
def test_paper_presets_shard_by_eight(name, billions):
    """HelixPipe's and PipeMesh's models: the named size (within the embedding's share) and T = 8
    with SP splits every one of them, as in the papers' runs."""
    m = ModelSpec.preset(name)
    assert abs(m.num_params / 1e9 - billions) / billions < 0.22
    TransformerCost(m, A100, tp=8, sp=True)


def test_split_w_under_sp_regathers_its_inputs_and_b_does_not():
    """The ZB1P code HelixPipe's paper runs (sail-sg@93af65c, ``execute_w_pass``) keeps each
    column-parallel linear's sequence shard and all-gathers it again in the split W, waiting for
    it; a full backward overlaps that gather with its input-gradient GEMM. So W's time grows by one
    ring all-gather per column-parallel linear (QKV, MLP input, LM head), B's and D's do not."""
    m, t = gpt(flash=True, dropout=False), 8
    gather = (t - 1) / t * m.tokens * m.hidden * m.dtype_bytes / BW
    plain, sp = cost(m, t), cost(m, t, sp=True)
    last = m.layers - 1            # the unit that ends in the LM head
    ops = [op for op, _ in sp.collectives_of(sp.units[last], "W")]
    assert ops == ["allgather"] * 3
    assert sp.tp_comm_time(last, "W") == pytest.approx(3 * gather, rel=1e-12)
    for u in (0, MID, last):
        assert sp.tp_comm_time(u, "B") == sp.tp_comm_time(u, "D")
        assert plain.tp_comm_time(u, "W") == 0
    # B = D + W in FLOPs, but B is cheaper than D + W by exactly the hidden gathers
    assert sp.unit_time(MID, "D") + sp.unit_time(MID, "W") - sp.unit_time(MID, "B") == pytest.approx(
        2 * gather, rel=1e-9)


@pytest.mark.parametrize("t", [1, 8])
def test_learned_positions_are_a_table_in_the_first_unit_split_like_the_vocabulary(t):
    """GPT's learned position embeddings (``pipert.models.gpt``'s ``pos.weight``, [seq, h]); HelixPipe's
    section 4.6 splits them over the TP group on the first stage, as the token embedding."""
    m = gpt(flash=True, dropout=False)
    with_pos = ModelSpec(**{**m.__dict__, "positions": True})
    assert with_pos.num_params - m.num_params == m.seq * m.hidden
    a, b = cost(m, t, sp=t > 1), cost(with_pos, t, sp=t > 1)
    assert b.params(0) - a.params(0) == pytest.approx(m.seq * m.hidden / t, rel=1e-12)
    assert all(b.params(u) == a.params(u) for u in range(1, m.layers))
    assert b.unit_time(0, "F") > a.unit_time(0, "F") and b.unit_time(1, "F") == a.unit_time(1, "F")
    assert b.unit_time(0, "OPT") > a.unit_time(0, "OPT")
    assert all(ModelSpec.preset(n).positions for n in ("gpt-1.3b", "gpt-3b", "gpt-7b"))
    assert not ModelSpec.preset("7b").positions
