"""The GPT-style model, the HelixPipe cut (2L+1 units) and recomputation by mode."""
import pytest
import torch

from unit_testutil import run_chain, token_batch
from torch import nn

from pipert.models import (GPTConfig, GPTModel, HelixAttentionUnit, HelixUnit, LlamaModel, build_units,
                           model_config, model_from_config, partition)
from pipert.models.recompute import save_policy, selective_checkpoint

MODELS = ["tiny", "gpt-tiny"]
MODES = ["none", "no_attention", "full"]


def _cfg(name, **kw):
    return model_config(name, dtype="float64", max_seq=16, **kw)


_batch, _chain = token_batch, run_chain


def _loss_and_grads(model, units, tok, tgt):
    loss = _chain(units, tok, tgt) if units else model(tok, tgt)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def _assert_same(a, b, tol=1e-10):
    (la, ga), (lb, gb) = a, b
    assert abs(la.item() - lb.item()) <= tol * abs(lb.item())
    assert ga.keys() == gb.keys()
    for n in gb:
        scale = max(gb[n].abs().max().item(), 1e-300)
        assert (ga[n] - gb[n]).abs().max().item() <= tol * scale, n


# ---------------------------------------------------------------- GPT model
def test_gpt_config_and_presets():
    cfg = GPTConfig.preset("gpt-tiny", layers=2)
    assert (cfg.layers, cfg.kv_heads, cfg.head_dim) == (2, cfg.heads, 16)
    assert GPTConfig.preset("gpt-7b").hidden == 4096
    with pytest.raises(ValueError, match="unknown GPTConfig preset 'gpt-huge'"):
        GPTConfig.preset("gpt-huge")
    with pytest.raises(ValueError, match="heads=5 must divide hidden=64"):
        GPTConfig(heads=5)
    with pytest.raises(ValueError, match="mlp_recompute applies to the chunked MLP"):
        GPTConfig(mlp_recompute=True)
    with pytest.raises(ValueError, match="unknown model 'nope'; allowed: tiny, .*gpt-tiny"):
        model_config("nope")


def test_gpt_model_names_init_and_causality():
    model = GPTModel(_cfg("gpt-tiny"), seed=0)
    names = dict(model.named_parameters())
    for n in ("embed.weight", "pos.weight", "layers.0.attn_norm.bias", "layers.0.attn.wq.bias",
              "layers.0.mlp.fc.weight", "layers.0.mlp.proj.bias", "norm.bias", "head.weight"):
        assert n in names, n
    assert torch.all(names["layers.1.attn.wo.bias"] == 0) and torch.all(names["norm.weight"] == 1)
    tok, tgt = _batch()
    loss = model(tok, tgt)
    assert abs(loss.item() - torch.log(torch.tensor(256.0)).item()) < 0.25  # near uniform at init
    tok2 = tok.clone()
    tok2[:, 5:] = (tok2[:, 5:] + 1) % 256
    assert torch.allclose(model(tok)[:, :5], model(tok2)[:, :5], atol=1e-12)
    assert not torch.allclose(model(tok)[:, 5:], model(tok2)[:, 5:])
    with pytest.raises(ValueError, match="sequence length 20 exceeds max_seq=16"):
        model(torch.zeros(1, 20, dtype=torch.long))


# ---------------------------------------------------------------- helix cut
@pytest.mark.parametrize("name", MODELS)
def test_helix_contract(name):
    model = model_from_config(_cfg(name, layers=3), seed=0)
    units = partition(model, cut="helix")
    assert [type(u) for u in units] == [HelixUnit, HelixAttentionUnit] * 3 + [HelixUnit]
    assert [u.kind for u in units[:2]] == ["helix_param", "helix_attn"]
    names = [set(dict(u.named_parameters())) for u in units]
    assert sum(map(len, names)) == len(list(model.parameters()))
    assert {n for n in names[1] if n.endswith("weight")} == {f"layers.0.attn.{w}.weight" for w in ("wq", "wk", "wv")}
    assert "layers.0.attn_norm.weight" in names[0] and "embed.weight" in names[0]
    assert {"layers.0.attn.wo.weight", "layers.0.mlp_norm.weight", "layers.1.attn_norm.weight"} <= names[2]
    assert "head.weight" in names[6] and "layers.2.attn.wo.weight" in names[6]
    tok, tgt = _batch()
    x, h = units[0](tok)
    assert x.shape == h.shape == (2, 8, 64)
    x2, o = units[1]((x, h))
    assert x2 is x and o.shape == (2, 8, 64)
    assert [t.shape for t in units[2]((x, o))] == [(2, 8, 64)] * 2
    assert partition(model, 7, cut="helix")[3].layer_index == 1


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", MODELS)
def test_helix_units_compose_to_the_model(name, mode):
    """Loss and every parameter gradient of the chained helix units equal the whole model's."""
    tok, tgt = _batch()
    ref = _loss_and_grads(model_from_config(_cfg(name), seed=0), None, tok, tgt)
    model = model_from_config(_cfg(name), seed=0)
    _assert_same(_loss_and_grads(model, partition(model, cut="helix", recompute=mode), tok, tgt), ref)


@pytest.mark.parametrize("cut, n", [("layers", 2), ("fine", None)])
def test_recompute_applies_to_every_cut(cut, n):
    tok, tgt = _batch()
    ref = _loss_and_grads(model_from_config(_cfg("gpt-tiny"), seed=0), None, tok, tgt)
    model = model_from_config(_cfg("gpt-tiny"), seed=0)
    _assert_same(_loss_and_grads(model, partition(model, n, cut=cut, recompute="no_attention"), tok, tgt), ref)


def test_build_units_helix_materialises_the_same_values():
    full = partition(model_from_config(_cfg("gpt-tiny"), seed=3), cut="helix")
    units = build_units(_cfg("gpt-tiny"), seed=3, cut="helix", keep=[1, 4])
    assert len(units) == 9
    for u in (1, 4):
        for (n, p), q in zip(units[u].named_parameters(), full[u].parameters()):
            assert torch.equal(p, q), n
    assert all(p.is_meta for p in units[0].parameters())


def test_partition_errors():
    model = LlamaModel(_cfg("tiny"), seed=0)
    with pytest.raises(ValueError, match=r"helix partition of a 4-layer model has 9 units \(2 per layer \+ 1\)"):
        partition(model, 8, cut="helix")
    with pytest.raises(ValueError, match="cut='diagonal'; allowed: layers, fine, helix"):
        partition(model, 2, cut="diagonal")
    with pytest.raises(ValueError, match="recompute='most'; allowed: none, no_attention, full"):
        partition(model, 2, recompute="most")
    with pytest.raises(ValueError, match="fine=True and cut='helix' disagree"):
        partition(model, fine=True, cut="helix")
    with pytest.raises(ValueError, match="apply to the built-in models"):
        partition([nn.Linear(2, 2)], 1, loss_fn=lambda y, t: y.sum(), recompute="full")
    with pytest.raises(ValueError, match="unknown op group"):
        save_policy(frozenset({"softmax"}))


def test_selective_checkpoint_keeps_named_ops_and_recomputes_the_rest():
    """With {"projection"} saved, backward runs no matmul again; with nothing saved it does."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        mm = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.mm += func._schema.name == "aten::mm"
            return func(*args, **(kwargs or {}))

    w = torch.randn(4, 4, dtype=torch.float64, requires_grad=True)
    x = torch.randn(3, 4, dtype=torch.float64)

    def f(x, w):
        return torch.tanh(x @ w).sum()

    for save, forward_mm_again in ((set(), 1), ({"projection"}, 0)):
        y = selective_checkpoint(f, x, w, save=save)
        Count.mm = 0
        with Count():
            y.backward()
        # backward itself: one mm for dW (x is data); the recomputed forward adds one unless saved
        assert Count.mm == 1 + forward_mm_again, save


def test_unit_count_of_a_schedule_is_checked_per_cut():
    from pipert.models.partition import check_unit_count
    check_unit_count("s", 9, "tiny", 4, "helix")
    check_unit_count("s", 3, "tiny", 4, None)
    with pytest.raises(ValueError, match="schedule s needs 8 units but a helix cut of model 'tiny' \\(4 layers\\) gives 9"):
        check_unit_count("s", 8, "tiny", 4, "helix")
    with pytest.raises(ValueError, match="schedule s needs 5 units but model 'tiny' has only 4 layers"):
        check_unit_count("s", 5, "tiny", 4, "layers")
