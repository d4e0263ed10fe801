"""CUDA device backend: device selection, memory budget and pool, streams, CUDA graphs.

* :mod:`.device` – ``resolve_device`` (``performance.device`` = cpu / cuda / auto,
  no silent fallback) and ``cuda_memory`` (the ``cuda_memory_*_bytes`` gauges);
* :mod:`.memory` – ``MemoryBudget`` (pure accounting against ``memory_limit``) and
  ``DeviceMemory`` (the reserved pool and the real allocations);
* :mod:`.staging` – pure helpers: staging sizes, stream rotation, waves, graph policy;
* :mod:`.backend` – ``CudaBackend``, the engine's backend on a GPU.

Importing this package never initialises CUDA, so it is safe on hosts without a
GPU; ``CudaBackend`` is loaded on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .device import cuda_available, cuda_memory, resolve_device
from .memory import DeviceMemory, MemoryBudget

if TYPE_CHECKING:
    from .backend import CudaBackend, CudaHandle


def __getattr__(name: str) -> Any:
    if name in ("CudaBackend", "CudaHandle"):
        from . import backend

        return getattr(backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CudaBackend", "CudaHandle", "DeviceMemory", "MemoryBudget", "cuda_available", "cuda_memory", "resolve_device"]
