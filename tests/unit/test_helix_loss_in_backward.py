"""HelixPipe's loss in backward in the runtime (UnitRunner, ``loss_in_backward=True``): C(L)'s F
stops before the final norm and keeps that norm's input; its first backward (B, or D then W)
runs norm, head and cross-entropy and hands the loss over (``pop_loss``). Loss and gradients equal
the whole model's (float64); what the stash keeps equals the formula and holds no logits."""
import pytest
import torch

from pipert.device.tensors import tensor_key
from pipert.exec.stash import StashLedger
from pipert.exec.unit import UnitRunner, unit_runner
from pipert.models import model_config, model_from_config, partition
from pipert.models.memory import helix_stash_bytes

B, S = 2, 8


def _setup(name, recompute):
    cfg = model_config(name, dtype="float64", max_seq=16, layers=2)
    model = model_from_config(cfg, seed=0)
    g = torch.Generator().manual_seed(1)
    tok, tgt = torch.randint(0, cfg.vocab, (B, S), generator=g), torch.randint(0, cfg.vocab, (B, S), generator=g)
    return cfg, model, partition(model, cut="helix", recompute=recompute), tok, tgt


def _reference(model, tok, tgt):
    loss = model(tok, tgt)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return loss.detach(), {n: g for (n, _), g in zip(model.named_parameters(), grads)}


def _rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


@pytest.mark.parametrize("backward", ["B", "DW"])
@pytest.mark.parametrize("recompute", ["none", "no_attention"])
@pytest.mark.parametrize("name", ["tiny", "gpt-tiny"])
def test_loss_in_backward_equals_the_whole_model(name, recompute, backward):
    _, model, units, tok, tgt = _setup(name, recompute)
    ref_loss, ref_grads = _reference(model, tok, tgt)
    model.zero_grad(set_to_none=True)
    runners = [unit_runner(u, i, len(units), {"loss_in_backward": True}) for i, u in enumerate(units)]
    x = tok
    for i, r in enumerate(runners):
        x = r.forward(0, x, tgt if i == len(runners) - 1 else None)
    assert x is None and runners[-1].pop_loss(0) is None  # no loss before the backward
    g = None
    for r in reversed(runners):
        if backward == "B":
            g = r.backward(0, g)
        else:
            g = r.backward_input(0, g)
            r.backward_weight(0)
    loss = runners[-1].pop_loss(0)
    assert loss is not None and runners[-1].pop_loss(0) is None  # handed over once
    assert abs(loss.item() - ref_loss.item()) <= 1e-12 * abs(ref_loss.item())
    for n, p in model.named_parameters():
        assert _rel(p.grad, ref_grads[n]) <= 1e-10, n
    assert all(not r.stashed() for r in runners)


def test_an_f_without_graph_computes_nothing_and_recompute_runs_the_trunk():
    _, model, units, tok, tgt = _setup("gpt-tiny", "none")
    ref_loss, ref_grads = _reference(model, tok, tgt)
    model.zero_grad(set_to_none=True)
    runners = [unit_runner(u, i, len(units), {"loss_in_backward": True}) for i, u in enumerate(units)]
    x = tok
    for r in runners[:-1]:
        x = r.forward(0, x)
    last = runners[-1]
    assert last.forward(0, x, tgt, keep_graph=False) is None
    assert not last.has_stash(0) and last.held_inputs()[0] == tuple(last.held_inputs()[0][:2])  # inputs only
    last.recompute(0)
    assert last.has_stash(0) and len(last.held_inputs()[0]) == 4  # the inputs, the trunk's output, the targets
    g = None
    for r in reversed(runners):
        g = r.backward(0, g)
    assert abs(last.pop_loss(0).item() - ref_loss.item()) <= 1e-12 * abs(ref_loss.item())
    for n, p in model.named_parameters():
        assert _rel(p.grad, ref_grads[n]) <= 1e-10, n


def _stash_of_last(cfg, units, tok, tgt, loss_in_backward):
    """Bytes the last unit's stash holds after its F, as the executor measures them (ledger keys
    plus the tensors the runner keeps), for one micro-batch."""
    model_params = [p for u in units for p in u.parameters()]
    ledger = StashLedger(lambda: model_params)
    runners = [unit_runner(u, i, len(units), {"loss_in_backward": loss_in_backward}) for i, u in enumerate(units)]
    x, last = tok, len(units) - 1
    for i, r in enumerate(runners):
        with ledger.capture(i, 0):
            x = r.forward(0, x, tgt if i == last else None)
    keys = ledger.keys(last, 0) | {tensor_key(t) for t in runners[last].held_inputs()[0]}
    return sum(k[3] for k in keys)


@pytest.mark.parametrize("recompute", ["none", "no_attention"])
@pytest.mark.parametrize("name", ["tiny", "gpt-tiny"])
def test_the_stash_keeps_no_logits(name, recompute):
    cfg, _, units, tok, tgt = _setup(name, recompute)
    last = len(units) - 1
    late = _stash_of_last(cfg, units, tok, tgt, True)
    assert late == helix_stash_bytes(cfg, last, B, S, recompute, loss_in_backward=True)
    early = _stash_of_last(cfg, units, tok, tgt, False)
    assert early == helix_stash_bytes(cfg, last, B, S, recompute)
    logits = B * S * cfg.vocab * 8
    if recompute == "none":  # the logits (log-softmax) left the stash with the norm and head tensors
        assert early - late >= logits
    else:  # the checkpoint kept no logits either way; the trunk's output is the one tensor more
        assert late - early == B * S * cfg.hidden * 8


def test_a_last_unit_without_a_trunk_is_refused():
    with pytest.raises(TypeError, match=r"loss in backward: the last unit \(Linear\) must provide forward_trunk"):
        UnitRunner(torch.nn.Linear(2, 2), is_first=False, is_last=True, loss_in_backward=True)
    UnitRunner(torch.nn.Linear(2, 2), is_first=False, is_last=False, loss_in_backward=True)  # not last: no head
