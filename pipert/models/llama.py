"""A LLaMA-style decoder-only transformer, small enough to train on a CPU in tests.

Pieces: RMSNorm, rotary position embedding (cos/sin tables precomputed per attention
module), grouped-query attention through ``scaled_dot_product_attention(is_causal=True)``
(``flash_attn`` when it imports and the inputs are CUDA fp16/bf16), a SwiGLU MLP (the chunked
one of ``pipert.kernels`` with ``mlp_chunk > 0``; any other through ``mlp_factory``), an embedding, a final norm and an LM head (tied to the
embedding or not). The loss is the token-mean cross-entropy.

Layouts: hidden states ``[batch, seq, hidden]``; q ``[batch, seq, heads, head_dim]``;
k and v ``[batch, seq, kv_heads, head_dim]`` (the layout ``flash_attn`` takes).

Parameter names are stable and used across the package (references, checkpoints, units):
``embed.weight``, ``layers.{i}.attn_norm.weight``, ``layers.{i}.attn.{wq,wk,wv,wo}.weight``,
``layers.{i}.mlp_norm.weight``, ``layers.{i}.mlp.{w1,w3,w2}.weight``, ``norm.weight`` and,
when untied, ``head.weight``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .common import (DTYPES, Attention, Block, DecoderModel, RMSNorm, Rotary, apply_rope, attention_core,
                     check_config, init_parameters, lm_loss, param_seed, preset_of, project_qkv)

__all__ = [
    "LlamaConfig", "PRESETS", "RMSNorm", "Rotary", "Attention", "SwiGLU", "DecoderLayer",
    "LlamaModel", "MLPFactory", "attention_core", "project_qkv", "lm_loss", "apply_rope",
    "model_config", "build_model", "init_parameters", "param_seed", "default_mlp",
]


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

    mlp_chunk: int = 0
    """Token rows per chunk of the chunked SwiGLU MLP (``pipert.kernels``); 0: the plain MLP."""
    mlp_recompute: bool = False
    """Chunked MLP only: save just its input and recompute the pre-activations in backward."""

    def __post_init__(self) -> None:
        check_config(self, ("vocab", "hidden", "layers", "heads", "kv_heads", "ffn", "max_seq"))
        if self.heads % self.kv_heads:
            raise ValueError(f"LlamaConfig: kv_heads={self.kv_heads} must divide heads={self.heads}")
        if self.head_dim % 2:
            raise ValueError(f"LlamaConfig: head_dim={self.head_dim} (hidden/heads) must be even for rotary")
        if self.rope_theta <= 0:
            raise ValueError(f"LlamaConfig.rope_theta must be > 0, got {self.rope_theta}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]

    @classmethod
    def preset(cls, name: str, **overrides) -> "LlamaConfig":
        """The named preset with ``overrides`` applied (e.g. ``preset("tiny", dtype="float64")``)."""
        return preset_of(cls, PRESETS, name, overrides)


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


def default_mlp(cfg: LlamaConfig) -> nn.Module:
    """The layer MLP the config asks for: ``SwiGLU``, or with ``mlp_chunk > 0`` the chunked
    SwiGLU MLP of ``pipert.kernels`` (same parameter names, same function)."""
    if not cfg.mlp_chunk:
        return SwiGLU(cfg)
    from pipert.kernels import ChunkedSwiGLUMLP
    return ChunkedSwiGLUMLP(cfg.hidden, cfg.ffn, chunk_size=cfg.mlp_chunk, recompute=cfg.mlp_recompute,
                            dtype=cfg.torch_dtype)


class DecoderLayer(Block):
    """Pre-norm block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``; RMSNorm, rotary attention."""

    def __init__(self, cfg: LlamaConfig, mlp_factory: MLPFactory = default_mlp) -> None:
        dt = cfg.torch_dtype
        super().__init__(RMSNorm(cfg.hidden, cfg.norm_eps, dt), Attention(cfg),
                         RMSNorm(cfg.hidden, cfg.norm_eps, dt), mlp_factory(cfg))


class LlamaModel(DecoderModel):
    """The whole LLaMA-style model (``DecoderModel``: forward, initialisation, ``untie``)."""

    def __init__(self, cfg: LlamaConfig, *, seed: int = 0, mlp_factory: MLPFactory | None = None) -> None:
        super().__init__()
        if mlp_factory is not None and cfg.mlp_chunk:
            raise ValueError(f"mlp_factory and LlamaConfig.mlp_chunk={cfg.mlp_chunk} both choose the MLP; give one")
        self.cfg = cfg
        factory, dt = mlp_factory or default_mlp, cfg.torch_dtype
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden, dtype=dt)
        self.pos = None  # rotary positions, inside attention
        self.layers = nn.ModuleList(DecoderLayer(cfg, factory) for _ in range(cfg.layers))
        self.norm = RMSNorm(cfg.hidden, cfg.norm_eps, dt)
        self.head = None if cfg.tie_embeddings else nn.Linear(cfg.hidden, cfg.vocab, bias=False, dtype=dt)
        self.reset_parameters(seed)


def model_config(name: str, **overrides) -> LlamaConfig:
    """The preset ``name`` with ``overrides`` (same as ``LlamaConfig.preset``)."""
    return LlamaConfig.preset(name, **overrides)


def build_model(name: str, *, seed: int = 0, mlp_factory: MLPFactory | None = None, **overrides) -> LlamaModel:
    """``LlamaModel(model_config(name, **overrides), seed=seed, mlp_factory=mlp_factory)``."""
    return LlamaModel(model_config(name, **overrides), seed=seed, mlp_factory=mlp_factory)
