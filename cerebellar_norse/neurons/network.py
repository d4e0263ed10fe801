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

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..config import Config, consistency_problems, load_checked_config
from ..engine.pipeline import StepBuffers, step_ticks, tick_results
from ..engine.pool import StatePool
from ..errors import ConfigError, InputError
from ..ticks import Tick, check_order, validate_tick, validate_ticks
from .backends import Backend, make_backend
from .parameters import encoder_parameters, network_parameters
from .state import StateArrays
from .topology import Weights, generate_weights


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
        if backend not in ("fused", "reference"):
            # make_backend also knows "cuda", but only the service's engine builds it (it needs the device plan).
            raise ValueError(f"unknown backend {backend!r} for CerebellarNetwork; choose 'fused' or 'reference' "
                             "(the CUDA backend runs in the service: performance.device = \"cuda\")")
        if isinstance(config, Config):
            # A Config is used as given (no memory or host checks), but a network shape that
            # cannot be built is refused here rather than crashing in the topology's sampling.
            shape = [p for p in consistency_problems(config) if p.key.startswith("neural.")]
            if shape:
                raise ConfigError(shape, "<Config object>")
            self.config = config
        else:
            self.config = load_checked_config(config)
        cfg = self.config
        self.weights = generate_weights(cfg) if weights is None else weights
        self.params = network_parameters(cfg, float(self.weights.golgi_init))
        if self.weights.shape != self.params.shape:
            raise InputError(f"weights of shape {self.weights.shape} do not match the config's network {self.params.shape}", "weights")
        self.max_batch = max_batch or cfg.performance.batch_size
        arrays = StateArrays.allocate(max_markets or cfg.performance.max_markets, self.params, cfg.neural.precision)
        self.pool = StatePool(arrays, self._reset_slot)
        self.last_spikes = np.zeros((0, 3), dtype=np.int64)  # spikes (granule, Purkinje, DCN) per tick of the last call
        self.backend: Backend = make_backend(backend, self.weights, self.params, arrays, encoder_parameters(cfg.neural), self.max_batch,
                                              cfg.performance.cpu_threads)
        self._buf = StepBuffers.allocate(self.backend, self.max_batch, arrays.slots)

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

    def process_batch(self, ticks: Iterable[Mapping[str, Any]] | Mapping[str, Any]) -> list[dict[str, Any]]:
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
            _, spikes, elapsed = step_ticks(self.pool, self.backend, self.weights, chunk, self._buf)
            out.extend(r.as_dict() for r in tick_results(chunk, self._buf, elapsed, self.config.neural.warmup_ticks))
            spike_parts.append(spikes.copy())
        self.last_spikes = np.concatenate(spike_parts)
        return out
