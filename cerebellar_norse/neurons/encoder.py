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

# Layout of one market's encoder state (float64).
S_LAST_PRICE, S_LAST_TS, S_N_TICKS = 0, 1, 2
S_MEAN, S_VAR, S_COUNT = 3, 6, 9  # three entries each, one per feature
N_ENC_STATE = 12
VAR_FLOOR = 1e-12


@nb.njit(cache=True, nogil=True, error_model="numpy")
def population_code_into(z: np.ndarray, per_feature: int, clip: float, gain: float, out: np.ndarray) -> None:
    """Write the mossy-fibre currents of features ``z`` (3,) into ``out`` (3*K,)."""
    spacing = 2.0 * clip / (per_feature - 1)
    for f in range(3):
        for j in range(per_feature):
            centre = -clip + spacing * j
            d = (z[f] - centre) / spacing
            out[f * per_feature + j] = gain * math.exp(-0.5 * d * d)


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
