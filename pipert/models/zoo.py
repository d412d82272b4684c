"""The built-in models by preset name: LLaMA-style (``tiny``, ``small``, ...) and GPT-style
(``gpt-tiny``, ``gpt-small``, ``gpt-1.3b``, ...)."""
from __future__ import annotations

from typing import Callable, Union

from torch import nn

from .common import DecoderModel
from .gpt import GPT_PRESETS, GPTConfig, GPTModel
from .llama import PRESETS, LlamaConfig, LlamaModel

__all__ = ["ModelConfig", "SIZES", "model_names", "model_config", "model_sizes", "model_from_config", "build_model"]

ModelConfig = Union[LlamaConfig, GPTConfig]


def model_names() -> list[str]:
    """Every preset name ``model_config`` accepts."""
    return list(PRESETS) + list(GPT_PRESETS)


SIZES = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "max_seq")
"""What a LLaMA-shaped model given by its sizes names (``layers=32,hidden=4096,heads=32,...``);
the first three are required, the others default to ``LlamaConfig``'s."""


def model_config(name: str, **overrides) -> ModelConfig:
    """The preset ``name`` (LLaMA or GPT) with ``overrides`` applied, or the LLaMA-shaped model of
    the sizes ``name`` gives (:data:`SIZES`, e.g. ``layers=32,hidden=4096,heads=32,ffn=11008``)."""
    if name in PRESETS:
        return LlamaConfig.preset(name, **overrides)
    if name in GPT_PRESETS:
        return GPTConfig.preset(name, **overrides)
    if "=" in name:
        return LlamaConfig(**{**model_sizes(name), **overrides})
    raise ValueError(f"unknown model {name!r}; allowed: {', '.join(model_names())}, or LLaMA sizes "
                     f"layers=..,hidden=..,heads=..[,kv_heads=..,ffn=..,vocab=..,max_seq=..]")


def model_sizes(text: str) -> dict[str, int]:
    """The sizes of ``layers=32,hidden=4096,heads=32,...`` (:data:`SIZES`); ValueError naming the
    text and what is allowed."""
    sizes: dict[str, int] = {}
    for pair in text.split(","):
        k, _, v = pair.partition("=")
        k = k.strip()
        if k not in SIZES or not v.strip().isdigit() or int(v) < 1 or k in sizes:
            raise ValueError(f"model {text!r}: {pair!r} is not size=positive integer (each once); allowed sizes: "
                             f"{', '.join(SIZES)}")
        sizes[k] = int(v)
    missing = [k for k in SIZES[:3] if k not in sizes]
    if missing:
        raise ValueError(f"model {text!r}: give {', '.join(missing)} too (layers, hidden and heads are needed)")
    return sizes


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
