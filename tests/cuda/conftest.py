"""Harness of the CUDA backend tests: run it beside the fused CPU backend and compare.

Both backends get the same interleaved multi-market tick stream in the same
batches, with their own slot arrays. Batches alternate between three shapes so
that every path is taken: runs of distinct markets (one wave; sizes recur, so CUDA
graphs get captured and replayed), fixed-size runs that repeat markets (several
waves), and single ticks. Midway the host changes state behind the backend's back
as the engine does: a market is reset (eviction and reuse of its slot) and a
snapshot is restored into another slot. Outputs are compared batch by batch,
states every few batches and at the end (after ``sync_to_host``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from network_sizes import SMALL_NEURAL

from cerebellar_norse.config import Config
from cerebellar_norse.cuda.backend import CudaBackend, CudaHandle
from cerebellar_norse.cuda.plan import CudaPlan, plan_cuda
from cerebellar_norse.cuda.staging import workspace_bytes
from cerebellar_norse.neurons.backends import FusedBackend
from cerebellar_norse.neurons.parameters import encoder_parameters, network_parameters, network_shape
from cerebellar_norse.neurons.state import STATE_FIELDS, StateArrays
from cerebellar_norse.neurons.topology import generate_weights
from cerebellar_norse.synthetic import generate_ticks
from cerebellar_norse.ticks import Tick, validate_ticks

TOLERANCE = 1e-4



def make_cfg(precision: str, neural: dict[str, Any] | None = None, performance: dict[str, Any] | None = None) -> Config:
    """A config of the given precision with overrides."""
    return Config.model_validate({"neural": {**(neural or {}), "precision": precision}, "performance": performance or {}})


def make_batches(ticks: list[Tick], max_batch: int) -> list[list[Tick]]:
    """Cut the stream into batches of three alternating shapes (see the module docstring)."""
    out: list[list[Tick]] = []
    i, mode = 0, 0
    while i < len(ticks):
        if mode == 0:  # distinct markets until one repeats
            batch: list[Tick] = []
            seen: set[str] = set()
            while i < len(ticks) and len(batch) < max_batch and ticks[i].market_id not in seen:
                seen.add(ticks[i].market_id)
                batch.append(ticks[i])
                i += 1
        elif mode == 1:  # a fixed run, markets repeat
            batch = ticks[i:i + max_batch]
            i += len(batch)
        else:
            batch = ticks[i:i + 1]
            i += 1
        out.append(batch)
        mode = (mode + 1) % 3
    return out


def as_arrays(batch: list[Tick], slot_of: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    """Kernel arrays of a batch."""
    slots = np.array([slot_of[t.market_id] for t in batch], dtype=np.int64)
    ticks = np.array([[t.price for t in batch], [t.volume for t in batch], [t.timestamp for t in batch]], dtype=np.float64)
    return slots, ticks


@dataclass
class PairReport:
    """Largest differences between the CUDA and the fused backend over a run."""

    ticks: int = 0
    batches: int = 0
    multi_wave_batches: int = 0
    max_prob_diff: float = 0.0
    max_state_diff: float = 0.0
    spike_mismatches: int = 0
    enc_mismatches: int = 0

    def check(self) -> None:
        """Assert the run agreed within the tolerance."""
        assert self.max_prob_diff <= TOLERANCE, self
        assert self.max_state_diff <= TOLERANCE, self
        assert self.spike_mismatches == 0, self
        assert self.enc_mismatches == 0, self


def state_diff(a: StateArrays, b: StateArrays) -> tuple[float, int]:
    """(max |diff| over the float state, rows of encoder state that differ)."""
    d = 0.0
    for name in STATE_FIELDS[1:]:
        x, y = getattr(a, name).astype(np.float64), getattr(b, name).astype(np.float64)
        d = max(d, float(np.abs(x - y).max()) if x.size else 0.0)
    return d, int((a.enc != b.enc).any(axis=1).sum())


RunPair = Callable[..., tuple[PairReport, CudaBackend]]


def run_pair(cfg: Config, *, device: str, streams: int = 1, use_graphs: bool = False, n_ticks: int = 500,
             markets: int = 6, max_batch: int = 12, seed: int = 3, asynchronous: bool = False,
             host_edits: bool = True, check_every: int = 7) -> tuple[PairReport, CudaBackend]:
    """Run the fused and the CUDA backend side by side; returns the report and the CUDA backend."""
    params = network_parameters(cfg)
    weights = generate_weights(cfg)
    enc_par = encoder_parameters(cfg.neural)
    prec = cfg.neural.precision
    slots_n = markets + 1  # one spare slot for the restored snapshot
    fa, ca = StateArrays.allocate(slots_n, params, prec), StateArrays.allocate(slots_n, params, prec)
    golgi = float(weights.golgi_init)
    fused = FusedBackend(weights, params, fa, enc_par, max_batch)
    cuda = CudaBackend(weights, params, ca, enc_par, max_batch, streams=streams, device=device, use_graphs=use_graphs,
                       memory_limit=int(cfg.performance.memory_limit), pool_size=int(cfg.performance.memory_pool_size),
                       pool_enabled=cfg.performance.memory_pool_enabled)
    stream = validate_ticks(generate_ticks(n_ticks, markets, seed))
    batches = make_batches(stream, max_batch)
    slot_of: dict[str, int] = {}
    rep = PairReport(ticks=len(stream), batches=len(batches))
    pending: list[tuple[CudaHandle, np.ndarray, np.ndarray]] = []

    def drain() -> None:
        for handle, p_ref, s_ref in pending:
            p, s = cuda.wait(handle)
            rep.max_prob_diff = max(rep.max_prob_diff, float(np.abs(p - p_ref).max()))
            rep.spike_mismatches += int((s != s_ref).any(axis=1).sum())
        pending.clear()

    def compare_states() -> None:
        drain()
        cuda.sync_to_host()
        d, e = state_diff(fa, ca)
        rep.max_state_diff = max(rep.max_state_diff, d)
        rep.enc_mismatches += e

    for k, batch in enumerate(batches):
        for t in batch:
            if t.market_id not in slot_of:  # a new market starts from rest, as the pool does it
                slot = slot_of[t.market_id] = len(slot_of)
                fa.reset_slot(slot, params, golgi)
                ca.reset_slot(slot, params, golgi)
        if host_edits and k == len(batches) // 3:
            # Eviction and reuse: the market in slot 0 restarts from rest.
            drain()
            fa.reset_slot(0, params, golgi)
            ca.reset_slot(0, params, golgi)
        if host_edits and k == len(batches) // 2:
            # Restore: slot 1's snapshot (taken from the synced host arrays) into the market of slot 2.
            compare_states()
            snap = ca.read_slot(1)
            fa.write_slot(2, snap)
            ca.write_slot(2, snap)
        slots, ticks = as_arrays(batch, slot_of)
        if len({int(x) for x in slots}) < slots.size:
            rep.multi_wave_batches += 1
        p_ref, s_ref = fused.step(slots, ticks)
        p_ref, s_ref = p_ref.copy(), s_ref.copy()
        if asynchronous:
            pending.append((cuda.submit(slots, ticks), p_ref, s_ref))
            if len(pending) > streams + 1:  # deeper than the streams: forces collection on reuse
                drain()
        else:
            p, s = cuda.step(slots, ticks)
            rep.max_prob_diff = max(rep.max_prob_diff, float(np.abs(p - p_ref).max()))
            rep.spike_mismatches += int((s != s_ref).any(axis=1).sum())
        if k % check_every == check_every - 1:
            compare_states()
    compare_states()
    return rep, cuda


@pytest.fixture
def backend_pair() -> RunPair:
    """:func:`run_pair`: ``backend_pair(cfg, device="cpu", streams=2, ...) -> (report, backend)``."""
    return run_pair


@pytest.fixture
def cuda_cfg() -> Callable[..., Config]:
    """:func:`make_cfg`: ``cuda_cfg("float32", small=True, performance={...})``."""

    def make(precision: str, small: bool = True, performance: dict[str, Any] | None = None,
             neural: dict[str, Any] | None = None) -> Config:
        return make_cfg(precision, {**(SMALL_NEURAL if small else {}), **(neural or {})}, performance)

    return make


# A granule layer wide enough that one tick's workspace (about 1.25 MB) is more than the
# whole-MiB rounding of the estimate, so a memory limit can be set to a given launch size.
WIDE_GRANULE = {"granule_size": 24_000}


def tight_limit(cfg: Config, *, slots: int, max_batch: int, streams: int, launch: int) -> tuple[int, CudaPlan]:
    """A memory_limit at which ``cfg``'s network runs in launches of exactly ``launch`` ticks, and the plan at that limit."""
    perf, shape, fb = cfg.performance, network_shape(cfg.neural), cfg.dtype_bytes

    def plan(limit: int) -> CudaPlan:
        return plan_cuda(shape, fb, slots=slots, max_batch=max_batch, streams=streams, limit=limit,
                         pool_size=int(perf.memory_pool_size), pool_enabled=perf.memory_pool_enabled)

    limit = plan(10**15).fixed + streams * workspace_bytes(shape, launch, fb)
    return limit, plan(limit)


@pytest.fixture
def tight_cfg() -> Callable[..., tuple[Config, CudaPlan]]:
    """``tight_cfg(precision, streams, launch, markets=6, max_batch=12) -> (cfg, plan)``: the wide network with a
    memory_limit that leaves room for launches of ``launch`` ticks (slots as :func:`run_pair` allocates them)."""

    def make(precision: str, streams: int, launch: int, markets: int = 6, max_batch: int = 12) -> tuple[Config, CudaPlan]:
        base = make_cfg(precision, WIDE_GRANULE)
        limit, plan = tight_limit(base, slots=markets + 1, max_batch=max_batch, streams=streams, launch=launch)
        assert plan.launch_ticks == launch
        return make_cfg(precision, WIDE_GRANULE, {"memory_limit": limit}), plan

    return make
