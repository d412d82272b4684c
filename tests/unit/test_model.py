"""The LLaMA-style model, its partition into units, and the built-in byte corpus."""
import math

import pytest
import torch

from unit_testutil import run_chain, token_batch
from torch import nn

from pipert.data import ByteCorpus
from pipert.models import (PRESETS, AttentionUnit, LlamaConfig, LlamaModel, PostAttentionUnit,
                           PreAttentionUnit, SwiGLU, build_model, model_config, partition)
from pipert.models.llama import Rotary, attention_core

CFG = LlamaConfig.preset("tiny", dtype="float64", max_seq=16)


_batch, _chain = token_batch, run_chain


# ---------------------------------------------------------------- config
def test_presets_are_valid_and_overridable():
    for name, cfg in PRESETS.items():
        assert cfg.hidden % cfg.heads == 0 and cfg.heads % cfg.kv_heads == 0, name
    cfg = LlamaConfig.preset("small", layers=2, dtype="float64")
    assert (cfg.hidden, cfg.layers, cfg.torch_dtype) == (256, 2, torch.float64)
    assert PRESETS["small"].layers == 8  # presets are not mutated


@pytest.mark.parametrize("kw, msg", [
    (dict(hidden=64, heads=5), "heads=5 must divide hidden=64"),
    (dict(heads=4, kv_heads=3), "kv_heads=3 must divide heads=4"),
    (dict(dtype="int8"), "dtype"),
    (dict(layers=0), "layers must be >= 1"),
])
def test_config_validation_names_the_problem(kw, msg):
    with pytest.raises(ValueError, match=msg):
        LlamaConfig(**kw)


def test_preset_errors():
    with pytest.raises(ValueError, match="unknown LlamaConfig preset 'huge'"):
        LlamaConfig.preset("huge")
    with pytest.raises(ValueError, match="unknown LlamaConfig field"):
        LlamaConfig.preset("tiny", width=3)


# ---------------------------------------------------------------- model
def test_init_is_a_function_of_the_seed():
    a, b, c = LlamaModel(CFG, seed=1), LlamaModel(CFG, seed=1), LlamaModel(CFG, seed=2)
    for (n, p), q, r in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(p, q), n
        if not n.endswith("norm.weight"):
            assert not torch.equal(p, r), n
    f32 = LlamaModel(LlamaConfig.preset("tiny", max_seq=16), seed=1)
    for p, q in zip(a.parameters(), f32.parameters()):
        assert q.dtype == torch.float32 and torch.allclose(p, q.double(), atol=1e-7)


def test_loss_at_init_is_near_uniform_and_logits_shape():
    model = LlamaModel(CFG, seed=0)
    tok, tgt = _batch()
    assert model(tok).shape == (2, 8, 256)
    assert abs(model(tok, tgt).item() - math.log(256)) < 0.1


def test_causal_prefix_is_unaffected_by_later_tokens():
    model = LlamaModel(CFG, seed=0)
    tok, _ = _batch(1, 10)
    tok2 = tok.clone()
    tok2[0, 6] = (tok[0, 6] + 1) % 256
    a, b = model(tok), model(tok2)
    assert torch.allclose(a[:, :6], b[:, :6], atol=1e-12)
    assert not torch.allclose(a[:, 6], b[:, 6])


def test_grouped_query_attention_matches_explicit_softmax():
    g = torch.Generator().manual_seed(0)
    b, s, h, hkv, d = 2, 5, 4, 2, 8
    q = torch.randn(b, s, h, d, generator=g, dtype=torch.float64)
    k = torch.randn(b, s, hkv, d, generator=g, dtype=torch.float64)
    v = torch.randn(b, s, hkv, d, generator=g, dtype=torch.float64)
    out = attention_core(q, k, v)
    kk, vv = k.repeat_interleave(h // hkv, dim=2), v.repeat_interleave(h // hkv, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, kk) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(s, s).triu(1).bool(), float("-inf"))
    ref = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), vv).reshape(b, s, h * d)
    assert torch.allclose(out, ref, atol=1e-12)


def test_rotary_scores_depend_on_relative_position_only():
    rope = Rotary(8, 16, 10000.0, torch.float64)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 1, 8, generator=g, dtype=torch.float64).expand(1, 16, 1, 8)
    k = torch.randn(1, 1, 1, 8, generator=g, dtype=torch.float64).expand(1, 16, 1, 8)
    rq, rk = rope(q)[0, :, 0], rope(k)[0, :, 0]
    assert torch.allclose(rq[5] @ rk[2], rq[12] @ rk[9], atol=1e-12)
    assert not torch.allclose(rq[5] @ rk[2], rq[5] @ rk[4])
    with pytest.raises(ValueError, match="exceeds max_seq=16"):
        rope(torch.zeros(1, 17, 1, 8, dtype=torch.float64))


def test_rotary_tables_keep_precision_under_dtype_casts():
    fresh = Rotary(16, 16, 10000.0, torch.float32)
    model = LlamaModel(LlamaConfig.preset("tiny", max_seq=16), seed=0).to(torch.bfloat16)
    rope = model.layers[0].attn.rope
    assert model.embed.weight.dtype == torch.bfloat16 and rope.cos.dtype == torch.float32
    assert torch.equal(rope.cos, fresh.cos) and torch.equal(rope.sin, fresh.sin)
    assert model.double().layers[0].attn.rope.cos.dtype == torch.float64


def test_build_model_by_name():
    model = build_model("tiny", seed=3, layers=2)
    assert len(model.layers) == 2 and model_config("tiny").layers == 4
    ref = LlamaModel(LlamaConfig.preset("tiny", layers=2), seed=3)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), ref.parameters()))


def test_tied_embeddings_and_untie():
    tied = LlamaModel(LlamaConfig.preset("tiny", dtype="float64", tie_embeddings=True), seed=0)
    untied = LlamaModel(CFG, seed=0)
    n_tied, n_untied = (sum(p.numel() for p in m.parameters()) for m in (tied, untied))
    assert tied.head is None and n_untied - n_tied == 256 * 64
    tok, tgt = _batch()
    before = tied(tok, tgt)
    tied.untie()
    assert tied.head is not None and tied.head.weight is not tied.embed.weight
    assert torch.allclose(tied(tok, tgt), before, atol=1e-12)


def test_mlp_factory_replaces_the_mlp():
    class ZeroMLP(SwiGLU):
        def forward(self, x):
            return torch.zeros_like(x)

    model = LlamaModel(CFG, seed=0, mlp_factory=ZeroMLP)
    assert all(isinstance(l.mlp, ZeroMLP) for l in model.layers)
    assert "layers.0.mlp.w1.weight" in dict(model.named_parameters())
    tok, tgt = _batch()
    assert (model(tok) - LlamaModel(CFG, seed=0)(tok)).abs().max() > 1e-6


# ---------------------------------------------------------------- partition
def _ids(units):
    return [{id(p) for p in u.parameters()} for u in units]


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_coarse_partition_matches_model(n):
    model = LlamaModel(CFG, seed=0)
    units = partition(model, n)
    tok, tgt = _batch()
    assert torch.allclose(_chain(units, tok, tgt), model(tok, tgt), atol=1e-12)
    ids = _ids(units)
    assert sum(map(len, ids)) == len(set().union(*ids)) == len(list(model.parameters()))
    sizes = [len(u.layers) for u in units]
    assert sizes == [4 // n + (i < 4 % n) for i in range(n)]
    assert units[0].embed is model.embed and all(u.embed is None for u in units[1:])
    assert units[-1].head is model.head and all(u.head is None for u in units[:-1])
    # names inside a unit are the model's names
    assert set().union(*(dict(u.named_parameters()) for u in units)) == set(dict(model.named_parameters()))


def test_coarse_partition_errors():
    model = LlamaModel(CFG, seed=0)
    with pytest.raises(ValueError, match=r"more units \(5\) than layers \(4\)"):
        partition(model, 5)
    with pytest.raises(ValueError, match="fine partition of a 4-layer model has 12 units"):
        partition(model, 8, fine=True)
    tied = LlamaModel(LlamaConfig.preset("tiny", tie_embeddings=True), seed=0)
    with pytest.raises(ValueError, match="tied embeddings"):
        partition(tied, 2)
    assert len(partition(tied, 1)) == 1


def test_fine_partition_contract():
    model = LlamaModel(CFG, seed=0)
    units = partition(model, 12, fine=True)
    kinds = [type(u) for u in units]
    assert kinds == [PreAttentionUnit, AttentionUnit, PostAttentionUnit] * 4
    assert all(not list(u.parameters()) for u in units[1::3])
    assert [u.kind for u in units[:3]] == ["pre_attn", "attn", "post_attn"]
    tok, tgt = _batch()
    assert torch.allclose(_chain(units, tok, tgt), model(tok, tgt), atol=1e-12)
    x, q, k, v = units[0](tok)
    assert x.shape == (2, 8, 64) and q.shape == (2, 8, 4, 16) and k.shape == v.shape == (2, 8, 2, 16)
    x2, o = units[1]((x, q, k, v))
    assert x2 is x and o.shape == (2, 8, 64)
    assert units[2]((x, o)).shape == (2, 8, 64)
    ids = _ids(units)
    assert sum(map(len, ids)) == len(list(model.parameters()))
    assert "layers.0.attn.wq.weight" in dict(units[0].named_parameters())
    assert "layers.3.attn.wo.weight" in dict(units[11].named_parameters())


def _mlp_layers(widths):
    return [nn.Linear(a, b, dtype=torch.float64) for a, b in zip(widths, widths[1:])]


def test_user_sequential_partition():
    torch.manual_seed(0)
    mods = nn.Sequential(*_mlp_layers([4, 8, 8, 8, 3]))
    loss_fn = nn.CrossEntropyLoss()
    units = partition(mods, 3, loss_fn=loss_fn)
    assert [len(u.order) for u in units] == [2, 1, 1]
    assert list(dict(units[1].named_parameters())) == ["2.weight", "2.bias"]
    x, y = torch.randn(5, 4, dtype=torch.float64), torch.randint(0, 3, (5,))
    assert torch.allclose(_chain(units, x, y), loss_fn(mods(x), y))
    with pytest.raises(ValueError, match="needs loss_fn"):
        partition(mods, 2)
    with pytest.raises(ValueError, match=r"more units \(5\) than modules \(4\)"):
        partition(mods, 5, loss_fn=loss_fn)
    shared = nn.Linear(3, 3)
    with pytest.raises(ValueError, match="shared by units 0 and 1"):
        partition([shared, shared], 2, loss_fn=loss_fn)


def test_param_balanced_partition_minimises_the_largest_unit():
    mods = _mlp_layers([64, 64, 2, 2, 2, 2, 2, 2])  # one big module, six small ones
    by_count = partition(mods, 2, loss_fn=nn.MSELoss())
    by_params = partition(mods, 2, loss_fn=nn.MSELoss(), balance="params")
    assert [len(u.order) for u in by_count] == [4, 3]
    assert [len(u.order) for u in by_params] == [1, 6]
    with pytest.raises(ValueError, match="balance='flops'"):
        partition(mods, 2, loss_fn=nn.MSELoss(), balance="flops")


# ---------------------------------------------------------------- data
def test_byte_corpus_batches():
    c = ByteCorpus(32, seed=3, batch_size=4)
    tok, tgt = c.batch(0)
    assert tok.shape == tgt.shape == (4, 32) and tok.dtype == torch.int64
    assert torch.equal(tok[:, 1:], tgt[:, :-1])
    assert 0 <= int(tok.min()) and int(tok.max()) < c.vocab_size == 256
    again = ByteCorpus(32, seed=3, batch_size=4)
    _ = again.batch(7)  # order of requests does not matter
    assert torch.equal(again.batch(0)[0], tok)
    assert not torch.equal(ByteCorpus(32, seed=4, batch_size=4).batch(0)[0], tok)
    assert not torch.equal(c.batch(1)[0], tok)
    first = next(iter(c))
    assert torch.equal(first[0], tok)
    listed = list(c.batches(2, steps=3, start=1))
    assert len(listed) == 3 and listed[0][0].shape == (2, 32)
    assert torch.equal(listed[0][0], c.batch(1, 2)[0]) and torch.equal(listed[2][1], c.batch(3, 2)[1])
    assert b"def " in bytes(c.data[:200000].tolist())


def test_byte_corpus_splits_and_errors():
    train, val = ByteCorpus(16), ByteCorpus(16, split="val")
    assert len(train) > 10 * len(val) > 0 and train.digest == val.digest
    with pytest.raises(ValueError, match="split='test'"):
        ByteCorpus(16, split="test")
