"""A LLaMA-style decoder-only transformer, small enough to train on a CPU in tests.

Pieces: RMSNorm, rotary position embedding (cos/sin tables precomputed per attention
module), grouped-query attention through ``scaled_dot_product_attention(is_causal=True)``
(``flash_attn`` when it imports and the inputs are CUDA fp16/bf16), a SwiGLU MLP that can
be swapped through ``mlp_factory``, an embedding, a final norm and an LM head (tied to the
embedding or not). The loss is the token-mean cross-entropy.

Layouts: hidden states ``[batch, seq, hidden]``; q ``[batch, seq, heads, head_dim]``;
k and v ``[batch, seq, kv_heads, head_dim]`` (the layout ``flash_attn`` takes).

Parameter names are stable and used across the package (references, checkpoints, units):
``embed.weight``, ``layers.{i}.attn_norm.weight``, ``layers.{i}.attn.{wq,wk,wv,wo}.weight``,
``layers.{i}.mlp_norm.weight``, ``layers.{i}.mlp.{w1,w3,w2}.weight``, ``norm.weight`` and,
when untied, ``head.weight``.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, fields, replace
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "LlamaConfig", "PRESETS", "RMSNorm", "Rotary", "Attention", "SwiGLU", "DecoderLayer",
    "LlamaModel", "MLPFactory", "attention_core", "project_qkv", "lm_loss", "apply_rope",
    "model_config", "build_model", "init_parameters", "param_seed",
]

try:  # optional fast path; used only for CUDA fp16/bf16 inputs
    from flash_attn import flash_attn_func as _flash_attn_func  # type: ignore
except Exception:  # noqa: BLE001 - any import failure means "not available"
    _flash_attn_func = None

_SDPA_HAS_GQA = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)
_DTYPES = {"float32": torch.float32, "float64": torch.float64,
           "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class LlamaConfig:
    """Shape and numerics of the model. ``LlamaConfig.preset(name, **overrides)`` builds one."""

    vocab: int = 256
    """Vocabulary size; 256 covers byte-level tokens (``pipert.data``)."""
    hidden: int = 64
    """Model width."""
    layers: int = 4
    """Number of decoder layers."""
    heads: int = 4
    """Query heads; must divide ``hidden``."""
    kv_heads: int = 2
    """Key/value heads (grouped-query attention); must divide ``heads``."""
    ffn: int = 176
    """Inner width of the SwiGLU MLP."""
    max_seq: int = 128
    """Longest sequence the rotary tables cover."""
    rope_theta: float = 10000.0
    """Rotary base frequency."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    tie_embeddings: bool = False
    """Use the embedding matrix as the LM head. Pipelined runs need it False (see partition)."""
    dtype: str = "float32"
    """Parameter dtype: float32, float64, bfloat16 or float16."""

    def __post_init__(self) -> None:
        for name in ("vocab", "hidden", "layers", "heads", "kv_heads", "ffn", "max_seq"):
            if getattr(self, name) < 1:
                raise ValueError(f"LlamaConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.hidden % self.heads:
            raise ValueError(f"LlamaConfig: heads={self.heads} must divide hidden={self.hidden}")
        if self.heads % self.kv_heads:
            raise ValueError(f"LlamaConfig: kv_heads={self.kv_heads} must divide heads={self.heads}")
        if self.head_dim % 2:
            raise ValueError(f"LlamaConfig: head_dim={self.head_dim} (hidden/heads) must be even for rotary")
        if self.dtype not in _DTYPES:
            raise ValueError(f"LlamaConfig.dtype={self.dtype!r}; allowed: {', '.join(_DTYPES)}")
        if self.rope_theta <= 0 or self.norm_eps <= 0:
            raise ValueError("LlamaConfig: rope_theta and norm_eps must be > 0")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def torch_dtype(self) -> torch.dtype:
        return _DTYPES[self.dtype]

    @classmethod
    def preset(cls, name: str, **overrides) -> "LlamaConfig":
        """The named preset with ``overrides`` applied (e.g. ``preset("tiny", dtype="float64")``)."""
        if name not in PRESETS:
            raise ValueError(f"unknown LlamaConfig preset {name!r}; allowed: {', '.join(PRESETS)}")
        known = {f.name for f in fields(cls)}
        bad = sorted(set(overrides) - known)
        if bad:
            raise ValueError(f"unknown LlamaConfig field(s) {bad}; allowed: {sorted(known)}")
        return replace(PRESETS[name], **overrides)


PRESETS: dict[str, LlamaConfig] = {
    "tiny": LlamaConfig(hidden=64, layers=4, heads=4, kv_heads=2, ffn=176, max_seq=128),
    "small": LlamaConfig(hidden=256, layers=8, heads=8, kv_heads=4, ffn=688, max_seq=512),
    "medium": LlamaConfig(hidden=768, layers=12, heads=12, kv_heads=4, ffn=2048, max_seq=1024),
    "large": LlamaConfig(hidden=2048, layers=16, heads=16, kv_heads=8, ffn=5632, max_seq=2048),
}

MLPFactory = Callable[[LlamaConfig], nn.Module]
"""Builds the MLP of one layer: a module mapping ``[b, s, hidden] -> [b, s, hidden]`` whose
parameters have dtype ``cfg.torch_dtype``. Replacements keep the parameter names ``w1`` (gate), ``w3`` (up), ``w2`` (down) so that
references and checkpoints compare by name."""


class RMSNorm(nn.Module):
    """``x / rms(x) * weight``; statistics in float32 (or float64 for float64 inputs)."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        xf = x if x.dtype == torch.float64 else x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return y.to(x.dtype) * self.weight


class Rotary(nn.Module):
    """Precomputed rotary tables ``cos``/``sin`` of shape ``[max_seq, head_dim/2]``.

    The tables are non-persistent buffers (not parameters, not in the state dict), float64
    for float64 models and float32 otherwise: a dtype cast of the module (``model.to(bf16)``)
    rebuilds them at that precision instead of rounding them.
    """

    def __init__(self, head_dim: int, max_seq: int, theta: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.head_dim, self.max_seq, self.theta = head_dim, max_seq, theta
        # on the default device: under ``torch.device("meta")`` the tables take no memory and
        # are computed when the module is materialised (``to_empty`` goes through ``_apply``)
        cos, sin = self._tables(torch.get_default_device(), dtype)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _tables(self, device: torch.device, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        table_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        # computed on the CPU whatever the default device, then placed on ``device``
        cpu = torch.device("cpu")
        inv = 1.0 / self.theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float64, device=cpu) / self.head_dim)
        ang = torch.outer(torch.arange(self.max_seq, dtype=torch.float64, device=cpu), inv)
        return ang.cos().to(device, table_dtype), ang.sin().to(device, table_dtype)

    def _apply(self, fn, recurse: bool = True):  # type: ignore[override]
        super()._apply(fn, recurse)
        self.cos, self.sin = self._tables(self.cos.device, self.cos.dtype)
        return self

    def forward(self, x: Tensor) -> Tensor:
        """Rotate ``x`` of shape ``[b, s, h, d]`` by position along dim 1."""
        s = x.shape[1]
        if s > self.cos.shape[0]:
            raise ValueError(f"sequence length {s} exceeds max_seq={self.cos.shape[0]}")
        return apply_rope(x, self.cos[:s], self.sin[:s])


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate pairs (first half, second half) of the last dim of ``x`` ``[b, s, h, d]``."""
    xf = x.to(cos.dtype)
    half = x.shape[-1] // 2
    x1, x2 = xf[..., :half], xf[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * c - x2 * s, x1 * s + x2 * c), dim=-1).to(x.dtype)


def project_qkv(attn: nn.Module, h: Tensor, heads: int, kv_heads: int) -> tuple[Tensor, Tensor, Tensor]:
    """q, k, v of normalised hidden states ``h``; ``attn`` has ``wq``, ``wk``, ``wv``, ``rope``."""
    b, s, _ = h.shape
    q = attn.wq(h).view(b, s, heads, -1)
    k = attn.wk(h).view(b, s, kv_heads, -1)
    v = attn.wv(h).view(b, s, kv_heads, -1)
    return attn.rope(q), attn.rope(k), v


def attention_core(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal grouped-query attention: q ``[b,s,H,d]``, k/v ``[b,s,Hkv,d]`` -> ``[b,s,H*d]``."""
    b, s, nh, d = q.shape
    fast = (_flash_attn_func is not None and q.is_cuda
            and q.dtype in (torch.float16, torch.bfloat16))
    if fast:
        o = _flash_attn_func(q, k, v, causal=True)
        return o.reshape(b, s, nh * d)
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if kt.shape[1] != nh:
        if _SDPA_HAS_GQA:
            o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True, enable_gqa=True)
            return o.transpose(1, 2).reshape(b, s, nh * d)
        rep = nh // kt.shape[1]
        kt, vt = kt.repeat_interleave(rep, dim=1), vt.repeat_interleave(rep, dim=1)
    o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
    return o.transpose(1, 2).reshape(b, s, nh * d)


class Attention(nn.Module):
    """Grouped-query self-attention with rotary embedding and no biases."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads = cfg.heads, cfg.kv_heads
        kv, dt = cfg.kv_heads * cfg.head_dim, cfg.torch_dtype
        self.wq = nn.Linear(cfg.hidden, cfg.hidden, bias=False, dtype=dt)
        self.wk = nn.Linear(cfg.hidden, kv, bias=False, dtype=dt)
        self.wv = nn.Linear(cfg.hidden, kv, bias=False, dtype=dt)
        self.wo = nn.Linear(cfg.hidden, cfg.hidden, bias=False, dtype=dt)
        self.rope = Rotary(cfg.head_dim, cfg.max_seq, cfg.rope_theta, cfg.torch_dtype)

    def forward(self, h: Tensor) -> Tensor:
        return self.wo(attention_core(*project_qkv(self, h, self.heads, self.kv_heads)))


class SwiGLU(nn.Module):
    """``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        dt = cfg.torch_dtype
        self.w1 = nn.Linear(cfg.hidden, cfg.ffn, bias=False, dtype=dt)
        self.w3 = nn.Linear(cfg.hidden, cfg.ffn, bias=False, dtype=dt)
        self.w2 = nn.Linear(cfg.ffn, cfg.hidden, bias=False, dtype=dt)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class DecoderLayer(nn.Module):
    """Pre-norm block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, cfg: LlamaConfig, mlp_factory: MLPFactory = SwiGLU) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden, cfg.norm_eps, cfg.torch_dtype)
        self.attn = Attention(cfg)
        self.mlp_norm = RMSNorm(cfg.hidden, cfg.norm_eps, cfg.torch_dtype)
        self.mlp = mlp_factory(cfg)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


def lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy over all tokens; half-precision logits are upcast to float32."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class LlamaModel(nn.Module):
    """The whole model. ``forward(tokens)`` -> logits; ``forward(tokens, targets)`` -> loss.

    Initialisation is a pure function of ``seed`` (independent of dtype up to rounding and
    of the global RNG): weights ~ N(0, 0.02), output projections (``wo``, ``w2``) scaled by
    ``1/sqrt(2 * layers)``, norm weights 1. Each parameter is drawn from its own generator,
    seeded by ``(seed, name)`` (:func:`param_seed`), so any subset of the parameters - one
    pipeline unit - can be initialised alone with the values the whole model gets.

    Built under ``torch.device("meta")`` the model holds no memory and is not initialised;
    ``pipert.models.materialize`` allocates and initialises the units a process needs.
    """

    def __init__(self, cfg: LlamaConfig, *, seed: int = 0, mlp_factory: MLPFactory | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        factory, dt = mlp_factory or SwiGLU, cfg.torch_dtype
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden, dtype=dt)
        self.layers = nn.ModuleList(DecoderLayer(cfg, factory) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.norm_eps, dt)
        self.head = None if cfg.tie_embeddings else nn.Linear(cfg.hidden, cfg.vocab, bias=False, dtype=dt)
        self.reset_parameters(seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int) -> None:
        """Deterministic init (see class docstring and :func:`init_parameters`); parameters on
        the meta device are left for materialisation (``pipert.models.materialize``)."""
        init_parameters(self.named_parameters(), seed=seed, layers=self.cfg.layers)

    def head_weight(self) -> Tensor:
        return self.embed.weight if self.head is None else self.head.weight

    def untie(self) -> None:
        """Give the head its own copy of the embedding matrix (needed to pipeline)."""
        if self.head is not None:
            return
        w = self.embed.weight
        self.head = nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device, dtype=w.dtype)
        with torch.no_grad():
            self.head.weight.copy_(w)
        self.cfg = replace(self.cfg, tie_embeddings=False)

    def forward(self, tokens: Tensor, targets: Tensor | None = None) -> Tensor:
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        logits = F.linear(self.norm(x), self.head_weight())
        return logits if targets is None else lm_loss(logits, targets)


def param_seed(seed: int, name: str) -> int:
    """The generator seed of parameter ``name`` (its name in the whole model) for model seed ``seed``."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


@torch.no_grad()
def init_parameters(named: Iterable[tuple[str, Tensor]], *, seed: int, layers: int) -> None:
    """Initialise parameters given by their names in the whole model (see ``LlamaModel``).

    Invariant: the value of a parameter depends only on ``seed``, its name, shape and dtype,
    and ``layers`` - not on which other parameters are initialised with it or in what order.
    Values are drawn in float32 on the CPU and copied (rounded) into the parameter; meta
    tensors are skipped.
    """
    out_std = 0.02 / math.sqrt(2 * layers)
    for name, p in named:
        if p.is_meta:
            continue
        if name.endswith("norm.weight"):
            p.fill_(1.0)
            continue
        std = out_std if name.endswith(("wo.weight", "w2.weight")) else 0.02
        gen = torch.Generator().manual_seed(param_seed(seed, name))
        p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32, device="cpu") * std)


def model_config(name: str, **overrides) -> LlamaConfig:
    """The preset ``name`` with ``overrides`` (same as ``LlamaConfig.preset``)."""
    return LlamaConfig.preset(name, **overrides)


def build_model(name: str, *, seed: int = 0, mlp_factory: MLPFactory | None = None, **overrides) -> LlamaModel:
    """``LlamaModel(model_config(name, **overrides), seed=seed, mlp_factory=mlp_factory)``."""
    return LlamaModel(model_config(name, **overrides), seed=seed, mlp_factory=mlp_factory)
