"""The built-in models' configurations and preset tables, without torch (the planner reads them):
``LlamaConfig`` (``tiny``, ``small``, ...), ``GPTConfig`` (``gpt-tiny``, ``gpt-1.3b``, ...), and a model
given by its sizes. ``pipert.models`` builds the modules from these."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Iterable, Union

__all__ = ["DTYPE_NAMES", "ConfigBase", "LlamaConfig", "GPTConfig", "PRESETS", "GPT_PRESETS", "ModelConfig",
           "SIZES", "model_names", "model_config", "model_sizes", "check_config", "preset_of"]

DTYPE_NAMES = ("float32", "float64", "bfloat16", "float16")
"""Parameter dtypes a model config accepts (names of ``torch`` dtypes)."""


@dataclass(frozen=True)
class ConfigBase:
    """The fields both model configs have (``LlamaConfig``, ``GPTConfig`` add their own).
    ``Config.preset(name, **overrides)`` builds one from the family's presets."""

    vocab: int = 256
    """Vocabulary size; 256 covers byte-level tokens (``pipert.data``)."""
    hidden: int = 64
    """Model width."""
    layers: int = 4
    """Number of decoder layers."""
    heads: int = 4
    """Query heads; must divide ``hidden``."""
    ffn: int = 176
    """Inner width of the MLP."""
    max_seq: int = 128
    """Longest sequence (rotary tables or the learned position table)."""
    norm_eps: float = 1e-5
    """Norm epsilon."""
    tie_embeddings: bool = False
    """Use the embedding matrix as the LM head. Pipelined runs need it False (see partition)."""
    dtype: str = "float32"
    """Parameter dtype: float32, float64, bfloat16 or float16."""
    mlp_chunk: int = 0
    """Token rows per chunk of the chunked MLP (``pipert.kernels``); 0: the plain MLP."""
    mlp_recompute: bool = False
    """Chunked MLP only: save just its input and recompute the pre-activations in backward."""

    def __post_init__(self) -> None:
        check_config(self, ("vocab", "hidden", "layers", "heads", "ffn", "max_seq"))

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def torch_dtype(self) -> Any:
        """The ``torch.dtype`` of :attr:`dtype` (imports torch)."""
        import torch
        return getattr(torch, self.dtype)

    @classmethod
    def presets(cls) -> dict:
        """The family's preset table."""
        raise NotImplementedError

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> Any:
        """The named preset with ``overrides`` applied (e.g. ``preset("tiny", dtype="float64")``)."""
        return preset_of(cls, cls.presets(), name, overrides)


def check_config(cfg: Any, positive: Iterable[str]) -> None:
    """Checks shared by the model configs: positive sizes, head split, dtype, MLP chunking."""
    kind = type(cfg).__name__
    for name in positive:
        if getattr(cfg, name) < 1:
            raise ValueError(f"{kind}.{name} must be >= 1, got {getattr(cfg, name)}")
    if cfg.hidden % cfg.heads:
        raise ValueError(f"{kind}: heads={cfg.heads} must divide hidden={cfg.hidden}")
    if cfg.dtype not in DTYPE_NAMES:
        raise ValueError(f"{kind}.dtype={cfg.dtype!r}; allowed: {', '.join(DTYPE_NAMES)}")
    if cfg.norm_eps <= 0:
        raise ValueError(f"{kind}.norm_eps must be > 0, got {cfg.norm_eps}")
    if cfg.mlp_chunk < 0:
        raise ValueError(f"{kind}.mlp_chunk must be >= 0 (0: the plain MLP), got {cfg.mlp_chunk}")
    if cfg.mlp_recompute and not cfg.mlp_chunk:
        raise ValueError(f"{kind}.mlp_recompute applies to the chunked MLP; set mlp_chunk > 0 as well")


def preset_of(cls: type, presets: dict, name: str, overrides: dict) -> Any:
    """``presets[name]`` with ``overrides`` applied; unknown names and fields raise."""
    if name not in presets:
        raise ValueError(f"unknown {cls.__name__} preset {name!r}; allowed: {', '.join(presets)}")
    known = {f.name for f in fields(cls)}
    bad = sorted(set(overrides) - known)
    if bad:
        raise ValueError(f"unknown {cls.__name__} field(s) {bad}; allowed: {sorted(known)}")
    return replace(presets[name], **overrides)


@dataclass(frozen=True)
class LlamaConfig(ConfigBase):
    """Shape and numerics of the LLaMA-style model (shared fields: ``ConfigBase``).
    ``LlamaConfig.preset(name, **overrides)`` builds one."""

    kv_heads: int = 2
    """Key/value heads (grouped-query attention); must divide ``heads``."""
    rope_theta: float = 10000.0
    """Rotary base frequency."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kv_heads < 1:
            raise ValueError(f"LlamaConfig.kv_heads must be >= 1, got {self.kv_heads}")
        if self.heads % self.kv_heads:
            raise ValueError(f"LlamaConfig: kv_heads={self.kv_heads} must divide heads={self.heads}")
        if self.head_dim % 2:
            raise ValueError(f"LlamaConfig: head_dim={self.head_dim} (hidden/heads) must be even for rotary")
        if self.rope_theta <= 0:
            raise ValueError(f"LlamaConfig.rope_theta must be > 0, got {self.rope_theta}")

    @classmethod
    def presets(cls) -> dict:
        return PRESETS


PRESETS: dict[str, LlamaConfig] = {
    "tiny": LlamaConfig(hidden=64, layers=4, heads=4, kv_heads=2, ffn=176, max_seq=128),
    "small": LlamaConfig(hidden=256, layers=8, heads=8, kv_heads=4, ffn=688, max_seq=512),
    "medium": LlamaConfig(hidden=768, layers=12, heads=12, kv_heads=4, ffn=2048, max_seq=1024),
    "large": LlamaConfig(hidden=2048, layers=16, heads=16, kv_heads=8, ffn=5632, max_seq=2048),
}


@dataclass(frozen=True)
class GPTConfig(ConfigBase):
    """Shape and numerics of the GPT-style model (fields: ``ConfigBase``).
    ``GPTConfig.preset(name, **overrides)`` builds one."""

    ffn: int = 256
    """Inner width of the GeLU MLP (4 x hidden in GPT-3)."""

    @property
    def kv_heads(self) -> int:
        """Multi-head attention: as many key/value heads as query heads."""
        return self.heads

    @classmethod
    def presets(cls) -> dict:
        return GPT_PRESETS


GPT_PRESETS: dict[str, GPTConfig] = {
    "gpt-tiny": GPTConfig(hidden=64, layers=4, heads=4, ffn=256, max_seq=128),
    "gpt-small": GPTConfig(hidden=256, layers=8, heads=8, ffn=1024, max_seq=512),
    # the paper's shapes (GPT-3 style, ffn = 4h, vocabulary of GPT-2 padded); max_seq is
    # overridable for the long-sequence settings (the position table grows with it)
    "gpt-1.3b": GPTConfig(vocab=50304, hidden=2048, layers=24, heads=16, ffn=8192, max_seq=2048),
    "gpt-3b": GPTConfig(vocab=50304, hidden=4096, layers=16, heads=32, ffn=16384, max_seq=2048),
    "gpt-7b": GPTConfig(vocab=50304, hidden=4096, layers=32, heads=32, ffn=16384, max_seq=2048),
}


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
