"""Tick encoder: market tick -> features -> population-coded mossy-fibre currents.

Per market, a running normaliser (float64, part of the market's state) turns each
tick into three z-scored features:

* log return ``log(price) - log(previous price)`` (dimensionless),
* log volume ``log1p(volume)`` (volume in the tick's units),
* log inter-tick gap ``log1p(gap_ms / 1000)`` (gap in seconds).

The first tick of a market has no return and no gap: those features are 0 and do not
enter the statistics. A feature is z-scored against the statistics *before* the tick
(an exponentially weighted mean and variance whose memory is ``norm_window`` ticks,
with a plain running mean while fewer ticks have been seen), 0 while fewer than two
observations exist, and clipped to ``±feature_clip``. The log return is not demeaned: it
is divided by its running root mean square (``sqrt(var + mean**2)``, the exponentially
weighted second moment), so its sign survives a short window in a trending market.

Population coding: feature f drives ``K = mossy_size / 3`` fibres with Gaussian
tuning curves centred evenly on ``[-clip, clip]``, width one centre spacing, peak
current ``mossy_gain`` (dimensionless current per step).

Both backends call these same numba functions, so encoding never differs between
them. All functions are pure apart from writing their output/state arguments.
"""

from __future__ import annotations

import math

import numba as nb
import numpy as np

from .. import kernelcache  # noqa: F401  (installs the guard: a failed write of numba's cache is no error)

# Layout of one market's encoder state (float64).
S_LAST_PRICE, S_LAST_TS, S_N_TICKS = 0, 1, 2
S_MEAN, S_VAR, S_COUNT = 3, 6, 9  # three entries each, one per feature
N_ENC_STATE = 12
VAR_FLOOR = 1e-12


# e^-1: the ratio between successive tuning-curve ratios of the population code.
_E_M1 = math.exp(-1.0)


@nb.njit(cache=True, nogil=True, error_model="numpy")
def population_code_into(z: np.ndarray, per_feature: int, clip: float, gain: float, out: np.ndarray) -> None:
    """Write the mossy-fibre currents of features ``z`` (3,) into ``out`` (3*K,).

    Fibre j of feature f carries ``gain * exp(-d_j**2 / 2)`` with ``d_j = (z[f] - c_j) / spacing``,
    ``c_j = -clip + j * spacing``. Since the centres are evenly spaced, the curve of fibre
    j + 1 is that of fibre j times ``exp(d_j - 1/2)``, and those ratios fall by a factor e
    from fibre to fibre. So two ``exp`` per feature (at the centre nearest to z, and its
    ratio) and multiplications give all K currents, instead of one ``exp`` per fibre;
    the products agree with the direct formula to about 1e-13 relative for K up to 64.
    """
    spacing = 2.0 * clip / (per_feature - 1)
    last = per_feature - 1
    for f in range(3):
        d = (z[f] + clip) / spacing  # position of z in centre spacings from the first centre
        j0 = 0  # nearest centre; a NaN z stays at 0 (and yields NaN currents, as the formula does)
        if d >= last:
            j0 = last
        elif d > 0.0:
            j0 = int(d + 0.5)
        e = d - j0
        base = f * per_feature
        g0 = gain * math.exp(-0.5 * e * e)
        out[base + j0] = g0
        g, r = g0, math.exp(e - 0.5)
        for j in range(j0 + 1, per_feature):
            g *= r
            out[base + j] = g
            r *= _E_M1
        g, r = g0, math.exp(-e - 0.5)
        for j in range(j0 - 1, -1, -1):
            g *= r
            out[base + j] = g
            r *= _E_M1


def population_code(z: np.ndarray, per_feature: int, clip: float, gain: float) -> np.ndarray:
    """Mossy-fibre currents (float64, shape (3*K,)) of the feature vector ``z``."""
    out = np.empty(3 * per_feature, dtype=np.float64)
    population_code_into(np.asarray(z, dtype=np.float64), per_feature, clip, gain, out)
    return out


@nb.njit(cache=True, nogil=True, error_model="numpy")
def encode_tick(state: np.ndarray, price: float, volume: float, ts_ms: float, window: float, clip: float,
                z_out: np.ndarray) -> None:
    """Update one market's normaliser ``state`` (12,) with a tick; write z-features to ``z_out`` (3,).

    Args:
        state: the market's encoder state (float64, layout S_*), updated in place.
        price: tick price (> 0, finite).
        volume: tick volume (>= 0, finite).
        ts_ms: tick time (ms since epoch); not older than the previous tick.
        window: memory of the running statistics (ticks).
        clip: z-scores are clipped to ±clip.
        z_out: output, the three z-scored features.
    """
    first = state[S_N_TICKS] == 0.0
    # difference of logs: a ratio of two valid prices can overflow, their logs cannot
    x0 = 0.0 if first else math.log(price) - math.log(state[S_LAST_PRICE])
    x2 = 0.0 if first else math.log1p(max(ts_ms - state[S_LAST_TS], 0.0) / 1000.0)
    x1 = math.log1p(volume)
    for f in range(3):
        x = x0 if f == 0 else (x1 if f == 1 else x2)
        if f != 1 and first:
            z_out[f] = 0.0
            continue
        cnt = state[S_COUNT + f]
        mean = state[S_MEAN + f]
        var = state[S_VAR + f]
        if cnt >= 2.0:
            # returns are scaled by their root mean square, not demeaned: over a short
            # window the mean return is the trend itself, which the network must see
            z = x / math.sqrt(var + mean * mean + VAR_FLOOR) if f == 0 else (x - mean) / math.sqrt(var + VAR_FLOOR)
            z_out[f] = min(max(z, -clip), clip)
        else:
            z_out[f] = 0.0
        alpha = max(1.0 / (cnt + 1.0), 1.0 / window)
        delta = x - mean
        state[S_MEAN + f] = mean + alpha * delta
        state[S_VAR + f] = (1.0 - alpha) * (var + alpha * delta * delta)
        state[S_COUNT + f] = cnt + 1.0
    state[S_LAST_PRICE] = price
    state[S_LAST_TS] = ts_ms
    state[S_N_TICKS] += 1.0


@nb.njit(cache=True, nogil=True, error_model="numpy")
def encode_tick_to_mossy(state: np.ndarray, price: float, volume: float, ts_ms: float, enc_par: np.ndarray,
                         z_buf: np.ndarray, mossy_out: np.ndarray) -> None:
    """Encode a tick straight into mossy-fibre currents ``mossy_out`` (any float type).

    ``enc_par`` is :func:`cerebellar_norse.neurons.parameters.encoder_parameters`.
    """
    encode_tick(state, price, volume, ts_ms, enc_par[0], enc_par[1], z_buf)
    population_code_into(z_buf, int(enc_par[3]), enc_par[1], enc_par[2], mossy_out)
