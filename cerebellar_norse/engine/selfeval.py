"""Live self-evaluation: every served prediction is scored once its horizon has passed.

The true class (0 down, 1 flat, 2 up) of a tick is known once its horizon has passed;
:class:`~cerebellar_norse.training.labels.StreamLabels` (the payload being the
probability row served for the tick) gives it, with the same labels as training and
``evaluate``. Each judged tick is scored in two scopes, its market and
all markets together:

* the model: directional accuracy over ticks labelled up or down (the sign of
  P(up) - P(down) against the label, a tie counting 0.5), direction log loss (binary,
  q = P(up) / (P(up) + P(down)) clipped to [1e-12, 1 - 1e-12]), 3-class log loss and
  accuracy (the most probable class; k tied classes get 1/k each);
* the base rate: the class frequencies of the ticks judged before this one in the
  same scope, with one pseudo-count per class, so it never uses the label it is scored
  on (the first judged tick's base rate is uniform); its directional accuracy is that
  of always predicting the more frequent of up and down so far (a tie counts 0.5);
* counts of judged ticks and of each class.

Figures cover a rolling window of the last ``window`` judged ticks of the scope and
every tick since the scope was first seen. Log losses are in nats.

Cost: served ticks are kept as rows of numbers and labelled and scored compiled, every
``FLUSH_AT`` ticks (and before any read), so that a tick costs its market's lookup and
one list extension on the serving path. The window is a ring of per-tick contributions
with running sums, O(1) per judged tick; integer parts (counts, hits in halves or sixths) are exact, the float
sums are recomputed from the ring every ``window`` updates of a scope so rounding
never accumulates. The ring holds 21 bytes per tick per scope (losses as float32, so
window losses carry a relative rounding of about 1e-7; totals are float64), so
per-market state is ``window * 21`` bytes: at most ``max_markets`` markets are
tracked (least recently observed ones are dropped, and ``max_bytes`` bounds the
total), and the engine forgets markets evicted from its pool. A row with a non-finite
probability is not scored.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Container, Sequence
from typing import Any

import numba as nb
import numpy as np

from .. import kernelcache  # noqa: F401  (installs the guard: a failed write of numba's cache is no error)
from ..config import Config
from ..ticks import Tick
from ..training.labels import J_CLASS, J_PAYLOAD, LabelSpec, StreamLabels

EPS = 1e-12
CLASSES = ("down", "flat", "up")
RING_BYTES_PER_TICK = 4 * 4 + 5  # four float32 losses, five int8 fields
DEFAULT_MAX_BYTES = 256 * 2**20
FLUSH_AT = 256  # served ticks kept before they are labelled and scored (reads score what is pending first)
# A served tick as kept until then: its market's scope, time (ms), price, then the payload the labels carry to its
# judgement: the probabilities served (down, flat, up) and the scope it is scored in (-1: served warming up, not scored)
OBS_WIDTH = 7
TOP_MARKETS = 100

# Integer sums of a scope (window and total): judged ticks, directional ticks, model
# directional hits (halves), model 3-class hits (sixths), the same two for the base
# rate, then the count of each class.
I_N, I_DIR, I_M_DIR, I_M_ACC, I_B_DIR, I_B_ACC, I_CLASS = 0, 1, 2, 3, 4, 5, 6
N_INT = 9
# Float sums: model direction log loss, model 3-class log loss, the same for the base rate.
F_M_DLL, F_M_LL, F_B_DLL, F_B_LL = 0, 1, 2, 3
N_FLOAT = 4
# Ring int fields: label, model dir hits, model acc hits, base dir hits, base acc hits.
N_RING_INT = 5


@nb.njit(cache=True, nogil=True)
def _hits6(a: float, b: float, c: float, y: int) -> int:
    """3-class hit in sixths: 6/k when class y is among the k most probable, else 0."""
    mx = max(max(a, b), c)
    k = (a == mx) + (b == mx) + (c == mx)
    v = a if y == 0 else (b if y == 1 else c)
    return 6 // k if v == mx else 0


@nb.njit(cache=True, nogil=True)
def _dir_hits2(up: float, down: float, y: int) -> int:
    """Directional hit in halves: 2 when the larger of up/down is the label's direction, 1 on a tie."""
    if up == down:
        return 1
    return 2 if (up > down) == (y == 2) else 0


@nb.njit(cache=True, nogil=True)
def _dir_loss(up: float, down: float, y: int) -> float:
    """Binary log loss (nats) of q = up / (up + down) for an up (y=2) or down (y=0) label."""
    s = up + down
    q = up / s if s > 0.0 else 0.5
    q = min(max(q, EPS), 1.0 - EPS)
    return -math.log(q) if y == 2 else -math.log(1.0 - q)


@nb.njit(cache=True, nogil=True)
def _class_loss(p: float) -> float:
    return -math.log(min(max(p, EPS), 1.0 - EPS))


@nb.njit(cache=True, nogil=True)
def _push(s: int, y: int, m_dir: int, m_acc: int, m_dll: float, m_ll: float,
          tot_i: np.ndarray, tot_f: np.ndarray, win_i: np.ndarray, win_f: np.ndarray,
          ring_i: np.ndarray, ring_f: np.ndarray, pos: np.ndarray, since: np.ndarray) -> None:
    """Score one judged tick in scope ``s``: its base rate from the scope's counts so far, then the sums and the ring."""
    n = tot_i[s, I_N]
    c0, c1, c2 = tot_i[s, I_CLASS], tot_i[s, I_CLASS + 1], tot_i[s, I_CLASS + 2]
    cy = c0 if y == 0 else (c1 if y == 1 else c2)
    b_ll = -math.log((cy + 1.0) / (n + 3.0))
    b_acc = _hits6(float(c0), float(c1), float(c2), y)
    b_dir = 0
    b_dll = 0.0
    directional = y != 1
    if directional:
        b_dir = _dir_hits2(float(c2), float(c0), y)
        b_dll = _dir_loss(c2 + 1.0, c0 + 1.0, y)
    # totals (float64 contributions)
    tot_i[s, I_N] += 1
    tot_i[s, I_CLASS + y] += 1
    tot_i[s, I_M_ACC] += m_acc
    tot_i[s, I_B_ACC] += b_acc
    tot_f[s, F_M_LL] += m_ll
    tot_f[s, F_B_LL] += b_ll
    if directional:
        tot_i[s, I_DIR] += 1
        tot_i[s, I_M_DIR] += m_dir
        tot_i[s, I_B_DIR] += b_dir
        tot_f[s, F_M_DLL] += m_dll
        tot_f[s, F_B_DLL] += b_dll
    # window: drop the oldest entry when full, then write this one in its place
    w = ring_f.shape[1]
    p = pos[s]
    if win_i[s, I_N] == w:
        oy = ring_i[s, p, 0]
        win_i[s, I_N] -= 1
        win_i[s, I_CLASS + oy] -= 1
        if oy != 1:
            win_i[s, I_DIR] -= 1
        win_i[s, I_M_DIR] -= ring_i[s, p, 1]
        win_i[s, I_M_ACC] -= ring_i[s, p, 2]
        win_i[s, I_B_DIR] -= ring_i[s, p, 3]
        win_i[s, I_B_ACC] -= ring_i[s, p, 4]
        for f in range(N_FLOAT):
            win_f[s, f] -= ring_f[s, p, f]
    ring_i[s, p, 0] = y
    ring_i[s, p, 1] = m_dir
    ring_i[s, p, 2] = m_acc
    ring_i[s, p, 3] = b_dir
    ring_i[s, p, 4] = b_acc
    ring_f[s, p, F_M_DLL] = m_dll
    ring_f[s, p, F_M_LL] = m_ll
    ring_f[s, p, F_B_DLL] = b_dll
    ring_f[s, p, F_B_LL] = b_ll
    win_i[s, I_N] += 1
    win_i[s, I_CLASS + y] += 1
    if directional:
        win_i[s, I_DIR] += 1
    win_i[s, I_M_DIR] += m_dir
    win_i[s, I_M_ACC] += m_acc
    win_i[s, I_B_DIR] += b_dir
    win_i[s, I_B_ACC] += b_acc
    for f in range(N_FLOAT):
        win_f[s, f] += ring_f[s, p, f]  # the stored (float32) value, so what is added is what is later removed
    pos[s] = p + 1 if p + 1 < w else 0
    since[s] += 1
    if since[s] >= w:  # recompute the float sums from the ring: no rounding drift
        since[s] = 0
        k = win_i[s, I_N]
        for f in range(N_FLOAT):
            acc = 0.0
            for j in range(k):
                acc += ring_f[s, j, f]
            win_f[s, f] = acc


@nb.njit(cache=True)  # holds the GIL, as the engine's step does: it runs on the event loop, inside a batch
def _score(judged: np.ndarray, tot_i: np.ndarray, tot_f: np.ndarray,
           win_i: np.ndarray, win_f: np.ndarray, ring_i: np.ndarray, ring_f: np.ndarray, pos: np.ndarray,
           since: np.ndarray) -> None:
    """Score judged ticks in order: each in scope 0 (all markets) and in its market's scope.

    ``judged`` (n, 7): as :meth:`~cerebellar_norse.training.labels.StreamLabels.label` yields them: the class, forward
    return and band, then the payload: the probabilities served (down, flat, up) and the market's scope (-1: not
    scored).
    """
    for k in range(judged.shape[0]):
        y = int(judged[k, J_CLASS])
        down, flat, up, scope = (judged[k, J_PAYLOAD], judged[k, J_PAYLOAD + 1], judged[k, J_PAYLOAD + 2],
                                 judged[k, J_PAYLOAD + 3])
        if scope < 0.0 or not (math.isfinite(down) and math.isfinite(flat) and math.isfinite(up)):
            continue
        py = down if y == 0 else (flat if y == 1 else up)
        m_ll = _class_loss(py)
        m_acc = _hits6(down, flat, up, y)
        m_dir = 0
        m_dll = 0.0
        if y != 1:
            m_dir = _dir_hits2(up, down, y)
            m_dll = _dir_loss(up, down, y)
        _push(0, y, m_dir, m_acc, m_dll, m_ll, tot_i, tot_f, win_i, win_f, ring_i, ring_f, pos, since)
        _push(int(scope), y, m_dir, m_acc, m_dll, m_ll, tot_i, tot_f, win_i, win_f, ring_i, ring_f, pos, since)


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def _figures(ints: np.ndarray, floats: np.ndarray) -> dict[str, Any]:
    """JSON figures of one scope's sums (window or total); None where undefined."""
    n, nd = int(ints[I_N]), int(ints[I_DIR])

    def side(i_dir: int, i_acc: int, f_dll: int, f_ll: int) -> dict[str, float | None]:
        return {"directional_accuracy": _ratio(float(ints[i_dir]), 2.0 * nd),
                "direction_log_loss": _ratio(float(floats[f_dll]), nd),
                "accuracy": _ratio(float(ints[i_acc]), 6.0 * n),
                "log_loss": _ratio(float(floats[f_ll]), n)}

    return {"judged": n, "directional": nd,
            "class_counts": {c: int(ints[I_CLASS + k]) for k, c in enumerate(CLASSES)},
            "model": side(I_M_DIR, I_M_ACC, F_M_DLL, F_M_LL),
            "base_rate": side(I_B_DIR, I_B_ACC, F_B_DLL, F_B_LL)}


class LiveScorer:
    """Scores served predictions against their labels, per market and overall, over a rolling window.

    Args:
        spec: how ticks are labelled (``LabelSpec.from_config``).
        window: judged ticks in the rolling window of each scope.
        max_markets: markets tracked at most; the least recently observed is dropped beyond it.
        max_bytes: bound on the rings' memory; lowers ``max_markets`` when needed.
    """

    def __init__(self, spec: LabelSpec, window: int = 1000, max_markets: int = 1024,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if window < 1:
            raise ValueError("window must be at least 1")
        if max_markets < 1:
            raise ValueError("max_markets must be at least 1")
        self.spec = spec
        self.window = window
        by_memory = max_bytes // (window * RING_BYTES_PER_TICK) - 1
        self.max_markets = max(1, min(max_markets, by_memory))
        self.dropped_markets = 0
        self._markets: OrderedDict[str, int] = OrderedDict()  # market -> its scope (and its row of the labels)
        self._free: list[int] = []
        self._arrays: tuple[np.ndarray, ...] = ()
        self._rows = 0
        self._labels = StreamLabels(spec, OBS_WIDTH - 3)
        self._alloc(1 + min(self.max_markets, 4))  # grows by doubling
        self._scopes = 1  # scopes in use; scope 0 is all markets together
        self._obs: list[float] = []  # served ticks not yet labelled, OBS_WIDTH numbers each
        self._load_kernels()

    @classmethod
    def from_config(cls, cfg: Config, max_markets: int) -> LiveScorer:
        """A scorer with the service's labels (``[neural]`` horizon, ``[training]`` band) and ``live_evaluation_window``."""
        return cls(LabelSpec.from_config(cfg), cfg.training.live_evaluation_window, max_markets)

    # -- state arrays -------------------------------------------------------------

    def _alloc(self, rows: int) -> None:
        """(Re)allocate the state of ``rows`` scopes, keeping the current ones.

        Per scope: total and window sums (ints, floats), the window's ring (ints,
        float32 losses), the ring's next position and the updates since its float
        sums were last recomputed.
        """
        w = self.window
        arrays: tuple[np.ndarray, ...] = (
            np.zeros((rows, N_INT), np.int64), np.zeros((rows, N_FLOAT)),  # totals
            np.zeros((rows, N_INT), np.int64), np.zeros((rows, N_FLOAT)),  # window sums
            np.zeros((rows, w, N_RING_INT), np.int8), np.zeros((rows, w, N_FLOAT), np.float32),  # window ring
            np.zeros(rows, np.int64), np.zeros(rows, np.int64))  # ring position, updates since recompute
        for new, old in zip(arrays, self._arrays, strict=False):
            new[:self._rows] = old
        self._arrays = arrays
        self._rows = rows
        self._labels.grow_rows(rows)

    def _new_slot(self) -> int:
        if self._free:
            s = self._free.pop()
        else:
            if self._scopes == self._rows:
                self._alloc(min(2 * self._rows, self.max_markets + 1))
            s = self._scopes
            self._scopes += 1
        for a in self._arrays:
            a[s] = 0
        self._labels.reset(s)
        return s

    def _load_kernels(self) -> None:
        """Load (or compile) the numba kernels now rather than on the first served ticks: two ticks in row 0 (no
        market's), not scored, then forgotten."""
        self._obs += (0, 0.0, 1.0, 0.0, 0.0, 0.0, -1.0) * 2
        self._flush()
        _score(np.zeros((0, OBS_WIDTH)), *self._arrays)
        self._labels.reset(0)

    def _flush(self) -> None:
        """Label the served ticks kept so far and score the ticks they judge, in order."""
        obs = self._obs
        try:
            served = np.array(obs, dtype=np.float64).reshape(-1, OBS_WIDTH)
        finally:
            obs.clear()
        for judged in self._labels.label(served):
            _score(judged, *self._arrays)

    def _flush_pending(self) -> None:
        if self._obs:
            self._flush()

    def _track(self, market: str) -> int:
        if len(self._markets) >= self.max_markets:
            if self._obs:  # served ticks of the market about to go still name its scope
                self._flush()
            _, slot = self._markets.popitem(last=False)
            self._free.append(slot)
            self.dropped_markets += 1
        slot = self._new_slot()
        self._markets[market] = slot
        return slot

    # -- updates ------------------------------------------------------------------

    def observe_batch(self, ticks: Sequence[Tick], probs: np.ndarray, warming: Sequence[bool] | None = None) -> None:
        """Record the probability rows (down, flat, up) served for ``ticks``; the ticks they judge are scored every
        ``FLUSH_AT`` ticks and before any read.

        Ticks flagged in ``warming`` (served with ``warming_up``) still drive the labels
        (volatility, horizons) but are not scored, as ``evaluate`` does not score them.
        """
        rows = probs.tolist()  # a copy: the caller reuses the array
        markets = self._markets
        obs = self._obs
        skip = [False] * len(rows) if warming is None else warming
        for t, row, warm in zip(ticks, rows, skip, strict=True):
            market = t.market_id
            s = markets.get(market)
            if s is None:
                s = self._track(market)
            else:
                markets.move_to_end(market)
            obs += (s, t.timestamp, t.price, row[0], row[1], row[2], -1.0 if warm else s)
        if len(obs) >= FLUSH_AT * OBS_WIDTH:  # labelled and scored in blocks: one compiled pass per block
            self._flush()

    def forget(self, market_id: str) -> bool:
        """Drop a market's pending ticks and figures (it was reset or evicted); True when it was tracked."""
        slot = self._markets.pop(market_id, None)
        if slot is None:
            return False
        if self._obs:  # its served ticks still name the scope about to be reused
            self._flush()
        self._labels.reset(slot)
        self._free.append(slot)
        return True

    def retain(self, markets: Container[str]) -> int:
        """Forget every tracked market not in ``markets`` (e.g. the pool's); returns how many were dropped."""
        gone = [m for m in self._markets if m not in markets]
        for m in gone:
            self.forget(m)
        return len(gone)

    # -- reading ------------------------------------------------------------------

    @property
    def markets(self) -> int:
        """Markets tracked."""
        return len(self._markets)

    def scope(self, market_id: str | None = None) -> dict[str, Any] | None:
        """Figures of one market (None: all markets), or None for an untracked market."""
        self._flush_pending()
        if market_id is None:
            return self._scope(0)
        slot = self._markets.get(market_id)
        return None if slot is None else self._scope(slot)

    def _scope(self, s: int) -> dict[str, Any]:
        tot_i, tot_f, win_i, win_f = self._arrays[:4]
        counts = tot_i[s, I_CLASS:I_CLASS + 3]
        n = int(tot_i[s, I_N])
        return {"window": _figures(win_i[s], win_f[s]), "total": _figures(tot_i[s], tot_f[s]),
                "base_rate": {c: (int(counts[k]) + 1) / (n + 3) for k, c in enumerate(CLASSES)}}

    @property
    def judged(self) -> int:
        """Ticks judged since start (all markets)."""
        self._flush_pending()
        return int(self._arrays[0][0, I_N])

    def overall(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The all-markets (window, total) figures."""
        self._flush_pending()
        s = self._scope(0)
        return s["window"], s["total"]

    def snapshot(self, top: int = TOP_MARKETS) -> dict[str, Any]:
        """JSON-serialisable figures: all markets together and the ``top`` markets by judged ticks (no NaN: None)."""
        self._flush_pending()
        names = list(self._markets)
        slots = np.fromiter((self._markets[m] for m in names), dtype=np.int64, count=len(names))
        judged = self._arrays[0][slots, I_N]
        order = np.argsort(-judged, kind="stable")[:top]
        return {"window_ticks": self.window, "labels": self.spec.describe(),
                "markets_tracked": len(names), "max_markets": self.max_markets,
                "markets_dropped": self.dropped_markets,
                "overall": self._scope(0),
                "markets": {names[k]: self._scope(int(slots[k])) for k in order}}
