"""A GPT-style decoder-only transformer (the model of the HelixPipe paper), beside the LLaMA one.

Differences from ``llama.py``: LayerNorm (with bias) instead of RMSNorm, learned absolute
position embeddings (``pos.weight``, ``[max_seq, hidden]``) instead of rotary, multi-head
attention with biases on the four projections, and a GeLU MLP ``proj(gelu(fc x))`` (tanh
form, as Megatron's fused bias-GeLU) with biases. Everything else (attention core, block,
loss, initialisation, parameter naming) is shared through ``common.py``.

Parameter names: ``embed.weight``, ``pos.weight``, ``layers.{i}.attn_norm.{weight,bias}``,
``layers.{i}.attn.{wq,wk,wv,wo}.{weight,bias}``, ``layers.{i}.mlp_norm.{weight,bias}``,
``layers.{i}.mlp.{fc,proj}.{weight,bias}``, ``norm.{weight,bias}`` and, untied, ``head.weight``.
"""
from __future__ import annotations

from typing import Callable

import torch.nn.functional as F
from torch import Tensor, nn

from ..presets import GPT_PRESETS, GPTConfig
from .common import Attention, Block, DecoderModel
from .tp import TensorParallel, enter, row_linear

__all__ = ["GPTConfig", "GPT_PRESETS", "GeluMLP", "GPTBlock", "GPTModel", "gpt_mlp"]

GELU_APPROXIMATE = "tanh"


class GeluMLP(nn.Module):
    """``proj(gelu(fc x))`` with biases; the parameter names of ``pipert.kernels.ChunkedGeluMLP``.
    With ``tp`` set, fc is column-parallel and proj row-parallel."""

    tp: TensorParallel | None = None

    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        dt = cfg.torch_dtype
        self.fc = nn.Linear(cfg.hidden, cfg.ffn, dtype=dt)
        self.proj = nn.Linear(cfg.ffn, cfg.hidden, dtype=dt)

    def forward(self, x: Tensor) -> Tensor:
        x = enter(self.tp, x)
        return row_linear(self.tp, self.proj, F.gelu(self.fc(x), approximate=GELU_APPROXIMATE))


def gpt_mlp(cfg: GPTConfig) -> nn.Module:
    """``GeluMLP``, or with ``mlp_chunk > 0`` the chunked GeLU MLP of ``pipert.kernels``."""
    if not cfg.mlp_chunk:
        return GeluMLP(cfg)
    from pipert.kernels import ChunkedGeluMLP
    return ChunkedGeluMLP(cfg.hidden, cfg.ffn, bias=True, approximate=GELU_APPROXIMATE, chunk_size=cfg.mlp_chunk,
                          recompute=cfg.mlp_recompute, dtype=cfg.torch_dtype)


class GPTBlock(Block):
    """Pre-norm block with LayerNorm, biased multi-head attention and the GeLU MLP."""

    def __init__(self, cfg: GPTConfig, mlp_factory: Callable[[GPTConfig], nn.Module] = gpt_mlp) -> None:
        dt = cfg.torch_dtype
        super().__init__(nn.LayerNorm(cfg.hidden, cfg.norm_eps, dtype=dt), Attention(cfg, bias=True, rotary=False),
                         nn.LayerNorm(cfg.hidden, cfg.norm_eps, dtype=dt), mlp_factory(cfg))


class GPTModel(DecoderModel):
    """The whole GPT-style model (``DecoderModel``: forward, initialisation, ``untie``)."""

    def __init__(self, cfg: GPTConfig, *, seed: int = 0,
                 mlp_factory: Callable[[GPTConfig], nn.Module] | None = None) -> None:
        super().__init__()
        if mlp_factory is not None and cfg.mlp_chunk:
            raise ValueError(f"mlp_factory and GPTConfig.mlp_chunk={cfg.mlp_chunk} both choose the MLP; give one")
        self.cfg = cfg
        dt = cfg.torch_dtype
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden, dtype=dt)
        self.pos = nn.Embedding(cfg.max_seq, cfg.hidden, dtype=dt)
        self.layers = nn.ModuleList(GPTBlock(cfg, mlp_factory or gpt_mlp) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.hidden, cfg.norm_eps, dtype=dt)
        self.head = None if cfg.tie_embeddings else nn.Linear(cfg.hidden, cfg.vocab, bias=False, dtype=dt)
        self.reset_parameters(seed)
