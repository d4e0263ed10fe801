"""Climbing-fibre learning: online adaptation of parallel-fibre -> Purkinje weights while serving.

The cerebellar rule (Marr–Albus–Ito): a parallel-fibre synapse that was active when
the Purkinje cell's climbing fibre signalled an error is depressed (LTD); an active
synapse without a climbing-fibre signal is potentiated (LTP), more weakly.

Here a tick's prediction is judged once its horizon has passed (``horizon_ticks``
later for the same market): the realised class c* is the label of the return over
the horizon. When the prediction ĉ was wrong:

* the climbing fibres of the Purkinje cells that inhibit class c*'s deep-nuclei group
  fire: LTD, ``w -= rate * w``, on their synapses from granule cells active at the
  tick — less inhibition, so c* gets stronger next time;
* the Purkinje cells of the wrongly predicted class ĉ get LTP on their active
  synapses, ``w += rate * ltp_ratio * w_scale`` — more inhibition of ĉ.

A Purkinje cell's class is the deep-nuclei group it inhibits most (``w_pd``).
Weights stay within [0, w_max]. Updates are applied in place to the fused kernel's
parallel-fibre weights between batches. Off by default (``training.online_learning``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numba as nb
import numpy as np

from .. import kernelcache  # noqa: F401  (installs the guard: a failed write of numba's cache is no error)
from ..neurons.topology import Weights

LTP_RATIO = 0.25


@nb.njit(cache=True, nogil=True)
def climbing_fibre_update(pf_w: np.ndarray, pf_ptr: np.ndarray, pf_post: np.ndarray, active: np.ndarray,
                          pc_signal: np.ndarray, rate: float, ltp_step: float, w_max: float,
                          pf_rows: np.ndarray | None = None) -> int:
    """Apply the rule to CSR parallel-fibre weights in place; returns the number of synapses changed.

    Args:
        pf_w: (nnz,) weights in CSR (presynaptic granule) order.
        pf_ptr, pf_post: CSR row pointers and postsynaptic Purkinje cells.
        active: (k,) granule cells active at the judged tick.
        pc_signal: (P,) int8: +1 climbing fibre fired (LTD), -1 potentiate (LTP), 0 leave.
        pf_rows: the kernel's dense copy (G, P) of the same weights, kept equal (None or (0, P): none).
        rate: LTD fraction per event (dimensionless).
        ltp_step: LTP increment per event (weight units).
        w_max: upper bound of a weight.
    """
    changed = 0
    for k in range(active.shape[0]):
        g = active[k]
        for e in range(pf_ptr[g], pf_ptr[g + 1]):
            sig = pc_signal[pf_post[e]]
            if sig > 0:
                pf_w[e] -= rate * pf_w[e]
                changed += 1
            elif sig < 0:
                w = pf_w[e] + ltp_step
                pf_w[e] = w if w < w_max else w_max
                changed += 1
            if pf_w[e] < 0:
                pf_w[e] = 0
            if pf_rows is not None and pf_rows.shape[0] > 0:
                pf_rows[g, pf_post[e]] = pf_w[e]
    return changed


def purkinje_classes(w: Weights) -> np.ndarray:
    """Class (0 down, 1 flat, 2 up) of each Purkinje cell: the DCN group it inhibits most."""
    n, k = w.w_pd.shape[0], w.w_out.shape[0]
    group = n // k
    per_class = np.stack([w.w_pd[c * group:(c + 1) * group].sum(axis=0) for c in range(k)])
    return np.asarray(per_class.argmax(axis=0), dtype=np.int64)


@dataclass
class _Pending:
    price: float
    predicted: int
    active: np.ndarray


class OnlineLearner:
    """Keeps each market's last ``horizon`` predictions and applies the rule when they are judged."""

    def __init__(self, weights: Weights, horizon: int, flat_band: float, rate: float) -> None:
        self.horizon = horizon
        self.flat_band = flat_band
        self.rate = rate
        self.pc_class = purkinje_classes(weights)
        self.w_scale = float(np.mean(weights.pf_w)) if weights.pf_w.size else 0.0
        self.w_max = float(np.max(weights.pf_w)) * 4.0 if weights.pf_w.size else 1.0
        self.pending: dict[str, deque[_Pending]] = {}
        self.updates = 0
        self.synapses_changed = 0
        self.judged = 0
        self.errors = 0

    def forget(self, market: str) -> None:
        """Drop a market's pending predictions (it was reset or evicted)."""
        self.pending.pop(market, None)

    def retain(self, markets: set[str]) -> None:
        """Drop the pending predictions of every market not in ``markets`` (no longer live)."""
        for market in [m for m in self.pending if m not in markets]:
            del self.pending[market]

    def observe(self, market: str, price: float, probs: np.ndarray, active: np.ndarray,
                pf_w_csr: np.ndarray, pf_ptr: np.ndarray, pf_post: np.ndarray, pf_rows: np.ndarray | None = None) -> None:
        """Record one processed tick; judge the tick ``horizon`` ticks back and learn from it."""
        q = self.pending.setdefault(market, deque())
        q.append(_Pending(price, int(np.argmax(probs)), np.flatnonzero(active).astype(np.int64)))
        if len(q) <= self.horizon:
            return
        old = q.popleft()
        r = math.log(price) - math.log(old.price)
        truth = 2 if r > self.flat_band else (0 if r < -self.flat_band else 1)
        self.judged += 1
        if truth == old.predicted or old.active.size == 0:
            return
        self.errors += 1
        signal = np.zeros(self.pc_class.shape[0], dtype=np.int8)
        signal[self.pc_class == truth] = 1
        signal[self.pc_class == old.predicted] = -1
        self.synapses_changed += climbing_fibre_update(pf_w_csr, pf_ptr, pf_post, old.active, signal, self.rate,
                                                       self.rate * LTP_RATIO * self.w_scale, self.w_max, pf_rows)
        self.updates += 1
