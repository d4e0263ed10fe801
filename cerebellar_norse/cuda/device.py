"""Device selection and device-wide memory figures.

``performance.device`` is honoured literally: ``"cpu"`` never touches CUDA,
``"cuda"`` demands a usable CUDA device and fails loudly without one (there is no
silent fallback to the CPU: an operator who configured a GPU must learn that it is
missing), and ``"auto"`` picks CUDA when torch can see a device, else the CPU.

Nothing here calls into CUDA at import time; :func:`cuda_memory` only reads memory
figures once CUDA has been initialised by this process (a CPU service on a GPU host
must not create a CUDA context just to report zeros).
"""

from __future__ import annotations

import os
from typing import Literal

import torch

from ..config import Config, PerformanceConfig
from ..errors import DeviceUnavailableError

Device = Literal["cpu", "cuda"]


def cuda_available() -> bool:
    """A CUDA device can be used by torch in this process."""
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # a broken driver reads as "no CUDA"; resolve_device says why
        return False


def _why_no_cuda() -> str:
    if torch.version.cuda is None:
        return f"this torch build ({torch.__version__}) has no CUDA support"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return f"CUDA_VISIBLE_DEVICES={visible!r} hides every device"
    return f"torch {torch.__version__} (CUDA {torch.version.cuda}) finds no usable CUDA device"


def resolve_device(cfg: Config | PerformanceConfig) -> Device:
    """The device the backend runs on: ``"cpu"`` or ``"cuda"``.

    Args:
        cfg: the configuration (or its ``[performance]`` section).

    Raises:
        DeviceUnavailableError: ``performance.device = "cuda"`` on a host without a
            usable CUDA device.
    """
    perf = cfg.performance if isinstance(cfg, Config) else cfg
    wanted = perf.device
    if wanted == "cpu":
        return "cpu"
    if wanted == "auto":
        return "cuda" if cuda_available() else "cpu"
    if cuda_available():
        return "cuda"
    raise DeviceUnavailableError(
        f'performance.device = "cuda" but no CUDA device is available: {_why_no_cuda()}; '
        'set performance.device = "cpu" (or "auto"), or run on a host with a GPU (check `nvidia-smi -L`)'
    )


def cuda_memory() -> tuple[int, int]:
    """(used_bytes, total_bytes) of CUDA device 0 as the driver reports them (like nvidia-smi).

    ``used`` counts every process on the device, so ``used / total`` is what the
    ``CUDAMemoryHigh`` alert watches. Returns ``(0, 0)`` without CUDA, and while this
    process has not initialised CUDA (a CPU service reports zeros).
    """
    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return 0, 0
        free, total = torch.cuda.mem_get_info()
    except Exception:  # a lost device reports zeros; the engine's health says why
        return 0, 0
    return int(total - free), int(total)


__all__ = ["Device", "cuda_available", "cuda_memory", "resolve_device"]
