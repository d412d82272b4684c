"""Analytic cost model of a LLaMA-style decoder (RMSNorm, RoPE, GQA attention, SwiGLU MLP).

Everything is per micro-batch of ``b = micro_batch`` sequences of ``s = seq`` tokens,
``T = b*s``, hidden ``h``, ``kv = kv_heads*head_dim``, FFN width ``f``, vocab ``V``,
``a`` heads and ``B = dtype_bytes``. Times are seconds, sizes bytes.

A layer has three parts, which are also the fine units (HelixPipe's split):
``pre_attn`` (RMSNorm, QKV projection, RoPE), ``attn`` (the core softmax(QK^T)V, no
weights) and ``post_attn`` (out projection, residual, RMSNorm, MLP, residual). The
embedding lives in the first unit, the final norm + LM head + cross-entropy in the last.

FLOPs (forward): weight matmuls ``2*T*params``; attention core ``4*b*s^2*h``, halved when
``causal and flash`` (FlashAttention skips masked blocks; a materialised score matrix is
computed in full and then masked). Backward: D (input grad) repeats the weight-matmul
FLOPs and does the whole attention backward (``2x`` its forward, ``2.5x`` with flash,
which recomputes QK^T); W (weight grad) repeats the weight-matmul FLOPs; ``B = D + W``;
``RECOMPUTE = F``. Time = FLOPs / (peak * efficiency) plus, with ``elementwise=True``,
the bytes of the elementwise kernels (norms, RoPE, activation, residuals, softmax or the
flash I/O, embedding gather, cross-entropy) / memory bandwidth, added because they are
separate kernels that do not overlap the GEMMs; D moves twice the forward bytes, W none
except the embedding's scatter-add. ``OPT`` = params * ``opt_bytes_per_param`` / bandwidth.

Saved activations (``stash``) follow Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models"), tensor by tensor, generalised to GQA, gated
MLPs and optional dropout; for a GPT layer (ffn = 4h, MHA, dropout, 2-byte activations,
no flash) it is exactly ``s*b*h*(34 + 5*a*s/h)``; with flash the ``a*s^2`` terms become
the attention output plus its fp32 log-sum-exp (``34*s*b*h + 4*a*s*b``). ``stash_w``
(kept from D until W) is the input and output-gradient of every weight matmul, which is
``32*s*b*h`` for the GPT layer, as in the Zero Bubble paper (Qi et al. 2023). For fine
units it can exceed ``stash`` (the QKV output-gradient is wider than the saved inputs).
"""
from __future__ import annotations

import numbers
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping, Sequence

from ..ir.action import Action, Op, Payload
from .devices import DeviceSpec, _replace
from .modes import RECOMPUTE_MODES
from .tensor_parallel import PHASES, collectives_time, piece_collectives, tp_divisors, tp_problem
from .topology import LinkSpec

__all__ = [
    "ModelSpec", "MODEL_PRESETS", "PAPER_LAYERS", "UnitSpec", "UNIT_KINDS", "TransformerCost",
    "partition_layers", "partition_fine", "partition_helix", "RECOMPUTE_MODES", "swiglu_ffn", "llama_like", "paper_model",
]

UNIT_KINDS = ("layers", "pre_attn", "attn", "post_attn", "helix_c", "helix_a")
_PARTS = ("pre_attn", "attn", "post_attn")
_FINE = {"pre_attn": ("norm1", "qkv")}   # a piece that is the sum of finer pieces (chain checks)
_LSE_BYTES = 4     # flash attention's log-sum-exp is fp32, one per (token, head)
_ID_BYTES = 8      # token ids are int64


def _positive_int(obj: Any, name: str) -> None:
    v = getattr(obj, name)
    if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v <= 0:
        raise ValueError(f"{type(obj).__name__}.{name}={v!r}: must be a positive integer")


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a LLaMA-style decoder and of one micro-batch."""

    layers: int
    """Number of decoder layers."""
    hidden: int
    """Model width h."""
    ffn: int
    """MLP inner width f."""
    heads: int
    """Query heads a; must divide ``hidden``."""
    kv_heads: int
    """Key/value heads (GQA); must divide ``heads``."""
    vocab: int
    """Vocabulary size V."""
    seq: int
    """Tokens per sequence s."""
    micro_batch: int = 1
    """Sequences per micro-batch b."""
    dtype_bytes: int = 2
    """Bytes per element of weights, activations and messages (2 = bf16/fp16, 8 = the
    float64 CPU test runs)."""
    tied_embedding: bool = False
    """LM head shares the embedding matrix (counted once in ``num_params``; a unit that
    holds the embedding or the head holds its own copy)."""
    flash: bool = True
    """FlashAttention: no s x s score matrix is stored, and causal masking halves its FLOPs."""
    causal: bool = True
    """Causal attention mask (only saves FLOPs together with ``flash``)."""
    gated_mlp: bool = True
    """SwiGLU MLP (three f x h matrices); False = GeLU MLP with two (GPT)."""
    dropout: bool = False
    """Dropout after attention softmax and both residual branches (GPT); LLaMA has none."""
    positions: bool = False
    """Learned absolute position embeddings (GPT; ``pipert.models.gpt``'s ``pos.weight``): a
    ``[seq, h]`` table beside the token embedding, split over the TP group as the vocabulary is
    (HelixPipe's section 4.6, applied to every method); LLaMA's rotary positions have none."""

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "ffn", "heads", "kv_heads", "vocab", "seq", "micro_batch"):
            _positive_int(self, name)
        if self.dtype_bytes not in (1, 2, 4, 8):
            raise ValueError(f"ModelSpec.dtype_bytes={self.dtype_bytes!r}: allowed 1, 2, 4, 8")
        if self.hidden % self.heads:
            raise ValueError(f"ModelSpec.heads={self.heads} must divide hidden={self.hidden}; "
                             f"allowed: {_divisors(self.hidden)}")
        if self.heads % self.kv_heads:
            raise ValueError(f"ModelSpec.kv_heads={self.kv_heads} must divide heads={self.heads}; "
                             f"allowed: {_divisors(self.heads)}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): ``kv_heads * head_dim``."""
        return self.kv_heads * self.head_dim

    @property
    def tokens(self) -> int:
        """Tokens per micro-batch T = b*s."""
        return self.micro_batch * self.seq

    @property
    def params_per_layer(self) -> int:
        return _pre_params(self) + _post_params(self)

    @property
    def num_params(self) -> int:
        """Parameters of the whole model (a tied embedding counted once)."""
        emb = self.vocab * self.hidden
        pos = self.seq * self.hidden if self.positions else 0
        return self.layers * self.params_per_layer + emb + pos + self.hidden + (0 if self.tied_embedding else emb)

    @classmethod
    def from_config(cls, cfg: Any, seq: int, micro_batch: int = 1, **overrides: Any) -> "ModelSpec":
        """The spec of a ``pipert.models.llama.LlamaConfig`` (or any object with its fields)."""
        dtype = str(getattr(cfg, "dtype", "bfloat16")).removeprefix("torch.")
        nbytes = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2}.get(dtype, 2)
        kw: dict[str, Any] = dict(layers=cfg.layers, hidden=cfg.hidden, ffn=cfg.ffn, heads=cfg.heads,
                                  kv_heads=cfg.kv_heads, vocab=cfg.vocab, seq=seq, micro_batch=micro_batch,
                                  dtype_bytes=nbytes, tied_embedding=bool(getattr(cfg, "tie_embeddings", False)))
        return _replace(cls(**kw), overrides)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "ModelSpec":
        """A copy of ``MODEL_PRESETS[name]`` with fields replaced, e.g. ``preset('7b', seq=8192)``."""
        if name not in MODEL_PRESETS:
            raise ValueError(f"unknown model preset {name!r}; allowed: {', '.join(MODEL_PRESETS)}")
        return _replace(MODEL_PRESETS[name], overrides)


def _pre_params(m: ModelSpec) -> int:
    return m.hidden + m.hidden * (m.hidden + 2 * m.kv_dim)


def _post_params(m: ModelSpec) -> int:
    return m.hidden * m.hidden + m.hidden + m.hidden * m.ffn * (3 if m.gated_mlp else 2)


MODEL_PRESETS: dict[str, ModelSpec] = {
    "tiny": ModelSpec(layers=4, hidden=256, ffn=688, heads=4, kv_heads=4, vocab=256, seq=128),
    # TinyLlama-1.1B (GQA: 32 query heads, 4 KV heads).
    "1b": ModelSpec(layers=22, hidden=2048, ffn=5632, heads=32, kv_heads=4, vocab=32000, seq=2048),
    "7b": ModelSpec(layers=32, hidden=4096, ffn=11008, heads=32, kv_heads=32, vocab=32000, seq=4096),
    "13b": ModelSpec(layers=40, hidden=5120, ffn=13824, heads=40, kv_heads=40, vocab=32000, seq=4096),
    "70b": ModelSpec(layers=80, hidden=8192, ffn=28672, heads=64, kv_heads=8, vocab=32000, seq=4096),
    # HelixPipe's GPT-3-style models (pipert.models.gpt presets of the same names: GeLU MLP of 4h,
    # multi-head attention, GPT-2's vocabulary padded to 50304 as Megatron pads it)
    "gpt-1.3b": ModelSpec(layers=24, hidden=2048, ffn=8192, heads=16, kv_heads=16, vocab=50304, seq=2048,
                          gated_mlp=False, positions=True),
    "gpt-3b": ModelSpec(layers=16, hidden=4096, ffn=16384, heads=32, kv_heads=32, vocab=50304, seq=2048,
                        gated_mlp=False, positions=True),
    "gpt-7b": ModelSpec(layers=32, hidden=4096, ffn=16384, heads=32, kv_heads=32, vocab=50304, seq=2048,
                        gated_mlp=False, positions=True),
    # PipeMesh's Table III models (pipert.planner.workload.PAPER_MODELS): GPT-3 with dropout; Llama2
    # with its 8h/3 MLP rounded up to a multiple of 256 (LLaMA's rule) so that T = 8 splits it
    "gpt3-58b": ModelSpec(layers=72, hidden=8192, ffn=32768, heads=64, kv_heads=64, vocab=50304, seq=3072,
                          gated_mlp=False, dropout=True),
    "llama2-55b": ModelSpec(layers=80, hidden=8192, ffn=22016, heads=64, kv_heads=8, vocab=32000, seq=4096),
}

# Layer counts of the weight-passing papers' models (WeiPipe: L=32, TawPipe: L=48).
PAPER_LAYERS: dict[str, int] = {"weipipe": 32, "tawpipe": 48}


def swiglu_ffn(hidden: int, multiple_of: int = 32) -> int:
    """LLaMA's SwiGLU width: ``int(8*hidden/3)`` rounded up to a multiple of ``multiple_of``."""
    f = int(2 * (4 * hidden) / 3)
    return multiple_of * ((f + multiple_of - 1) // multiple_of)


def llama_like(hidden: int, layers: int, *, heads: int = 32, kv_heads: int | None = None,
               vocab: int = 32000, seq: int = 4096, multiple_of: int = 32, **overrides: Any) -> ModelSpec:
    """A LLaMA-shaped model of width ``hidden``: SwiGLU ffn from ``swiglu_ffn``, MHA unless ``kv_heads``."""
    kw = dict(layers=layers, hidden=hidden, ffn=swiglu_ffn(hidden, multiple_of), heads=heads,
              kv_heads=heads if kv_heads is None else kv_heads, vocab=vocab, seq=seq)
    kw.update(overrides)
    names = {f.name for f in fields(ModelSpec)}
    bad = [k for k in kw if k not in names]
    if bad:
        raise ValueError(f"unknown ModelSpec field(s) {', '.join(bad)}; allowed: {', '.join(sorted(names))}")
    return ModelSpec(**kw)


def paper_model(paper: str, hidden: int, seq: int = 4096, micro_batch: int | None = None,
                **overrides: Any) -> ModelSpec:
    """The WeiPipe / TawPipe models: 32 heads, V=32000, SwiGLU ffn rounded to 32, L from
    ``PAPER_LAYERS``. Both papers keep ``micro_batch*seq = 65536`` tokens, the default
    micro-batch; TawPipe's code ties the embedding, WeiPipe's Llama-2 model does not."""
    if paper not in PAPER_LAYERS:
        raise ValueError(f"unknown paper {paper!r}; allowed: {', '.join(PAPER_LAYERS)}")
    mb = max(1, 65536 // seq) if micro_batch is None else micro_batch
    kw: dict[str, Any] = dict(micro_batch=mb, tied_embedding=(paper == "tawpipe"))
    kw.update(overrides)
    return llama_like(hidden, PAPER_LAYERS[paper], seq=seq, **kw)


# --------------------------------------------------------------------------------------
# Units and partitions
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class UnitSpec:
    """What one unit of the chain computes."""

    kind: str
    """One of UNIT_KINDS: ``layers`` (whole decoder layers), one part of one layer, or a
    HelixPipe unit: ``helix_a`` = A(l) (QKV projection + attention core of ``layers[0]``),
    ``helix_c`` = C(l) (post-attention of ``layers[0]`` + the input norm of ``layers[1]``; with
    ``embed``: embedding + input norm of ``layers[0]``; with ``head``: post-attention of
    ``layers[0]`` + final norm, head and loss)."""
    layers: tuple[int, ...] = ()
    """Layer indices, ascending; exactly one for a part kind and ``helix_a``; may be empty for a
    ``layers`` unit that holds only the embedding or the head."""
    embed: bool = False
    """Holds the token embedding (runs before its layers)."""
    head: bool = False
    """Holds the final norm, LM head and loss (runs after its layers)."""

    def __post_init__(self) -> None:
        if self.kind not in UNIT_KINDS:
            raise ValueError(f"UnitSpec.kind={self.kind!r}; allowed: {', '.join(UNIT_KINDS)}")
        if not isinstance(self.layers, tuple):
            object.__setattr__(self, "layers", tuple(self.layers))
        if self.kind == "helix_c":
            want = 1 if self.embed or self.head else 2
            if len(self.layers) != want or (self.embed and self.head):
                raise ValueError(f"UnitSpec.layers={self.layers}: a helix_c unit names two layers (l-1, l), or one "
                                 f"with embed (C(0)) or head (C(L)), not both")
        elif self.kind != "layers" and len(self.layers) != 1:
            raise ValueError(f"UnitSpec.layers={self.layers}: a {self.kind!r} unit covers exactly one layer")
        if not self.layers and not (self.embed or self.head):
            raise ValueError("UnitSpec.layers is empty: a unit needs layers, the embedding or the head")
        if any(isinstance(l, bool) or not isinstance(l, numbers.Integral) or l < 0 for l in self.layers):
            raise ValueError(f"UnitSpec.layers={self.layers}: layer indices must be integers >= 0")

    def parts(self) -> list[tuple[str, int]]:
        """The unit's pieces in execution order: ("embed", -1), (part, layer)..., ("head", -1)."""
        out: list[tuple[str, int]] = [("embed", -1)] if self.embed else []
        if self.kind == "helix_a":
            out += [("qkv", self.layers[0]), ("attn", self.layers[0])]
        elif self.kind == "helix_c":
            out += [("norm1", self.layers[0])] if self.embed else [("post_attn", self.layers[0])]
            out += [("norm1", self.layers[1])] if len(self.layers) == 2 else []
        else:
            kinds = _PARTS if self.kind == "layers" else (self.kind,)
            out += [(p, l) for l in self.layers for p in kinds]
        if self.head:
            out.append(("head", -1))
        return out


def partition_layers(model: ModelSpec, num_units: int, sizes: Sequence[int] | None = None) -> list[UnitSpec]:
    """Split the layers into ``num_units`` contiguous ``layers`` units.

    Default sizes follow ``pipert.models.partition`` (so costs describe the units the
    runtime builds): counts differ by at most one and the first ``L mod n`` units get the
    spare layer. The embedding (unit 0) costs no GEMM FLOPs, the head (last unit) about
    ``hV/params_per_layer`` of a layer (~0.65 at 7B) and never gets a spare layer; nothing
    else compensates for it. Pass ``sizes`` (layers per unit) for any other split.
    """
    n = num_units
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or not 1 <= n <= model.layers:
        raise ValueError(f"num_units={n!r}: allowed 1..{model.layers} (one layer per unit at least)")
    if sizes is None:
        sizes = [model.layers // n + (1 if u < model.layers % n else 0) for u in range(n)]
    sizes = list(sizes)
    if len(sizes) != n or sum(sizes) != model.layers or min(sizes) < 1:
        raise ValueError(f"sizes={sizes}: allowed {n} positive layer counts summing to layers={model.layers}")
    units, start = [], 0
    for u, k in enumerate(sizes):
        units.append(UnitSpec("layers", tuple(range(start, start + k)), embed=(u == 0), head=(u == n - 1)))
        start += k
    return units


def partition_fine(model: ModelSpec) -> list[UnitSpec]:
    """Three units per layer (pre_attn, attn, post_attn); embedding on the first pre_attn,
    head on the last post_attn."""
    last = model.layers - 1
    return [UnitSpec(p, (l,), embed=(l == 0 and p == "pre_attn"), head=(l == last and p == "post_attn"))
            for l in range(model.layers) for p in _PARTS]


def partition_helix(model: ModelSpec) -> list[UnitSpec]:
    """HelixPipe's 2L+1 units ``[C(0), A(0), C(1), ..., A(L-1), C(L)]``
    (``pipert.schedules.helixpipe``)."""
    L = model.layers
    out = [UnitSpec("helix_c", (0,), embed=True)]
    for l in range(L):
        out.append(UnitSpec("helix_a", (l,)))
        out.append(UnitSpec("helix_c", (l,), head=True) if l == L - 1 else UnitSpec("helix_c", (l, l + 1)))
    return out


# --------------------------------------------------------------------------------------
# Per-piece accounting
# --------------------------------------------------------------------------------------

@dataclass
class _Piece:
    """Per-micro-batch costs of one piece (or a sum of pieces)."""

    params: float = 0.0
    mm: float = 0.0        # forward weight-matmul FLOPs; D and W each repeat them
    attn: float = 0.0      # forward attention-core FLOPs; their backward is all in D
    ew_f: float = 0.0      # elementwise bytes moved in F
    ew_d: float = 0.0      # ... in D
    ew_w: float = 0.0      # ... in W
    stash: float = 0.0     # saved by F for backward
    stash_w: float = 0.0   # kept from D until W
    rerun_mm: float = 0.0  # matmul FLOPs a D reruns first (recomputation without attention)

    def __iadd__(self, o: "_Piece") -> "_Piece":
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(o, f.name))
        return self


def _pieces(m: ModelSpec, tp: int = 1, sp: bool = False) -> dict[str, _Piece]:
    """Per-device costs of each piece under ``tp``-way tensor parallelism (Megatron's split:
    weights, heads, the MLP width and the vocabulary over the group, so their FLOPs, weights and
    tensors take ``ks = 1/tp``); the ``[T, h]`` tensors outside attention and the MLP (norms,
    residuals, dropout masks, the QKV and MLP inputs) are whole on every device unless ``sp``
    shards the sequence (``kr``). Norm weights are whole on every device (Korthikanti's Table 2:
    ``sbh(10 + 24/t + 5as/(ht))`` with TP, ``sbh/t (34 + 5as/h)`` with TP + SP)."""
    T, h, kv, f, V, B = m.tokens, m.hidden, m.kv_dim, m.ffn, m.vocab, m.dtype_bytes
    a, s, b = m.heads, m.seq, m.micro_batch
    ks = 1.0 / tp                                    # split over the group
    kr = ks if sp else 1.0                           # whole on every device unless SP
    th = T * h * B                                   # bytes of one [T, h] tensor
    drop_mask = T * h if m.dropout else 0            # 1-byte masks of the residual dropouts
    # pre_attn = norm1 (saves its input) + qkv (saves its input; RoPE rewrites q and k).
    norm1 = _Piece(params=h, ew_f=2 * th * kr, ew_d=4 * th * kr, stash=th * kr)
    ew = 2 * T * (h + kv) * B * ks
    proj = _Piece(params=h * (h + 2 * kv) * ks, mm=2 * T * h * (h + 2 * kv) * ks, ew_f=ew, ew_d=2 * ew,
                  stash=th * kr, stash_w=th * kr + T * (h + 2 * kv) * B * ks)
    pre = _Piece()
    pre += norm1
    pre += proj
    # attn core: saves Q, K, V and either (O, lse) or the probabilities (+ dropout mask/output).
    scores = b * a * s * s
    qkv = T * (h + 2 * kv) * B
    if m.flash:
        flops = 4 * b * s * s * h * (0.5 if m.causal else 1.0)
        stash, ew = qkv + th + T * a * _LSE_BYTES, qkv + th
    else:
        flops = 4 * b * s * s * h
        stash = qkv + scores * B + (scores * (1 + B) if m.dropout else 0)
        ew = 2 * scores * B + ((2 * scores * B + scores) if m.dropout else 0)
    attn = _Piece(attn=flops * ks, ew_f=ew * ks, ew_d=2 * ew * ks, stash=stash * ks)
    # post_attn: out-proj input (split), norm2 input, MLP input, activation inputs + down-proj input.
    nmat = 3 if m.gated_mlp else 2
    act_saved = T * f * B * nmat                      # gate+up+down-input, or fc1-out+fc2-in
    ew = (2 * 3 * th + 2 * th + (2 * (2 * th + T * h) if m.dropout else 0)) * kr + \
        T * f * B * (3 if m.gated_mlp else 2) * ks
    post = _Piece(params=(_post_params(m) - h) * ks + h, mm=(2 * T * h * h + 2 * T * h * f * nmat) * ks, ew_f=ew,
                  ew_d=2 * ew, stash=th * ks + 2 * th * kr + act_saved * ks + 2 * drop_mask * kr,
                  stash_w=3 * th * kr + (th + T * f * B * nmat) * ks)
    # the embedding's lookup writes a whole [T, h] (partial sums) on every device before the reduction;
    # learned positions add their rows to it (read + write) and their gradient rows to the table in W
    pos = 2 * th if m.positions else 0.0
    embed = _Piece(params=(V + (s if m.positions else 0)) * h * ks, ew_f=2 * th + pos, ew_w=2 * th + pos,
                   stash=T * _ID_BYTES, stash_w=T * _ID_BYTES + th)
    ew = 2 * th * kr + 2 * T * V * B * ks
    head = _Piece(params=h + V * h * ks, mm=2 * T * h * V * ks, ew_f=ew, ew_d=2 * ew,
                  stash=2 * th * kr + T * V * B * ks, stash_w=th * kr + T * V * B * ks)
    return {"embed": embed, "pre_attn": pre, "norm1": norm1, "qkv": proj, "attn": attn, "post_attn": post,
            "head": head}


def _check_chain(m: ModelSpec, units: list[UnitSpec]) -> None:
    """Units, read in order, must run embed?, every (part, layer) once in order, head?."""
    got = [(u, (q, l)) for u, spec in enumerate(units) for p, l in spec.parts() for q in _FINE.get(p, (p,))]
    parts = [p for _, p in got]
    want = [("embed", -1)] if ("embed", -1) in parts else []
    want += [(q, l) for l in range(m.layers) for p in _PARTS for q in _FINE.get(p, (p,))]
    want += [("head", -1)] if ("head", -1) in parts else []
    for i, (w, g) in enumerate(zip(want, got)):
        if w != g[1]:
            raise ValueError(f"unit {g[0]} ({units[g[0]]}) runs {g[1]} where the chain needs {w}: units must "
                             f"cover layers 0..{m.layers - 1} in order, each part once, embed first, head last")
    if len(want) != len(got):
        extra = f"extra piece {got[len(want)][1]}" if len(got) > len(want) else f"missing {want[len(got)]}"
        raise ValueError(f"units do not cover the model exactly: {extra}")


# --------------------------------------------------------------------------------------
# The cost model
# --------------------------------------------------------------------------------------

@dataclass
class TransformerCost:
    """CostModel of a LLaMA-style model cut into ``units`` (seconds and bytes)."""

    model: ModelSpec
    """Model and micro-batch shape."""
    device: DeviceSpec
    """Device of every rank not in ``rank_devices``."""
    units: list[UnitSpec] | None = None
    """The chain of units; default: one ``layers`` unit per layer (``partition_layers``)."""
    elementwise: bool = True
    """Add elementwise-kernel bytes / memory bandwidth to GEMM time (see module doc)."""
    opt_bytes_per_param: float = 30.0
    """Optimizer-step traffic per parameter: AdamW with fp32 master, moments and gradient
    (4 tensors read, 3 written) plus a 16-bit weight copy written: 4*4 + 3*4 + 2."""
    rank_devices: Mapping[int, DeviceSpec] = field(default_factory=dict)
    """Per-rank device overrides (heterogeneous clusters)."""
    recompute: str = "none"
    """One of RECOMPUTE_MODES. ``no_attention`` (HelixPipe's recomputation without attention,
    for ``layers`` and helix units): a unit keeps only its input and, per attention, the output
    and log-sum-exp; its D (and B) first reruns everything but the attention core."""
    tp: int = 1
    """Tensor-parallel size T: every rank of the program is a group of T devices of one node that
    runs each compute Megatron-style (``pipert.cost.tensor_parallel``): FLOPs, weights and the
    split tensors per device divide by T, the group's collectives add to the compute's time."""
    sp: bool = False
    """Sequence parallelism over the TP group: the norms, residuals and dropouts work on 1/T of
    the sequence, all-reduces become all-gathers + reduce-scatters, and every [T, h] tensor a
    unit keeps or sends (its boundary activation included) is 1/T of the bytes."""
    tp_link: LinkSpec | None = None
    """The link between the devices of a TP group (default: the preset intra-node link)."""
    loss_in_backward: bool = False
    """The LM head and cross-entropy run in the backward of the unit that holds them (HelixPipe's
    section 4, which the paper applies to its baselines too): their forward work and TP collectives
    move from that unit's F to its D (and B); its stash keeps the final norm's input (the trunk's
    output, as ``pipert.exec.unit.UnitRunner`` does) instead of the norm's output and the logits.
    With ``recompute="no_attention"`` the D's rerun of the forward already includes them, and that
    kept input is one more tensor beside the unit's inputs."""

    def __post_init__(self) -> None:
        if self.recompute not in RECOMPUTE_MODES:
            raise ValueError(f"TransformerCost.recompute={self.recompute!r}; allowed: {', '.join(RECOMPUTE_MODES)}")
        if self.units is None:
            self.units = partition_layers(self.model, self.model.layers)
        self.units = list(self.units)
        if not self.units:
            raise ValueError("TransformerCost.units is empty")
        for u, spec in enumerate(self.units):
            if not isinstance(spec, UnitSpec):
                raise ValueError(f"TransformerCost.units[{u}]={spec!r}: expected a UnitSpec")
        _check_chain(self.model, self.units)
        if not self.opt_bytes_per_param >= 0:
            raise ValueError(f"TransformerCost.opt_bytes_per_param={self.opt_bytes_per_param!r}: must be >= 0")
        _positive_int(self, "tp")
        problem = tp_problem(self.model, self.tp, self.sp)
        if problem:
            raise ValueError(f"TransformerCost.tp={self.tp}: {problem}; allowed: "
                             f"{', '.join(map(str, tp_divisors(self.model, self.sp)))}")
        self._ks = 1.0 / self.tp
        self._kr = self._ks if self.sp else 1.0
        pieces = _pieces(self.model, self.tp, self.sp)
        self._sums: list[_Piece] = []
        self._moved: list[_Piece] = []                 # forward work the loss-in-backward moves from F to D
        self._tp_time: list[dict[str, float]] = []     # seconds of the TP collectives per unit and phase
        dup_o = self.model.tokens * self.model.hidden * self.model.dtype_bytes * self._ks if self.model.flash else 0
        for spec in self.units:
            acc = _Piece()
            parts = spec.parts()
            times = {ph: collectives_time(self.collectives_of(spec, ph), self.tp, self.tp_link) for ph in PHASES}
            late = spec.head and self.loss_in_backward and self.tp > 1
            times["late"] = collectives_time(piece_collectives("head", self.model, self.sp)["F"], self.tp,
                                             self.tp_link) if late else 0.0
            times["F"] -= times["late"]
            self._tp_time.append(times)
            for p, l in parts:
                acc += pieces[p]
                if p == "post_attn" and ("attn", l) in parts:
                    acc.stash -= dup_o        # flash's saved O is the out-proj input: one tensor
            moved = self._loss_moved(spec, pieces["head"])
            acc.stash -= moved.stash
            if self.recompute == "no_attention":
                acc.stash = self._kept_no_attention(spec) + (self._head_input() if self.loss_in_backward and spec.head else 0.0)
                rerun = sum(pieces[p].ew_f for p, _ in parts if p != "attn")
                acc.ew_d += rerun
                acc.rerun_mm = acc.mm
            self._sums.append(acc)
            self._moved.append(moved)
        self._out_bytes = [self._output_bytes(spec) for spec in self.units]
        self._memo: dict[tuple, float] = {}

    def _loss_moved(self, spec: UnitSpec, head: _Piece) -> _Piece:
        """What the loss-in-backward takes out of ``spec``'s forward: the head's matmul and
        elementwise work, and from its stash the logits and the norm's output (nothing for a unit
        without the head, or with ``loss_in_backward`` off)."""
        if not (self.loss_in_backward and spec.head):
            return _Piece()
        logits = self.model.tokens * self.model.vocab * self.model.dtype_bytes * self._ks
        return _Piece(mm=head.mm, ew_f=head.ew_f, stash=logits + self._head_input())

    def _head_input(self) -> float:
        """Bytes of the final norm's input or output ([T, h], whole per device unless SP)."""
        return self.model.tokens * self.model.hidden * self.model.dtype_bytes * self._kr

    # --- per-unit quantities -------------------------------------------------------------
    @property
    def num_units(self) -> int:
        return len(self._sums)

    def _piece(self, unit: int) -> _Piece:
        if isinstance(unit, bool) or not isinstance(unit, numbers.Integral) or not 0 <= unit < len(self._sums):
            raise ValueError(f"unit={unit!r}: allowed 0..{len(self._sums) - 1}")
        return self._sums[unit]

    def params(self, unit: int) -> float:
        """Parameters held by ``unit`` (its own copy of a tied embedding)."""
        return self._piece(unit).params

    def flops(self, unit: int, op: Op | str) -> float:
        """FLOPs of ``op`` (F, B, D, W, RECOMPUTE) on ``unit`` for one micro-batch."""
        p, op = self._piece(unit), Op(op)
        k = 2.5 if self.model.flash else 2.0
        fwd, late = p.mm + p.attn - self._moved[unit].mm, self._late(unit).mm
        by_op = {Op.F: fwd, Op.RECOMPUTE: fwd, Op.D: p.rerun_mm + p.mm + k * p.attn + late,
                 Op.W: p.mm, Op.B: p.rerun_mm + 2 * p.mm + k * p.attn + late}
        if op not in by_op:
            raise ValueError(f"op={op.value!r} has no FLOPs; allowed: F, B, D, W, RECOMPUTE")
        return by_op[op]

    def elementwise_bytes(self, unit: int, op: Op | str) -> float:
        """Bytes moved by elementwise kernels of ``op`` on ``unit`` for one micro-batch."""
        p, op = self._piece(unit), Op(op)
        fwd, late = p.ew_f - self._moved[unit].ew_f, self._late(unit).ew_f
        by_op = {Op.F: fwd, Op.RECOMPUTE: fwd, Op.D: p.ew_d + late, Op.W: p.ew_w, Op.B: p.ew_d + p.ew_w + late}
        if op not in by_op:
            raise ValueError(f"op={op.value!r}; allowed: F, B, D, W, RECOMPUTE")
        return by_op[op]

    def _late(self, unit: int) -> _Piece:
        """The moved forward work a D (or B) runs besides its own: all of it, unless the D reruns
        the whole forward anyway (``recompute="no_attention"``)."""
        return _Piece() if self.recompute == "no_attention" else self._moved[unit]

    def unit_time(self, unit: int, op: Op | str, rank: int | None = None) -> float:
        """Seconds of ``op`` on ``unit`` for one micro-batch (OPT: one step of the unit), TP
        collectives included (:meth:`tp_comm_time`)."""
        dev = self.rank_devices.get(rank, self.device) if rank is not None else self.device
        op = Op(op)
        if op is Op.OPT:
            return self._piece(unit).params * self.opt_bytes_per_param / dev.mem_bandwidth
        t = self.flops(unit, op) / dev.flops
        if self.elementwise:
            t += self.elementwise_bytes(unit, op) / dev.mem_bandwidth
        return t + self.tp_comm_time(unit, op) if self.tp > 1 else t

    def collectives_of(self, spec: UnitSpec, phase: str) -> list[tuple[str, float]]:
        """(op, bytes) of every TP collective one micro-batch of ``spec`` runs in ``phase`` (F, D
        or W), in order (``pipert.cost.tensor_parallel.piece_collectives``); none when T = 1."""
        if self.tp == 1:
            return []
        return [c for p, _ in spec.parts() for c in piece_collectives(p, self.model, self.sp)[phase]]

    def tp_comm_time(self, unit: int, op: Op | str) -> float:
        """Seconds of the TP collectives of ``op`` on ``unit`` for one micro-batch: F and
        RECOMPUTE run the forward's, D and B the backward's (plus the forward's when D reruns
        the forward, ``recompute="no_attention"``), a split W under SP the gathers of its
        column-parallel inputs (B hides them behind its input-gradient GEMMs), OPT none."""
        self._piece(unit)
        op, t = Op(op), self._tp_time[unit]
        if op in (Op.F, Op.RECOMPUTE):
            return t["F"]
        if op in (Op.D, Op.B):   # the head's forward collectives run here once under loss_in_backward
            return t["D"] + t["late"] + (t["F"] if self.recompute == "no_attention" else 0.0)
        return t["W"] if op is Op.W else 0.0

    # --- CostModel protocol --------------------------------------------------------------
    def compute_time(self, action: Action, rank: int) -> float:
        """Duration of one micro-batch of a whole compute; 0 for memory and communication actions
        (as in UniformCost)."""
        if not action.is_compute:
            return 0.0
        key = (action.unit, action.op, rank)
        t = self._memo.get(key)
        if t is None:     # the model is fixed once built: each (unit, op, rank) is priced once
            if action.unit is None:
                raise ValueError(f"{action}: OPT needs a unit for an analytic cost model")
            t = self._memo[key] = self.unit_time(action.unit, action.op, rank)
        return t

    def _kept_no_attention(self, spec: UnitSpec) -> float:
        """What a unit keeps under recomputation without attention: its input (token ids for
        the first; the norm output for A(l), whose residual only passes through; residual and
        attention output for a helix C(l)) plus each attention's output and log-sum-exp."""
        m = self.model
        th = m.tokens * m.hidden * m.dtype_bytes
        if spec.kind not in ("layers", "helix_c", "helix_a"):
            raise ValueError(f"recompute='no_attention' is modelled for layers and helix units, not {spec.kind!r}")
        # the residual and the norm output are whole per device unless SP; the attention output
        # and log-sum-exp are split by heads
        kept = m.tokens * _ID_BYTES if spec.embed else \
            (th * (self._kr + self._ks) if spec.kind == "helix_c" else th * self._kr)
        n_attn = sum(1 for p, _ in spec.parts() if p == "attn")
        return kept + n_attn * (th + m.tokens * m.heads * _LSE_BYTES) * self._ks

    def _output_bytes(self, spec: UnitSpec) -> float:
        """Bytes of the unit's output for one micro-batch (the last piece decides):
        pre_attn sends q, k, v and the residual; attn sends its output and the residual; a helix
        C(l) (ending in the input norm) sends the norm output and the residual; everything else one
        [T, h] hidden state (nominal for the head, which sends nothing); per device of a TP group
        (q, k, v, o split by heads, the rest whole unless SP: the boundary activation under SP is
        the device's 1/T sequence shard). HelixPipe's messages per
        layer and micro-batch are so 2Th + 2Th activations and the QKV weight ``h(h+2kv)`` once per
        stage and step (``message_bytes(weight, A(l))``), gradients the same back."""
        m = self.model
        th = m.tokens * m.hidden * m.dtype_bytes
        ks, kr = self._ks, self._kr        # q, k, v and o are split by heads; the rest whole unless SP
        last = spec.parts()[-1][0]
        if last == "pre_attn":
            return th * kr + m.tokens * (m.hidden + 2 * m.kv_dim) * m.dtype_bytes * ks
        if last == "attn":
            return th * (ks + kr)
        if last == "norm1":
            return 2 * th * kr
        return th * kr

    def message_bytes(self, payload: Payload | str, unit: int, num_mbs: int = 1) -> float:
        """act/grad: output bytes x ``num_mbs``; weight/wgrad: params x dtype_bytes (any num_mbs)."""
        payload = Payload(payload)
        if isinstance(num_mbs, bool) or not isinstance(num_mbs, numbers.Integral) or num_mbs < 1:
            raise ValueError(f"num_mbs={num_mbs!r}: must be a positive integer")
        if payload in (Payload.ACT, Payload.GRAD):
            self._piece(unit)
            return self._out_bytes[unit] * num_mbs
        return self._piece(unit).params * self.model.dtype_bytes

    def memory(self, kind: str, unit: int) -> float:
        """Bytes of one value of ``kind`` (stash, stash_w, act, grad, weight, wgrad) of ``unit``."""
        p = self._piece(unit)
        if kind == "stash":
            return p.stash
        if kind == "stash_w":
            return p.stash_w
        if kind in ("act", "grad", "weight", "wgrad"):
            return self.message_bytes(kind, unit)
        raise ValueError(f"memory kind {kind!r}; allowed: stash, stash_w, act, grad, weight, wgrad")

    # --- reporting -----------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Model, device and per-unit F/B/D/W/OPT seconds, FLOPs and bytes, for printing."""
        rows = []
        for u, spec in enumerate(self.units):
            row: dict[str, Any] = {"unit": u, "kind": spec.kind, "layers": list(spec.layers),
                                   "embed": spec.embed, "head": spec.head, "params": self.params(u)}
            for op in ("F", "B", "D", "W", "OPT"):
                row[op] = self.unit_time(u, op)
            row["flops_F"] = self.flops(u, "F")
            row["tp_F"], row["tp_D"] = self.tp_comm_time(u, "F"), self.tp_comm_time(u, "D")
            for kind in ("act", "weight", "stash", "stash_w"):
                row[f"{kind}_bytes"] = self.memory(kind, u)
            rows.append(row)
        totals = {k: sum(r[k] for r in rows) for k in ("F", "B", "D", "W", "OPT", "params", "flops_F")}
        model = dict(asdict(self.model), num_params=self.model.num_params, tp=self.tp, sp=self.sp)
        return {"model": model, "device": asdict(self.device), "units": rows, "totals": totals}
