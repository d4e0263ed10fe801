"""Public Python API: a cerebellar network you can feed ticks without HTTP.

>>> from cerebellar_norse import CerebellarNetwork
>>> net = CerebellarNetwork()                      # built-in default config, fused backend
>>> r = net.process({"price": 100.0, "volume": 1000.0, "timestamp": 1640995200000, "market_id": "TEST"})
>>> sorted(r)
['confidence', 'market_id', 'prediction', 'probabilities', 'processing_time_ns', 'spike_count', 'warming_up']

Results are the dicts the HTTP API returns (without model_version/request_id):
``prediction = P(up) - P(down)`` in [-1, 1]; ``confidence = 1 - H(p)/ln 3`` in [0, 1]
(0 for a uniform distribution, 1 for a certain one); ``spike_count`` the spikes of all
populations during the tick; ``processing_time_ns`` the network time of the call,
divided evenly among the ticks of a batch; ``warming_up`` True until the market has
seen ``neural.warmup_ticks`` ticks (its state still depends on where it started).
Probabilities are the network's, passed through the model's calibrated head
(``Weights.head_gain``/``head_bias``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numba as nb
import numpy as np

from ..config import Config, load_checked_config
from ..engine.pool import StatePool
from ..errors import InputError
from ..ticks import Tick, check_order, validate_tick, validate_ticks
from .backends import Backend, make_backend
from .encoder import S_N_TICKS
from .fused import softmax_row
from .parameters import encoder_parameters, network_parameters
from .state import StateArrays
from .topology import Weights, generate_weights

CLASSES = ("down", "flat", "up")
_LN3 = math.log(3.0)


def _confidence(p: list[float]) -> float:
    h = -sum(x * math.log(x) for x in p if x > 0.0)
    return min(max(1.0 - h / _LN3, 0.0), 1.0)


def result_dicts(ticks: Sequence[Tick], probs: np.ndarray, spikes: np.ndarray, elapsed_ns: int,
                 seen: np.ndarray | None = None, warmup_ticks: int = 0) -> list[dict[str, Any]]:
    """Result dicts of a batch (shared with the engine so every path answers alike).

    ``seen`` (B,) holds how many ticks each tick's market had seen including it; a
    result carries ``warming_up`` while that is at most ``warmup_ticks``.

    Plain Python per row: for the small batches of live serving, numpy's per-call
    overhead would cost more than the kernel, and one code path for every batch size
    keeps a tick's result bit-identical whether it was batched or not.
    """
    per_tick = elapsed_ns // max(len(ticks), 1)
    rows = probs.tolist()
    totals = spikes.sum(axis=1).tolist()
    warm = [False] * len(ticks) if seen is None else (seen[:len(ticks)] <= warmup_ticks).tolist()
    out = []
    for j, t in enumerate(ticks):
        p = rows[j]
        out.append({
            "market_id": t.market_id,
            "prediction": p[2] - p[0],
            "probabilities": {"down": p[0], "flat": p[1], "up": p[2]},
            "confidence": _confidence(p),
            "spike_count": int(totals[j]),
            "processing_time_ns": per_tick,
            "warming_up": warm[j],
        })
    return out


@nb.njit(cache=True, nogil=True, error_model="numpy")
def _finish_batch(slots: np.ndarray, enc: np.ndarray, scratch: np.ndarray, seen: np.ndarray, probs: np.ndarray,
                  gain: np.ndarray, bias: np.ndarray, apply_head: bool) -> None:
    """Ticks seen per market (after a step) and, with ``apply_head``, the calibrated head in place.

    ``seen[j]`` is the market's tick count including tick j (later ticks of the same
    market in the batch are subtracted from the count after the step). The head maps
    each row ``p`` to ``softmax(gain * log p + bias)``.
    """
    b = slots.shape[0]
    for j in range(b):
        scratch[slots[j]] = enc[slots[j], S_N_TICKS]
    for j in range(b - 1, -1, -1):
        s = slots[j]
        seen[j] = scratch[s]
        scratch[s] -= 1.0
    if not apply_head:
        return
    for j in range(b):
        for c in range(probs.shape[1]):
            probs[j, c] = gain[c] * math.log(max(probs[j, c], 1e-300)) + bias[c]
        softmax_row(probs[j])


@dataclass
class StepBuffers:
    """Preallocated inputs and outputs of :func:`step_ticks` for batches up to ``max_batch`` ticks."""

    slots: np.ndarray  # (B,) int64 slot of each tick
    ticks: np.ndarray  # (3, B) float64 price, volume, time (ms)
    seen: np.ndarray  # (B,) float64 ticks seen by the tick's market, including it
    scratch: np.ndarray  # (S,) float64, one per state slot
    head_of: object = None  # the weights whose head ``apply_head`` describes
    apply_head: bool = False

    @classmethod
    def allocate(cls, max_batch: int, n_slots: int) -> StepBuffers:
        """Buffers for ``max_batch`` ticks over ``n_slots`` state slots."""
        return cls(np.zeros(max_batch, dtype=np.int64), np.zeros((3, max_batch)), np.zeros(max_batch), np.zeros(n_slots))


def step_ticks(pool: StatePool, backend: Backend, weights: Weights, ticks: Sequence[Tick],
               buf: StepBuffers) -> tuple[np.ndarray, np.ndarray, int]:
    """Give each tick its market's slot, step the backend, apply the model's calibrated head.

    Fills ``buf.seen[:len(ticks)]`` (see :func:`_finish_batch`). Returns probabilities,
    spikes and the time in ns (backend step and head).
    """
    b = len(ticks)
    slots, arr = buf.slots[:b], buf.ticks[:, :b]
    for j, t in enumerate(ticks):
        slots[j] = pool.table.acquire(t.market_id)
        arr[0, j], arr[1, j], arr[2, j] = t.price, t.volume, t.timestamp
    t0 = time.perf_counter_ns()
    probs, spikes = backend.step(slots, arr)
    if weights is not buf.head_of:  # checked once per weights object, not per batch
        buf.head_of, buf.apply_head = weights, not weights.head_is_identity
    _finish_batch(slots, pool.arrays.enc, buf.scratch, buf.seen, probs, weights.head_gain, weights.head_bias,
                  buf.apply_head)
    return probs, spikes, time.perf_counter_ns() - t0


class CerebellarNetwork:
    """A cerebellar spiking network with per-market state.

    Args:
        config: a :class:`Config`, a path to a TOML file, or None for the built-in default.
        backend: ``"fused"`` (numba kernel, fast) or ``"reference"`` (Norse, slow, differentiable).
        weights: weights to use instead of the ones generated from the config's seed.
        max_markets: market slots (default ``performance.max_markets``); beyond it the
            least recently used market is evicted and restarts from rest.
        max_batch: largest batch (default ``performance.batch_size``; bigger batches are split).

    Not thread-safe: use one network per thread, or the engine for concurrent callers.
    """

    def __init__(self, config: Config | str | Path | None = None, backend: str = "fused", weights: Weights | None = None,
                 max_markets: int | None = None, max_batch: int | None = None) -> None:
        self.config = config if isinstance(config, Config) else load_checked_config(config)
        cfg = self.config
        self.weights = generate_weights(cfg) if weights is None else weights
        self.params = network_parameters(cfg, float(self.weights.golgi_init))
        if self.weights.shape != self.params.shape:
            raise InputError(f"weights of shape {self.weights.shape} do not match the config's network {self.params.shape}", "weights")
        self.max_batch = max_batch or cfg.performance.batch_size
        arrays = StateArrays.allocate(max_markets or cfg.performance.max_markets, self.params, cfg.neural.precision)
        self.pool = StatePool(arrays, self._reset_slot)
        self.last_spikes = np.zeros((0, 3), dtype=np.int64)  # spikes (granule, Purkinje, DCN) per tick of the last call
        self._buf = StepBuffers.allocate(self.max_batch, arrays.slots)
        self.backend: Backend = make_backend(backend, self.weights, self.params, arrays, encoder_parameters(cfg.neural), self.max_batch,
                                              cfg.performance.cpu_threads)

    # -- state -----------------------------------------------------------------

    def _reset_slot(self, slot: int) -> None:
        self.pool.arrays.reset_slot(slot, self.params, float(self.weights.golgi_init))

    @property
    def markets(self) -> list[str]:
        """Markets with live state, least recently used first."""
        return self.pool.table.markets()

    def reset(self, market_id: str) -> bool:
        """Forget a market's state (its next tick starts from rest); True when it had state."""
        return self.pool.table.release(market_id)

    def snapshot(self, market_id: str) -> dict[str, np.ndarray]:
        """A copy of a market's state (encoder and every neuron), for later :meth:`restore`."""
        slot = self.pool.table.get(market_id)
        if slot is None:
            raise InputError(f"no state for market {market_id!r}", "market_id")
        return self.pool.arrays.read_slot(slot)

    def restore(self, market_id: str, snapshot: Mapping[str, np.ndarray]) -> None:
        """Load a snapshot into a market (created if new). Shapes are checked before any change."""
        probe = self.pool.arrays.read_slot(0)
        for k, v in probe.items():
            got = snapshot.get(k)
            if got is None or np.shape(got) != v.shape:
                raise InputError(f"snapshot field {k!r} missing or of shape {None if got is None else np.shape(got)}, expected {v.shape}", "snapshot")
        self.pool.arrays.write_slot(self.pool.table.acquire(market_id), dict(snapshot))

    # -- processing ------------------------------------------------------------

    def process(self, tick: Mapping[str, Any]) -> dict[str, Any]:
        """Process one tick (a mapping with price, volume, timestamp, market_id)."""
        return self.process_ticks([validate_tick(tick)], batch=False)[0]

    def process_batch(self, ticks: Sequence[Mapping[str, Any]] | Mapping[str, Any]) -> list[dict[str, Any]]:
        """Process many ticks in order: a list of tick mappings or a mapping of columns.

        Every tick is validated (and checked not to be older than its market's last
        tick) before any state changes; results come back in input order.
        """
        return self.process_ticks(validate_ticks(ticks))

    def process_ticks(self, ticks: Sequence[Tick], batch: bool = True) -> list[dict[str, Any]]:
        """Process validated ticks (see :mod:`cerebellar_norse.ticks`)."""
        if not ticks:
            return []
        check_order(ticks, self.pool.last_timestamp, batch)
        distinct = len({t.market_id for t in ticks})
        if distinct > self.pool.capacity:
            raise InputError(f"batch has {distinct} markets but the pool holds {self.pool.capacity}", "ticks")
        out: list[dict[str, Any]] = []
        spike_parts: list[np.ndarray] = []
        for start in range(0, len(ticks), self.max_batch):
            chunk = ticks[start:start + self.max_batch]
            b = len(chunk)
            probs, spikes, elapsed = step_ticks(self.pool, self.backend, self.weights, chunk, self._buf)
            out.extend(result_dicts(chunk, probs, spikes, elapsed, self._buf.seen[:b], self.config.neural.warmup_ticks))
            spike_parts.append(spikes.copy())
        self.last_spikes = np.concatenate(spike_parts)
        return out
