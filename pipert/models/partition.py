"""Cut a model into units: the atoms of work a schedule places and orders.

Unit I/O contract (``pipert.exec.unit.UnitRunner`` and the reference rely on it):

- A unit is an ``nn.Module``. A non-last unit computes ``y = unit(x)``; the last unit
  computes ``loss = unit(x, targets)``, a scalar: the mean loss over its micro-batch.
- ``x`` and ``y`` are activations: one Tensor or a tuple of Tensors, passed as ONE
  positional argument. Unit ``u + 1`` takes exactly what unit ``u`` returns.
- The first unit takes the batch input (token ids ``[b, s]`` int64 for the LLaMA model).
- Units share parameter tensors with the model they were cut from (no copies); no
  parameter belongs to two units (``partition`` raises otherwise).
- Inside a unit, parameters keep the model's names (``layers.3.attn.wq.weight``); a
  pipelined run names them ``unit{u}.{name}`` (``pipert.tools.reference.unit_param_names``).

LLaMA, coarse (``fine=False``): unit u holds a contiguous chunk of layers; unit 0 also the
embedding, the last unit also the final norm, the head and the loss. Layer counts differ by
at most one; the first ``layers % num_units`` units get the extra layer.

    unit 0:     tokens [b, s]  -> x [b, s, hidden]        (x, targets -> loss if it is also last)
    unit u:     x [b, s, hidden] -> x [b, s, hidden]
    last unit:  (x [b, s, hidden], targets [b, s]) -> loss

LLaMA, fine (``fine=True``): three units per layer l, ``num_units == 3 * layers``:

    pre(l)  = unit 3l:     x [b,s,hidden] (tokens for l = 0, embedding folded in)
                           -> (x, q [b,s,H,d], k [b,s,Hkv,d], v [b,s,Hkv,d])    attn_norm, wq/wk/wv, rotary
    attn(l) = unit 3l+1:   (x, q, k, v) -> (x, o [b,s,hidden])                 no parameters
    post(l) = unit 3l+2:   (x, o) -> x                                          wo, residual, mlp_norm, mlp, residual
                           last layer: ((x, o), targets) -> loss                + final norm, head, loss

The residual ``x`` travels with the attention inputs so that each unit needs only its
predecessor's output; attn(l) declares it relayed (``relays``, ``pipert.exec.unit``), so
the runner keeps no copy of it.

Helix (``cut="helix"``): 2L+1 units ``[C(0), A(0), ..., C(L-1), A(L-1), C(L)]``, the
contract in ``pipert.models.helix`` and docs/helixpipe.md.

The GPT-style model (``GPTModel``) is cut the same ways; its first unit also holds the
position table ``pos``. ``recompute`` (``none``, ``no_attention``, ``full``) makes every unit
of a built-in model run under selective checkpointing (``pipert.models.recompute``).

Every unit class names its ``kind`` (``layers``, ``pre_attn``, ``attn``, ``post_attn``,
``helix_param``, ``helix_attn``, ``modules``) for cost models.

Every cut of a built-in model shards for tensor parallelism (``pipert.models.tpshard``): q, k, v
and the attention output ``o`` that units pass are then the TP rank's heads (1/T of the bytes).

User modules (``nn.Sequential`` or a list of modules, plus ``loss_fn(output, targets)``):
``num_units`` contiguous, non-empty groups, applied in order to one tensor; the last unit
applies ``loss_fn``. ``balance="count"``: group sizes differ by at most one (first groups
larger); ``balance="params"``: the split minimising the largest group's parameter count
(ties: the lexicographically smallest list of group sizes). Parameter names are
``{index}.{name}`` with the module's index in the full list (``nn.Sequential``'s names).

Tied embeddings: a tied LLaMA model can only be one unit (the weight would live in the
first and the last unit). Pipelined runs use untied models (``LlamaConfig.tie_embeddings``
is False by default; ``LlamaModel.untie()`` converts), and so does their reference.
"""
from __future__ import annotations

from typing import Callable, Sequence

from torch import Tensor, nn

from .common import DecoderModel, attention_core, embed_input, project_qkv
from .helix import HelixAttentionUnit, HelixUnit, helix_units
from .recompute import recompute_save_set
from .tp import enter, row_linear
from .unitbase import QKV, ModelUnit

__all__ = [
    "partition", "LlamaUnit", "PreAttentionUnit", "AttentionUnit", "PostAttentionUnit",
    "SequentialUnit", "HelixUnit", "HelixAttentionUnit", "LossFn", "CUTS", "check_unit_count",
]

LossFn = Callable[[Tensor, Tensor], Tensor]
CUTS = ("layers", "fine", "helix")


class LlamaUnit(ModelUnit):
    """A chunk of decoder layers, with the embedding if first and norm + head + loss if last."""

    kind = "layers"

    def __init__(self, model: DecoderModel, layer_ids: Sequence[int], *, first: bool, last: bool) -> None:
        super().__init__()
        self.embed = model.embed if first else None
        self.pos = model.pos if first else None
        self.layers = nn.ModuleDict({str(i): model.layers[i] for i in layer_ids})
        self.norm = model.norm if last else None
        self.head = model.head if last else None  # None with a tied model: the unit is also first
        self.is_last = last

    def body(self, x: Tensor, targets: Tensor | None = None) -> Tensor:
        x = self.trunk(x)
        return self.head_loss(x, targets) if self.is_last else x

    def trunk(self, x: Tensor) -> Tensor:
        if self.embed is not None:
            x = embed_input(x, self.embed, self.pos, self.tp)
        for layer in self.layers.values():
            x = layer(x)
        return x


class PreAttentionUnit(ModelUnit):
    """pre(l): ``x -> (x, q, k, v)``; with the embedding folded in for layer 0."""

    kind = "pre_attn"

    def __init__(self, model: DecoderModel, layer: int) -> None:
        super().__init__()
        src = model.layers[layer]
        part = nn.Module()
        part.attn_norm, part.attn = src.attn_norm, QKV(src.attn)
        self.embed = model.embed if layer == 0 else None
        self.pos = model.pos if layer == 0 else None
        self.layers = nn.ModuleDict({str(layer): part})
        self.layer_index = layer

    def body(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        if self.embed is not None:
            x = embed_input(x, self.embed, self.pos, self.tp)
        part = self.layers[str(self.layer_index)]
        q, k, v = project_qkv(part.attn, enter(self.tp, part.attn_norm(x)), part.attn.heads, part.attn.kv_heads)
        return x, q, k, v


class AttentionUnit(ModelUnit):
    """attn(l): ``(x, q, k, v) -> (x, o)``, causal grouped-query attention; no parameters.
    ``x`` is relayed (``relays``): passed through, not kept."""

    kind = "attn"
    relays = {0: 0}

    def __init__(self, layer: int) -> None:
        super().__init__()
        self.layer_index = layer

    def forward(self, xs: tuple[Tensor, Tensor, Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        x, q, k, v = xs
        return x, self.run_body(q, k, v)

    def body(self, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        return attention_core(q, k, v)


class PostAttentionUnit(ModelUnit):
    """post(l): ``(x, o) -> x + wo(o) + mlp(...)``; the last layer adds norm, head and loss."""

    kind = "post_attn"

    def __init__(self, model: DecoderModel, layer: int, *, last: bool) -> None:
        super().__init__()
        src = model.layers[layer]
        part = nn.Module()
        part.attn = nn.Module()
        part.attn.wo = src.attn.wo
        part.mlp_norm, part.mlp = src.mlp_norm, src.mlp
        self.layers = nn.ModuleDict({str(layer): part})
        self.norm = model.norm if last else None
        self.head = model.head if last else None
        self.layer_index = layer

    def body(self, xs: tuple[Tensor, Tensor], targets: Tensor | None = None) -> Tensor:
        x = self.trunk(xs)
        return x if self.norm is None else self.head_loss(x, targets)

    def trunk(self, xs: tuple[Tensor, Tensor]) -> Tensor:
        x, o = xs
        part = self.layers[str(self.layer_index)]
        x = x + row_linear(self.tp, part.attn.wo, o)
        return x + part.mlp(part.mlp_norm(x))


class SequentialUnit(nn.Module):
    """A contiguous group of user modules; the last group also applies ``loss_fn``."""

    kind = "modules"

    def __init__(self, modules: Sequence[nn.Module], start: int, loss_fn: LossFn | None = None) -> None:
        super().__init__()
        self.order = [str(start + i) for i in range(len(modules))]
        for name, m in zip(self.order, modules):
            self.add_module(name, m)
        self.loss_fn = loss_fn  # registered as a submodule when it is an nn.Module

    def forward(self, x: Tensor, targets: Tensor | None = None) -> Tensor:
        for name in self.order:
            x = self._modules[name](x)
        if self.loss_fn is None or targets is None:
            return x
        return self.loss_fn(x, targets)


def _even_sizes(n: int, k: int) -> list[int]:
    return [n // k + (1 if i < n % k else 0) for i in range(k)]


def _param_balanced_sizes(weights: list[int], k: int) -> list[int]:
    """Contiguous split of ``weights`` into k non-empty groups minimising the largest sum."""
    n = len(weights)
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    inf = float("inf")
    # best[j][i]: smallest achievable max-sum splitting the first i items into j groups
    best = [[inf] * (n + 1) for _ in range(k + 1)]
    cut = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0
    for j in range(1, k + 1):
        for i in range(j, n - (k - j) + 1):
            for s in range(j - 1, i):  # last group is items s..i-1; smallest s wins ties
                cost = max(best[j - 1][s], prefix[i] - prefix[s])
                if cost < best[j][i]:
                    best[j][i], cut[j][i] = cost, s
    sizes, i = [], n
    for j in range(k, 0, -1):
        s = cut[j][i]
        sizes.append(i - s)
        i = s
    return sizes[::-1]


def _check_disjoint(units: list[nn.Module]) -> None:
    owner: dict[int, int] = {}
    for u, unit in enumerate(units):
        for name, p in unit.named_parameters():
            if id(p) in owner and owner[id(p)] != u:
                raise ValueError(f"parameter {name!r} is shared by units {owner[id(p)]} and {u}; "
                                 f"units must own disjoint parameters (untie shared weights first)")
            owner[id(p)] = u


def check_unit_count(schedule: str, num_units: int, model: str, layers: int, cut: str | None) -> None:
    """Raise ValueError when a schedule's ``num_units`` cannot be cut from a ``layers``-layer model."""
    cut = cut or "layers"
    want = {"fine": 3 * layers, "helix": 2 * layers + 1}.get(cut)
    if want is None and num_units > layers:
        raise ValueError(f"schedule {schedule} needs {num_units} units but model {model!r} has only {layers} layers; "
                         f"use fewer stages/chunks or a larger model")
    if want is not None and num_units != want:
        raise ValueError(f"schedule {schedule} needs {num_units} units but a {cut} cut of model {model!r} "
                         f"({layers} layers) gives {want}")


def _partition_model(model: DecoderModel, num_units: int | None, cut: str) -> list[nn.Module]:
    n_layers = len(model.layers)
    if model.head is None and (cut != "layers" or (num_units or 1) > 1):
        raise ValueError("a model with tied embeddings cannot be cut into several units: the weight "
                         "would live in the first and the last unit; build it with "
                         "tie_embeddings=False or call model.untie() first")
    expected = {"fine": 3 * n_layers, "helix": 2 * n_layers + 1}.get(cut)
    if expected is not None and num_units not in (None, expected):
        per = "3 per layer" if cut == "fine" else "2 per layer + 1"
        raise ValueError(f"{cut} partition of a {n_layers}-layer model has {expected} units ({per}), "
                         f"got num_units={num_units}")
    if cut == "helix":
        return helix_units(model)
    if cut == "fine":
        units: list[nn.Module] = []
        for l in range(n_layers):
            units += [PreAttentionUnit(model, l), AttentionUnit(l),
                      PostAttentionUnit(model, l, last=l == n_layers - 1)]
        return units
    if num_units is None:
        raise ValueError("cut='layers' needs num_units (the number of layer chunks)")
    if num_units > n_layers:
        raise ValueError(f"cannot cut {n_layers} layers into {num_units} units: "
                         f"more units ({num_units}) than layers ({n_layers})")
    units, start = [], 0
    for u, size in enumerate(_even_sizes(n_layers, num_units)):
        units.append(LlamaUnit(model, range(start, start + size), first=u == 0, last=u == num_units - 1))
        start += size
    return units


def partition(model_or_modules: DecoderModel | nn.Sequential | Sequence[nn.Module], num_units: int | None = None,
              *, fine: bool = False, cut: str | None = None, recompute: str = "none", loss_fn: LossFn | None = None,
              balance: str = "count") -> list[nn.Module]:
    """Cut a model into units following the contract in the module docstring.

    ``model_or_modules``: a built-in model (``LlamaModel``, ``GPTModel``), cut by ``cut``:
    ``"layers"`` (the default; ``num_units`` chunks of layers), ``"fine"`` (three units per
    layer; ``fine=True`` says the same) or ``"helix"`` (2L+1 units); ``num_units`` may be
    omitted for the last two. ``recompute`` (``pipert.models.recompute.RECOMPUTE_MODES``:
    ``none``, ``no_attention``, ``full``) makes every unit checkpoint its forward, keeping
    only what the mode names. ``loss_fn`` and ``balance`` do not apply to built-in models.
    Or an ``nn.Sequential`` / list of modules with ``loss_fn`` (``balance`` is ``"count"``
    or ``"params"``); no ``cut``, no ``recompute``.
    """
    if num_units is not None and num_units < 1:
        raise ValueError(f"num_units must be >= 1, got {num_units}")
    if fine and cut not in (None, "fine"):
        raise ValueError(f"fine=True and cut={cut!r} disagree; give one of them")
    cut = "fine" if fine else cut
    save = recompute_save_set(recompute)
    if isinstance(model_or_modules, DecoderModel):
        if loss_fn is not None or balance != "count":
            raise ValueError("loss_fn and balance apply to user modules; a built-in model brings its own "
                             "loss and is cut by layer count")
        if (cut or "layers") not in CUTS:
            raise ValueError(f"cut={cut!r}; allowed: {', '.join(CUTS)}")
        units = _partition_model(model_or_modules, num_units, cut or "layers")
        _check_disjoint(units)
        for u in units:
            u.save_ops = save
        return units
    if cut is not None or save is not None:
        raise ValueError("cut, fine and recompute apply to the built-in models (LlamaModel, GPTModel) only")
    if num_units is None:
        raise ValueError("partitioning user modules needs num_units")
    if loss_fn is None:
        raise ValueError("partitioning user modules needs loss_fn(output, targets) for the last unit")
    modules = list(model_or_modules)
    if not modules:
        raise ValueError("no modules to partition")
    if num_units > len(modules):
        raise ValueError(f"cannot cut {len(modules)} modules into {num_units} units: "
                         f"more units ({num_units}) than modules ({len(modules)})")
    if balance == "count":
        sizes = _even_sizes(len(modules), num_units)
    elif balance == "params":
        sizes = _param_balanced_sizes([sum(p.numel() for p in m.parameters()) for m in modules], num_units)
    else:
        raise ValueError(f"balance={balance!r}; allowed: 'count', 'params'")
    units, start = [], 0
    for u, size in enumerate(sizes):
        last = u == num_units - 1
        units.append(SequentialUnit(modules[start:start + size], start, loss_fn if last else None))
        start += size
    _check_disjoint(units)
    return units
