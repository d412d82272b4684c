"""The optional C++ extension pipert._C, chosen at import.

``HAVE_EXT`` says whether it loaded; ``C`` is the module or None. When it is missing,
pipert warns once (here, at first import) and every user falls back to its
pure-Python path with the same API. ``PIPERT_NO_EXT=1`` in the environment skips
loading it even when it is built (to test the fallback on a machine that has it).
"""
from __future__ import annotations

import atexit
import os
import warnings
from types import ModuleType

__all__ = ["HAVE_EXT", "HAVE_EXT_CUDA", "C", "load_error"]

C: ModuleType | None = None
load_error: str | None = None

if os.environ.get("PIPERT_NO_EXT") == "1":
    load_error = "disabled by PIPERT_NO_EXT=1"
else:
    try:
        import torch  # noqa: F401  (loads libtorch, which pipert._C links against)

        from . import _C as C
    except ImportError as exc:  # not built, or built against another torch
        C = None
        load_error = str(exc)

HAVE_EXT: bool = C is not None

if HAVE_EXT and hasattr(C, "close_streams"):
    # Every stream's worker is joined while Python still runs: one that takes the GIL once the
    # interpreter finalizes is ended mid-item, which aborts the process.
    atexit.register(C.close_streams)
HAVE_EXT_CUDA: bool = bool(HAVE_EXT and getattr(C, "HAS_CUDA", False))

if not HAVE_EXT:
    warnings.warn(f"pipert._C is not available ({load_error}); using the pure-Python streams, "
                  "link emulator and pinned pool (same API, more Python per action)",
                  RuntimeWarning, stacklevel=2)
