"""Scoring of a model's class probabilities against simple baselines (pure functions, no I/O).

Classes are indexed 0 = down, 1 = flat, 2 = up (``data.CLASS_NAMES``). The served
``prediction`` is P(up) − P(down); its sign is the traded direction. Rows are ticks
in time order (one market after another is fine); each row has the label of the
log return from the tick to its horizon (``fwd_ret``) and, where known, the log
return over the previous horizon (``past_ret``).

Units: probabilities are fractions in [0, 1]; log losses are in nats per row;
returns are natural-log returns; P&L figures named ``*_bp`` are in basis points
(1 bp = 1e-4 log-return units); ``cost_bp`` is the round-trip cost of a position of size 1 in
basis points: half of it is paid on every unit bought or sold (the book's turnover, see :func:`score`).

Baselines (the rules' tilts are fitted on the scored labels, one number each; no other baseline looks at them):

* ``base_rates`` — the class frequencies of the data the model was trained and calibrated
  on (its training and validation splits: what a model without an edge serves), for every row;
* ``majority`` — the most frequent class of those with probability ≈ 1 (the one-hot
  vector clipped to [1e-4, 1] and renormalised, so that its log loss is finite);
* ``persistence`` — the direction of ``past_ret`` continues: P(flat) is the base rate
  of flat and the moving mass M = P(down) + P(up) of the base rates is split
  (0.5 + t) M / (0.5 − t) M in favour of the direction of ``past_ret``; where ``past_ret``
  is zero or unknown (NaN) the split is 0.5 M / 0.5 M (no view, no position). The tilt t
  is the rule's own (:func:`rule_tilts`): the share of the scored moving ticks whose
  direction it calls right, less 0.5, kept within [1e-6, 0.49] — the rule's best
  probabilities, so that its log losses are a fair bar (a fixed tilt is beaten on log
  loss by any calibrated forecast without skill); the floor keeps its direction (and
  its trades) where it has none;
* ``mean_reversion`` — as persistence with the opposite direction;
* ``always_up`` — as persistence with the direction always up (long at every tick: a drifting
  market's directional accuracy and P&L are not an edge unless the model beats this);
* ``logistic`` — a multinomial logistic regression's probabilities (``fit_logistic``),
  when the caller supplies them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from .data import CLASS_NAMES

DOWN, FLAT, UP = 0, 1, 2
LOG_LOSS_CLIP = 1e-12
MAJORITY_FLOOR = 1e-4
TILT_RANGE = (1e-6, 0.49)  # a fitted tilt: above 0 so that the rule keeps its direction, below 0.5 so no P is 0
RULES = ("persistence", "mean_reversion", "always_up")
CALIBRATION_BINS = 10
PSEUDO_COUNT = 0.5
HESSIAN_ROWS = 32_768
NEWTON_TOL = 1e-10
ROUNDING = 1e-12  # per-row model-minus-baseline differences below this are rounding
MAX_MARKETS_REPORTED = 200
BASELINE_NAMES = ("base_rates", "majority", "persistence", "mean_reversion", "always_up", "logistic")
_VARIANCE_CHUNK = 4_000_000  # elements of block sums a pass of _block_variance holds


# --------------------------------------------------------------------------- logistic regression


@dataclass(frozen=True)
class LogisticModel:
    """A fitted multinomial logistic regression over standardised features.

    ``mean``/``scale`` (d,) standardise the raw features (``scale`` is 1 for constant
    columns); ``coef`` (d, 3) and ``intercept`` (3,) give the class logits (nats) of the
    standardised features; ``loss`` is the fitted objective (mean negative log-likelihood
    in nats per row plus the penalty); ``iterations`` Newton steps were taken.
    """

    mean: np.ndarray
    scale: np.ndarray
    coef: np.ndarray
    intercept: np.ndarray
    l2: float
    iterations: int
    converged: bool
    loss: float

    def logits(self, X: np.ndarray) -> np.ndarray:
        """Class logits (n, 3) in nats for raw features ``X`` (n, d)."""
        Xf = _as_matrix(X, self.mean.shape[0])
        w = self.coef / self.scale[:, None]
        return Xf @ w + (self.intercept - self.mean @ w)

    def predict_proba(self, X: np.ndarray) -> np.ndarray:
        """Class probabilities (n, 3), columns down/flat/up, each row summing to 1."""
        return _softmax(self.logits(X))


def _as_matrix(X: np.ndarray, d: int | None = None) -> np.ndarray:
    Xf = np.asarray(X, dtype=np.float64)
    if Xf.ndim != 2:
        raise ValueError(f"X must be 2-D (rows, features), got shape {Xf.shape}")
    if d is not None and Xf.shape[1] != d:
        raise ValueError(f"X has {Xf.shape[1]} features, the model was fitted on {d}")
    if not np.isfinite(Xf).all():
        raise ValueError("X contains NaN or infinite values")
    return Xf


def _as_labels(y: np.ndarray, n: int) -> np.ndarray:
    arr = np.asarray(y)
    if arr.shape != (n,):
        raise ValueError(f"labels must have shape ({n},), got {arr.shape}")
    if arr.dtype.kind == "f" and not np.all(np.isfinite(arr) & (arr == np.round(arr))):
        raise ValueError("labels must be integers 0 (down), 1 (flat) or 2 (up)")
    if arr.dtype.kind not in "iuf" and n > 0:
        raise ValueError(f"labels must be integers, got dtype {arr.dtype}")
    lab = arr.astype(np.int64)
    if n and (lab.min() < 0 or lab.max() > 2):
        raise ValueError("labels must be 0 (down), 1 (flat) or 2 (up)")
    return lab


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _logsumexp_rows(zt: np.ndarray) -> np.ndarray:
    """log Σ_k exp(zt[k]) of class-major logits (3, n) (elementwise over contiguous rows: fast)."""
    m = np.maximum(np.maximum(zt[0], zt[1]), zt[2])
    return m + np.log(np.exp(zt - m).sum(axis=0))


def _logsumexp(z: np.ndarray) -> np.ndarray:
    m = z.max(axis=-1)
    return m + np.log(np.exp(z - m[..., None]).sum(axis=-1))


class _Objective:
    """Mean negative log-likelihood + pseudo-count prior + L2 penalty over rows of raw features.

    Parameters ``theta`` (3·(d+1),): for each class, the d standardised weights then the
    intercept. Logits are computed as ``X @ (w / scale) + (b − mean @ (w / scale))`` so that
    the standardised copy of ``X`` is never made.
    """

    def __init__(self, X: np.ndarray, labels: np.ndarray, mean: np.ndarray, scale: np.ndarray, l2: float,
                 constant: np.ndarray) -> None:
        self.X, self.labels, self.mean, self.scale, self.l2 = X, labels, mean, scale, l2
        self.constant = constant
        self.n, self.d = X.shape
        self.rows = np.arange(self.n)
        self.counts = np.bincount(labels, minlength=3).astype(np.float64)
        self._aug: np.ndarray | None = None
        self._aug_t = np.zeros((0, 0))

    def unpack(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t = theta.reshape(3, self.d + 1)
        return t[:, :self.d].T, t[:, self.d]

    def loss(self, theta: np.ndarray) -> tuple[float, np.ndarray]:
        """The objective (nats per row) and the class-major logits (3, n)."""
        w, b = self.unpack(theta)
        wr = w / self.scale[:, None]
        zt = np.ascontiguousarray(wr.T) @ self.X.T
        zt += (b - self.mean @ wr)[:, None]
        nll = float(_logsumexp_rows(zt).sum() - np.take_along_axis(zt, self.labels[None, :], axis=0).sum())
        prior = PSEUDO_COUNT * float(3.0 * _logsumexp(b) - b.sum())
        return (nll + prior) / self.n + 0.5 * self.l2 * float((w * w).sum()), zt

    def gradient(self, theta: np.ndarray, zt: np.ndarray) -> np.ndarray:
        w, b = self.unpack(theta)
        gt = np.exp(zt - _logsumexp_rows(zt))
        gt[self.labels, self.rows] -= 1.0
        gsum = gt.sum(axis=1)
        gw = self.X.T @ gt.T
        gw = (gw - np.outer(self.mean, gsum)) / self.scale[:, None] / self.n + self.l2 * w
        gw[self.constant] = 0.0  # a constant column standardises to 0: its weights stay at 0
        gb = (gsum + PSEUDO_COUNT * (3.0 * _softmax(b) - 1.0)) / self.n
        return np.concatenate([gw.T, gb[:, None]], axis=1).ravel()

    def hessian(self, theta: np.ndarray) -> np.ndarray:
        """The exact Hessian (3·(d+1), 3·(d+1)) over this objective's rows."""
        d, p1 = self.d, self.d + 1
        w, b = self.unpack(theta)
        if self._aug is None:
            aug = np.empty((self.n, p1))
            aug[:, :d] = (self.X - self.mean) / self.scale
            aug[:, :d][:, self.constant] = 0.0
            aug[:, d] = 1.0
            self._aug = aug
            self._aug_t = np.ascontiguousarray(aug.T)  # both layouts: a C-order GEMM is much faster here
        aug, aug_t = self._aug, self._aug_t
        p = _softmax(aug @ np.vstack([w, b[None, :]]))
        pairs = [(j, k) for j in range(3) for k in range(j, 3)]
        weights = [p[:, j] * ((1.0 if j == k else 0.0) - p[:, k]) for j, k in pairs]
        blocks = [((aug_t * wt) @ aug) / self.n for wt in weights]
        pb = _softmax(b)
        h = np.zeros((3 * p1, 3 * p1))
        for block, (j, k) in zip(blocks, pairs, strict=True):
            block[d, d] += PSEUDO_COUNT * pb[j] * ((1.0 if j == k else 0.0) - pb[k]) / self.n
            if j == k:
                block[:d, :d] += self.l2 * np.eye(d)
            h[j * p1:(j + 1) * p1, k * p1:(k + 1) * p1] = block
            h[k * p1:(k + 1) * p1, j * p1:(j + 1) * p1] = block.T
        return h


def _newton(obj: _Objective, theta: np.ndarray, max_iter: int, hessian_of: _Objective | None,
            fixed_hessian: np.ndarray | None = None,
            tol: float = NEWTON_TOL) -> tuple[np.ndarray, int, bool, float, np.ndarray | None]:
    """Damped Newton with Armijo backtracking; the Hessian from ``hessian_of`` (or ``fixed_hessian``).

    Stops when half the Newton decrement (the predicted loss decrease, nats per row) is below ``tol``.
    """
    loss, z = obj.loss(theta)
    h = fixed_hessian
    iterations = 0
    converged = False
    for _ in range(max_iter):
        g = obj.gradient(theta, z)
        if float(np.abs(g).max()) < 1e-10:
            converged = True
            break
        if hessian_of is not None:
            h = hessian_of.hessian(theta)
        assert h is not None
        damped = h + (1e-10 * float(np.trace(h)) / h.shape[0] + 1e-12) * np.eye(h.shape[0])
        try:
            step = -np.linalg.solve(damped, g)
        except np.linalg.LinAlgError:
            step = -np.linalg.lstsq(damped, g, rcond=None)[0]
        decrement = float(-g @ step)
        if decrement <= 0.0:
            step, decrement = -g, float(g @ g)
        if decrement / 2.0 < tol:
            converged = True
            break
        t = 1.0
        while True:
            new_loss, new_z = obj.loss(theta + t * step)
            if new_loss <= loss - 1e-4 * t * decrement:
                break
            t *= 0.5
            if t < 1e-10:
                return theta, iterations, decrement / 2.0 < 100 * tol, loss, h
        iterations += 1
        theta = theta + t * step
        improvement = loss - new_loss
        loss, z = new_loss, new_z
        if improvement < 1e-14 * max(1.0, abs(loss)):
            converged = True
            break
    return theta, iterations, converged, loss, h


def fit_logistic(X: np.ndarray, y: np.ndarray, l2: float = 1e-3, max_iter: int = 200) -> LogisticModel:
    """Fit a 3-class multinomial logistic regression with intercept, deterministically.

    ``X`` (n, d) raw features (any units; standardised internally to mean 0, sd 1, constant
    columns left at 0); ``y`` (n,) labels 0 = down, 1 = flat, 2 = up. The objective is the
    mean negative log-likelihood (nats per row) plus ``l2``/2 · ‖coef‖² on the standardised
    weights (the intercept is not penalised). To keep classes absent from ``y`` at a finite
    (small) probability, the likelihood also counts ``PSEUDO_COUNT`` (0.5) pseudo-rows per
    class at the feature means, i.e. about 0.5 / (n + 1.5) for an absent class.

    Newton's method with an Armijo backtracking line search in float64. Up to
    ``HESSIAN_ROWS`` rows it is exact Newton on all rows; beyond, it first converges on a
    fixed (seed 0) random subsample of ``HESSIAN_ROWS`` rows, then takes Newton steps on
    all rows with the subsample's Hessian (the gradient and the loss use all rows), so
    1e6 rows × 50 features fit in a few seconds. At most ``max_iter`` steps per stage.
    """
    Xf = _as_matrix(X)
    n, d = Xf.shape
    if n == 0:
        raise ValueError("no rows to fit")
    if l2 < 0 or not math.isfinite(l2):
        raise ValueError("l2 must be a finite number >= 0")
    lab = _as_labels(y, n)
    mean = Xf.mean(axis=0)
    var = np.zeros(d)
    step_rows = max(1, 8_000_000 // max(d, 1))
    for a in range(0, n, step_rows):
        dev = Xf[a:a + step_rows] - mean
        var += np.square(dev, out=dev).sum(axis=0)  # squared in place: one temporary of step_rows rows, not two
    scale = np.sqrt(var / n)
    constant = scale <= 1e-12 * (1.0 + np.abs(mean))
    scale = np.where(constant, 1.0, scale)
    full = _Objective(Xf, lab, mean, scale, float(l2), constant)
    theta = np.zeros((3, d + 1))
    theta[:, d] = np.log((full.counts + PSEUDO_COUNT) / (n + 3.0 * PSEUDO_COUNT))
    theta = theta.ravel()
    if n <= HESSIAN_ROWS:
        theta, iterations, converged, loss, _ = _newton(full, theta, max_iter, full)
    else:
        rows = np.sort(np.random.default_rng(0).choice(n, HESSIAN_ROWS, replace=False))
        sub = _Objective(Xf[rows], lab[rows], mean, scale, float(l2), constant)
        theta, it_sub, _, _, _ = _newton(sub, theta, max_iter, sub, tol=1e-8)  # a warm start
        h = sub.hessian(theta)
        theta, iterations, converged, loss, _ = _newton(full, theta, max_iter, None, h)
        iterations += it_sub
    w, b = full.unpack(theta)
    return LogisticModel(mean=mean, scale=scale, coef=np.ascontiguousarray(w), intercept=b.copy(), l2=float(l2),
                         iterations=iterations, converged=converged, loss=float(loss))


# --------------------------------------------------------------------------- scoring


@dataclass
class ScoreInputs:
    """What ``score`` compares, one row per labelled tick in time order.

    ``probs`` (n, 3) the model's class probabilities (down, flat, up; rows are renormalised
    to sum to 1); ``labels`` (n,) ints in {0, 1, 2}; ``fwd_ret`` (n,) the log return from the
    tick to its horizon (what the label came from); ``past_ret`` (n,) the log return over the
    previous horizon (NaN where unknown); ``base_rates`` (3,) class frequencies of the
    model's training data; ``lr_probs`` (n, 3) logistic-regression baseline probabilities
    or None; ``horizon`` the label horizon in ticks (bootstrap block length, P&L sizing);
    ``markets`` (n,) per-row market ids (strings) or None (one market); ``times_ms`` (n,) each
    row's tick time in ms since the epoch, or None (the Sharpe ratio is then not annualised);
    ``spans`` (n,) the ticks from each row's tick to its horizon's end (with a horizon in ms they
    vary), or None (``horizon`` for every row). The rows of one market are its consecutive ticks
    in time order; markets may follow one another or be interleaved.
    """

    probs: np.ndarray
    labels: np.ndarray
    fwd_ret: np.ndarray
    past_ret: np.ndarray
    base_rates: np.ndarray
    lr_probs: np.ndarray | None = None
    horizon: int = 1
    markets: np.ndarray | None = None
    times_ms: np.ndarray | None = None
    spans: np.ndarray | None = None


@dataclass
class _Checked:
    probs: np.ndarray
    labels: np.ndarray
    fwd_ret: np.ndarray
    past_ret: np.ndarray
    base_rates: np.ndarray
    lr_probs: np.ndarray | None
    horizon: int
    markets: np.ndarray | None
    times_ms: np.ndarray | None
    spans: np.ndarray
    books: list[np.ndarray]  # per market, its rows in order (a book each: positions never net across markets)
    annualisation: dict[str, Any]  # _annualisation's


def _prob_matrix(p: np.ndarray, n: int, name: str) -> np.ndarray:
    arr = np.asarray(p, dtype=np.float64)
    if arr.shape != (n, 3):
        raise ValueError(f"{name} must have shape ({n}, 3), got {arr.shape}")
    if not np.isfinite(arr).all() or (arr < 0).any():
        raise ValueError(f"{name} must be finite and >= 0")
    sums = arr.sum(axis=1, keepdims=True)
    if (sums <= 0).any():
        raise ValueError(f"{name} has a row of zeros")
    return arr / sums


def _check(inp: ScoreInputs) -> _Checked:
    labels_raw = np.asarray(inp.labels)
    if labels_raw.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {labels_raw.shape}")
    n = labels_raw.shape[0]
    if n == 0:
        raise ValueError("no samples to score")
    labels = _as_labels(labels_raw, n)
    probs = _prob_matrix(inp.probs, n, "probs")
    lr = None if inp.lr_probs is None else _prob_matrix(inp.lr_probs, n, "lr_probs")
    fwd = np.asarray(inp.fwd_ret, dtype=np.float64)
    if fwd.shape != (n,) or not np.isfinite(fwd).all():
        raise ValueError(f"fwd_ret must be {n} finite log returns")
    past = np.asarray(inp.past_ret, dtype=np.float64)
    if past.shape != (n,):
        raise ValueError(f"past_ret must have shape ({n},), got {past.shape}")
    br = np.asarray(inp.base_rates, dtype=np.float64)
    if br.shape != (3,) or not np.isfinite(br).all() or (br < 0).any() or br.sum() <= 0:
        raise ValueError("base_rates must be 3 finite frequencies >= 0 with a positive sum")
    horizon = int(inp.horizon)
    if horizon < 1 or horizon != inp.horizon:
        raise ValueError("horizon must be an integer >= 1 (ticks)")
    markets = None
    if inp.markets is not None:
        markets = np.asarray(inp.markets).astype(str)
        if markets.shape != (n,):
            raise ValueError(f"markets must have shape ({n},), got {markets.shape}")
    times = None
    if inp.times_ms is not None:
        times = np.asarray(inp.times_ms, dtype=np.float64)
        if times.shape != (n,) or not np.isfinite(times).all():
            raise ValueError(f"times_ms must be {n} finite times in ms")
    if inp.spans is None:
        spans = np.full(n, horizon, dtype=np.int64)
    else:
        raw = np.asarray(inp.spans)
        if raw.shape != (n,) or raw.dtype.kind not in "iu" or (n and raw.min() < 1):
            raise ValueError(f"spans must be {n} integers >= 1 (ticks from each row to its horizon's end)")
        spans = raw.astype(np.int64)
    books = _books(markets, n)
    return _Checked(probs, labels, fwd, past, br / br.sum(), lr, horizon, markets, times, spans, books,
                    _annualisation(times, n, horizon, books, markets))


MIN_ANNUALISED_DAYS = 30.0
MIN_ANNUALISED_HORIZONS = 20.0
DAY_MS = 86_400_000.0
YEAR_DAYS = 365.25


def _annualisation(times: np.ndarray | None, n: int, horizon: int, books: list[np.ndarray],
                   markets: np.ndarray | None) -> dict[str, Any]:
    """How a per-trade Sharpe ratio is annualised: ``horizons_per_year`` = the non-overlapping horizons a year of the
    scored rows, each market's (its rows / ``horizon``) per year of its own calendar span (its first to its last
    scored tick time), summed over the markets (``books``: each market's rows), as a portfolio trading them together
    would hold them. A market whose own span is under ``MIN_ANNUALISED_DAYS`` days or holds fewer than
    ``MIN_ANNUALISED_HORIZONS`` horizons cannot tell its own rate and is counted over the whole scored span (first to
    last scored tick of any market; with one market, or markets scored over one period, this is what each has).
    None with the reason in ``note`` when the whole span is under ``MIN_ANNUALISED_DAYS`` days, the horizons fewer
    than ``MIN_ANNUALISED_HORIZONS`` or the times unknown. Nothing assumes trading hours or days a year."""
    horizons = n / horizon
    out: dict[str, Any] = {"horizons": _num(horizons), "span_days": None, "horizons_per_year": None}
    if times is None or not n:
        out["note"] = "not annualised: the tick times are not known"
        return out
    days = float(times.max() - times.min()) / DAY_MS
    out["span_days"] = _num(days)
    if days < MIN_ANNUALISED_DAYS:
        out["note"] = (f"not annualised: the scored ticks span {days:.1f} days, under {MIN_ANNUALISED_DAYS:g}: too "
                       "short to tell how many horizons a year holds")
        return out
    if horizons < MIN_ANNUALISED_HORIZONS:
        out["note"] = (f"not annualised: the scored ticks hold about {horizons:.0f} non-overlapping horizons, fewer "
                       f"than {MIN_ANNUALISED_HORIZONS:g}")
        return out
    rates: list[tuple[str, float, float, float, bool]] = []  # market, horizons, span days, a year, own span
    for rows in books:
        name = str(markets[rows[0]]) if markets is not None else ""
        h = rows.shape[0] / horizon
        own_days = float(times[rows].max() - times[rows].min()) / DAY_MS
        own = own_days >= MIN_ANNUALISED_DAYS and h >= MIN_ANNUALISED_HORIZONS
        rates.append((name, h, own_days, h / ((own_days if own else days) / YEAR_DAYS), own))
    per_year = sum(r[3] for r in rates)
    out["horizons_per_year"] = per_year
    if len(rates) == 1:
        out["note"] = (f"annualised by the square root of {per_year:.1f} non-overlapping horizons a year: "
                       f"{horizons:.0f} horizons of {horizon} ticks over the {days:.0f} days from the first to the "
                       "last scored tick")
        return out
    out["markets"] = {name: {"horizons": _num(h), "span_days": _num(d), "horizons_per_year": _num(rate),
                             "own_span": own} for name, h, d, rate, own in rates}
    shown = "; ".join(f"{name} {rate:.1f} ({h:.0f} over {d:.0f} days)" for name, h, d, rate, own in rates[:5] if own)
    more = sum(r[4] for r in rates[5:])
    note = (f"annualised by the square root of {per_year:.1f} non-overlapping horizons a year: each market's "
            f"horizons of {horizon} ticks a year of its own span (first to last scored tick), summed over the "
            f"{len(rates)} markets")
    if shown:
        note += f" ({shown}{f'; {more} more' if more else ''})"
    short = [r for r in rates if not r[4]]
    if short:
        note += (f"; {len(short)} market{'s' if len(short) > 1 else ''} spanning under {MIN_ANNUALISED_DAYS:g} days"
                 f" or holding fewer than {MIN_ANNUALISED_HORIZONS:g} horizons counted over the whole span of"
                 f" {days:.0f} days ({', '.join(r[0] for r in short[:5])}{', …' if len(short) > 5 else ''})")
    out["note"] = note
    return out


def _books(markets: np.ndarray | None, n: int) -> list[np.ndarray]:
    """Per market (in order of first row), the indices of its rows in order: one book each."""
    if markets is None:
        return [np.arange(n)]
    _, first, inverse = np.unique(markets, return_index=True, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    counts = np.bincount(inverse)
    books = np.split(order, np.cumsum(counts)[:-1])
    return [books[k] for k in np.argsort(first, kind="stable")]


def _rule_views(past_ret: np.ndarray) -> dict[str, np.ndarray]:
    """Each rule's view per row: +1 up, −1 down, 0 none (``past_ret`` zero or NaN for the two that read it)."""
    past = np.asarray(past_ret, dtype=np.float64)
    direction = np.where(np.isfinite(past), np.sign(np.nan_to_num(past)), 0.0)
    return {"persistence": direction, "mean_reversion": -direction, "always_up": np.ones(past.shape[0])}


def rule_tilts(past_ret: np.ndarray, labels: np.ndarray,
               views: dict[str, np.ndarray] | None = None) -> dict[str, float]:
    """The tilt of each rule (``RULES``) that maximises its direction likelihood on these rows.

    Over the rows with a moving label (down or up) where the rule has a view, k called the
    direction right and m wrong: t = k / (k + m) − 0.5 (the maximum of k log(0.5 + t) +
    m log(0.5 − t)), kept within ``TILT_RANGE``; the floor where there is no such row.
    ``views``: the rules' views of ``past_ret`` (:func:`_rule_views`) when the caller has them.
    """
    lab = np.asarray(labels)
    moving = lab != FLAT
    went = np.where(lab == UP, 1.0, -1.0)
    out: dict[str, float] = {}
    for name, view in (_rule_views(past_ret) if views is None else views).items():
        called = moving & (view != 0)
        k = int(np.count_nonzero(called & (view == went)))
        m = int(np.count_nonzero(called)) - k
        t = k / (k + m) - 0.5 if k + m else 0.0
        out[name] = float(min(max(t, TILT_RANGE[0]), TILT_RANGE[1]))
    return out


def baseline_probs(base_rates: np.ndarray, past_ret: np.ndarray, tilts: dict[str, float],
                   views: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Probabilities (n, 3) of the baselines (module docstring), n = len(past_ret).

    ``base_rates`` (3,) training class frequencies (normalised here); ``past_ret`` (n,) log
    returns over the previous horizon, NaN where unknown; ``tilts`` each rule's tilt
    (:func:`rule_tilts`); ``views`` the rules' views of ``past_ret`` when the caller has them.
    """
    return dict(_each_baseline_probs(base_rates, past_ret, tilts, views))


def _each_baseline_probs(base_rates: np.ndarray, past_ret: np.ndarray, tilts: dict[str, float],
                         views: dict[str, np.ndarray] | None = None) -> Iterator[tuple[str, np.ndarray]]:
    """``(name, probabilities (n, 3))`` of each baseline of :func:`baseline_probs` in turn, each made when asked for
    (so that a caller scoring them one by one holds one at a time)."""
    n = np.asarray(past_ret).shape[0]
    br = np.asarray(base_rates, dtype=np.float64)
    br = br / br.sum()
    majority = np.full(3, MAJORITY_FLOOR)
    majority[int(np.argmax(br))] = 1.0
    majority /= majority.sum()
    moving = br[DOWN] + br[UP]
    yield "base_rates", np.tile(br, (n, 1))
    yield "majority", np.tile(majority, (n, 1))
    for name, view in (_rule_views(past_ret) if views is None else views).items():
        tilt = tilts[name]
        p = np.empty((n, 3))
        p[:, FLAT] = br[FLAT]
        p[:, UP] = moving * (0.5 + tilt * view)
        p[:, DOWN] = moving * (0.5 - tilt * view)
        yield name, p


def _num(x: float | np.floating[Any] | None) -> float | None:
    """A JSON-safe float: None for None, NaN and infinities."""
    if x is None:
        return None
    v = float(x)
    return v if math.isfinite(v) else None


def _mean(x: np.ndarray) -> float | None:
    return float(x.mean()) if x.size else None


def _direction_q(p: np.ndarray) -> np.ndarray:
    """q = P(up) / (P(up) + P(down)); 0.5 where both are 0."""
    moving = p[:, UP] + p[:, DOWN]
    return np.divide(p[:, UP], moving, out=np.full(p.shape[0], 0.5), where=moving > 0)


def _calibration_bins(conf: np.ndarray, hit: np.ndarray) -> tuple[float | None, list[dict[str, Any]]]:
    """ECE (count-weighted mean |hit frequency − mean confidence|) and the per-bin table."""
    edges = np.linspace(0.0, 1.0, CALIBRATION_BINS + 1)
    idx = np.clip((conf * CALIBRATION_BINS).astype(np.int64), 0, CALIBRATION_BINS - 1)
    count = np.bincount(idx, minlength=CALIBRATION_BINS)
    sum_conf = np.bincount(idx, weights=conf, minlength=CALIBRATION_BINS)
    sum_hit = np.bincount(idx, weights=hit.astype(np.float64), minlength=CALIBRATION_BINS)
    table = []
    for k in range(CALIBRATION_BINS):
        c = int(count[k])
        table.append({"lo": float(edges[k]), "hi": float(edges[k + 1]), "count": c,
                      "mean_predicted": float(sum_conf[k] / c) if c else None,
                      "observed": float(sum_hit[k] / c) if c else None})
    total = conf.shape[0]
    if total == 0:
        return None, table
    ece = float(np.abs(sum_hit - sum_conf).sum() / total)
    return ece, table


def _positions(p: np.ndarray) -> np.ndarray:
    return np.sign(p[:, UP] - p[:, DOWN])


@dataclass
class _Book:
    """One sign strategy's P&L per row (log-return units), every figure's series.

    ``gross`` (n,) the return of the row's trade of size 1 held to its horizon (position × fwd_ret); ``cost`` (n,)
    the costs charged at the row's tick (the last row of a market also pays closing its book); ``net`` (n,)
    gross / horizon − cost, summing to the strategy's total after costs; ``turnover`` Σ |P_t − P_{t−1}| over every
    market's book, opening and closing included.
    """

    gross: np.ndarray
    cost: np.ndarray
    net: np.ndarray
    turnover: float


def _book(pos: np.ndarray, c: _Checked, cost_bp: float) -> _Book:
    """The P&L of trading ``pos`` (n,) (each row's trade sign·1/horizon, held for its span of ticks) as one book per
    market, costs on the book's turnover.

    A market's position at tick t is the sum of its open trades, P_t = Σ sign_i / horizon over the trades opened and
    not yet closed; the cost at t is ``cost_bp`` / 2 (a round trip is two units of turnover) × |P_t − P_{t−1}|, with
    P = 0 before the market's first row and after its last trade closes (the closing is charged at its last row).
    Trades that net against each other cost nothing; always long pays one round trip per market. With horizon 1
    this is cost_bp / 2 × |pos_t − pos_{t−1}|.
    """
    n, h = pos.shape[0], c.horizon
    cost = np.zeros(n)  # the turnover at each row, then its cost
    turnover = 0.0
    for rows in c.books:
        k = rows.size
        if not k:
            continue
        span = c.spans[rows]
        size = pos[rows] / h
        flow = np.zeros(k + int(span.max()))  # the position's change at each tick from the market's first row on
        flow[:k] = size
        np.add.at(flow, np.arange(k) + span, -size)
        del size, span
        moved = np.abs(flow, out=flow)
        moved[moved < ROUNDING] = 0.0  # trades opened and closed at one tick net exactly; sums of 1/h may not
        turnover += float(moved.sum())
        moved[k - 1] += moved[k:].sum()
        cost[rows] = moved[:k]
        del flow, moved
    cost *= cost_bp * 1e-4 / 2.0
    gross = pos * c.fwd_ret
    net = gross / h
    net -= cost
    return _Book(gross, cost, net, turnover)


def _pnl(pos: np.ndarray, book: _Book, horizon: int, per_year: float | None) -> dict[str, Any]:
    traded = pos != 0
    g = book.gross[traded]
    trades = int(traded.sum())
    n = book.net.shape[0]
    sd = float(book.net.std(ddof=1)) if n >= 2 else 0.0
    sharpe = _num(book.net.mean() / sd) if sd > 0 else None
    return {"trades": trades,
            "hit_rate": float((g > 0).mean()) if trades else None,
            "mean_trade_bp": _num(g.mean() * 1e4) if trades else None,
            "gross_bp": _num(book.gross.sum() / horizon * 1e4),
            "turnover": _num(book.turnover),
            "costs_bp": _num(book.cost.sum() * 1e4),
            "total_bp": _num(book.net.sum() * 1e4),
            "net_per_tick_bp": _num(book.net.mean() * 1e4) if n else None,
            "sharpe_per_trade": sharpe,
            "sharpe_annualised": _num(sharpe * math.sqrt(per_year)) if sharpe is not None and per_year else None}


@dataclass
class _Rows:
    """Per-row contributions of one predictor (for the paired bootstrap)."""

    log_loss: np.ndarray
    correct: np.ndarray
    direction_log_loss: np.ndarray
    direction_correct: np.ndarray
    pnl: np.ndarray  # the sign strategy's net P&L per row (_Book.net)
    pnl_cost: np.ndarray  # the costs charged at each row (_Book.cost)


def _evaluate(p: np.ndarray, c: _Checked, cost_bp: float) -> tuple[dict[str, Any], _Rows]:
    n = p.shape[0]
    lab = c.labels
    moving = lab != FLAT
    pred = p.argmax(axis=1)
    rows = np.arange(n)
    ll = -np.log(np.clip(p[rows, lab], LOG_LOSS_CLIP, 1.0))
    correct = (pred == lab).astype(np.float64)
    q = _direction_q(p)[moving]
    up = lab[moving] == UP
    dll = -np.log(np.clip(np.where(up, q, 1.0 - q), LOG_LOSS_CLIP, 1.0))
    sign = _positions(p)[moving]
    dcorrect = np.where(sign == 0, 0.5, (sign > 0) == up).astype(np.float64)
    err = p.copy()  # p minus the one-hot label, squared in place: no (n, 3) one-hot nor its temporaries
    err[rows, lab] -= 1.0
    np.square(err, out=err)
    brier = float(err.sum(axis=1).mean())
    del err
    confusion = np.zeros((3, 3), dtype=np.int64)
    np.add.at(confusion, (lab, pred), 1)
    recall = {}
    for k, name in enumerate(CLASS_NAMES):
        row = int(confusion[k].sum())
        recall[name] = float(confusion[k, k] / row) if row else None
    ece, _ = _calibration_bins(p.max(axis=1), pred == lab)
    dece, reliability = _calibration_bins(q, up)
    metrics = {
        "accuracy": float(correct.mean()),
        "directional_accuracy": _mean(dcorrect),
        "log_loss": float(ll.mean()),
        "direction_log_loss": _mean(dll),
        "brier": brier,
        "recall": recall,
        "confusion": confusion.tolist(),
        "ece": ece,
        "direction_ece": dece,
        "reliability": reliability,
    }
    pos = _positions(p)
    book = _book(pos, c, cost_bp)
    metrics["pnl"] = _pnl(pos, book, c.horizon, c.annualisation["horizons_per_year"])
    return metrics, _Rows(ll, correct, dll, dcorrect, book.net, book.cost)


def _confidence(p: np.ndarray) -> np.ndarray:
    """1 − H(p) / ln 3 in [0, 1] (1 = certain, 0 = uniform)."""
    logp = np.log(np.where(p > 0, p, 1.0))
    return np.clip(1.0 + (p * logp).sum(axis=1) / math.log(3.0), 0.0, 1.0)


def _confidence_quartiles(p: np.ndarray, rows: _Rows, labels: np.ndarray) -> dict[str, Any]:
    conf = _confidence(p)
    edges = np.quantile(conf, [0.0, 0.25, 0.5, 0.75, 1.0])
    idx = np.searchsorted(edges[1:4], conf, side="right")
    moving = labels != FLAT
    idx_moving = idx[moving]
    quartiles = []
    for k in range(4):
        sel = idx == k
        sel_m = idx_moving == k
        quartiles.append({"lo": float(edges[k]), "hi": float(edges[k + 1]), "count": int(sel.sum()),
                          "mean_confidence": _mean(conf[sel]), "accuracy": _mean(rows.correct[sel]),
                          "moving": int(sel_m.sum()), "directional_accuracy": _mean(rows.direction_correct[sel_m])})
    return {"edges": [float(e) for e in edges], "quartiles": quartiles}


def block_length(n: int, horizon: int) -> int:
    """Moving-block bootstrap block length in rows: max(horizon, ceil(n ** (1/3))), at most n."""
    return max(1, min(n, max(horizon, math.ceil(n ** (1.0 / 3.0) - 1e-9))))


def _prefix_sums(series: np.ndarray) -> np.ndarray:
    """Prefix sums (m + 1, k) of each row of ``series`` (k, m), one column each, a leading row of zeros (a
    block's k sums are then one contiguous gather)."""
    k, m = series.shape
    prefix = np.zeros((m + 1, k))
    np.cumsum(series.T, axis=0, out=prefix[1:])
    return prefix


def _block_variance(prefix: np.ndarray, block: int) -> np.ndarray:
    """The moving-block bootstrap's variance (k,) of the mean of each series whose prefix sums are the columns of
    ``prefix`` (m + 1, k) (:func:`_prefix_sums`), for blocks of ``block`` rows: exactly, not estimated from resamples.

    A resample concatenates k = ceil(m / block) blocks with starts drawn uniformly from the N = m − block + 1
    (the same starts for every series: paired), so its mean is the mean of k independent draws of a block sum over
    ``block``: its variance is Var_N(S) / (k · block²), Var_N the population variance of the N block sums S. That is
    what infinitely many resamples would give; a finite number of them only adds Monte-Carlo noise to the interval's
    width (400 resamples: about ± 8 % on each end of an interval), which no degrees of freedom count. Block sums are the
    differences of two prefix sums, taken ``_VARIANCE_CHUNK`` elements at a time (no (N, k) array is held).
    """
    m, k = prefix.shape[0] - 1, prefix.shape[1]
    n_starts = m - block + 1
    step = max(1, _VARIANCE_CHUNK // max(1, k))
    total = np.zeros(k)
    for a in range(0, n_starts, step):
        b = min(n_starts, a + step)
        total += (prefix[a + block:b + block] - prefix[a:b]).sum(axis=0)
    mean = total / n_starts
    squares = np.zeros(k)
    for a in range(0, n_starts, step):
        b = min(n_starts, a + step)
        sums = prefix[a + block:b + block] - prefix[a:b]
        sums -= mean
        squares += np.einsum("ij,ij->j", sums, sums)
    return squares / n_starts / (math.ceil(m / block) * block * block)


def _interval_variance(prefix: np.ndarray, block: int) -> np.ndarray:
    """The variance (k,) of each series' mean that its interval is made of (prefix sums ``prefix`` (m + 1, k)): the
    moving-block bootstrap's, freed of the block length's bias.

    For dependent rows, the moving-block bootstrap's variance of a mean falls short of the
    true one by a term of order 1/block (the covariances at lags near the block length are
    cut): with the block of max(horizon, n^(1/3)) rows, a no-skill model's 95 % intervals
    excluded 0 for 7-9 % of series of 8,000 rows. With blocks of ``block`` (variance v1) and
    ``2 * block`` (v2), each divided by its :func:`_block_shortfall`, v = 2·v2 − v1 cancels that term
    (Richardson extrapolation; never below v2; benchmarks/interval_coverage.py measures the result). A series
    shorter than four blocks (``4 * block > m``) gets v1 alone (divided by its shortfall): blocks of twice that
    length would have too few distinct starts to spread (a single one, and a zero-width interval, when
    ``2 * block >= m``), and the extrapolation assumes both blocks are short.
    """
    m = prefix.shape[0] - 1
    if 4 * block > m:
        plain = _block_variance(prefix, block)
        shortfall = _block_shortfall(m, block)
        return plain if shortfall <= 0.0 else plain / shortfall  # one start: nothing to spread
    v_short = _block_variance(prefix, block) / _block_shortfall(m, block)
    v_long = _block_variance(prefix, 2 * block) / _block_shortfall(m, 2 * block)
    return np.maximum(2.0 * v_long - v_short, v_long)


def _block_shortfall(m: int, block: int) -> float:
    """The moving-block bootstrap's variance of the mean of ``m`` independent rows over the true one (exact), for
    blocks of ``block`` rows: 1 − 1/m for single rows (the variance's divisor m, not m − 1), and less the more of the
    rows each block holds (block sums from overlapping starts vary less about their own mean than about the truth)
    and where ceil(m / block) blocks make a resample longer than m; 0 for a single start (``block`` = ``m``).

    With N = m − block + 1 starts, row i in w_i of the blocks and k = ceil(m / block) blocks a resample:
    m · (block − Σ w_i² / N²) / (k · block²). Blocks of 20 in 450 rows: 0.93 (blocks of 10: 0.98), so the
    extrapolation 2·v(2b) − v(b) from the raw variances fell 11 % short; each is divided by its own.
    """
    n_starts = m - block + 1
    k = math.ceil(m / block)
    i = np.arange(m)
    w = np.minimum(i, n_starts - 1) - np.maximum(i - block + 1, 0) + 1
    return max(0.0, m * (block - float((w * w).sum()) / n_starts ** 2) / (k * block * block))


def interval_dof(rows: int, block: int) -> float:
    """Degrees of freedom of the bootstrap variance of a mean of ``rows`` rows resampled in blocks of ``block``:
    3·rows / (8·block), at least 1.

    The extrapolated variance 2·v(2b) − v(b) weighs the rows' autocovariances as the
    trapezoidal flat-top lag window of Politis and Romano (weight 1 up to lag b, falling
    to 0 at 2b: the window Politis and White (2004) estimate the long-run variance with);
    a lag-window estimate of bandwidth S and window k spreads as a chi-square of
    rows / (S·∫k²) degrees of freedom (the equivalent degrees of freedom of HAR inference,
    Lazarus, Lewis, Stock and Watson 2018), here rows / (2b · 4/3). Rows of fewer than four
    blocks, resampled with plain blocks (whose variance falls short of the truth), get the
    same count: fewer than 1.5.
    """
    return max(1.0, 3.0 * rows / (8.0 * max(1, block)))


def student_t_quantile(p: float, dof: float) -> float:
    """The ``p`` quantile (0.5 < p < 1) of Student's t with ``dof`` (>= 1, not necessarily whole) degrees of freedom.

    P(|T| < x) = ∫₀^φ cos^(dof−1) θ dθ / ∫₀^(π/2) cos^(dof−1) θ dθ with x = √dof · tan φ: the bounded integrand is
    summed on a fine grid (the quantile within 1e-6 of the tables); past 10,000 degrees of freedom the
    Cornish-Fisher expansion about the normal quantile (Abramowitz and Stegun 26.7.5) is exact to far less.
    """
    if not 0.5 < p < 1.0 or not dof >= 1.0:
        raise ValueError("student_t_quantile needs 0.5 < p < 1 and dof >= 1")
    z = NormalDist().inv_cdf(p)
    if dof > 1e4:
        return z + (z ** 3 + z) / (4 * dof) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * dof ** 2)
    theta = np.linspace(0.0, math.pi / 2, 40_001)
    f = np.cos(theta) ** (dof - 1.0) if dof > 1.0 else np.ones_like(theta)
    cum = np.concatenate([[0.0], np.cumsum((f[1:] + f[:-1]) * 0.5)])
    phi = float(np.interp((2.0 * p - 1.0) * cum[-1], cum, theta))
    return math.sqrt(dof) * math.tan(phi)


def _bootstrap_intervals(prefix: np.ndarray, point: np.ndarray, block: int) -> np.ndarray:
    """95 % intervals (2, k) of the means of the series whose prefix sums are ``prefix`` (m + 1, k) and means ``point``:
    point ± t · √v, v the :func:`_interval_variance` and t the 97.5 % quantile of Student's t with
    :func:`interval_dof` degrees of freedom (1.96 for many blocks).

    The variance is the moving-block bootstrap's, computed exactly (:func:`_block_variance`). The intervals were the
    2.5 and 97.5 percentiles of 400-1,000 resamples scaled to a variance estimated from resamples too, widened by
    t / 1.96: the Monte-Carlo noise of both (about ± 8 % on each end of the interval with 400 resamples) is not in
    the degrees of freedom: a no-skill model's directional-accuracy, P&L and Sharpe intervals excluded 0 for 5.7, 5.4
    and 5.6 % of 3,000 GARCH series of 2,000 rows, 5.2, 4.5 and 5.3 % computed exactly (5 % nominal:
    benchmarks/interval_coverage.py, 400 resamples). The percentiles' asymmetry, the
    one thing they added, is of the order of the blocks' skewness over √blocks, and it points the wrong way for a
    studentized mean (Hall 1988): the interval is symmetric.
    """
    m = prefix.shape[0] - 1
    half = student_t_quantile(0.975, interval_dof(m, block)) * np.sqrt(_interval_variance(prefix, block))
    return np.stack([point - half, point + half])


_ROW_FIELDS = {"log_loss": "log_loss", "accuracy": "correct", "direction_log_loss": "direction_log_loss",
               "directional_accuracy": "direction_correct"}  # metric -> its per-row contributions in _Rows
_FIELD_GROUPS = (("log_loss", "accuracy"), ("direction_log_loss", "directional_accuracy"))  # all rows, moving rows


class _Differences:
    """The model-minus-baseline per-row differences of one group of metrics (``_FIELD_GROUPS``), reduced as each
    baseline is added.

    Each series (one per baseline and metric, in the order added) is kept only as its mean
    and, when it gets an interval, its prefix sums (float64 (m + 1, k), m rows): the
    per-row differences of all baselines are never held at once, nor a copy of them.
    """

    def __init__(self, fields: tuple[str, ...], series: int, rows: int, resampled: bool,
                 order: np.ndarray | None = None) -> None:
        self.fields = fields
        self.rows = rows
        self.point = np.zeros(series)
        self.prefix = np.zeros((rows + 1, series)) if resampled and rows else None
        self.keys: list[tuple[str, str]] = []
        self.order = order  # the rows in time order (None: as given), for the blocks

    def add(self, name: str, model: _Rows, baseline: _Rows) -> None:
        """Reduce the differences of ``model`` minus ``baseline`` (named ``name``) in this group's metrics."""
        for f in self.fields:
            j = len(self.keys)
            self.keys.append((name, f))
            if not self.rows:
                continue
            row = getattr(model, _ROW_FIELDS[f]) - getattr(baseline, _ROW_FIELDS[f])
            # a predictor serving the same probabilities as a baseline (a model without an edge and the base rates)
            # differs from it only by rounding (~1e-16 nats a row): that is no difference, not a 95 % interval
            # excluding 0
            row[np.abs(row) < ROUNDING] = 0.0
            self.point[j] = row.mean()
            if self.prefix is not None:
                np.cumsum(row if self.order is None else row[self.order], out=self.prefix[1:, j])

    def cells(self, block_all: int) -> list[tuple[str, str, dict[str, Any]]]:
        """``(baseline, metric, {"diff", "ci95"})`` per series added (intervals when the group keeps prefix sums); the
        bootstrap's blocks are ``block_all`` rows (at most the group's rows). Frees the prefix sums."""
        if not self.rows:
            return [(name, f, {"diff": None, "ci95": None}) for name, f in self.keys]
        ci: np.ndarray | None = None
        if self.prefix is not None:
            ci = _bootstrap_intervals(self.prefix, self.point, min(block_all, self.rows))
            self.prefix = None
        return [(name, f, {"diff": _num(self.point[j]), "ci95": None if ci is None else [_num(ci[0, j]), _num(ci[1, j])]})
                for j, (name, f) in enumerate(self.keys)]


def _difference_groups(model: _Rows, baselines: int, intervals: bool,
                       orders: tuple[np.ndarray | None, np.ndarray | None] = (None, None)) -> tuple[_Differences, _Differences]:
    """Empty :class:`_Differences` of the two metric groups (all rows, moving rows) for ``baselines`` baselines (with
    ``intervals``, keeping the prefix sums they are made of); ``orders``: each group's rows in time order
    (:func:`_time_order`), or None to keep them as given."""
    sizes = (model.log_loss.shape[0], model.direction_log_loss.shape[0])
    return (_Differences(_FIELD_GROUPS[0], 2 * baselines, sizes[0], intervals, orders[0]),
            _Differences(_FIELD_GROUPS[1], 2 * baselines, sizes[1], intervals, orders[1]))


def time_order(times: np.ndarray, ends: np.ndarray, markets: int, horizon: int) -> tuple[np.ndarray | None, int]:
    """The rows in time order for blocks of consecutive rows (None where they are in it already, or with one market),
    and a horizon in rows of that order: the median over the rows of the rows, of every market, from a row's time
    (``times``, ms) to its horizon's end (``ends``, ms; NaN where not known), at least ``horizon`` (ticks).

    Markets of one period move together: rows of several markets at one time share a shock, and their labels overlap
    as one market's do over a horizon. Blocks of consecutive rows in time order hold those rows together, and a
    horizon of rows in that order holds every market's ticks of one horizon (four markets of one period: four times
    ``horizon`` rows). Blocks cut from the markets one after another held each market's rows apart, and scored four
    markets of correlation 0.9 as four independent ones: a no-skill lean's P&L interval excluded 0 for 28 % of such
    files instead of 5 % (benchmarks/interval_coverage.py --markets 4 --rho 0.9). Markets of successive periods (a
    file a month read as a market each) are in time order already, and one market's rows are kept as they are."""
    if markets < 2 or not times.size:
        return None, horizon
    order = np.argsort(times, kind="stable")
    sorted_t = times[order]
    known = np.isfinite(ends)
    if known.any():
        spans = (np.searchsorted(sorted_t, ends[known], side="left")
                 - np.searchsorted(sorted_t, times[known], side="left"))
        horizon = max(horizon, int(np.median(spans)))
    return (None if np.array_equal(order, np.arange(times.size)) else order), horizon


def _time_order(c: _Checked) -> tuple[np.ndarray | None, np.ndarray | None, int]:
    """:func:`time_order` of the scored rows, all rows and the moving ones, and the horizon in rows (``c.horizon``
    without times). A row's horizon ends at the row ``spans`` later in its market, when that is a scored row."""
    if c.times_ms is None:
        return None, None, c.horizon
    t = c.times_ms
    ends = np.full(t.shape[0], np.nan)
    for rows in c.books:
        end = np.arange(rows.size) + c.spans[rows]
        inside = end < rows.size  # the horizon's end is a scored row of the market: its time is known
        ends[rows[inside]] = t[rows[end[inside]]]
    order, horizon = time_order(t, ends, len(c.books), c.horizon)
    if order is None:
        return None, None, horizon
    return order, np.argsort(t[c.labels != FLAT], kind="stable"), horizon


def _diff_cells(groups: tuple[_Differences, _Differences], n: int, horizon: int) -> tuple[dict[str, Any], int]:
    """``vs_baselines`` from the filled groups (all rows, then moving rows) and the block length."""
    block_all = block_length(n, horizon)
    out: dict[str, dict[str, Any]] = {name: {} for name, _ in groups[0].keys}
    for group in groups:
        for name, f, cell in group.cells(block_all):
            out[name][f] = cell
    return out, block_all


def _dof(rows: int, block: int, intervals: bool) -> float | None:
    """:func:`interval_dof` of ``rows`` rows in blocks of ``block`` (at most the rows), rounded; None without rows or
    without intervals."""
    return round(interval_dof(rows, min(block, rows)), 2) if rows and intervals else None


def _t975(rows: int, block: int, intervals: bool) -> float | None:
    """The Student t quantile the intervals of ``rows`` rows in blocks of ``block`` use, rounded; None as for
    :func:`_dof`."""
    return round(student_t_quantile(0.975, interval_dof(rows, min(block, rows))), 4) if rows and intervals else None


def _per_market(c: _Checked, rows: _Rows) -> dict[str, Any]:
    assert c.markets is not None
    ids, inverse, counts = np.unique(c.markets, return_inverse=True, return_counts=True)
    order = np.argsort(-counts, kind="stable")[:MAX_MARKETS_REPORTED]
    moving = c.labels != FLAT
    inv_moving = inverse[moving]
    pos = _positions(c.probs)
    table = []
    for k in order:
        sel = inverse == k
        sel_m = inv_moving == k
        table.append({"market": str(ids[k]), "samples": int(counts[k]), "accuracy": _mean(rows.correct[sel]),
                      "directional_accuracy": _mean(rows.direction_correct[sel_m]),
                      "log_loss": _mean(rows.log_loss[sel]),
                      "trades": int((pos[sel] != 0).sum()),
                      "costs_bp": _num(rows.pnl_cost[sel].sum() * 1e4), "total_bp": _num(rows.pnl[sel].sum() * 1e4)})
    return {"markets": int(ids.shape[0]), "reported": len(table), "table": table}


def _pnl_intervals(pnl: dict[str, Any], net: np.ndarray, constant: dict[str, np.ndarray], block: int, intervals: bool,
                   per_year: float | None, order: np.ndarray | None = None) -> None:
    """Add to the model's ``pnl`` the 95 % intervals of its net P&L (``total_bp_ci95``, ``net_per_tick_bp_ci95``), of
    its Sharpe ratios, and its differences with the constant positions (``vs_always_long``, ``vs_always_short``:
    ``{"diff_bp", "ci95"}`` of the totals, model minus constant).

    The series are the model's net P&L per row, its per-row differences with each constant position's and the
    Sharpe ratio's influence per row, each given an interval by :func:`_bootstrap_intervals` (the same blocks as the
    other intervals). The Sharpe ratio S = μ/σ of rows x moves with the mean of
    ψ_t = z_t − S/2 · (z_t² − 1), z_t = (x_t − μ)/σ (to first order: the mean's error over σ, less S/2 times the
    variance's relative error), so its interval is S plus the interval of ψ's mean about its point: the sd's own
    uncertainty counted, and the rows' autocorrelation (overlapping horizons) through the blocks. For independent
    rows ψ's variance is 1 − S·skew + S²·(kurtosis − 1)/4 (Mertens 2002; 1 + S²/2 for normal ones, Lo 2002).
    None without ``intervals``, and the Sharpe ratios' with a net P&L of sd 0. ``order``: the rows in time order for
    the blocks (:func:`_time_order`; None: as given).
    """
    n = net.shape[0]
    sd = float(net.std(ddof=1)) if n >= 2 else 0.0
    rows = [net, net - constant["always_long"], net - constant["always_short"]]
    sharpe = float(net.mean()) / sd if sd > 0 else None
    if sharpe is not None:
        z = (net - net.mean()) / sd
        rows.append(z - 0.5 * sharpe * (z * z - 1.0))
    series = np.stack(rows)
    series[1:3][np.abs(series[1:3]) < ROUNDING * 1e-4] = 0.0  # a model trading as a constant position: rounding
    point = series.mean(axis=1)
    ci: np.ndarray | None = None
    if intervals and n:
        ci = _bootstrap_intervals(_prefix_sums(series if order is None else series[:, order]), point, min(block, n))

    def interval(j: int, scale: float) -> list[float | None] | None:
        return None if ci is None else [_num(ci[0, j] * scale), _num(ci[1, j] * scale)]

    def sharpe_interval(scale: float) -> list[float | None] | None:
        if ci is None or sharpe is None:
            return None
        return [_num((sharpe + ci[0, 3] - point[3]) * scale), _num((sharpe + ci[1, 3] - point[3]) * scale)]

    pnl["total_bp_ci95"] = interval(0, n * 1e4)
    pnl["net_per_tick_bp_ci95"] = interval(0, 1e4)
    pnl["sharpe_per_trade_ci95"] = sharpe_interval(1.0)
    pnl["sharpe_annualised_ci95"] = sharpe_interval(math.sqrt(per_year)) if per_year else None
    for j, key in ((1, "always_long"), (2, "always_short")):
        pnl[f"vs_{key}"] = {"diff_bp": _num(point[j] * n * 1e4), "ci95": interval(j, n * 1e4)}


def score(inp: ScoreInputs, cost_bp: float = 0.0, bootstrap: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Score the model's probabilities and the baselines' on the same rows; a JSON-safe dict.

    ``cost_bp`` round-trip cost per unit traded in basis points; ``bootstrap`` > 0 asks for the
    moving-block bootstrap's 95 % intervals (0: no intervals; the variance is computed exactly, as infinitely many
    resamples would give it, so the number and ``seed``, recorded, no longer change them). Undefined values (no
    moving labels, no trades…) are None, never NaN.

    Keys: ``samples``, ``class_counts``, ``moving_samples``, ``horizon``, ``cost_bp``,
    ``base_rates``, ``rule_tilts`` (:func:`rule_tilts`); ``model`` and ``baselines[name]`` with ``accuracy`` (argmax vs label),
    ``directional_accuracy`` (moving labels only; sign of P(up) − P(down), ties count half),
    ``log_loss`` (nats, probabilities clipped at 1e-12), ``direction_log_loss`` (nats, binary,
    q = P(up) / (P(up) + P(down)) over moving labels), ``brier`` (3-class, in [0, 2]),
    ``recall`` per class, ``confusion`` (rows true, columns predicted), ``ece`` (top label,
    10 equal-width bins), ``direction_ece`` (q over moving labels, 10 bins), ``reliability``
    (the q bins: count, mean_predicted q, observed up frequency) and ``pnl``; the model also
    has ``confidence_quartiles`` (confidence = 1 − H(p)/ln 3). ``vs_baselines[name][metric]`` = ``{"diff", "ci95"}``
    (model minus baseline, 95% moving-block bootstrap interval) for ``log_loss``,
    ``direction_log_loss``, ``accuracy``, ``directional_accuracy``; ``bootstrap`` describes
    the resampling; ``per_market`` (when markets are given) the model per market.

    P&L: at every tick a trade of sign(P(up) − P(down)) ∈ {−1, 0, 1}, size 1/horizon, is opened and held for the
    horizon; the trades of one market make its book (P_t = the sum of its open trades; markets never net), and
    costs are paid on the book's turnover: ``cost_bp``/2 (a round trip is two units) × |P_t − P_{t−1}|, opening at
    the market's first row and closing after its last included (:func:`_book`). ``trades`` counts nonzero signs,
    ``hit_rate`` the fraction of them with a positive return and ``mean_trade_bp`` their mean return (bp, a size-1
    trade over the horizon), both before costs; ``gross_bp`` the book's total before costs, ``turnover`` Σ|ΔP|,
    ``costs_bp`` the costs, ``total_bp`` = gross − costs, ``net_per_tick_bp`` its mean per row;
    ``sharpe_per_trade`` mean / sd (ddof 1) of the net P&L per row (each row's trade of size 1 less the costs paid
    at it, over a horizon; None with sd 0) and ``sharpe_annualised`` that × √(horizons per year) (``annualisation``:
    :func:`_annualisation`; None when it says so). The model's ``pnl`` also has bootstrap 95 % intervals
    (:func:`_pnl_intervals`), and the model has the P&L of ``always_long`` and ``always_short`` (a constant position:
    one round trip per market).
    """
    if bootstrap < 0:
        raise ValueError("bootstrap must be >= 0")
    if not math.isfinite(cost_bp) or cost_bp < 0:
        raise ValueError("cost_bp must be a finite number >= 0")
    c = _check(inp)
    n = c.labels.shape[0]
    counts = np.bincount(c.labels, minlength=3)
    model, model_rows = _evaluate(c.probs, c, cost_bp)
    model["confidence_quartiles"] = _confidence_quartiles(c.probs, model_rows, c.labels)
    per_year = c.annualisation["horizons_per_year"]
    views = _rule_views(c.past_ret)  # the rules' calls, read once for both their tilts and their forecasts
    tilts = rule_tilts(c.past_ret, c.labels, views)
    each = _each_baseline_probs(c.base_rates, c.past_ret, tilts, views)
    if c.lr_probs is not None:
        each = itertools.chain(each, [("logistic", c.lr_probs)])
    # one baseline at a time: its (n, 3) probabilities made, scored and its per-row contributions reduced into the
    # model-minus-baseline differences before the next (holding every baseline's took gigabytes for millions of rows)
    intervals = bootstrap > 0
    order, moving_order, block_horizon = _time_order(c)
    groups = _difference_groups(model_rows, 2 + len(views) + (c.lr_probs is not None), intervals,
                                (order, moving_order))
    baselines: dict[str, Any] = {}
    for name, p in each:
        baselines[name], rows = _evaluate(p, c, cost_bp)
        del p
        for group in groups:
            group.add(name, model_rows, rows)
        del rows
    vs, block = _diff_cells(groups, n, block_horizon)
    del groups
    constant = {}  # the constant positions' books, made once the baselines' rows are freed
    for key, side in (("always_long", 1.0), ("always_short", -1.0)):
        pos = np.full(n, side)
        book = _book(pos, c, cost_bp)
        model[key] = _pnl(pos, book, c.horizon, per_year)
        constant[key] = book.net
        del pos, book
    _pnl_intervals(model["pnl"], model_rows.pnl, constant, block, intervals, per_year, order)
    moving = int(n - counts[FLAT])
    summary: dict[str, Any] = {
        "samples": int(n),
        "class_counts": {name: int(counts[k]) for k, name in enumerate(CLASS_NAMES)},
        "moving_samples": moving,
        "horizon": c.horizon,
        "cost_bp": float(cost_bp),
        "base_rates": {name: float(c.base_rates[k]) for k, name in enumerate(CLASS_NAMES)},
        "rule_tilts": tilts,
        "annualisation": c.annualisation,
        "model": model,
        "baselines": baselines,
        "vs_baselines": vs,
        "bootstrap": {"method": "moving-block bootstrap of per-row model-minus-baseline contributions, "
                                "the rows in time order (every market's rows at one time in the same blocks; "
                                "block_length at least horizon_rows, the rows a horizon spans in that order), "
                                "the same blocks for every baseline, with blocks of block_length and twice that; each "
                                "one's variance of the mean computed exactly (the variance of the block sums over all "
                                "starts: the limit of infinitely many resamples, no Monte-Carlo noise), divided by its "
                                "shortfall for independent rows and extrapolated to remove the block length's bias "
                                "(2·v(2b) − v(b); rows of fewer than four blocks: blocks of block_length alone); the "
                                "interval is the point ± t·√v, t the 97.5 % quantile of Student's t with "
                                "degrees_of_freedom (3·rows / (8·block_length), at least 1); directional metrics over "
                                "moving rows only; the model's net P&L per row, its differences with always long and "
                                "always short and its Sharpe ratio's influence per row (z − S/2·(z² − 1), z the "
                                "standardised net P&L: the sd's uncertainty counted) the same way over all rows; "
                                "resamples > 0 asks for the intervals, their number and the seed no longer change them",
                      "resamples": int(bootstrap), "seed": int(seed), "block_length": block,
                      "horizon_rows": block_horizon, "time_ordered": c.times_ms is not None and len(c.books) > 1,
                      "degrees_of_freedom": {"all_rows": _dof(n, block, intervals),
                                             "moving_rows": _dof(moving, block, intervals)},
                      "t_quantile": {"all_rows": _t975(n, block, intervals), "moving_rows": _t975(moving, block, intervals)},
                      "rows_used": int(n),
                      "moving_rows_used": moving, "subsampled": False,
                      "note": "all rows used (block sums from prefix sums, no subsampling)"},
    }
    if c.markets is not None:
        summary["per_market"] = _per_market(c, model_rows)
    return summary


def cumulative_pnl(inp: ScoreInputs, cost_bp: float = 0.0) -> dict[str, np.ndarray]:
    """Cumulative P&L in bp after costs over the rows in order (float64 (n,) each), for plotting.

    ``model`` trades sign(P(up) − P(down)) and ``always_long`` is long at every tick; each row adds its net P&L
    (``score``'s accounting: the row's trade's return / horizon less the costs of its book's turnover at that tick),
    so the last value equals ``score``'s ``total_bp``.
    """
    c = _check(inp)
    model = _book(_positions(c.probs), c, cost_bp).net * 1e4
    long = _book(np.ones(c.labels.shape[0]), c, cost_bp).net * 1e4
    return {"model": np.cumsum(model), "always_long": np.cumsum(long)}


BOUNCE_Z = 1.96  # how far below 0 the lag-1 autocovariance must lie (in robust standard errors) to read as a bounce


def bid_ask_bounce(returns: list[np.ndarray], markets: list[str] | None = None) -> dict[str, Any] | None:
    """Whether the scored prices bounce between bid and ask, and the round-trip spread that implies.

    ``returns``: per market, the per-tick log returns over its scored ticks, in time order. Prints that alternate
    between bid and ask make consecutive returns negatively correlated: with the mid a martingale, the lag-1
    autocovariance is −(half-spread)², so the effective spread is 2 √(−cov₁) (Roll 1984), a taker's round trip. A
    direction that lives on that bounce earns at the printed prices what a taker pays to trade it, so a P&L charged
    less than this spread is not one a trader gets. Pooled over the markets (each demeaned); ``z`` is the
    autocovariance over its standard error from the products' spread (robust to volatility clusters and heavy
    tails).

    A bounce is a fixed gap between bid and ask, so it turns the sign of the next move back in calm stretches as often
    as in busy ones; a reversal that lives in a few large moves (a crash's overreaction in daily closes) drags the
    autocovariance below 0 as far, but not the signs. ``reversals`` is the share of consecutive non-zero returns (in
    each market) whose signs differ, ``reversal_z`` its distance above 1/2 in binomial standard errors (signs do not
    see the size of a move: a martingale with symmetric moves has 1/2 whatever its volatility). ``spread_bp`` is set
    only where the autocovariance is below 0 by more than ``BOUNCE_Z`` standard errors and the share of reversals
    above 1/2 by more than ``BOUNCE_Z`` (a martingale shows either on about 2.5 % of samples), else None. None without
    two returns in a row.

    With ``markets`` (the names of the markets of ``returns``, two or more), each market is also tested on its own:
    pooled, a market that bounces is diluted by quieter or busier ones (its products drown in theirs) and its spread
    is averaged with theirs. The markets are tested as one family at 2.5 % (each at the normal quantile of
    1 − 0.025 / k for k markets tested, Bonferroni), so a file of many quiet markets does not flag one by chance;
    ``markets`` (added) holds the figures of those that bounce, largest spread first, ``pooled_spread_bp`` the pooled
    test's spread and ``market_z`` the threshold, and ``spread_bp`` is the largest of the flagged markets' spreads and
    the pooled one: a cost below it leaves some market's P&L living on its bounce.
    """
    pooled = _at(_bounce_of(returns), BOUNCE_Z)
    if pooled is None or markets is None or len(returns) < 2:
        return pooled
    each = {name: b for name, r in zip(markets, returns, strict=True) if (b := _bounce_of([r])) is not None}
    cut = NormalDist().inv_cdf(1.0 - 0.025 / max(len(each), 1))
    flagged = {}
    for name, figures in each.items():
        found = _at(figures, cut)
        if found is not None and found["spread_bp"] is not None:
            flagged[name] = found
    order = sorted(flagged, key=lambda name: -flagged[name]["spread_bp"])
    spreads = [flagged[name]["spread_bp"] for name in order] + ([pooled["spread_bp"]] if pooled["spread_bp"] else [])
    return {**pooled, "pooled_spread_bp": pooled["spread_bp"], "market_z": cut,
            "markets": {name: flagged[name] for name in order}, "spread_bp": max(spreads) if spreads else None}


def _at(figures: tuple[dict[str, Any], float] | None, threshold: float) -> dict[str, Any] | None:
    """``bid_ask_bounce``'s figures (of :func:`_bounce_of`) with ``spread_bp`` of the tests at ``threshold`` standard
    errors."""
    if figures is None:
        return None
    out, cov1 = figures
    bounce = out["z"] < -threshold and out["reversal_z"] > threshold
    return {**out, "spread_bp": 2.0 * math.sqrt(-cov1) * 1e4 if bounce else None}


def _bounce_of(returns: list[np.ndarray]) -> tuple[dict[str, Any], float] | None:
    """``bid_ask_bounce``'s figures of ``returns`` taken together (all but ``spread_bp``), and the lag-1
    autocovariance; None without two returns in a row."""
    prods: list[np.ndarray] = []
    squares = 0.0
    count = 0
    pairs = 0  # consecutive non-zero returns, and those of them whose signs differ
    turns = 0
    for r in returns:
        r = np.asarray(r, dtype=np.float64)
        r = r[np.isfinite(r)]
        if r.size < 2:
            continue
        x = r - r.mean()
        prods.append(x[1:] * x[:-1])
        squares += float(np.dot(x, x))
        count += int(x.size)
        signs = np.sign(r[r != 0.0])
        pairs += max(int(signs.size) - 1, 0)
        turns += int(np.count_nonzero(signs[1:] != signs[:-1]))
    if not prods or squares <= 0.0:
        return None
    p = np.concatenate(prods)
    cov1 = float(p.mean())
    se = float(p.std()) / math.sqrt(p.size)
    z = cov1 / se if se > 0 else 0.0
    share = turns / pairs if pairs else None
    turn_z = (turns / pairs - 0.5) * 2.0 * math.sqrt(pairs) if pairs else 0.0
    return {"returns": count, "lag1_autocorrelation": cov1 / (squares / count), "z": z, "reversals": share,
            "reversal_z": turn_z}, cov1
