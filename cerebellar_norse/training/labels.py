"""Labels: the class (down, flat, up) of a tick's return over the prediction horizon.

One definition serves training, ``evaluate`` and the service's live self-evaluation;
:func:`label_series` (a whole series) and :class:`StreamLabeler` (tick by tick) give
identical labels for the same ticks.

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
from collections import deque
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

import numba as nb
import numpy as np

from .. import kernelcache  # noqa: F401  (installs the guard: a failed write of numba's cache is no error)
from ..config import Config

T = TypeVar("T")
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


def _volatility_update_py(var: float, count: float, r: float, window: float) -> tuple[float, float]:
    """Running mean of squared returns: plain mean for the first ``window`` returns, then EWMA."""
    count += 1.0
    alpha = max(1.0 / count, 1.0 / window)
    return var + alpha * (r * r - var), count


def _classify_py(r: float, band: float) -> int:
    if r > band:
        return 2
    if r < -band:
        return 0
    return 1


# The same IEEE operations compiled for the series kernel; the streaming path stays in
# Python, where a call into numba per tick would cost more than the arithmetic.
_volatility_update = nb.njit(cache=True, nogil=True)(_volatility_update_py)
_classify = nb.njit(cache=True, nogil=True)(_classify_py)


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


class Resolved(NamedTuple, Generic[T]):
    """A tick judged once its horizon passed: its payload, class, forward return and band."""

    payload: T
    label: int
    fwd_ret: float
    band: float


class StreamLabeler(Generic[T]):
    """Labels one market's ticks as they arrive (same labels as :func:`label_series`).

    ``observe`` takes each tick (with any payload, e.g. the probabilities served for it)
    and returns the earlier ticks that the new one judges. For time horizons at most
    ``MAX_PENDING`` ticks wait; older ones are dropped and counted in ``dropped``.
    """

    __slots__ = ("_count", "_last_price", "_n", "_pending", "_var", "dropped", "spec")

    def __init__(self, spec: LabelSpec) -> None:
        self.spec = spec
        self._var = 0.0
        self._count = 0.0
        self._last_price = math.nan
        self._n = 0
        self._pending: deque[tuple[int, float, float, float, T]] = deque()
        self.dropped = 0

    def observe(self, ts_ms: float, price: float, payload: T) -> list[Resolved[T]]:
        """Add a tick (ms since epoch, price > 0); returns the ticks it judges, oldest first."""
        s = self.spec
        if self._n > 0:
            self._var, self._count = _volatility_update_py(self._var, self._count,
                                                           math.log(price) - math.log(self._last_price), float(s.volatility_window))
        out: list[Resolved[T]] = []
        q = self._pending
        logp = math.log(price)
        while q:
            idx, t0, logp0, sig0, pay = q[0]
            if s.horizon_ms is not None:
                if ts_ms < t0 + s.horizon_ms:
                    break
            elif self._n - idx < s.horizon_ticks:
                break
            q.popleft()
            r = logp - logp0
            b = s.band_multiple * sig0 * math.sqrt(self._n - idx) if s.volatility_band else s.flat_band
            out.append(Resolved(pay, _classify_py(r, b), r, b))
        q.append((self._n, float(ts_ms), logp, math.sqrt(self._var), payload))
        if len(q) > MAX_PENDING:
            q.popleft()
            self.dropped += 1
        self._last_price = price
        self._n += 1
        return out
