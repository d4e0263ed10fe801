"""Device memory of the CUDA backend: a hard budget, an optional reserved pool.

Two layers:

* :class:`MemoryBudget` – pure accounting, no torch. Every allocation the backend
  plans (weights, market state slots, staging buffers, workspaces, CUDA graph
  pools) is charged under a name before it is made; an allocation that would take
  the total over ``performance.memory_limit`` is refused with a
  :class:`~cerebellar_norse.errors.CapacityError` that names the numbers. With
  ``performance.memory_pool_enabled`` the budget first reserves
  ``performance.memory_pool_size`` bytes (charged in full, used or not); allocations
  marked ``from_pool`` are then placed inside the pool (first fit, aligned) and cost
  the limit nothing more.
* :class:`DeviceMemory` – the thin torch layer: at start it allocates the pool as one
  ``uint8`` tensor on the device (the arena; the memory is really held from start,
  so a later allocation cannot fail for lack of it), hands out typed views of the
  arena for pool allocations and plain tensors (device or pinned host) for the rest,
  each charged to the budget first. The device refusing an allocation the budget
  allowed (another process holds its memory) raises
  :class:`~cerebellar_norse.errors.DeviceMemoryError`: a host shortage, not a fault
  of the model or of the config.

All sizes are bytes. Pinned host staging counts against the limit too: it is memory
the backend pins for its own use.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from ..config import fmt_bytes
from ..errors import CapacityError, DeviceMemoryError

ALIGN = 256  # bytes; the alignment cudaMalloc guarantees, kept for views of the arena

Kind = Literal["device", "host"]


def align_up(nbytes: int, align: int = ALIGN) -> int:
    """``nbytes`` rounded up to a multiple of ``align``."""
    return -(-int(nbytes) // align) * align


@dataclass(frozen=True)
class Allocation:
    """One charged allocation.

    Attributes:
        name: unique name (e.g. ``state``, ``weights``, ``staging.in.0``).
        nbytes: bytes charged (rounded up to :data:`ALIGN` inside the pool).
        kind: ``device`` memory or pinned ``host`` memory.
        offset: byte offset inside the pool, or None outside it.
    """

    name: str
    nbytes: int
    kind: Kind
    offset: int | None = None


class MemoryBudget:
    """Planned allocations against a hard ``limit`` (bytes), with an optional pool.

    Args:
        limit: the cap, ``performance.memory_limit`` in bytes.
    """

    def __init__(self, limit: int) -> None:
        if limit <= 0:
            raise ValueError(f"memory limit must be positive, got {limit}")
        self.limit = int(limit)
        self.pool_size = 0
        self._allocs: dict[str, Allocation] = {}

    # -- figures ----------------------------------------------------------------

    @property
    def pool_reserved(self) -> bool:
        """A pool has been reserved."""
        return self.pool_size > 0

    @property
    def pool_used(self) -> int:
        """Bytes placed in the pool."""
        return sum(a.nbytes for a in self._allocs.values() if a.offset is not None)

    @property
    def used(self) -> int:
        """Bytes charged against the limit: the whole pool plus everything outside it."""
        return self.pool_size + sum(a.nbytes for a in self._allocs.values() if a.offset is None)

    @property
    def available(self) -> int:
        """Bytes that may still be charged outside the pool."""
        return self.limit - self.used

    def items(self) -> dict[str, Allocation]:
        """Live allocations by name."""
        return dict(self._allocs)

    def report(self) -> dict[str, int]:
        """Figures for logs and health: limit, used, pool size/used, device and host bytes."""
        outside = [a for a in self._allocs.values() if a.offset is None]
        return {
            "limit_bytes": self.limit,
            "used_bytes": self.used,
            "pool_bytes": self.pool_size,
            "pool_used_bytes": self.pool_used,
            "device_bytes": self.pool_size + sum(a.nbytes for a in outside if a.kind == "device"),
            "host_pinned_bytes": sum(a.nbytes for a in outside if a.kind == "host"),
        }

    def breakdown(self) -> str:
        """What is charged, by group (``pool 20.00GB, weights 5.63GB, …``)."""
        parts = [f"pool {fmt_bytes(self.pool_size)}"] if self.pool_size else []
        groups: dict[str, int] = {}
        for a in self._allocs.values():
            if a.offset is None:
                key = a.name.split(".")[0]
                groups[key] = groups.get(key, 0) + a.nbytes
        parts += [f"{k} {fmt_bytes(v)}" for k, v in sorted(groups.items())]
        return ", ".join(parts) or "nothing"

    # -- changes ----------------------------------------------------------------

    def reserve_pool(self, nbytes: int) -> None:
        """Reserve the pool (``performance.memory_pool_size``); charged in full against the limit."""
        if self.pool_reserved:
            raise ValueError("the pool is already reserved")
        n = align_up(nbytes)
        if n <= 0:
            raise ValueError(f"pool size must be positive, got {nbytes}")
        if self.used + n > self.limit:
            raise CapacityError(
                f"performance.memory_pool_size {fmt_bytes(n)} ({n} bytes) does not fit performance.memory_limit "
                f"{fmt_bytes(self.limit)} ({self.limit} bytes) with {fmt_bytes(self.used)} already in use "
                f"({self.breakdown()}); lower memory_pool_size or raise memory_limit",
                retry_after_s=0.0,
            )
        self.pool_size = n

    def allocate(self, name: str, nbytes: int, *, from_pool: bool = False, kind: Kind = "device") -> Allocation:
        """Charge ``nbytes`` under ``name``; returns the allocation (with its pool offset when placed there).

        Raises:
            CapacityError: the pool has no room for it, or the total would exceed the limit.
            ValueError: ``name`` is taken, ``nbytes`` is negative, or ``from_pool`` without a pool.
        """
        if name in self._allocs:
            raise ValueError(f"allocation {name!r} exists; release it first")
        if nbytes < 0:
            raise ValueError(f"allocation {name!r} of negative size {nbytes}")
        if from_pool:
            if not self.pool_reserved:
                raise ValueError(f"allocation {name!r} asks for the pool, but no pool is reserved")
            n = align_up(nbytes)
            offset = self._first_fit(n)
            if offset is None:
                raise CapacityError(
                    f"{name} needs {fmt_bytes(n)} ({n} bytes) but the memory pool has {fmt_bytes(self.pool_size - self.pool_used)} "
                    f"free of performance.memory_pool_size {fmt_bytes(self.pool_size)} ({self.pool_size} bytes); "
                    "raise memory_pool_size or lower performance.max_markets",
                    retry_after_s=0.0,
                )
            alloc = Allocation(name, n, "device", offset)
        else:
            n = int(nbytes)
            if self.used + n > self.limit:
                raise CapacityError(
                    f"{name} needs {fmt_bytes(n)} ({n} bytes): {fmt_bytes(self.used)} in use ({self.breakdown()}) "
                    f"+ {fmt_bytes(n)} = {fmt_bytes(self.used + n)} exceeds performance.memory_limit "
                    f"{fmt_bytes(self.limit)} ({self.limit} bytes); raise memory_limit or lower "
                    "performance.batch_size, performance.cuda_streams or the network size",
                    retry_after_s=0.0,
                )
            alloc = Allocation(name, n, kind)
        self._allocs[name] = alloc
        return alloc

    def release(self, name: str) -> int:
        """Give back an allocation; returns the bytes freed."""
        alloc = self._allocs.pop(name, None)
        if alloc is None:
            raise KeyError(f"no allocation named {name!r}")
        return alloc.nbytes

    def release_pool(self) -> None:
        """Give back the pool reservation (every allocation inside it must be released first)."""
        inside = [a.name for a in self._allocs.values() if a.offset is not None]
        if inside:
            raise ValueError(f"the pool still holds {', '.join(sorted(inside))}")
        self.pool_size = 0

    def _first_fit(self, n: int) -> int | None:
        taken = sorted((a.offset, a.nbytes) for a in self._allocs.values() if a.offset is not None)
        cursor = 0
        for off, size in taken:
            if off - cursor >= n:
                return cursor
            cursor = max(cursor, off + size)
        return cursor if self.pool_size - cursor >= n else None


def nbytes_of(shape: Sequence[int], dtype: torch.dtype) -> int:
    """Bytes of a dense tensor of ``shape`` and ``dtype``."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return int(math.prod(shape)) * itemsize


class DeviceMemory:
    """The budget plus the real allocations on ``device`` (a CUDA device, or the CPU in tests).

    Args:
        device: where device tensors live.
        limit: ``performance.memory_limit`` (bytes).
        pool_size: ``performance.memory_pool_size`` (bytes), reserved at once when ``pool_enabled``.
        pool_enabled: ``performance.memory_pool_enabled``.
        pin: pin host staging buffers (only meaningful with CUDA).
    """

    def __init__(self, device: torch.device, limit: int, pool_size: int, pool_enabled: bool, pin: bool) -> None:
        self.device = device
        self.pin = pin
        self.budget = MemoryBudget(limit)
        self.arena: torch.Tensor | None = None
        self._tensors: dict[str, torch.Tensor] = {}
        if pool_enabled:
            self.budget.reserve_pool(pool_size)
            try:
                self.arena = torch.empty(self.budget.pool_size, dtype=torch.uint8, device=device)
            except torch.cuda.OutOfMemoryError:
                size = self.budget.pool_size
                self.budget.release_pool()
                raise DeviceMemoryError(
                    f"cannot reserve performance.memory_pool_size {fmt_bytes(size)} ({size} bytes) on {device}: "
                    "the device is out of memory; lower memory_pool_size or free the GPU",
                ) from None

    @property
    def used(self) -> int:
        """Bytes charged (pool reservation included)."""
        return self.budget.used

    @property
    def total(self) -> int:
        """The cap (``performance.memory_limit``)."""
        return self.budget.limit

    def empty(self, name: str, shape: Sequence[int], dtype: torch.dtype, *, from_pool: bool = False,
              host: bool = False) -> torch.Tensor:
        """An uninitialised tensor charged under ``name``.

        ``from_pool`` places it in the arena when a pool is reserved (otherwise it is a
        plain device allocation, charged against the limit); ``host`` makes it a
        (pinned, with CUDA) host buffer.
        """
        n = nbytes_of(shape, dtype)
        use_pool = from_pool and self.arena is not None and not host
        alloc = self.budget.allocate(name, n, from_pool=use_pool, kind="host" if host else "device")
        try:
            if use_pool:
                assert self.arena is not None and alloc.offset is not None
                t = self.arena[alloc.offset:alloc.offset + n].view(dtype).view(tuple(shape))
            elif host:
                t = torch.empty(tuple(shape), dtype=dtype, pin_memory=self.pin)
            else:
                t = torch.empty(tuple(shape), dtype=dtype, device=self.device)
        except torch.cuda.OutOfMemoryError:
            self.budget.release(name)
            raise DeviceMemoryError(f"{name}: the device ran out of memory allocating {fmt_bytes(n)} ({n} bytes)") from None
        except BaseException:
            self.budget.release(name)
            raise
        self._tensors[name] = t
        return t

    def charge(self, name: str, nbytes: int) -> None:
        """Charge memory held elsewhere (a stream's graph pool or its rounding) under ``name``."""
        self.budget.allocate(name, nbytes)

    def release(self, name: str) -> None:
        """Release ``name`` (its tensor, if any, is dropped)."""
        self.budget.release(name)
        self._tensors.pop(name, None)

    def close(self) -> None:
        """Release everything, the pool last."""
        for name in list(self.budget.items()):
            self.release(name)
        if self.arena is not None:
            self.arena = None
            self.budget.release_pool()


__all__ = ["ALIGN", "Allocation", "DeviceMemory", "MemoryBudget", "align_up", "nbytes_of"]
