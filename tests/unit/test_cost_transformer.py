"""The analytic LLaMA-style cost model: parameter counts, FLOPs, times, bytes, partitions."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st

from pipert.cost.base import CostModel
from pipert.cost.devices import DEVICE_PRESETS, DeviceSpec
from pipert.cost.transformer import (MODEL_PRESETS, ModelSpec, TransformerCost, UnitSpec, paper_model,
                                     partition_fine, partition_layers, swiglu_ffn)
from pipert.ir.action import Action, Op, Payload, parse_action
from pipert.ir.semantics import action_time

A100 = DeviceSpec.preset("a100")


def cost(model: ModelSpec, units=None, **kw) -> TransformerCost:
    return TransformerCost(model, A100, units, **kw)


# --- parameter counts ---------------------------------------------------------------------

@pytest.mark.parametrize("name,expected,tol", [("7b", 6.74e9, 0.02), ("13b", 13.0e9, 0.03),
                                               ("70b", 69.0e9, 0.03), ("1b", 1.10e9, 0.03)])
def test_preset_param_counts(name, expected, tol):
    assert abs(ModelSpec.preset(name).num_params - expected) / expected < tol


def test_unit_params_sum_to_model_params():
    m = ModelSpec.preset("7b")
    c = cost(m, partition_layers(m, 4))
    assert sum(c.params(u) for u in range(4)) == m.num_params
    tied = ModelSpec.preset("7b", tied_embedding=True)
    ct = cost(tied, partition_layers(tied, 4))
    # each end unit holds its own copy of the tied matrix
    assert sum(ct.params(u) for u in range(4)) == tied.num_params + tied.vocab * tied.hidden


def test_preset_overrides_and_paper_shapes():
    m = ModelSpec.preset("7b", seq=8192, micro_batch=2)
    assert (m.seq, m.micro_batch, m.hidden) == (8192, 2, 4096)
    assert MODEL_PRESETS["7b"].seq == 4096          # presets are not mutated
    assert swiglu_ffn(4096) == 10944 and swiglu_ffn(4096, 256) == 11008
    for paper, layers in (("weipipe", 32), ("tawpipe", 48)):
        for h in (1024, 2048, 4096):
            for s in (4096, 8192, 16384):
                pm = paper_model(paper, h, seq=s)
                assert (pm.layers, pm.heads, pm.vocab, pm.ffn % 32) == (layers, 32, 32000, 0)
                assert pm.micro_batch * pm.seq == 65536
    # TawPipe's "668M to 10B" counts 12*L*H^2 + 2*V*H; SwiGLU at 8H/3 lands within 5%
    assert abs(paper_model("tawpipe", 1024, tied_embedding=False).num_params - 668e6) / 668e6 < 0.05


# --- FLOPs and times ------------------------------------------------------------------------

def test_total_forward_flops_match_independent_formula():
    m = ModelSpec.preset("7b")
    c = cost(m, partition_layers(m, 5))
    matmul_params = m.num_params - m.vocab * m.hidden - (2 * m.layers + 1) * m.hidden   # no embed, no norms
    attn = m.layers * 4 * m.micro_batch * m.seq ** 2 * m.hidden / 2                     # causal flash
    assert sum(c.flops(u, "F") for u in range(5)) == pytest.approx(2 * m.tokens * matmul_params + attn, rel=1e-12)


@pytest.mark.parametrize("units_fn", [lambda m: partition_layers(m, 3), partition_fine])
@pytest.mark.parametrize("flash", [True, False])
def test_backward_relations(units_fn, flash):
    m = ModelSpec.preset("tiny", flash=flash, seq=512)
    c = cost(m, units_fn(m))
    for u in range(c.num_units):
        f, b, d, w = (c.unit_time(u, op) for op in "FBDW")
        assert b == pytest.approx(d + w, rel=1e-12)
        assert c.unit_time(u, "RECOMPUTE") == f
        assert c.flops(u, "B") == pytest.approx(c.flops(u, "D") + c.flops(u, "W"), rel=1e-12)
        if c.units[u].kind == "attn":
            assert w == 0 and c.flops(u, "B") == pytest.approx((2.5 if flash else 2.0) * c.flops(u, "F"))
        else:
            assert 2 * c.flops(u, "F") <= c.flops(u, "B") <= 2.5 * c.flops(u, "F")
            assert 1.8 * f <= b <= 2.6 * f


def test_without_attention_backward_is_exactly_twice_forward():
    m = ModelSpec.preset("7b", flash=False)
    c = cost(m, partition_layers(m, 4), elementwise=False)
    for u in range(4):
        assert c.unit_time(u, "B") == pytest.approx(2 * c.unit_time(u, "F"), rel=1e-12)
        # D does the attention backward on top of F's FLOPs, W lacks attention: both differ by it
        assert c.flops(u, "D") - c.flops(u, "F") == pytest.approx(c.flops(u, "F") - c.flops(u, "W"), rel=1e-12)


def test_attention_quadratic_matmul_linear_in_seq():
    def fine(seq):
        m = ModelSpec.preset("7b", seq=seq, layers=1)
        return cost(m, partition_fine(m), elementwise=False)
    c1, c2 = fine(2048), fine(4096)
    pre, attn, post = 0, 1, 2                                # (head on post, embed on pre)
    assert c2.unit_time(attn, "F") == pytest.approx(4 * c1.unit_time(attn, "F"), rel=1e-12)
    for u in (pre, post):
        for op in "FDW":
            assert c2.flops(u, op) == pytest.approx(2 * c1.flops(u, op), rel=1e-12)
    # causal halves attention only with flash
    assert cost(ModelSpec.preset("7b", causal=False)).flops(0, "F") > cost(ModelSpec.preset("7b")).flops(0, "F")
    nf = ModelSpec.preset("7b", flash=False)
    assert cost(nf).flops(0, "F") == cost(ModelSpec.preset("7b", flash=False, causal=False)).flops(0, "F")


def test_device_and_efficiency_scale_time():
    m = ModelSpec.preset("7b")
    slow = TransformerCost(m, DeviceSpec.preset("a100", efficiency=0.3), elementwise=False)
    fast = TransformerCost(m, DeviceSpec.preset("a100", efficiency=0.6), elementwise=False)
    assert slow.unit_time(3, "F") == pytest.approx(2 * fast.unit_time(3, "F"))
    h100, a100 = TransformerCost(m, DeviceSpec.preset("h100")), TransformerCost(m, A100)
    assert h100.unit_time(3, "F") < a100.unit_time(3, "F")
    ew = a100.elementwise_bytes(3, "F") / A100.mem_bandwidth
    assert ew > 0 and a100.unit_time(3, "F") == pytest.approx(fast.unit_time(3, "F") + ew)
    # a 7B layer at 4096 tokens on an A100 at 60% takes ~10 ms forward
    assert 0.005 < fast.unit_time(3, "F") < 0.02


def test_compute_time_actions():
    m = ModelSpec.preset("tiny")
    het = {1: DeviceSpec.preset("a100", efficiency=0.3)}
    c = TransformerCost(m, A100, partition_layers(m, 2), rank_devices=het)
    one = c.unit_time(1, "F")
    assert c.compute_time(parse_action("F u1 m0"), 0) == one
    assert action_time(c.compute_time, parse_action("F u1 m0,1,2"), 0) == pytest.approx(3 * one)
    assert action_time(c.compute_time, parse_action("F u1 m0 s1/4"), 0) == pytest.approx(one / 4)
    assert c.compute_time(parse_action("F u1 m0"), 1) > one
    assert c.compute_time(parse_action("OPT u0"), 0) == pytest.approx(c.params(0) * 30.0 / A100.mem_bandwidth)
    assert c.compute_time(parse_action("SEND act u0 m0 ->1"), 0) == 0.0
    assert c.compute_time(parse_action("FREE weight u0"), 0) == 0.0
    with pytest.raises(ValueError, match="OPT needs a unit"):
        c.compute_time(Action(Op.OPT), 0)
    with pytest.raises(ValueError, match="allowed 0..1"):
        c.compute_time(parse_action("F u2 m0"), 0)
    assert isinstance(c, CostModel)


# --- bytes ---------------------------------------------------------------------------------

def test_message_bytes_exact():
    m = ModelSpec.preset("7b", micro_batch=3, seq=1000)
    c = cost(m, partition_layers(m, 4))
    for u in range(4):
        for n in (1, 2, 5):
            assert c.message_bytes(Payload.ACT, u, n) == 3 * 1000 * 4096 * 2 * n
            assert c.message_bytes("grad", u, n) == 3 * 1000 * 4096 * 2 * n
        assert c.message_bytes(Payload.WEIGHT, u) == c.params(u) * 2 == c.memory("wgrad", u)
        assert c.memory("act", u) == c.message_bytes("act", u)
    g = ModelSpec.preset("70b", seq=100)                      # GQA: kv = 8 * 128
    cf = cost(g, partition_fine(g))
    T, h, kv = 100, 8192, 1024
    assert [cf.message_bytes("act", u) for u in range(3)] == [(T * h + T * (h + 2 * kv)) * 2, 2 * T * h * 2, T * h * 2]
    with pytest.raises(ValueError, match="num_mbs"):
        c.message_bytes("act", 0, 0)


def test_korthikanti_gpt_layer_stash():
    # GPT layer: ffn 4h, MHA, dropout, 2-byte activations
    s, b, h, a = 2048, 2, 1024, 16
    gpt = ModelSpec(layers=1, hidden=h, ffn=4 * h, heads=a, kv_heads=a, vocab=1000, seq=s, micro_batch=b,
                    gated_mlp=False, dropout=True, flash=False)
    layer = [UnitSpec("layers", (0,))]
    c = cost(gpt, layer)
    assert c.memory("stash", 0) == s * b * h * (34 + 5 * a * s / h)
    assert c.memory("stash_w", 0) == 32 * s * b * h                                    # Zero Bubble's M_W
    cfl = cost(ModelSpec(**{**gpt.__dict__, "flash": True}), layer)
    assert cfl.memory("stash", 0) == 34 * s * b * h + 4 * a * s * b                   # + fp32 lse
    # fine units sum to the layer (flash: the saved attention output is counted on both sides)
    fine = [UnitSpec(p, (0,)) for p in ("pre_attn", "attn", "post_attn")]
    assert sum(cost(gpt, fine).memory("stash", u) for u in range(3)) == c.memory("stash", 0)
    cff = cost(cfl.model, fine)
    assert sum(cff.memory("stash", u) for u in range(3)) == cfl.memory("stash", 0) + s * b * h * 2


@pytest.mark.parametrize("kind", ["stash", "stash_w", "act", "grad"])
@pytest.mark.parametrize("flash", [True, False])
def test_memory_monotonic_in_seq_and_micro_batch(kind, flash):
    def mem(seq, mb):
        m = ModelSpec.preset("tiny", seq=seq, micro_batch=mb, flash=flash)
        c = cost(m, partition_fine(m))
        return [c.memory(kind, u) for u in range(c.num_units)]
    for seq, mb in ((64, 1), (128, 1), (128, 2), (256, 2), (256, 4)):
        lo, hi_s, hi_b = mem(seq, mb), mem(2 * seq, mb), mem(seq, 2 * mb)
        for u, x in enumerate(lo):
            if kind == "stash_w" and u % 3 == 1:
                assert x == hi_s[u] == hi_b[u] == 0           # attention core has no weights
            else:
                assert 0 < x < hi_s[u] and x < hi_b[u]


def test_summary_rows():
    m = ModelSpec.preset("1b")
    c = TransformerCost(m, DeviceSpec.preset("h100"), partition_layers(m, 4))
    s = c.summary()
    assert len(s["units"]) == 4 and s["units"][0]["embed"] and s["units"][-1]["head"]
    assert s["totals"]["params"] == m.num_params and s["model"]["num_params"] == m.num_params
    for row in s["units"]:
        assert row["B"] == pytest.approx(row["D"] + row["W"]) and row["F"] > 0 and row["stash_bytes"] > 0


# --- partitions ----------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(layers=st.integers(1, 40), data=st.data())
def test_partition_layers_covers_each_layer_once(layers, data):
    n = data.draw(st.integers(1, layers))
    m = ModelSpec.preset("tiny", layers=layers)
    units = partition_layers(m, n)
    assert len(units) == n
    assert [l for u in units for l in u.layers] == list(range(layers))
    sizes = [len(u.layers) for u in units]
    assert max(sizes) - min(sizes) <= 1
    assert [u.embed for u in units] == [True] + [False] * (n - 1)
    assert [u.head for u in units] == [False] * (n - 1) + [True]
    assert sizes == sorted(sizes, reverse=True)      # spare layers on the first units (as models.partition)
    if n > 1 and layers % n:
        assert sizes[-1] == min(sizes) < sizes[0]    # the head unit never gets a spare layer
    TransformerCost(m, A100, units)                  # the chain check accepts it


def test_partition_layers_explicit_sizes_and_runtime_models():
    m = ModelSpec.preset("tiny", layers=7)
    assert [u.layers for u in partition_layers(m, 3, sizes=[1, 4, 2])] == [(0,), (1, 2, 3, 4), (5, 6)]
    assert [len(u.layers) for u in partition_layers(m, 3)] == [3, 2, 2]
    # duck-typed pipert.models.llama.LlamaConfig (not imported: keeps torch out of this test)
    cfg = SimpleNamespace(hidden=64, layers=4, heads=4, kv_heads=2, ffn=176, vocab=256, dtype="float32",
                          tie_embeddings=False)
    spec = ModelSpec.from_config(cfg, seq=32, micro_batch=2)
    assert (spec.hidden, spec.kv_heads, spec.ffn, spec.dtype_bytes, spec.tokens) == (64, 2, 176, 4, 64)
    # fine-unit messages are the runtime's tuples: (x, q, k, v) and (x, o)
    c = cost(spec, partition_fine(spec))
    assert c.message_bytes("act", 0) == 64 * (64 + 64 + 2 * 32) * 4 and c.message_bytes("act", 1) == 64 * 128 * 4


def test_partition_fine():
    m = ModelSpec.preset("tiny", layers=3)
    units = partition_fine(m)
    assert [(u.kind, u.layers) for u in units] == [(p, (l,)) for l in range(3) for p in ("pre_attn", "attn", "post_attn")]
    assert [i for i, u in enumerate(units) if u.embed] == [0] and [i for i, u in enumerate(units) if u.head] == [8]
    c = cost(m, units)
    assert sum(c.params(u) for u in range(9)) == m.num_params
    assert c.params(1) == 0 and c.unit_time(1, "W") == 0


# --- bad inputs ----------------------------------------------------------------------------

@pytest.mark.parametrize("override,pattern", [
    (dict(heads=5), r"heads=5 must divide hidden=256; allowed: 1, 2, 4, 8, 16, 32, 64, 128, 256"),
    (dict(kv_heads=3), r"kv_heads=3 must divide heads=4; allowed: 1, 2, 4"),
    (dict(seq=0), r"ModelSpec.seq=0: must be a positive integer"),
    (dict(layers=-1), r"ModelSpec.layers=-1"),
    (dict(micro_batch=1.5), r"ModelSpec.micro_batch=1.5"),
    (dict(dtype_bytes=3), r"dtype_bytes=3: allowed 1, 2, 4, 8"),
    (dict(hiden=3), r"unknown ModelSpec field\(s\) hiden; allowed: .*hidden"),
])
def test_bad_model_specs(override, pattern):
    with pytest.raises(ValueError, match=pattern):
        ModelSpec.preset("tiny", **override)


def test_bad_names_and_units():
    with pytest.raises(ValueError, match="unknown model preset '8b'; allowed: tiny, 1b, 7b, 13b, 70b"):
        ModelSpec.preset("8b")
    with pytest.raises(ValueError, match="unknown device preset 'tpu'; allowed: .*a100.*h100"):
        DeviceSpec.preset("tpu")
    with pytest.raises(ValueError, match="efficiency"):
        DeviceSpec.preset("a100", efficiency=1.5)
    with pytest.raises(ValueError, match="unknown paper 'gpipe'; allowed: weipipe, tawpipe"):
        paper_model("gpipe", 1024)
    with pytest.raises(ValueError, match="UnitSpec.kind=.mlp.; allowed: layers, pre_attn, attn, post_attn, helix_c, helix_a"):
        UnitSpec("mlp", (0,))
    with pytest.raises(ValueError, match="exactly one layer"):
        UnitSpec("attn", (0, 1))
    m = ModelSpec.preset("tiny")                                         # 4 layers
    with pytest.raises(ValueError, match=r"num_units=5: allowed 1..4"):
        partition_layers(m, 5)
    with pytest.raises(ValueError, match=r"sizes=\[3, 0, 1\]: allowed 3 positive layer counts summing to layers=4"):
        partition_layers(m, 3, sizes=[3, 0, 1])
    with pytest.raises(ValueError, match="chain needs"):                  # layer 1 skipped
        cost(m, [UnitSpec("layers", (0, 2, 3), embed=True, head=True)])
    with pytest.raises(ValueError, match="missing"):                      # layer 3 missing
        cost(m, [UnitSpec("layers", (0, 1, 2), embed=True)])
    with pytest.raises(ValueError, match="memory kind 'x'; allowed: stash"):
        cost(m).memory("x", 0)
    assert set(DEVICE_PRESETS) >= {"a100", "a800", "h100", "h200", "v100", "a10", "gh200"}
