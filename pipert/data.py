"""Built-in data: byte-level tokens of the Python standard library's sources.

Every machine with Python has the corpus, so runs need no downloads. The ``.py`` files
under ``sysconfig.get_paths()["stdlib"]`` (without ``site-packages``, ``dist-packages`` and
``__pycache__``) are read as bytes in sorted relative-path order and concatenated until
``max_bytes``; the last file is truncated at the cap. The content depends on the Python
version; ``ByteCorpus.digest`` fingerprints it. Tokens are bytes (vocabulary 256).

The last ``val_fraction`` of the bytes form the ``"val"`` split, the rest ``"train"``.
Batch ``step`` is a pure function of ``(seed, step, batch_size)``: each row starts at an
offset drawn uniformly from the split, independent of which batches were drawn before.
"""
from __future__ import annotations

import functools
import hashlib
import os
import sysconfig
from typing import Iterator

import numpy as np
import torch
from torch import Tensor

__all__ = ["ByteCorpus", "stdlib_bytes", "VOCAB_SIZE"]

VOCAB_SIZE = 256
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}


@functools.lru_cache(maxsize=4)
def stdlib_bytes(max_bytes: int = 4 << 20, root: str | None = None) -> bytes:
    """The corpus: ``.py`` sources under ``root`` (default: the stdlib), sorted, capped."""
    root = root or sysconfig.get_paths()["stdlib"]
    paths = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in _SKIP_DIRS)
        paths += [os.path.join(d, f) for f in files if f.endswith(".py")]
    paths.sort(key=lambda p: os.path.relpath(p, root).split(os.sep))
    chunks, total = [], 0
    for p in paths:
        if total >= max_bytes:
            break
        try:
            with open(p, "rb") as fh:
                data = fh.read(max_bytes - total)
        except OSError:
            continue
        chunks.append(data)
        total += len(data)
    if not chunks:
        raise RuntimeError(f"no .py files found under {root}")
    return b"".join(chunks)


class ByteCorpus:
    """Batches ``(tokens, targets)`` of shape ``[batch, seq_len]`` int64; targets are the
    tokens shifted by one position."""

    def __init__(self, seq_len: int, seed: int = 0, *, batch_size: int = 8, split: str = "train",
                 max_bytes: int = 4 << 20, val_fraction: float = 0.05, root: str | None = None) -> None:
        if seq_len < 1 or batch_size < 1:
            raise ValueError(f"seq_len and batch_size must be >= 1, got {seq_len}, {batch_size}")
        if split not in ("train", "val"):
            raise ValueError(f"split={split!r}; allowed: 'train', 'val'")
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
        raw = stdlib_bytes(max_bytes, root)
        cut = int(len(raw) * (1.0 - val_fraction))
        part = raw[:cut] if split == "train" else raw[cut:]
        if len(part) < seq_len + 1:
            raise ValueError(f"the {split} split has {len(part)} bytes, fewer than seq_len + 1 = {seq_len + 1}")
        self.seq_len, self.seed, self.batch_size, self.split = seq_len, seed, batch_size, split
        self.vocab_size = VOCAB_SIZE
        self.digest = hashlib.sha256(raw).hexdigest()[:16]
        self.data = torch.frombuffer(bytearray(part), dtype=torch.uint8)

    def __len__(self) -> int:
        """Bytes in this split."""
        return int(self.data.numel())

    def batch(self, step: int, batch_size: int | None = None) -> tuple[Tensor, Tensor]:
        """Batch number ``step`` (a pure function of seed, step and batch size)."""
        b = batch_size or self.batch_size
        rng = np.random.default_rng([self.seed, step, 0 if self.split == "train" else 1])
        starts = torch.from_numpy(rng.integers(0, len(self) - self.seq_len, size=b))
        idx = starts[:, None] + torch.arange(self.seq_len + 1)[None, :]
        rows = self.data[idx].long()
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()

    def batches(self, batch_size: int | None = None, steps: int | None = None,
                start: int = 0) -> Iterator[tuple[Tensor, Tensor]]:
        """Batches ``start, start + 1, ...`` of ``batch_size`` rows (default: the corpus's);
        forever when ``steps`` is None."""
        step = start
        while steps is None or step < start + steps:
            yield self.batch(step, batch_size)
            step += 1

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        return self.batches()
