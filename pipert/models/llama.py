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

from typing import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from ..presets import PRESETS, LlamaConfig
from .common import (Attention, Block, DecoderModel, RMSNorm, Rotary, apply_rope, attention_core,
                     init_parameters, lm_loss, param_seed, project_qkv)
from .tp import TensorParallel, enter, row_linear

__all__ = [
    "LlamaConfig", "PRESETS", "RMSNorm", "Rotary", "Attention", "SwiGLU", "DecoderLayer",
    "LlamaModel", "MLPFactory", "attention_core", "project_qkv", "lm_loss", "apply_rope",
    "model_config", "build_model", "init_parameters", "param_seed", "default_mlp",
]


MLPFactory = Callable[[LlamaConfig], nn.Module]
"""Builds the MLP of one layer: a module mapping ``[b, s, hidden] -> [b, s, hidden]`` whose
parameters have dtype ``cfg.torch_dtype``. Replacements keep the parameter names ``w1`` (gate), ``w3`` (up), ``w2`` (down) so that
references and checkpoints compare by name."""


class SwiGLU(nn.Module):
    """``w2(silu(w1 x) * w3 x)``; with ``tp`` set, w1/w3 column-parallel and w2 row-parallel."""

    tp: TensorParallel | None = None

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        dt = cfg.torch_dtype
        self.w1 = nn.Linear(cfg.hidden, cfg.ffn, bias=False, dtype=dt)
        self.w3 = nn.Linear(cfg.hidden, cfg.ffn, bias=False, dtype=dt)
        self.w2 = nn.Linear(cfg.ffn, cfg.hidden, bias=False, dtype=dt)

    def forward(self, x: Tensor) -> Tensor:
        x = enter(self.tp, x)
        return row_linear(self.tp, self.w2, F.silu(self.w1(x)) * self.w3(x))


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
