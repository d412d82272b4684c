"""The built-in LLaMA-style model and its partition into units."""
from .llama import PRESETS, LlamaConfig, LlamaModel, MLPFactory, SwiGLU, build_model, lm_loss, model_config
from .materialize import build_units, materialize
from .partition import (AttentionUnit, LlamaUnit, PostAttentionUnit, PreAttentionUnit, SequentialUnit,
                        partition)

__all__ = ["PRESETS", "LlamaConfig", "LlamaModel", "MLPFactory", "SwiGLU", "lm_loss", "partition",
           "model_config", "build_model", "build_units", "materialize",
           "LlamaUnit", "PreAttentionUnit", "AttentionUnit", "PostAttentionUnit", "SequentialUnit"]
