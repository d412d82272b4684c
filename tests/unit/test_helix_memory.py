"""Saved-activation bytes of the helix units: the saved-tensor-hook meter equals the documented
formula in every recompute mode and MLP mode; the chunked MLP inside the model; helix units
under UnitRunner (B, D + W, RECOMPUTE) with recomputation."""
import pytest
import torch

from pipert.models import model_config, model_from_config, partition
from pipert.models.memory import SavedBytesMeter, helix_stash_bytes
from pipert.exec.unit import UnitRunner

B, S = 2, 8
MLP = {"plain": {}, "chunked": {"mlp_chunk": 8}, "chunked-recompute": {"mlp_chunk": 8, "mlp_recompute": True}}


def _cfg(name, dtype="float64", layers=2, **kw):
    return model_config(name, dtype=dtype, max_seq=16, layers=layers, **kw)


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (B, S), generator=g), torch.randint(0, 256, (B, S), generator=g)


def _measure(cfg, recompute):
    """Forward every helix unit under the meter (inputs as a runner makes them); returns the meter,
    the loss and what keeps the graphs alive."""
    model = model_from_config(cfg, seed=0)
    units = partition(model, cut="helix", recompute=recompute)
    meter = SavedBytesMeter(list(model.parameters()) + list(model.buffers()))
    tok, tgt = _batch()
    x, alive = tok, []
    for i, u in enumerate(units):
        xs = x if isinstance(x, tuple) else (x,)
        xs = tuple(t.detach().requires_grad_(t.is_floating_point()) for t in xs)
        extra = (tgt,) if i == len(units) - 1 else ()
        relayed = getattr(u, "relays", {})  # passed through; the runner keeps no copy
        with meter.track(i, tuple(t for j, t in enumerate(xs) if j not in relayed) + extra):
            out = u(xs if len(xs) > 1 else xs[0], *extra)
        alive.append((xs, out))
        x = tuple(o.detach() for o in out) if isinstance(out, tuple) else out.detach()
    return meter, out, alive, len(units)


@pytest.mark.parametrize("mlp", list(MLP))
@pytest.mark.parametrize("recompute", ["none", "no_attention", "full"])
@pytest.mark.parametrize("name", ["tiny", "gpt-tiny"])
def test_meter_equals_formula(name, recompute, mlp):
    cfg = _cfg(name, **MLP[mlp])
    meter, _, _, n = _measure(cfg, recompute)
    assert [meter.bytes(u) for u in range(n)] == [helix_stash_bytes(cfg, u, B, S, recompute) for u in range(n)]


@pytest.mark.parametrize("name", ["tiny", "gpt-tiny"])
def test_meter_equals_formula_in_float32_and_drops_to_zero_after_backward(name):
    cfg = _cfg(name, dtype="float32")
    meter, loss, alive, n = _measure(cfg, "none")
    assert [meter.bytes(u) for u in range(n)] == [helix_stash_bytes(cfg, u, B, S) for u in range(n)]
    loss.backward()  # frees the last unit's graph; its inputs x, o are still held (by `alive`)
    assert meter.bytes(n - 1) == 2 * B * S * cfg.hidden * 4
    assert meter.bytes(n - 2) == helix_stash_bytes(cfg, n - 2, B, S)


def test_no_attention_keeps_four_activations_per_layer_and_lse():
    """Per layer (A(l) + C(l+1)) without recomputation vs no_attention: the documented totals."""
    cfg = _cfg("gpt-tiny")
    N, h, e = B * S, cfg.hidden, 8
    lse = B * cfg.heads * S * 8
    per_layer = helix_stash_bytes(cfg, 1, B, S, "no_attention") + helix_stash_bytes(cfg, 2, B, S, "no_attention")
    assert per_layer == 4 * N * h * e + lse  # h and o at A; x and o at C (HelixPipe's 4bsh)
    full = helix_stash_bytes(cfg, 1, B, S) + helix_stash_bytes(cfg, 2, B, S)
    assert full == 10 * N * h * e + 2 * N * cfg.ffn * e + 4 * N * 8 + lse


@pytest.mark.parametrize("name", ["tiny", "gpt-tiny"])
def test_chunked_mlp_shrinks_the_stash_as_documented(name):
    ffn_saved = {"tiny": (4, 2, 0), "gpt-tiny": (2, 1, 0)}[name]  # ffn-wide tensors kept per mode
    got = []
    for mlp in MLP:
        cfg = _cfg(name, **MLP[mlp])
        meter, _, alive, _ = _measure(cfg, "none")
        got.append(meter.bytes(2))
        del alive
    N, f = B * S, _cfg(name).ffn
    assert [got[0] - g for g in got] == [(ffn_saved[0] - k) * N * f * 8 for k in ffn_saved]


@pytest.mark.parametrize("mlp", ["chunked", "chunked-recompute"])
@pytest.mark.parametrize("name", ["tiny", "gpt-tiny"])
def test_chunked_mlp_model_equals_the_plain_model(name, mlp):
    """Loss and gradients equal to 1e-10 (float64; the chunked MLP sums weight gradients chunk
    by chunk, so only the summation order differs). The key bias's gradient is zero up to
    rounding (softmax ignores a shift shared by all keys): scales are floored at 1e-6."""
    tok, tgt = _batch()
    out = []
    for kw in ({}, MLP[mlp]):
        model = model_from_config(_cfg(name, **kw), seed=0)
        loss = model(tok, tgt)
        loss.backward()
        out.append((loss.item(), {n: p.grad for n, p in model.named_parameters()}))
    (la, ga), (lb, gb) = out
    assert abs(la - lb) <= 1e-10 * abs(la) and ga.keys() == gb.keys()
    for n in ga:
        assert (ga[n] - gb[n]).abs().max() <= 1e-10 * max(ga[n].abs().max(), 1e-6), n


@pytest.mark.parametrize("op", ["B", "D+W", "RECOMPUTE+B"])
@pytest.mark.parametrize("recompute", ["none", "no_attention"])
def test_helix_units_under_the_unit_runner(recompute, op):
    """Tuple boundaries (residual relay, norm output) through UnitRunner; a selective region
    differentiated twice (D then W) gives the gradients of one backward."""
    cfg = _cfg("gpt-tiny", mlp_chunk=8)
    tok, tgt = _batch()
    ref = model_from_config(cfg, seed=0)
    ref(tok, tgt).backward()
    model = model_from_config(cfg, seed=0)
    units = partition(model, cut="helix", recompute=recompute)
    runners = [UnitRunner(u, i == 0, i == len(units) - 1) for i, u in enumerate(units)]
    x = tok
    for i, r in enumerate(runners):
        x = r.forward(0, x, tgt if i == len(runners) - 1 else None, keep_graph=not op.startswith("RECOMPUTE"))
    grad = None
    for r in reversed(runners):
        if op == "D+W":
            nxt = r.backward_input(0, grad)
            r.backward_weight(0)
            grad = nxt
        else:
            if op.startswith("RECOMPUTE"):
                r.recompute(0)
            grad = r.backward(0, grad)
    want = dict(ref.named_parameters())
    for n, p in model.named_parameters():
        assert (p.grad - want[n].grad).abs().max() <= 1e-10 * want[n].grad.abs().max(), n


def test_formula_rejects_what_it_does_not_cover():
    with pytest.raises(ValueError, match="unit 5 is not a helix unit of a 2-layer model; allowed: 0..4"):
        helix_stash_bytes(_cfg("tiny"), 5, B, S)
    with pytest.raises(ValueError, match="covers float32 and float64 models, got dtype='bfloat16'"):
        helix_stash_bytes(_cfg("tiny", dtype="bfloat16"), 0, B, S)


@pytest.mark.parametrize("recompute", ["none", "no_attention"])
def test_executor_ledger_counts_what_the_meter_counts(recompute):
    """The executor's measure (StashLedger keys plus the inputs a UnitRunner keeps, as
    ``State.stash_bytes`` sums them) equals the formula, selective caches included."""
    from pipert.exec.stash import StashLedger
    from pipert.device.tensors import tensor_key
    cfg = _cfg("tiny")
    model = model_from_config(cfg, seed=0)
    units = partition(model, cut="helix", recompute=recompute)
    ledger = StashLedger(lambda: list(model.parameters()) + list(model.buffers()))
    runners = [UnitRunner(u, i == 0, i == len(units) - 1) for i, u in enumerate(units)]
    tok, tgt = _batch()
    x = tok
    for i, r in enumerate(runners):
        with ledger.capture(i, 0):
            x = r.forward(0, x, tgt if i == len(runners) - 1 else None)
    for i, r in enumerate(runners):
        keys = ledger.keys(i, 0) | {tensor_key(t) for t in r.held_inputs()[0]}
        assert sum(k[3] for k in keys) == helix_stash_bytes(cfg, i, B, S, recompute), i


def test_a_false_relay_declaration_is_rejected():
    class Liar(torch.nn.Module):
        relays = {0: 0}

        def forward(self, xs):
            x, h = xs
            return x * 1, h * 2

    r = UnitRunner(Liar(), False, False)
    x = torch.ones(2, 3, dtype=torch.float64)
    with pytest.raises(TypeError, match=r"Liar.relays says input 0 is returned as output 0 unchanged"):
        r.forward(0, (x, x))


def test_a_relayed_input_the_unit_also_uses_is_rejected():
    class Sneaky(torch.nn.Module):
        relays = {0: 0}

        def forward(self, xs):
            x, h = xs
            return x, h * x

    r = UnitRunner(Sneaky(), False, False)
    x = torch.ones(2, 3, dtype=torch.float64)
    with pytest.raises(TypeError, match="Sneaky.relays names an input that the unit also uses"):
        r.forward(0, (x, x.clone()))


def test_a_relayed_input_is_not_kept_and_its_gradient_passes_through():
    cfg = _cfg("tiny")
    model = model_from_config(cfg, seed=0)
    attn = partition(model, cut="helix")[1]
    r = UnitRunner(attn, False, False)
    x, h = torch.randn(B, S, cfg.hidden, dtype=torch.float64), torch.randn(B, S, cfg.hidden, dtype=torch.float64)
    r.forward(0, (x, h))
    kept = r.held_inputs()[0]
    assert kept[0].shape == x.shape and kept[0].untyped_storage().nbytes() == 8  # a placeholder
    gx, go = torch.randn_like(x), torch.randn_like(h)
    dx, dh = r.backward(0, (gx, go))
    assert dx is gx and dh.shape == h.shape
