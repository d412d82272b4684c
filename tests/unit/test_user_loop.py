"""The user's loop (pipert.loop): forward_backward, clip_grad_norm_, optimizer_step, an LR
scheduler and eval over a Pipeline equal the same loop on the single-process model."""
import copy

import pytest
import torch
from torch import nn

from pipert.errors import PipelineError
from pipert.ir.phases import SplitError
from pipert.models import partition
from pipert.pipeline import Pipeline
from pipert.schedules import build_schedule


def _user_model(seed: int = 0) -> tuple[nn.Sequential, nn.Module]:
    torch.manual_seed(seed)
    layers = [nn.Linear(6, 16), *[nn.Sequential(nn.Tanh(), nn.Linear(16, 16)) for _ in range(6)],
              nn.Sequential(nn.Tanh(), nn.Linear(16, 3))]
    return nn.Sequential(*layers).double(), nn.MSELoss()


def _batch(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 6, generator=g, dtype=torch.float64), 3 * torch.randn(n, 3, generator=g, dtype=torch.float64)


def _adamw(params):
    return torch.optim.AdamW(params, lr=0.05, weight_decay=0.01)


def _cosine(opt):
    return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=3)


def _reference(model: nn.Module, loss_fn: nn.Module, batches: list, max_norm: float) -> tuple[list, list]:
    opt = _adamw(model.parameters())
    sched = _cosine(opt)
    losses, norms = [], []
    for x, y in batches:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)))
        opt.step()
        sched.step()
        losses.append(loss.item())
    return losses, norms


CASES = [("1f1b", 4, 1, 0), ("zb-v", 2, 1, 0), ("interleaved-1f1b", 2, 1, 0), ("pipemesh", 2, 2, 0),
         ("pipemesh", 2, 2, 2), ("gpipe", 2, 2, 1)]


@pytest.mark.parametrize("name,stages,dp,zero", CASES, ids=[f"{c[0]}-dp{c[2]}-z{c[3]}" for c in CASES])
def test_user_loop_equals_single_process(name, stages, dp, zero):
    model, loss_fn = _user_model()
    ref_model = copy.deepcopy(model)
    chunks = 2 if name in ("zb-v", "interleaved-1f1b") else None
    M = 4 * dp
    units = partition(list(model), build_schedule(name, stages=stages, microbatches=4, chunks=chunks).num_units,
                      loss_fn=loss_fn)
    batches = [_batch(2 * M, s) for s in range(3)]
    ref_losses, ref_norms = _reference(ref_model, loss_fn, batches, max_norm=1.0)
    pipe = Pipeline(units, name, stages=stages, microbatches=M, chunks=chunks, optimizer=_adamw, dp=dp, zero=zero)
    sched = pipe.lr_scheduler(_cosine)
    for (x, y), ref_loss, ref_norm in zip(batches, ref_losses, ref_norms):
        loss = pipe.forward_backward(x, y)
        assert isinstance(loss, torch.Tensor) and loss.dim() == 0
        norm = pipe.clip_grad_norm_(1.0)
        pipe.optimizer_step()
        sched.step()
        assert abs(float(loss) - ref_loss) <= 1e-10 * max(1.0, abs(ref_loss))
        assert abs(float(norm) - ref_norm) <= 1e-10 * max(1.0, ref_norm)
    assert ref_norms[0] > 1.0  # clipping changed the update (the test would see a wrong scale)
    got = pipe.named_parameters()
    want = dict(ref_model.named_parameters())
    for k, v in got.items():
        name_in_model = _model_name(k, units, model)
        torch.testing.assert_close(v, want[name_in_model], rtol=1e-10, atol=1e-10)
    out = pipe.eval(batches[0][0])
    torch.testing.assert_close(out, ref_model(batches[0][0]).detach(), rtol=1e-12, atol=1e-12)
    pipe.close()


def _model_name(key: str, units: list[nn.Module], model: nn.Sequential) -> str:
    """``unit{u}.{name}`` of the pipeline -> the parameter's name in the single-process model."""
    unit, rest = key.split(".", 1)
    p = dict(units[int(unit[4:])].named_parameters())[rest]
    return next(n for n, q in model.named_parameters() if q is p)


def _pipe(name: str = "1f1b", stages: int = 2, M: int = 4, **kw) -> tuple[Pipeline, nn.Sequential]:
    model, loss_fn = _user_model()
    ref = copy.deepcopy(model)
    n = build_schedule(name, stages=stages, microbatches=M // kw.get("dp", 1), **kw.pop("build", {})).num_units
    return Pipeline(partition(list(model), n, loss_fn=loss_fn), name, stages=stages, microbatches=M,
                    optimizer=_adamw, **kw), ref


def test_bigger_batch_on_a_later_step_equals_single_process():
    pipe, ref = _pipe()
    opt = _adamw(ref.parameters())
    for n in (8, 16, 4):  # micro-batches of 2, 4, then 1 sample: the boundaries follow
        x, y = _batch(n, n)
        loss = pipe.forward_backward(x, y)
        pipe.optimizer_step()
        opt.zero_grad()
        want = nn.MSELoss()(ref(x), y)
        want.backward()
        opt.step()
        assert abs(float(loss) - want.item()) <= 1e-12
    torch.testing.assert_close(pipe.eval(x), ref(x).detach(), rtol=1e-12, atol=1e-12)


def test_eval_with_targets_is_the_loss_and_changes_nothing():
    pipe, ref = _pipe("interleaved-1f1b", build={"chunks": 2}, chunks=2)
    x, y = _batch(8, 1)
    before = {k: v.clone() for k, v in pipe.named_parameters().items()}
    loss = pipe.eval(x, y)
    assert abs(float(loss) - nn.MSELoss()(ref(x), y).item()) <= 1e-12
    for k, v in pipe.named_parameters().items():
        assert torch.equal(v, before[k]) and v.grad is None


def test_weight_passing_schedule_keeps_its_optimizer_inside_step():
    model, loss_fn = _user_model()
    units = partition(list(model), 2, loss_fn=loss_fn)
    pipe = Pipeline(units, "weipipe-zb1", stages=2, microbatches=4)
    x, y = _batch(8, 0)
    with pytest.raises(SplitError, match=r"weipipe-zb1.*after its first optimizer step.*use Pipeline.step"):
        pipe.forward_backward(x, y)
    with pytest.raises(SplitError, match="moves weights to the computes"):
        pipe.eval(x)
    assert all(v.grad is None for v in pipe.named_parameters().values())  # nothing ran
    assert isinstance(pipe.step(x, y), float)  # the whole step still trains


def test_update_needs_gradients_first():
    pipe, _ = _pipe()
    with pytest.raises(PipelineError, match=r"optimizer_step\(\) needs a forward_backward\(\)"):
        pipe.optimizer_step()
    with pytest.raises(PipelineError, match=r"call it after forward_backward\(\)"):
        pipe.clip_grad_norm_(1.0)
    x, y = _batch(8, 0)
    pipe.forward_backward(x, y)
    pipe.optimizer_step()
    with pytest.raises(PipelineError, match="once per step"):
        pipe.optimizer_step()


def test_eval_of_zero3_is_refused_naming_the_units():
    pipe, _ = _pipe("gpipe", M=8, dp=2, zero=3)
    with pytest.raises(SplitError, match=r"units \[0, 1\] sharded \(ZeRO-3\).*use zero <= 2"):
        pipe.eval(_batch(16, 0)[0])


def test_infinity_norm_clips_like_torch():
    pipe, ref = _pipe()
    x, y = _batch(8, 3)
    pipe.forward_backward(x, y)
    norm = pipe.clip_grad_norm_(0.01, norm_type=float("inf"))
    nn.MSELoss()(ref(x), y).backward()
    want = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.01, norm_type=float("inf"))
    assert abs(float(norm) - float(want)) <= 1e-12
    grads = {k: v.grad for k, v in pipe.named_parameters().items()}
    got_max = max(float(g.abs().max()) for g in grads.values() if g is not None)
    assert abs(got_max - max(float(p.grad.abs().max()) for p in ref.parameters())) <= 1e-12
