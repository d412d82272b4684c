"""The single-process reference step, and its agreement with units driven by UnitRunner."""
import pytest
import torch

from pipert.data import ByteCorpus
from pipert.models import LlamaConfig, LlamaModel, partition
from pipert.tools.reference import named_unit_parameters, reference_step, split_microbatches, unit_param_names
from pipert.exec.unit import UnitRunner

CFG = LlamaConfig.preset("tiny", dtype="float64", layers=2, max_seq=16)


def _data(b=4, s=16):
    return ByteCorpus(s, seed=0, batch_size=b).batch(0)


def _close(a: dict, b: dict, tol=1e-10):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=tol, atol=tol), k


def test_names_follow_units():
    units = partition(LlamaModel(CFG, seed=0), 2)
    names = unit_param_names(units)
    assert names[0] == "unit0.embed.weight" and names[-1] == "unit1.head.weight"
    assert "unit1.layers.1.attn.wq.weight" in names and len(names) == len(set(names))
    assert list(named_unit_parameters(units)) == names
    with pytest.raises(ValueError, match="same tensor"):
        named_unit_parameters([units[0], units[0]])


def test_microbatch_count_does_not_change_loss_or_grads():
    tok, tgt = _data(4)
    full = LlamaModel(CFG, seed=0)(tok, tgt).item()
    units = partition(LlamaModel(CFG, seed=0), 2)
    results = [reference_step(units, tok, tgt, m) for m in (1, 2, 4)]
    for r, m in zip(results, (1, 2, 4)):
        assert len(r.losses) == m and abs(r.loss - full) < 1e-12
        _close(r.grads, results[0].grads)
        _close(r.params_after, results[0].params_after)
    assert abs(sum(results[2].losses) / 4 - full) < 1e-12
    assert max(results[2].losses) - min(results[2].losses) > 1e-3  # micro-batches differ


def test_sgd_step_and_copy_semantics():
    tok, tgt = _data()
    units = partition(LlamaModel(CFG, seed=0), 2)
    before = {k: p.detach().clone() for k, p in named_unit_parameters(units).items()}
    r = reference_step(units, tok, tgt, 2)
    for k in before:
        assert torch.allclose(r.params_after[k], before[k] - 0.1 * r.grads[k], atol=1e-14), k
        assert torch.equal(named_unit_parameters(units)[k], before[k])  # caller's copy untouched
    assert any(g.abs().max() > 0 for g in r.grads.values())
    reference_step(units, tok, tgt, 2, copy_units=False)
    _close({k: p.detach() for k, p in named_unit_parameters(units).items()}, r.params_after, 1e-14)


def test_adamw_factory_is_deterministic():
    tok, tgt = _data()
    units = partition(LlamaModel(CFG, seed=0), 2)
    factory = lambda ps: torch.optim.AdamW(ps, lr=1e-2)  # noqa: E731
    a = reference_step(units, tok, tgt, 2, factory)
    b = reference_step(units, tok, tgt, 2, factory)
    for k in a.params_after:
        assert torch.equal(a.params_after[k], b.params_after[k])


def test_single_module_is_one_unit_and_tied_models_work_unsplit():
    tok, tgt = _data()
    model = LlamaModel(CFG, seed=0)
    whole = reference_step(model, tok, tgt, 2)
    unit = reference_step(partition(model, 1), tok, tgt, 2)
    assert set(whole.grads) == set(unit.grads) and "unit0.embed.weight" in whole.grads
    _close(whole.grads, unit.grads, 1e-12)
    tied = LlamaModel(LlamaConfig.preset("tiny", dtype="float64", layers=2, tie_embeddings=True), seed=0)
    r = reference_step(tied, tok, tgt, 2)
    assert "unit0.head.weight" not in r.grads and r.grads["unit0.embed.weight"].abs().max() > 0


def test_split_microbatches_requires_equal_sizes():
    tok, tgt = _data(4)
    parts = split_microbatches(tok, tgt, 2)
    assert [p[0].shape[0] for p in parts] == [2, 2] and torch.equal(parts[1][1], tgt[2:])
    with pytest.raises(ValueError, match="batch of 4 does not split into 3"):
        split_microbatches(tok, tgt, 3)


@pytest.mark.parametrize("n_units,fine", [(2, False), (6, True)])
def test_runner_driven_step_matches_reference(n_units, fine):
    """A 1F1B-like single-process walk with D/W on odd units reproduces the reference."""
    tok, tgt = _data(4)
    m = 4
    ref = reference_step(partition(LlamaModel(CFG, seed=0), n_units, fine=fine), tok, tgt, m)
    units = partition(LlamaModel(CFG, seed=0), n_units, fine=fine)
    runners = [UnitRunner(u, i == 0, i == n_units - 1, loss_scale=1 / m) for i, u in enumerate(units)]
    mbs = split_microbatches(tok, tgt, m)
    losses = {}

    def fwd(mb):
        x = mbs[mb][0]
        for r in runners[:-1]:
            x = r.forward(mb, x)
        losses[mb] = float(runners[-1].forward(mb, x, mbs[mb][1]))

    def bwd(mb):
        g = None
        for i in reversed(range(n_units)):
            g = runners[i].backward(mb, g) if i % 2 == 0 else runners[i].backward_input(mb, g)

    fwd(0), fwd(1), bwd(0), fwd(2), bwd(1), fwd(3), bwd(2), bwd(3)
    for mb in (2, 0, 3, 1):  # W in any order
        for r in runners[1::2]:
            r.backward_weight(mb)
    named = named_unit_parameters(units)
    _close({k: p.grad for k, p in named.items()}, ref.grads, 1e-9)
    assert abs(sum(losses.values()) / m - ref.loss) < 1e-12
    opt = torch.optim.SGD(list(named.values()), lr=0.1)
    opt.step()
    _close({k: p.detach() for k, p in named.items()}, ref.params_after, 1e-9)


def test_existing_optimizer_runs_in_place_and_keeps_state():
    """Two steps with SGD momentum equal a plain full-batch training loop."""
    units = partition(LlamaModel(CFG, seed=0), 2)
    loop = LlamaModel(CFG, seed=0)
    opt = torch.optim.SGD([p for u in units for p in u.parameters()], lr=0.1, momentum=0.9)
    loop_opt = torch.optim.SGD(loop.parameters(), lr=0.1, momentum=0.9)
    corpus = ByteCorpus(16, seed=1, batch_size=4)
    for tok, tgt in corpus.batches(steps=2):
        r = reference_step(units, tok, tgt, 2, optimizer=opt)
        loop_opt.zero_grad()
        loop(tok, tgt).backward()
        loop_opt.step()
    live = named_unit_parameters(units)
    for name, p in loop.named_parameters():
        key = _unit_name(units, name)
        assert torch.allclose(r.params_after[key], p, atol=1e-12), name
        assert torch.equal(live[key], r.params_after[key])  # in place
    with pytest.raises(ValueError, match="not parameters of these units"):
        reference_step(units, tok, tgt, 2, optimizer=loop_opt)
    with pytest.raises(ValueError, match="not both"):
        reference_step(units, tok, tgt, 2, lambda ps: opt, optimizer=opt)


def _unit_name(units, name):
    for u, unit in enumerate(units):
        if name in dict(unit.named_parameters()):
            return f"unit{u}.{name}"
    raise KeyError(name)
