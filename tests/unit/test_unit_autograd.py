"""UnitRunner: F, B, D, W and RECOMPUTE on every kind of unit, checked against plain autograd."""
import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from pipert.models import LlamaConfig, LlamaModel, partition
from pipert.exec.unit import UnitRunner

CFG = LlamaConfig.preset("tiny", dtype="float64", layers=3, max_seq=8)
FINE = LlamaConfig.preset("tiny", dtype="float64", layers=2, max_seq=8)
SPLITS = ["intermediates", "retain"]


def _batch(b=2, s=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (b, s), generator=g), torch.randint(0, 256, (b, s), generator=g)


class TwoIn(nn.Module):
    """Takes (a, b), uses only a; its second output does not depend on the input."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.linspace(0.5, 1.5, 4, dtype=torch.float64))

    def forward(self, xs):
        a, _unused = xs
        return a * self.w, self.w * 2.0


def _llama_units(kind):
    if kind == "fine":
        return partition(LlamaModel(FINE, seed=0), 6, fine=True)
    return partition(LlamaModel(CFG, seed=0), 3)


def _user_units():
    torch.manual_seed(0)
    mods = [nn.Linear(4, 6, dtype=torch.float64), nn.Tanh(), nn.Linear(6, 6, dtype=torch.float64),
            nn.Linear(6, 3, dtype=torch.float64)]
    return partition(mods, 3, loss_fn=nn.CrossEntropyLoss())


# (family, unit index): every unit type the runtime meets
CASES = [("coarse", 0), ("coarse", 1), ("coarse", 2), ("single", 0),
         ("fine", 0), ("fine", 1), ("fine", 2), ("fine", 3), ("fine", 5),
         ("user", 0), ("user", 1), ("user", 2), ("twoin", 0)]


def _setup(family, u, seq=8):
    """(module, is_first, is_last, input, targets, output grad) for unit u of a family (LLaMA units:
    a batch of ``seq`` tokens)."""
    g = torch.Generator().manual_seed(1)
    if family == "twoin":
        x = tuple(torch.randn(3, 4, generator=g, dtype=torch.float64) for _ in range(2))
        mod = TwoIn()
        gout = tuple(torch.randn_like(o, dtype=torch.float64) for o in mod(x))
        return mod, False, False, x, None, gout
    if family == "user":
        units = _user_units()
        x, tgt = torch.randn(5, 4, generator=g, dtype=torch.float64), torch.randint(0, 3, (5,), generator=g)
    elif family == "single":
        units = partition(LlamaModel(CFG, seed=0), 1)
        x, tgt = _batch(s=seq)
    else:
        units = _llama_units(family)
        x, tgt = _batch(s=seq)
    with torch.no_grad():
        for unit in units[:u]:
            x = unit(x)
    last = u == len(units) - 1
    gout = None
    if not last:
        with torch.no_grad():
            out = units[u](x)
        gout = (torch.randn(out.shape, generator=g, dtype=torch.float64) if isinstance(out, torch.Tensor)
                else tuple(torch.randn(o.shape, generator=g, dtype=torch.float64) for o in out))
    return units[u], u == 0, last, x, (tgt if last else None), gout


def _as_list(x):
    return [] if x is None else [x] if isinstance(x, torch.Tensor) else list(x)


def _run(mod, first, last, x, tgt, gout, mode, split="auto"):
    for p in mod.parameters():
        p.grad = None
    r = UnitRunner(mod, first, last, split=split)
    r.forward(7, x, tgt)
    assert r.stashed() == [7]
    if mode == "B":
        gin = r.backward(7, gout)
    else:
        gin = r.backward_input(7, gout)
        assert all(p.grad is None for p in mod.parameters()), "D must defer weight gradients"
        assert r.stashed() == r.awaiting_weight() == [7]
        r.backward_weight(7)
    assert r.stashed() == []
    return gin, {n: p.grad.clone() for n, p in mod.named_parameters() if p.grad is not None}


def _truth(mod, first, x, tgt, gout):
    """Input and parameter gradients by one direct autograd.grad call."""
    xs = [t.detach().requires_grad_(not first and t.is_floating_point()) for t in _as_list(x)]
    arg = xs[0] if isinstance(x, torch.Tensor) else tuple(xs)
    out = mod(arg, tgt) if tgt is not None else mod(arg)
    outs = _as_list(out)
    seeds = _as_list(gout) if gout is not None else [torch.ones_like(outs[0])]
    wrt = [t for t in xs if t.requires_grad]
    params = dict(mod.named_parameters())
    got = torch.autograd.grad(outs, wrt + list(params.values()), seeds, allow_unused=True)
    gin = [torch.zeros_like(t) if g is None else g for t, g in zip(wrt, got)]
    return gin, {n: g for n, g in zip(params, got[len(wrt):]) if g is not None}


@pytest.mark.parametrize("family,u", CASES)
def test_b_matches_autograd_and_d_w_matches_b(family, u):
    mod, first, last, x, tgt, gout = _setup(family, u)
    gin_true, pg_true = _truth(mod, first, x, tgt, gout)
    results = {"B": _run(mod, first, last, x, tgt, gout, "B")}
    for split in SPLITS:
        results[split] = _run(mod, first, last, x, tgt, gout, "DW", split)
    for name, (gin, pg) in results.items():
        if first:
            assert gin is None
        else:
            assert type(gin) is type(x), name  # the gradient has the input's structure
            for a, b in zip(_as_list(gin), gin_true):
                assert torch.allclose(a, b, rtol=1e-10, atol=1e-12), name
        assert pg.keys() == pg_true.keys() == dict(mod.named_parameters()).keys(), name
        for n in pg:
            assert torch.allclose(pg[n], pg_true[n], rtol=1e-10, atol=1e-12), (name, n)
    if pg_true:
        assert any(g.abs().max() > 0 for g in pg_true.values())


def test_unused_floating_input_gets_zero_gradient():
    mod, first, last, x, tgt, gout = _setup("twoin", 0)
    for mode in ("B", "DW"):
        gin, _ = _run(mod, first, last, x, tgt, gout, mode)
        assert torch.equal(gin[1], torch.zeros_like(x[1])) and gin[0].abs().max() > 0


@pytest.mark.parametrize("family,n_units", [("coarse", 3), ("fine", 6)])
def test_chained_runners_equal_the_unsplit_model(family, n_units):
    cfg = CFG if family == "coarse" else FINE
    model = LlamaModel(cfg, seed=0)
    units = partition(model, n_units, fine=family == "fine")
    tok, tgt = _batch(4)
    m = 2
    runners = [UnitRunner(u, i == 0, i == n_units - 1) for i, u in enumerate(units)]
    losses = []
    for mb in range(m):
        x = tok[2 * mb:2 * mb + 2]
        for r in runners[:-1]:
            x = r.forward(mb, x)
        losses.append(runners[-1].forward(mb, x, tgt[2 * mb:2 * mb + 2]))
    for mb in reversed(range(m)):  # B on even units, D then later W on odd ones
        g = None
        for i in reversed(range(n_units)):
            r = runners[i]
            g = r.backward(mb, g, loss_scale=1 / m) if i % 2 == 0 else r.backward_input(mb, g, loss_scale=1 / m)
    for r in runners[1::2]:
        assert r.awaiting_weight() == [0, 1]
        for mb in range(m):
            r.backward_weight(mb)
    assert all(r.stashed() == [] for r in runners)
    got = {n: p.grad.clone() for u in units for n, p in u.named_parameters()}
    model.zero_grad(set_to_none=True)
    full = model(tok, tgt)
    full.backward()
    assert torch.allclose(sum(losses) / m, full.detach(), atol=1e-12)
    for n, p in model.named_parameters():
        assert torch.allclose(got[n], p.grad, rtol=1e-9, atol=1e-12), n


def test_gradients_accumulate_across_microbatches():
    units = partition(LlamaModel(CFG, seed=0), 3)
    r = UnitRunner(units[2], False, True)
    xs = []
    with torch.no_grad():
        for seed in (0, 1):
            tok, tgt = _batch(seed=seed)
            xs.append((units[1](units[0](tok)), tgt))

    def grads(mbs, split_mode):
        units[2].zero_grad(set_to_none=True)
        for mb in mbs:
            r.forward(mb, *xs[mb])
        for mb in mbs:
            if split_mode:
                r.backward_input(mb)
            else:
                r.backward(mb)
        for mb in mbs if split_mode else ():
            r.backward_weight(mb)
        return [p.grad.clone() for p in units[2].parameters()]

    g0, g1 = grads([0], False), grads([1], False)
    for split_mode in (False, True):
        for a, b, c in zip(grads([0, 1], split_mode), g0, g1):
            assert torch.allclose(a, b + c, atol=1e-12)


def test_loss_scale_scales_gradients():
    mod, first, last, x, tgt, _ = _setup("coarse", 2)
    r = UnitRunner(mod, first, last, loss_scale=0.25)
    r.forward(0, x, tgt)
    g_quarter = r.backward(0).clone()
    r.forward(0, x, tgt)
    g_one = r.backward(0, loss_scale=1.0)
    assert torch.allclose(g_quarter * 4, g_one, atol=1e-12)


def test_recompute_rebuilds_the_graph():
    mod, first, last, x, tgt, gout = _setup("coarse", 1)
    gin_ref, pg_ref = _run(mod, first, last, x, tgt, gout, "B")
    mod.zero_grad(set_to_none=True)
    r = UnitRunner(mod, first, last)
    out = r.forward(0, x, keep_graph=False)
    assert out.grad_fn is None
    with pytest.raises(RuntimeError, match="RECOMPUTE first"):
        r.backward(0, gout)
    r.recompute(0)
    with pytest.raises(RuntimeError, match="already present"):
        r.recompute(0)
    assert torch.allclose(r.backward(0, gout), gin_ref, atol=1e-12)
    for n, p in mod.named_parameters():
        assert torch.allclose(p.grad, pg_ref[n], atol=1e-12)


def test_misuse_is_reported():
    mod, first, last, x, tgt, gout = _setup("coarse", 1)
    r = UnitRunner(mod, first, last)
    with pytest.raises(RuntimeError, match="no D ran"):
        r.backward_weight(0)
    r.forward(0, x)
    with pytest.raises(RuntimeError, match="already stashed"):
        r.forward(0, x)
    with pytest.raises(ValueError, match="needs the output gradient"):
        r.backward(0)
    with pytest.raises(ValueError, match=r"gradient 0 has shape \(1,\)"):
        r.backward(0, torch.zeros(1, dtype=torch.float64))
    r.backward_input(0, gout)
    with pytest.raises(RuntimeError, match="its D already ran"):
        r.backward(0, gout)
    r.backward_weight(0)
    with pytest.raises(RuntimeError, match="nothing stashed"):
        r.backward(0, gout)
    last_mod, _, _, lx, _, _ = _setup("coarse", 2)
    with pytest.raises(ValueError, match="needs targets"):
        UnitRunner(last_mod, False, True).forward(0, lx)
    with pytest.raises(ValueError, match="split='fast'"):
        UnitRunner(mod, False, False, split="fast")


class _CountMM(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.mm = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm):
            self.mm += 1
        return func(*args, **(kwargs or {}))


def _backward_mm(split):
    mod, first, last, x, tgt, _ = _setup("coarse", 2)
    r = UnitRunner(mod, first, last, split="auto" if split == "B" else split)
    r.forward(0, x, tgt)
    with _CountMM() as c:
        if split == "B":
            r.backward(0)
        else:
            r.backward_input(0)
            r.backward_weight(0)
    return c.mm


def test_intermediates_split_does_no_extra_matmuls():
    b = _backward_mm("B")
    assert b > 0
    assert _backward_mm("intermediates") == b
    assert _backward_mm("retain") > b  # W repeats the activation-gradient chain


@pytest.mark.parametrize("u", [0, 1])
def test_w_in_pieces_matches_b(u):
    """W in 3 pieces after D gives B's gradients (the first unit, whose D walks nothing, and a middle one)."""
    mod, first, last, x, tgt, gout = _setup("coarse", u)
    gin_b, pg_b = _run(mod, first, last, x, tgt, gout, "B")
    for p in mod.parameters():
        p.grad = None
    r = UnitRunner(mod, first, last, split="intermediates")
    r.forward(0, x, tgt)
    gin = r.backward_input(0, gout)
    for j in range(3):
        assert r.awaiting_weight() == [0]
        r.backward_weight(0, piece=(j, 3))
    assert r.stashed() == []
    assert (gin is None) == first and (first or torch.allclose(gin, gin_b, rtol=1e-10, atol=1e-12))
    pg = {n: p.grad for n, p in mod.named_parameters()}
    assert pg.keys() == pg_b.keys()
    for n in pg:
        assert torch.allclose(pg[n], pg_b[n], rtol=1e-10, atol=1e-12), n


class Twice(nn.Module):
    """Uses its weight at two depths (one parameter group whose intermediates differ in level)
    beside a weight used once."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.w = nn.Parameter(torch.randn(4, 4, generator=g, dtype=torch.float64) / 2)
        self.v = nn.Parameter(torch.randn(4, 4, generator=g, dtype=torch.float64) / 2)

    def forward(self, x):
        return torch.tanh(torch.tanh(x @ self.w) @ self.v) @ self.w


def test_w_merges_groups_by_level_and_keeps_mixed_groups_apart():
    mod = Twice()
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    gout = torch.randn(3, 4, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    gin_true, pg_true = _truth(mod, False, x, None, gout)
    gin, pg = _run(mod, False, False, x, None, gout, "DW", "intermediates")
    assert torch.allclose(gin, gin_true[0], rtol=1e-10, atol=1e-12)
    for n in pg_true:
        assert torch.allclose(pg[n], pg_true[n], rtol=1e-10, atol=1e-12), n
    r = UnitRunner(mod, False, False, split="intermediates")
    r.forward(0, x)
    r.backward_input(0, gout)
    calls = r._stash[0].groups
    assert sorted("groups" in c for c in calls) == [False, True]  # v merged alone, w's mixed group apart

    units = _llama_units("coarse")
    mid, xm = units[1], _batch()[0]
    with torch.no_grad():
        xm = units[0](xm)
    r = UnitRunner(mid, False, False, split="intermediates")
    out = r.forward(0, xm)
    r.backward_input(0, torch.ones_like(out))
    calls = r._stash[0].groups
    assert not any("groups" in c for c in calls)
    assert len(calls) < len({id(p) for c in calls for p in c["params"]})  # fewer calls than weights


def _d_then_w(r, batches):
    """F of every micro-batch, then D of each (last first), then W of each; input gradients by micro-batch."""
    for mb, (x, tgt, _) in enumerate(batches):
        r.forward(mb, x, tgt)
    gins = {mb: r.backward_input(mb, gout) for mb, (_, _, gout) in reversed(list(enumerate(batches)))}
    for mb in range(len(batches)):
        r.backward_weight(mb)
    assert r.stashed() == []
    return gins


def _check_against_truth(r, mod, first, batches):
    """D + W of ``batches`` on runner ``r`` equal one autograd.grad per micro-batch (summed over them)."""
    gins_true, pg_true = [], {}
    for x, tgt, gout in batches:
        gin, pg = _truth(mod, first, x, tgt, gout)
        gins_true.append(gin)
        for n, g in pg.items():
            pg_true[n] = pg_true[n] + g if n in pg_true else g
    mod.zero_grad(set_to_none=True)
    gins = _d_then_w(r, batches)
    for mb, gin_true in enumerate(gins_true):
        for a, b in zip(_as_list(gins[mb]), gin_true):
            assert torch.allclose(a, b, rtol=1e-10, atol=1e-12), mb
    got = {n: p.grad for n, p in mod.named_parameters() if p.grad is not None}
    assert got.keys() == pg_true.keys()
    for n in got:
        assert torch.allclose(got[n], pg_true[n], rtol=1e-10, atol=1e-12), n


@pytest.mark.parametrize("family,u", [("coarse", 1), ("coarse", 2), ("fine", 1), ("fine", 2), ("twoin", 0)])
def test_d_analysis_is_computed_once_for_microbatches_of_one_structure(family, u):
    """Several micro-batches in flight, one of another sequence length (same structure, other shapes):
    one analysis, reused by the others, and D + W exact for each."""
    mod, first, last, x, tgt, gout = _setup(family, u)
    batches = [(x, tgt, gout)]
    g = torch.Generator().manual_seed(9)
    noisy = lambda t: t + 0.1 * torch.randn(t.shape, generator=g, dtype=t.dtype) if t.is_floating_point() else t
    batches.append((tuple(map(noisy, x)) if isinstance(x, tuple) else noisy(x), tgt,
                    tuple(map(noisy, gout)) if isinstance(gout, tuple) else gout if gout is None else noisy(gout)))
    if family != "twoin":  # a shorter sequence, through the same weights (another copy of the model)
        batches.append(_setup(family, u, seq=5)[3:])
    r = UnitRunner(mod, first, last, split="intermediates")
    _check_against_truth(r, mod, first, batches)
    assert (r._analyses.misses, r._analyses.hits) == (1, len(batches) - 1)


class Branchy(nn.Module):
    """A unit whose graph depends on its input's values and on train vs eval. ``x[0, 1]`` picks one of
    two wirings with the same node types and counts and the same parameter numbers in the analysis'
    walk (only the signature's edges differ); ``x[0, 0]`` picks which weight the last matmul reads (the
    same graph up to that); eval skips it."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(6)
        self.a, self.b, self.c, self.d, self.e = (
            nn.Parameter(torch.randn(4, 4, generator=g, dtype=torch.float64) / 2) for _ in range(5))

    def forward(self, x):
        if x[0, 1] > 0:
            h = torch.tanh(torch.tanh(x @ self.a)) @ self.b
        else:
            h = torch.tanh(torch.tanh(x) @ self.a) @ self.b
        h = h + torch.tanh(x @ self.c)
        if self.training:
            h = torch.tanh(h @ (self.d if x[0, 0] > 0 else self.e))
        return h


def test_a_changed_structure_misses_the_d_analysis_cache():
    """Micro-batches whose graphs differ (wiring, which weight, eval) each get their own analysis; a
    repeated structure reuses its own; D + W stay exact throughout."""
    mod = Branchy()
    g = torch.Generator().manual_seed(7)

    def batch(pick_weight, pick_wiring):
        x = torch.randn(3, 4, generator=g, dtype=torch.float64)
        x[0, :2] = torch.tensor([pick_weight, pick_wiring])
        return x, None, torch.randn(3, 4, generator=g, dtype=torch.float64)

    r = UnitRunner(mod, False, False, split="intermediates")
    _check_against_truth(r, mod, False, [batch(1.0, 1.0), batch(1.0, -1.0), batch(-1.0, 1.0), batch(1.0, 1.0)])
    assert (r._analyses.misses, r._analyses.hits) == (3, 1)
    mod.eval()
    _check_against_truth(r, mod, False, [batch(1.0, 1.0)])
    assert (r._analyses.misses, r._analyses.hits) == (4, 1)
    mod.train()
    _check_against_truth(r, mod, False, [batch(-1.0, 1.0)])
    assert (r._analyses.misses, r._analyses.hits) == (4, 2)


class _Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


class Squares(nn.Module):
    """A unit whose graph holds nodes of a custom autograd.Function (as tensor-parallel units do)."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(8)
        self.w, self.v = (nn.Parameter(torch.randn(4, 4, generator=g, dtype=torch.float64) / 2) for _ in range(2))

    def forward(self, x):
        return _Square.apply(_Square.apply(x @ self.w) @ self.v)


def test_d_analysis_reuse_through_custom_function_nodes():
    mod = Squares()
    g = torch.Generator().manual_seed(10)
    batches = [(torch.randn(3, 4, generator=g, dtype=torch.float64), None,
                torch.randn(3, 4, generator=g, dtype=torch.float64)) for _ in range(3)]
    r = UnitRunner(mod, False, False, split="intermediates")
    _check_against_truth(r, mod, False, batches)
    assert (r._analyses.misses, r._analyses.hits) == (1, 2)


def test_recompute_on_and_off_between_microbatches_stays_exact():
    """The same unit with and without selective recomputation, micro-batches of both in flight."""
    mod, first, last, x, tgt, gout = _setup("coarse", 1)
    r = UnitRunner(mod, first, last, split="intermediates")
    truth = _truth(mod, first, x, tgt, gout)
    mod.zero_grad(set_to_none=True)
    for mb, save in enumerate([None, frozenset(), None]):
        mod.save_ops = save
        r.forward(mb, x)
    mod.save_ops = None
    gins = [r.backward_input(mb, gout) for mb in range(3)]
    for mb in range(3):
        r.backward_weight(mb)
    for gin in gins:
        assert torch.allclose(gin, truth[0][0], rtol=1e-10, atol=1e-12)
    for n, p in mod.named_parameters():
        assert torch.allclose(p.grad, 3 * truth[1][n], rtol=1e-10, atol=1e-12), n
    assert r._analyses.misses + r._analyses.hits == 3
