"""Accelerator specs for analytic cost models, with presets of public datasheet numbers.

Peaks are dense (no structured sparsity) 16-bit tensor-core throughput: bf16 where the
part has it, fp16 on V100. ``mem_bandwidth`` is the datasheet HBM/GDDR bandwidth and
``memory`` the nominal capacity in GiB (what the driver reports, rounded).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = ["DeviceSpec", "DEVICE_PRESETS", "GiB"]

GiB = 1 << 30


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator as an analytic cost model sees it."""

    name: str
    """Label used in summaries and reports."""
    peak_tflops: float
    """Dense 16-bit tensor-core peak in TFLOP/s (1e12 FLOP/s)."""
    efficiency: float = 0.6
    """Achieved fraction of ``peak_tflops`` for GEMMs and attention, in (0, 1]."""
    mem_bandwidth: float = 2.0e12
    """Device memory bandwidth in bytes/s; prices elementwise kernels and optimizer steps."""
    memory: float = 80 * GiB
    """Device memory capacity in bytes."""

    def __post_init__(self) -> None:
        for f in ("peak_tflops", "mem_bandwidth", "memory"):
            v = getattr(self, f)
            if not v > 0:
                raise ValueError(f"DeviceSpec.{f}={v!r} must be > 0")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"DeviceSpec.efficiency={self.efficiency!r} must be in (0, 1]")

    @property
    def flops(self) -> float:
        """Achieved GEMM throughput in FLOP/s: ``peak_tflops * 1e12 * efficiency``."""
        return self.peak_tflops * 1e12 * self.efficiency

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "DeviceSpec":
        """A copy of ``DEVICE_PRESETS[name]`` with fields replaced by ``overrides``."""
        if name not in DEVICE_PRESETS:
            raise ValueError(f"unknown device preset {name!r}; allowed: {', '.join(DEVICE_PRESETS)}")
        return _replace(DEVICE_PRESETS[name], overrides)


def _replace(spec: Any, overrides: dict[str, Any]) -> Any:
    """``dataclasses.replace`` that names the allowed fields when one is unknown."""
    names = [f.name for f in dataclasses.fields(spec)]
    bad = [k for k in overrides if k not in names]
    if bad:
        raise ValueError(f"unknown {type(spec).__name__} field(s) {', '.join(bad)}; allowed: {', '.join(names)}")
    return dataclasses.replace(spec, **overrides)


# Datasheet numbers (SXM parts unless named otherwise).
DEVICE_PRESETS: dict[str, DeviceSpec] = {
    "v100": DeviceSpec("V100-SXM2-32GB", 125.0, mem_bandwidth=900e9, memory=32 * GiB),   # fp16
    "a10": DeviceSpec("A10", 125.0, mem_bandwidth=600e9, memory=24 * GiB),
    "a100": DeviceSpec("A100-SXM4-80GB", 312.0, mem_bandwidth=2039e9, memory=80 * GiB),
    "a800": DeviceSpec("A800-SXM4-80GB", 312.0, mem_bandwidth=2039e9, memory=80 * GiB),
    "h20": DeviceSpec("H20", 148.0, mem_bandwidth=4.0e12, memory=96 * GiB),
    "h100": DeviceSpec("H100-SXM5-80GB", 989.0, mem_bandwidth=3.35e12, memory=80 * GiB),
    "h200": DeviceSpec("H200-SXM-141GB", 989.0, mem_bandwidth=4.8e12, memory=140 * GiB),
    "gh200": DeviceSpec("GH200-96GB", 989.0, mem_bandwidth=4.0e12, memory=96 * GiB),
}
