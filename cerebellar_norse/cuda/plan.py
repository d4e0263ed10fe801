"""The CUDA backend's memory plan: what it will charge to ``performance.memory_limit``, worked out before anything is allocated.

The backend charges, in this order: the pool (``memory_pool_size``, in full, when
``memory_pool_enabled``), the market state (inside the pool when there is one),
the weights (the sparse projections as index and value rows), each stream's staging buffers (pinned host and device), and each
stream's step workspace. The workspace grows with the ticks stepped in one device
launch (every intermediate holds one row per tick), so it is sized last, from what
is left: a launch takes at most :attr:`CudaPlan.launch_ticks` ticks, the largest
count whose workspace fits every stream. A batch of more ticks (``batch_size``) is
stepped in several launches, in order; a plan with no room for even one tick per
stream cannot run at all.

``--validate-config`` prints this plan for a CUDA configuration and refuses one that
cannot run; the backend computes the same figures from its real allocations. All
sizes are bytes. Pure: no torch, no device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..config import Config, fmt_bytes, pool_capacity
from ..neurons.parameters import NetworkShape, network_shape
from ..neurons.state import floats_per_slot
from .memory import align_up
from .staging import staging_layout, workspace_bytes

INDEX_BYTES = 8  # int64 gather indices


def weight_tensors(s: NetworkShape) -> list[tuple[str, tuple[int, ...], bool]]:
    """The device weight tensors: (name, shape, holds indices). The two sparse projections are (index, value) rows
    (:mod:`~cerebellar_norse.cuda.projections`), the small dense layers are dense."""
    return [("w_mg.idx", (s.granule, s.dendrites), True), ("w_mg.val", (s.granule, s.dendrites), False),
            ("w_pf.idx", (s.purkinje, s.pf_per_purkinje), True), ("w_pf.val", (s.purkinje, s.pf_per_purkinje), False),
            ("pc_bias", (s.purkinje,), False), ("w_md", (s.dcn, s.mossy), False), ("w_pd", (s.dcn, s.purkinje), False),
            ("dcn_bias", (s.dcn,), False), ("w_out", (s.classes, s.dcn), False)]


def device_weight_bytes(s: NetworkShape, float_bytes: int) -> int:
    """Bytes of the device weights (each tensor charged as its own allocation)."""
    return sum(math.prod(shape) * (INDEX_BYTES if index else float_bytes) for _, shape, index in weight_tensors(s))


def launch_ticks(shape: NetworkShape, float_bytes: int, max_batch: int, streams: int, available: int) -> int:
    """Most ticks per device launch (at most ``max_batch``) whose workspace fits ``streams`` times in ``available`` bytes; 0 when one tick does not."""
    lo, hi = 0, max_batch
    while lo < hi:  # the largest n with streams * workspace(n) <= available; workspace grows with n
        mid = (lo + hi + 1) // 2
        if streams * workspace_bytes(shape, mid, float_bytes) <= available:
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True)
class CudaPlan:
    """The CUDA backend's charges against ``performance.memory_limit`` (bytes).

    Attributes:
        limit: ``memory_limit``.
        pool: the reserved pool (0 without one).
        state: market state bytes (``slots`` markets), inside the pool when there is one.
        state_in_pool: the state is placed in the pool.
        weights: device weights.
        staging: staging buffers of all streams (pinned host and device).
        streams: CUDA streams.
        max_batch: ``batch_size``.
        workspace: step workspace of one stream, for launches of ``launch_ticks`` ticks.
        launch_ticks: most ticks per device launch (0: not even one fits).
        one_tick_workspace: workspace of one stream for a launch of one tick.
    """

    limit: int
    pool: int
    state: int
    state_in_pool: bool
    weights: int
    staging: int
    streams: int
    max_batch: int
    workspace: int
    launch_ticks: int
    one_tick_workspace: int

    @property
    def fixed(self) -> int:
        """Bytes charged before the workspaces: pool, state outside the pool, weights, staging."""
        return self.pool + (0 if self.state_in_pool else self.state) + self.weights + self.staging

    @property
    def state_fits_pool(self) -> bool:
        """The market state fits the pool (always True without one)."""
        return not self.state_in_pool or align_up(self.state) <= self.pool

    @property
    def total(self) -> int:
        """Bytes charged in all: the fixed charges and every stream's workspace."""
        return self.fixed + self.streams * self.workspace

    def summary(self) -> str:
        """One line for ``--validate-config`` and the start-up log."""
        head = (f"pool {fmt_bytes(self.pool)}" if self.pool else f"state {fmt_bytes(self.state)}")
        return (f"{head} + weights {fmt_bytes(self.weights)} + staging {fmt_bytes(self.staging)} + {self.streams} stream(s) x "
                f"workspace {fmt_bytes(self.workspace)} = {fmt_bytes(self.total)} of "
                f"memory_limit {fmt_bytes(self.limit)}; device launches of up to {self.launch_ticks} tick(s)"
                f" (batch_size {self.max_batch})")


def plan_cuda(shape: NetworkShape, float_bytes: int, *, slots: int, max_batch: int, streams: int, limit: int,
              pool_size: int, pool_enabled: bool) -> CudaPlan:
    """The plan for a network of ``shape`` with ``slots`` market slots (see the module docstring)."""
    pool = align_up(pool_size) if pool_enabled else 0
    state = slots * floats_per_slot(shape.granule, shape.purkinje, shape.dcn, shape.classes) * float_bytes
    weights = device_weight_bytes(shape, float_bytes)
    lay = staging_layout(max_batch, shape, float_bytes)
    staging = streams * (lay.host_bytes + lay.device_bytes)
    fixed = pool + (0 if pool_enabled else state) + weights + staging
    n = launch_ticks(shape, float_bytes, max_batch, streams, limit - fixed)
    return CudaPlan(limit=limit, pool=pool, state=state, state_in_pool=pool_enabled, weights=weights, staging=staging,
                    streams=streams, max_batch=max_batch, workspace=workspace_bytes(shape, n, float_bytes) if n else 0,
                    launch_ticks=n, one_tick_workspace=workspace_bytes(shape, 1, float_bytes))


def plan_for_config(cfg: Config) -> CudaPlan:
    """:func:`plan_cuda` for a configuration (its network, ``[performance]`` and market slots)."""
    perf = cfg.performance
    return plan_cuda(network_shape(cfg.neural), cfg.dtype_bytes, slots=pool_capacity(cfg), max_batch=perf.batch_size,
                     streams=perf.cuda_streams, limit=int(perf.memory_limit), pool_size=int(perf.memory_pool_size),
                     pool_enabled=perf.memory_pool_enabled)


__all__ = ["CudaPlan", "device_weight_bytes", "launch_ticks", "plan_cuda", "plan_for_config", "weight_tensors"]
