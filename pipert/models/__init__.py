"""The built-in models (LLaMA-style, GPT-style) and their partition into units."""
from .common import DecoderModel
from .gpt import GPT_PRESETS, GPTConfig, GPTModel
from .llama import PRESETS, LlamaConfig, LlamaModel, MLPFactory, SwiGLU, lm_loss
from .materialize import build_units, materialize
from .partition import (CUTS, AttentionUnit, HelixAttentionUnit, HelixUnit, LlamaUnit, PostAttentionUnit,
                        PreAttentionUnit, SequentialUnit, partition)
from .recompute import RECOMPUTE_MODES, SAVE_GROUPS, selective_checkpoint, selective_context
from .zoo import ModelConfig, build_model, model_config, model_from_config, model_names

__all__ = ["PRESETS", "GPT_PRESETS", "LlamaConfig", "GPTConfig", "ModelConfig", "DecoderModel", "LlamaModel",
           "GPTModel", "MLPFactory", "SwiGLU", "lm_loss", "partition", "CUTS", "model_config", "model_names",
           "model_from_config", "build_model", "build_units", "materialize",
           "LlamaUnit", "PreAttentionUnit", "AttentionUnit", "PostAttentionUnit", "SequentialUnit",
           "HelixUnit", "HelixAttentionUnit", "RECOMPUTE_MODES", "SAVE_GROUPS", "selective_checkpoint",
           "selective_context"]
