"""Labels: the class (down, flat, up) of a tick's return over the prediction horizon.

One definition serves training, ``evaluate`` and the service's live self-evaluation;
:func:`label_series` (a whole series) and :class:`StreamLabels` (many markets' ticks as
they arrive) give identical labels for the same ticks.

Horizon. Tick t of a market is judged at its *end tick* e(t):

* ``neural.horizon_ticks = h`` (default): e(t) = t + h, ticks of the same market;
* ``neural.horizon_ms = H``: e(t) = the first later tick with time >= time(t) + H.

Its forward return is ``r = log(price[e]) - log(price[t])`` (dimensionless); ticks
without an end tick have no label (-1).

Flat band. ``|r| <= band(t)`` is ``flat``, above it ``up``, below ``-band`` ``down``:

* ``training.flat_band_mode = "fixed"``: ``band = training.flat_band`` (a log return;
  0.0005 = 5 basis points);
* ``"volatility"`` (default): ``band = k * sigma_t * sqrt(e(t) - t)`` with
  ``k = training.flat_band_volatility_multiple`` and ``sigma_t`` the running standard
  deviation of the per-tick log returns up to and including tick t (an exponentially
  weighted mean of squared returns with a memory of ``training.volatility_window``
  ticks, a plain mean while fewer returns have been seen). It uses nothing after t,
  so the band adapts to each market's recent volatility whatever its tick size or
  sampling (ticks, hours, days). For Gaussian returns ``k = 0.43`` puts about a third
  of the ticks in each class.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import numba as nb
import numpy as np

from .. import kernelcache  # noqa: F401  (installs the guard: a failed write of numba's cache is no error)
from ..config import Config

MAX_PENDING = 1_000_000  # pending ticks per market beyond which the oldest are dropped (time horizons only)


@dataclass(frozen=True)
class LabelSpec:
    """How ticks are labelled (see the module docstring).

    Attributes:
        horizon_ticks: horizon in ticks of the same market (used when ``horizon_ms`` is None).
        horizon_ms: horizon in ms of market time, or None.
        volatility_band: True for the volatility-scaled band, False for the fixed one.
        flat_band: fixed band (log return).
        band_multiple: band in units of the horizon's volatility.
        volatility_window: memory of the running volatility (ticks).
    """

    horizon_ticks: int = 10
    horizon_ms: int | None = None
    volatility_band: bool = True
    flat_band: float = 0.0005
    band_multiple: float = 0.43
    volatility_window: int = 100

    @classmethod
    def from_config(cls, cfg: Config) -> LabelSpec:
        """The spec of ``[neural]`` horizon keys and ``[training]`` band keys."""
        n, t = cfg.neural, cfg.training
        return cls(n.horizon_ticks, n.horizon_ms, t.flat_band_mode == "volatility", t.flat_band,
                   t.flat_band_volatility_multiple, t.volatility_window)

    def describe(self) -> str:
        """One line for reports, e.g. ``horizon 10 ticks, flat band 0.43 x volatility``."""
        h = f"{self.horizon_ms} ms" if self.horizon_ms is not None else f"{self.horizon_ticks} ticks"
        band = f"{self.band_multiple:g} x volatility" if self.volatility_band else f"{self.flat_band * 1e4:g} bp"
        return f"horizon {h}, flat band {band}"

    def to_dict(self) -> dict[str, object]:
        """JSON form (stored with models)."""
        return {"horizon_ticks": self.horizon_ticks, "horizon_ms": self.horizon_ms,
                "flat_band_mode": "volatility" if self.volatility_band else "fixed", "flat_band": self.flat_band,
                "flat_band_volatility_multiple": self.band_multiple, "volatility_window": self.volatility_window}


class Labels(NamedTuple):
    """Labels of one market's series (all arrays of the series' length).

    Attributes:
        labels: int64 class (0 down, 1 flat, 2 up), -1 without an end tick.
        fwd_ret: forward log return to the end tick (NaN without one).
        end: index of the end tick (-1 without one).
        band: flat band used (log return; NaN without an end tick).
        sigma: running per-tick volatility at the tick (log return).
    """

    labels: np.ndarray
    fwd_ret: np.ndarray
    end: np.ndarray
    band: np.ndarray
    sigma: np.ndarray


@nb.njit(cache=True, nogil=True)
def _volatility_update(var: float, count: float, r: float, window: float) -> tuple[float, float]:
    """Running mean of squared returns: plain mean for the first ``window`` returns, then EWMA."""
    count += 1.0
    alpha = max(1.0 / count, 1.0 / window)
    return var + alpha * (r * r - var), count


@nb.njit(cache=True, nogil=True)
def _classify(r: float, band: float) -> int:
    if r > band:
        return 2
    if r < -band:
        return 0
    return 1


@nb.njit(cache=True)
def _label_kernel(ts: np.ndarray, price: np.ndarray, h_ticks: int, h_ms: float, vol_band: bool, flat_band: float,
                  k: float, window: float, labels: np.ndarray, fwd: np.ndarray, end: np.ndarray, band: np.ndarray,
                  sigma: np.ndarray) -> None:
    n = price.shape[0]
    var, count = 0.0, 0.0
    for t in range(n):
        if t > 0:
            var, count = _volatility_update(var, count, math.log(price[t]) - math.log(price[t - 1]), window)
        sigma[t] = math.sqrt(var)
    j = 0
    for t in range(n):
        if h_ms > 0.0:
            j = max(j, t + 1)
            while j < n and ts[j] < ts[t] + h_ms:
                j += 1
            e = j if j < n else -1
        else:
            e = t + h_ticks if t + h_ticks < n else -1
        end[t] = e
        if e < 0:
            labels[t] = -1
            fwd[t] = np.nan
            band[t] = np.nan
            continue
        r = math.log(price[e]) - math.log(price[t])
        b = k * sigma[t] * math.sqrt(e - t) if vol_band else flat_band
        fwd[t] = r
        band[t] = b
        labels[t] = _classify(r, b)


def label_series(timestamp: np.ndarray, price: np.ndarray, spec: LabelSpec) -> Labels:
    """Labels of one market's ticks in time order (timestamps in ms, prices > 0)."""
    n = int(price.shape[0])
    out = Labels(np.empty(n, dtype=np.int64), np.empty(n), np.empty(n, dtype=np.int64), np.empty(n), np.empty(n))
    h_ms = float(spec.horizon_ms) if spec.horizon_ms is not None else 0.0
    _label_kernel(np.asarray(timestamp, dtype=np.float64), np.asarray(price, dtype=np.float64), spec.horizon_ticks, h_ms,
                  spec.volatility_band, spec.flat_band, spec.band_multiple, float(spec.volatility_window), *out)
    return out


def past_returns(price: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Log return over the previous horizon of each tick: from the tick whose end tick it is (NaN if none).

    For a tick horizon this is the return from tick t - h to t; for a time horizon,
    from the latest tick s whose end tick e(s) is t (NaN when no tick ends at t).
    """
    n = price.shape[0]
    out = np.full(n, np.nan)
    logp = np.log(np.asarray(price, dtype=np.float64))
    valid = np.nonzero(end >= 0)[0]
    # later starts overwrite earlier ones: the shortest look-back ending at t wins
    out[end[valid]] = logp[end[valid]] - logp[valid]
    return out


# StreamLabels' state. Per market row: state_f (running variance of the per-tick log returns, its count, the last log
# price) and state_i (ticks seen, the first and last of its pending ticks in the pool, -1 for none, how many pend).
S_VAR, S_COUNT, S_LOGP = 0, 1, 2
S_N, S_HEAD, S_TAIL, S_PENDING = 0, 1, 2, 3
# A pending tick, an entry of the pool shared by all markets: pool_i (its index among its market's ticks, the market's
# next pending entry, -1 for none) and pool_f (time in ms, log price, sigma, then the caller's payload).
P_IDX, P_NEXT = 0, 1
P_TS, P_LOGP, P_SIGMA, P_PAYLOAD = 0, 1, 2, 3
# Columns of a judged tick in the blocks StreamLabels.label yields: class, forward log return, band, then the payload.
J_CLASS, J_RET, J_BAND, J_PAYLOAD = 0, 1, 2, 3
# Columns of an observed tick given to StreamLabels.label: market row, time (ms), price, then the payload.
O_ROW, O_TS, O_PRICE, O_PAYLOAD = 0, 1, 2, 3


@nb.njit(cache=True)  # holds the GIL, as the engine's step does (docs/benchmarks.md, "The GIL inside the processing
# window"): the service labels served ticks on the event loop, between steps
def _stream_kernel(obs: np.ndarray, start: int, h_ticks: int, h_ms: float, vol_band: bool, flat_band: float,
                   k: float, window: float, max_pending: int, state_f: np.ndarray, state_i: np.ndarray,
                   pool_f: np.ndarray, pool_i: np.ndarray, free: np.ndarray, tops: np.ndarray, out: np.ndarray,
                   n_out: np.ndarray) -> int:
    """Label the observed ticks ``obs[start:]`` in order (see :class:`StreamLabels`), writing the ticks each one
    judges to ``out`` from ``n_out[0]`` on. Returns the index of the first tick not taken: ``len(obs)`` when all
    were, earlier when the pool has no free entry (``tops[0]``, the free stack's height) or ``out`` has no room for
    every tick the next one might judge. ``tops[1]`` counts pending ticks dropped beyond ``max_pending``."""
    w = obs.shape[1] - O_PAYLOAD
    for j in range(start, obs.shape[0]):
        s = int(obs[j, O_ROW])
        if tops[0] == 0 or n_out[0] + state_i[s, S_PENDING] > out.shape[0]:
            return j
        ts = obs[j, O_TS]
        logp = math.log(obs[j, O_PRICE])
        n = state_i[s, S_N]
        if n > 0:
            var, count = _volatility_update(state_f[s, S_VAR], state_f[s, S_COUNT], logp - state_f[s, S_LOGP], window)
            state_f[s, S_VAR], state_f[s, S_COUNT] = var, count
        e = state_i[s, S_HEAD]
        while e >= 0:  # the market's pending ticks whose end tick this is, oldest first
            if h_ms > 0.0:
                if ts < pool_f[e, P_TS] + h_ms:
                    break
            elif n - pool_i[e, P_IDX] < h_ticks:
                break
            r = logp - pool_f[e, P_LOGP]
            b = k * pool_f[e, P_SIGMA] * math.sqrt(n - pool_i[e, P_IDX]) if vol_band else flat_band
            o = n_out[0]
            out[o, J_CLASS], out[o, J_RET], out[o, J_BAND] = _classify(r, b), r, b
            for c in range(w):
                out[o, J_PAYLOAD + c] = pool_f[e, P_PAYLOAD + c]
            n_out[0] = o + 1
            free[tops[0]] = e
            tops[0] += 1
            state_i[s, S_PENDING] -= 1
            e = pool_i[e, P_NEXT]
        state_i[s, S_HEAD] = e
        tops[0] -= 1
        f = free[tops[0]]
        pool_i[f, P_IDX], pool_i[f, P_NEXT] = n, -1
        pool_f[f, P_TS], pool_f[f, P_LOGP], pool_f[f, P_SIGMA] = ts, logp, math.sqrt(state_f[s, S_VAR])
        for c in range(w):
            pool_f[f, P_PAYLOAD + c] = obs[j, O_PAYLOAD + c]
        if e >= 0:
            pool_i[state_i[s, S_TAIL], P_NEXT] = f
        else:
            state_i[s, S_HEAD] = f
        state_i[s, S_TAIL] = f
        state_i[s, S_PENDING] += 1
        if state_i[s, S_PENDING] > max_pending:  # the oldest pending tick goes unjudged
            h = state_i[s, S_HEAD]
            state_i[s, S_HEAD] = pool_i[h, P_NEXT]
            free[tops[0]] = h
            tops[0] += 1
            state_i[s, S_PENDING] -= 1
            tops[1] += 1
        state_f[s, S_LOGP] = logp
        state_i[s, S_N] = n + 1
    return obs.shape[0]


@nb.njit(cache=True)
def _stream_reset(s: int, state_f: np.ndarray, state_i: np.ndarray, pool_i: np.ndarray, free: np.ndarray,
                  tops: np.ndarray) -> None:
    """Forget market row ``s``: its pending ticks back to the free stack, its state as new."""
    e = state_i[s, S_HEAD]
    while e >= 0:
        free[tops[0]] = e
        tops[0] += 1
        e = pool_i[e, P_NEXT]
    state_f[s] = 0.0
    state_i[s, S_N], state_i[s, S_HEAD], state_i[s, S_TAIL], state_i[s, S_PENDING] = 0, -1, -1, 0


@nb.njit(cache=True)  # holds the GIL (numpy's own copy of a large array releases it)
def _grown_pool(pool_f: np.ndarray, pool_i: np.ndarray, free: np.ndarray,
                top: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pool's arrays with twice its entries, the old ones kept and the new ones on the free stack (whose height
    was ``top``) under the old free entries."""
    size = pool_i.shape[0]
    new_f = np.zeros((2 * size, pool_f.shape[1]))
    new_i = np.zeros((2 * size, 2), np.int64)
    new_free = np.zeros(2 * size, np.int64)
    new_f[:size] = pool_f
    new_i[:size] = pool_i
    new_free[:top] = free[:top]
    for k in range(size):
        new_free[top + k] = 2 * size - 1 - k
    return new_f, new_i, new_free


class StreamLabels:
    """Labels many markets' ticks as they arrive, with the labels :func:`label_series` gives each market's series.

    A market is a row (``0 <= row < rows``, the caller's numbering; :meth:`reset` makes a row new). Ticks are given
    to :meth:`label` in blocks, in arrival order (each market's in time order): an array of ``(row, time in ms, price
    > 0, payload...)``, ``payload`` columns of the caller's (``payload_width`` of them, e.g. the probabilities served
    for the tick). It yields the earlier ticks that they judge, in the order they are judged: ``(class, forward log
    return, band, payload...)``. A tick waits in a pool shared by the markets until its end tick comes; for a
    horizon in ms at most ``MAX_PENDING`` ticks of a market wait, older ones are dropped and counted in
    :attr:`dropped`. All of it runs compiled, one call per block: tracked tick by tick in Python, the labels cost the
    service about 1.3 µs per tick more (docs/operations.md, "Live self-evaluation").
    """

    def __init__(self, spec: LabelSpec, payload_width: int, rows: int = 1, pool: int = 64, out: int = 256,
                 max_pending: int = MAX_PENDING) -> None:
        self.spec = spec
        self._params = (int(spec.horizon_ticks), float(spec.horizon_ms) if spec.horizon_ms is not None else 0.0,
                        bool(spec.volatility_band), float(spec.flat_band), float(spec.band_multiple),
                        float(spec.volatility_window), int(max_pending))  # (typed: one compiled variant)
        self._state_f = np.zeros((0, 3))
        self._state_i = np.zeros((0, 4), np.int64)
        self.grow_rows(rows)
        half = max(pool // 2, 1)  # the pool is made by growing one of half its size: the compiled growth is then
        self._pool_f = np.zeros((half, P_PAYLOAD + payload_width))  # loaded at the start, not while serving
        self._pool_i = np.zeros((half, 2), np.int64)
        self._free = np.arange(half - 1, -1, -1, dtype=np.int64)  # a stack: entry 0 on top
        self._tops = np.array([half, 0], np.int64)  # the free stack's height, pending ticks dropped
        self._grow_pool()
        self._out = np.zeros((max(out, 1), J_PAYLOAD + payload_width))
        self._n_out = np.zeros(1, np.int64)

    @property
    def rows(self) -> int:
        """Market rows held."""
        return int(self._state_i.shape[0])

    @property
    def dropped(self) -> int:
        """Pending ticks dropped unjudged (beyond ``max_pending`` of one market)."""
        return int(self._tops[1])

    @property
    def pending(self) -> int:
        """Ticks waiting for their end tick, all markets."""
        return int(self._free.shape[0] - self._tops[0])

    def grow_rows(self, rows: int) -> None:
        """Hold at least ``rows`` market rows (the new ones as new markets)."""
        old = self.rows
        if rows <= old:
            return
        state_f = np.zeros((rows, 3))
        state_i = np.zeros((rows, 4), np.int64)
        state_i[:, S_HEAD:S_TAIL + 1] = -1
        state_f[:old], state_i[:old] = self._state_f, self._state_i
        self._state_f, self._state_i = state_f, state_i

    def reset(self, row: int) -> None:
        """Make ``row`` a new market: its pending ticks are dropped unjudged (not counted in :attr:`dropped`)."""
        _stream_reset(row, self._state_f, self._state_i, self._pool_i, self._free, self._tops)

    def label(self, obs: np.ndarray) -> Iterator[np.ndarray]:
        """Label the observed ticks ``obs`` (float64, ``(n, 3 + payload_width)``: row, ms, price, payload), in order;
        yields blocks of the ticks they judge, oldest first (each block valid until the next is asked for)."""
        obs = np.ascontiguousarray(obs, dtype=np.float64)  # one compiled variant, whatever view is given
        j, n = 0, obs.shape[0]
        while True:
            self._n_out[0] = 0
            j = _stream_kernel(obs, j, *self._params, self._state_f, self._state_i, self._pool_f, self._pool_i,
                               self._free, self._tops, self._out, self._n_out)
            judged = int(self._n_out[0])
            if judged:
                yield self._out[:judged]
            if j == n:
                return
            if self._tops[0] == 0:
                self._grow_pool()
            elif not judged:  # one tick may judge more pending ticks than a block holds
                need = int(self._state_i[int(obs[j, O_ROW]), S_PENDING])
                self._out = np.zeros((max(need, 2 * self._out.shape[0]), self._out.shape[1]))

    def _grow_pool(self) -> None:
        """Twice the pool's entries, the new ones free (compiled: numpy's copies of a large array release the GIL)."""
        size = self._pool_i.shape[0]
        top = int(self._tops[0])
        self._pool_f, self._pool_i, self._free = _grown_pool(self._pool_f, self._pool_i, self._free, top)
        self._tops[0] = top + size
