"""The built-in models by preset name: LLaMA-style (``tiny``, ``small``, ...) and GPT-style
(``gpt-tiny``, ``gpt-small``, ``gpt-1.3b``, ...)."""
from __future__ import annotations

from typing import Callable

from torch import nn

from ..presets import SIZES, ModelConfig, model_config, model_names, model_sizes
from .common import DecoderModel
from .gpt import GPTConfig, GPTModel
from .llama import LlamaConfig, LlamaModel

__all__ = ["ModelConfig", "SIZES", "model_names", "model_config", "model_sizes", "model_from_config", "build_model"]


def model_from_config(cfg: ModelConfig, *, seed: int = 0,
                      mlp_factory: Callable[[ModelConfig], nn.Module] | None = None) -> DecoderModel:
    """``LlamaModel`` or ``GPTModel`` of ``cfg``."""
    if isinstance(cfg, LlamaConfig):
        return LlamaModel(cfg, seed=seed, mlp_factory=mlp_factory)
    if isinstance(cfg, GPTConfig):
        return GPTModel(cfg, seed=seed, mlp_factory=mlp_factory)
    raise TypeError(f"a model config is a LlamaConfig or a GPTConfig, got {type(cfg).__name__}")


def build_model(name: str, *, seed: int = 0, mlp_factory: Callable[[ModelConfig], nn.Module] | None = None,
                **overrides) -> DecoderModel:
    """The model of preset ``name`` with ``overrides``, initialised from ``seed``."""
    return model_from_config(model_config(name, **overrides), seed=seed, mlp_factory=mlp_factory)
