"""Pieces shared by the built-in decoder-only models (``llama.py``, ``gpt.py``).

Layouts: hidden states ``[batch, seq, hidden]``; q ``[batch, seq, heads, head_dim]``;
k and v ``[batch, seq, kv_heads, head_dim]`` (the layout ``flash_attn`` takes).

A model config (``LlamaConfig``, ``GPTConfig``) is read here through the fields both have:
``vocab``, ``hidden``, ``layers``, ``heads``, ``kv_heads``, ``head_dim``, ``max_seq``,
``norm_eps``, ``torch_dtype``, ``tie_embeddings``, ``mlp_chunk``, ``mlp_recompute``.

Parameter names (stable; references, checkpoints and units compare by them):
``embed.weight`` (``pos.weight`` with learned positions), ``layers.{i}.attn_norm.*``,
``layers.{i}.attn.{wq,wk,wv,wo}.*``, ``layers.{i}.mlp_norm.*``, ``layers.{i}.mlp.*``,
``norm.*`` and, when untied, ``head.weight``. Initialisation (``init_parameters``) is a
pure function of the seed and the parameter's name.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import replace
from typing import Any, Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..presets import DTYPE_NAMES, ConfigBase, check_config, preset_of  # noqa: F401  (re-exported)
from .tp import TensorParallel, enter, row_linear, seq_shard, vocab_embed, vocab_parallel_loss

__all__ = [
    "DTYPES", "ConfigBase", "RMSNorm", "Rotary", "apply_rope", "project_qkv", "attention_core", "Attention", "Block",
    "DecoderModel", "embed_input", "final_logits", "lm_loss", "param_seed", "init_parameters",
    "check_config", "preset_of",
]

try:  # optional fast path; used only for CUDA fp16/bf16 inputs
    from flash_attn import flash_attn_func as _flash_attn_func  # type: ignore
except Exception:  # noqa: BLE001 - any import failure means "not available"
    _flash_attn_func = None

_SDPA_HAS_GQA = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)
DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}
_OUT_PROJECTIONS = ("wo.weight", "w2.weight", "proj.weight")  # residual-branch outputs: std / sqrt(2L)


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
    """q, k, v of normalised hidden states ``h``; ``attn`` has ``wq``, ``wk``, ``wv`` and ``rope``
    (a ``Rotary``, or None for models with learned positions)."""
    b, s, _ = h.shape
    q = attn.wq(h).view(b, s, heads, -1)
    k = attn.wk(h).view(b, s, kv_heads, -1)
    v = attn.wv(h).view(b, s, kv_heads, -1)
    if attn.rope is None:
        return q, k, v
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
    """Grouped-query causal self-attention: ``wo(attention(rope(wq h), rope(wk h), wv h))``.

    ``bias`` gives the four projections biases (GPT); ``rotary=False`` leaves positions to the
    embedding (``rope`` is None then). With ``tp`` set (``pipert.models.tpshard``) the module holds
    its TP rank's heads: wq/wk/wv column-parallel, wo row-parallel (``pipert.models.tp``).
    """

    tp: TensorParallel | None = None

    def __init__(self, cfg: Any, *, bias: bool = False, rotary: bool = True) -> None:
        super().__init__()
        self.heads, self.kv_heads = cfg.heads, cfg.kv_heads
        kv, dt = cfg.kv_heads * cfg.head_dim, cfg.torch_dtype
        self.wq = nn.Linear(cfg.hidden, cfg.hidden, bias=bias, dtype=dt)
        self.wk = nn.Linear(cfg.hidden, kv, bias=bias, dtype=dt)
        self.wv = nn.Linear(cfg.hidden, kv, bias=bias, dtype=dt)
        self.wo = nn.Linear(cfg.hidden, cfg.hidden, bias=bias, dtype=dt)
        self.rope = Rotary(cfg.head_dim, cfg.max_seq, cfg.rope_theta, dt) if rotary else None

    def forward(self, h: Tensor) -> Tensor:
        o = attention_core(*project_qkv(self, enter(self.tp, h), self.heads, self.kv_heads))
        return row_linear(self.tp, self.wo, o)


class Block(nn.Module):
    """Pre-norm decoder layer: ``x + attn(attn_norm(x))``, then ``x + mlp(mlp_norm(x))``."""

    def __init__(self, attn_norm: nn.Module, attn: nn.Module, mlp_norm: nn.Module, mlp: nn.Module) -> None:
        super().__init__()
        self.attn_norm, self.attn, self.mlp_norm, self.mlp = attn_norm, attn, mlp_norm, mlp

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


def embed_input(tokens: Tensor, embed: nn.Embedding, pos: nn.Embedding | None,
                tp: TensorParallel | None = None) -> Tensor:
    """Token embedding, plus the learned position embedding of positions ``0..s-1`` if any; with
    ``tp`` the vocabulary-parallel embedding (under SP: this rank's sequence shard)."""
    x = vocab_embed(tp, tokens, embed)
    if pos is None:
        return x
    s = tokens.shape[-1]
    if s > pos.weight.shape[0]:
        raise ValueError(f"sequence length {s} exceeds max_seq={pos.weight.shape[0]}")
    return x + seq_shard(tp, pos.weight[:s], 0)


def final_logits(x: Tensor, norm: nn.Module, head_weight: Tensor) -> Tensor:
    return F.linear(norm(x), head_weight)


class DecoderModel(nn.Module):
    """The body both models share. ``forward(tokens)`` -> logits; ``forward(tokens, targets)`` -> loss.

    Subclasses set ``cfg``, ``embed``, ``pos`` (None without learned positions), ``layers``,
    ``norm`` and ``head`` (None when tied) and call ``reset_parameters(seed)``.

    Initialisation is a pure function of ``seed`` (independent of dtype up to rounding and
    of the global RNG): weights ~ N(0, 0.02), residual-branch output projections (``wo``,
    ``w2``, ``proj``) scaled by ``1/sqrt(2 * layers)``, norm weights 1, biases 0. Each
    parameter is drawn from its own generator, seeded by ``(seed, name)`` (:func:`param_seed`),
    so any subset of the parameters - one pipeline unit - can be initialised alone with the
    values the whole model gets. Built under ``torch.device("meta")`` the model holds no
    memory and is not initialised; ``pipert.models.materialize`` allocates the units a
    process needs.
    """

    @torch.no_grad()
    def reset_parameters(self, seed: int) -> None:
        """Deterministic init (class docstring); meta parameters are left for materialisation."""
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
        x = embed_input(tokens, self.embed, self.pos)
        for layer in self.layers:
            x = layer(x)
        logits = final_logits(x, self.norm, self.head_weight())
        return logits if targets is None else lm_loss(logits, targets)


def lm_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy over all tokens; half-precision logits are upcast to float32."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


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
        if name.endswith(".bias"):
            p.zero_()
            continue
        std = out_std if name.endswith(_OUT_PROJECTIONS) else 0.02
        gen = torch.Generator().manual_seed(param_seed(seed, name))
        p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float32, device="cpu") * std)
