"""Selective recomputation of a whole unit (pipert.models.recompute.selective_recompute, PyTorch SAC): the ops not kept run
again in the backward, the kept ones do not, and results equal the plain unit exactly."""
from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pipert.models.recompute import selective_recompute
from pipert.testing import make_batch, tiny_units


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: dict[str, int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.calls[name] = self.calls.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def _backward_calls(unit, x, y):
    x = x.detach().clone().requires_grad_(True)
    loss = unit(x, y)
    with _Count() as c:
        loss.backward()
    return loss.detach(), x.grad, [p.grad for p in unit.parameters()], c.calls


def test_norms_and_activations_recomputed_projections_kept():
    plain = tiny_units(2, "float64")[1]   # the last unit: a decoder layer, norm, head, loss
    sac = selective_recompute(copy.deepcopy(plain), {"projection", "attention"})
    x = torch.randn(2, 8, 32, dtype=torch.float64)
    _, y = make_batch(1)
    l0, g0, p0, c0 = _backward_calls(plain, x, y)
    l1, g1, p1, c1 = _backward_calls(sac, x, y)
    assert c0.get("silu", 0) == 0 and c0.get("rsqrt", 0) == 0
    assert c1["silu"] == 1 and c1["rsqrt"] == 3        # SwiGLU's SiLU; attention, MLP and final RMSNorm
    assert c1["mm"] == c0["mm"]                        # no projection runs again
    assert torch.equal(l0, l1) and torch.equal(g0, g1)
    assert all(torch.equal(a, b) for a, b in zip(p0, p1))
    assert [n for n, _ in sac.named_parameters()] == [n for n, _ in plain.named_parameters()]


def test_copies_follow_their_module_and_pickle():
    unit = selective_recompute(tiny_units(2, "float64")[0], {"projection"})
    twin = copy.deepcopy(unit)
    assert twin.forward.forward.__self__ is twin
    pickle.loads(pickle.dumps(unit))


def test_unknown_op_groups_are_rejected():
    with pytest.raises(ValueError, match=r"unknown op group\(s\) to save \['projections'\]; allowed: attention"):
        selective_recompute(tiny_units(2, "float64")[0], {"projections"})


def _attention_inputs():
    """The fine cut's first layer: pre(0) on a token batch gives attn(0)'s input (x, q, k, v)."""
    units = tiny_units(6, "float64", fine=True)
    tokens, _ = make_batch(1)
    with torch.no_grad():
        xs = units[0](tokens)
    return units[1], tuple(t.detach().requires_grad_(True) for t in xs)


@pytest.mark.parametrize("save", [set(), {"attention"}])
def test_fine_cut_attention_relays_its_residual_around_the_region(save):
    """attn(l) relays x (input 0 -> output 0): under selective recomputation x is passed through,
    neither kept by the region nor recomputed; the runner accepts the unit, its stash holds no
    byte of x, and keeping nothing stores less than the plain unit (which keeps the attention
    output and its statistics)."""
    from pipert.models.memory import SavedBytesMeter
    from pipert.exec.unit import UnitRunner
    plain, xs = _attention_inputs()
    sac = selective_recompute(copy.deepcopy(plain), save)
    held = {}
    for name, unit in (("plain", plain), ("sac", sac)):
        runner, meter = UnitRunner(unit, is_first=False, is_last=False), SavedBytesMeter()
        with meter.track(name, xs[1:]):
            x, o = runner.forward(0, xs)
        assert x.data_ptr() == xs[0].data_ptr()
        held[name] = meter.bytes(name)
        dx = runner.backward(0, (torch.ones_like(x), torch.ones_like(o)))
        assert torch.equal(dx[0], torch.ones_like(x))   # the relayed gradient goes straight back
        held[name + "_grads"] = dx[1:]
    qkv = sum(t.numel() * t.element_size() for t in xs[1:])
    if not save:
        assert held["sac"] == qkv < held["plain"]
    else:
        assert qkv < held["sac"] <= held["plain"]
    assert all(torch.equal(a, b) for a, b in zip(held["plain_grads"], held["sac_grads"]))


def test_fine_cut_pipeline_with_selective_recompute_equals_the_reference():
    from pipert.testing import Case, assert_exact, run_case
    case = Case("pipemesh", 2, 4, chunks=1, fine=True, save_ops=("projection",), options=(("units_per_chunk", 3),))
    assert_exact([run_case(case).as_dict()])


def test_a_deterministic_region_leaves_the_generator_alone_and_a_random_one_replays_it(monkeypatch):
    """torch's get/set of the generator's state deadlocks between threads (its mutex against the
    GIL): deterministic regions (every built-in unit) never touch it; a unit with dropout replays
    the forward's random numbers in its recomputation."""
    import torch
    from torch import nn

    from pipert.models.recompute import selective_checkpoint, stochastic

    class Unit(nn.Module):
        def __init__(self, p: float) -> None:
            super().__init__()
            self.lin, self.drop = nn.Linear(8, 8), nn.Dropout(p)

        def forward(self, x):
            return self.drop(torch.relu(self.lin(x))).sum()

    calls = []
    real_get = torch.get_rng_state
    monkeypatch.setattr(torch, "get_rng_state", lambda: calls.append(1) or real_get())
    plain = Unit(0.0)
    assert not stochastic(plain) and stochastic(Unit(0.5)) and not stochastic(Unit(0.5).eval())
    selective_checkpoint(plain.forward, torch.randn(4, 8, requires_grad=True), save=()).backward()
    assert calls == []
    random = Unit(0.5)
    x = torch.randn(4, 8, requires_grad=True)
    torch.manual_seed(0)
    selective_checkpoint(random.forward, x, save=()).backward()
    grad = x.grad.clone()
    x.grad = None
    torch.manual_seed(0)
    random(x).backward()  # the same draws without recomputation
    assert calls and torch.equal(grad, x.grad)
