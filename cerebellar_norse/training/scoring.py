"""Scoring a model on prepared ticks: the served probabilities against the baselines.

Used by ``train`` (on its test split, after every choice is made) and by
``cerebellar-norse evaluate`` (on any data, every tick past the warm-up). The logistic
regression baseline sees the same inputs as the network: the mossy-fibre currents of
the tick (the encoder's population code of its z-scored return, volume and gap).
``train`` fits it on the training split; ``evaluate`` has no training split and
cross-fits it in time (the model for the second half of each market is fitted on
the first half and vice versa, with one horizon dropped on each side of the seam), which if
anything flatters the baseline. Each fit's L2 penalty is chosen by cross-validation in
time on its own rows (:func:`choose_l2`), never on the rows it scores.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..config import Config
from ..neurons.topology import Weights
from .calibration import apply_head
from .evaluation import LogisticModel, ScoreInputs, bid_ask_bounce, cumulative_pnl, fit_logistic, score
from .trainer import Prepared, PreparedMarket, network_logp

MAX_LR_ROWS = 200_000  # rows the logistic baseline is fitted on at most
L2_GRID = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)  # the logistic baseline's penalties tried (per row, standardised weights)
L2_ROWS = 8_000  # rows its penalty is chosen on at most
PREDICT_ROWS = 65_536  # rows the baseline predicts at a time


def _cat(parts: list[np.ndarray], width: int | None = None) -> np.ndarray:
    if parts:
        return np.concatenate(parts)
    return np.zeros((0, width)) if width else np.zeros(0)


def score_inputs(cfg: Config, weights: Weights, prep: Prepared, split: int, base_rates: np.ndarray,
                 logistic: str = "train") -> ScoreInputs:
    """The :class:`ScoreInputs` of the scored ticks of ``split`` (1 validation, 2 test).

    ``logistic``: ``"train"`` fits the baseline on the training split's labels,
    ``"crossfit"`` cross-fits it on the scored ticks in time, ``"none"`` leaves it out.
    """
    logp = network_logp(cfg, weights, prep)
    idx, labels = prep.rows(split)
    probs = apply_head(_cat([lp[i] for lp, i in zip(logp, idx, strict=True)], 3).reshape(-1, 3), weights.head_gain,
                       weights.head_bias)
    del logp  # (T, 3) per market: not needed past the scored rows' probabilities
    fwd = _cat([pm.fwd_ret[i] for pm, i in zip(prep.markets, idx, strict=True)])
    past = _cat([pm.past_ret[i] for pm, i in zip(prep.markets, idx, strict=True)])
    markets = np.array([pm.market_id for pm, i in zip(prep.markets, idx, strict=True) for _ in range(i.size)], dtype=object)
    times = _cat([pm.ticks.timestamp[i] for pm, i in zip(prep.markets, idx, strict=True)]).astype(np.float64)
    spans = _cat([pm.end[i] - i for pm, i in zip(prep.markets, idx, strict=True)]).astype(np.int64)  # ticks held
    lr = None
    if logistic == "train":
        lr = _logistic_from_train(prep, idx)
    elif logistic == "crossfit":
        lr = _logistic_crossfit(prep, idx)
    return ScoreInputs(probs, labels, fwd, past, base_rates, lr, prep.block, markets, times, spans)


def _scored_returns(prep: Prepared, split: int) -> tuple[list[np.ndarray], list[str]]:
    """Per market, the per-tick log returns from its first scored tick of ``split`` to its last one, and the
    markets' names."""
    out, names = [], []
    for pm, i in zip(prep.markets, prep.rows(split)[0], strict=True):
        if i.size:
            out.append(np.diff(np.log(np.asarray(pm.ticks.price[i[0]:i[-1] + 1], dtype=np.float64))))
            names.append(pm.market_id)
    return out, names


def _kept_rows(n: int) -> np.ndarray:
    """Which of ``n`` rows the logistic baseline is fitted on: all, or ``MAX_LR_ROWS`` spread evenly (ascending)."""
    return np.arange(n) if n <= MAX_LR_ROWS else np.linspace(0, n - 1, MAX_LR_ROWS).astype(np.int64)


def _fit_on(markets: list[PreparedMarket], rows: list[np.ndarray], ys: list[np.ndarray]) -> LogisticModel | None:
    """The logistic baseline fitted on the mossy inputs of rows ``rows[k]`` of ``markets[k]``, labelled ``ys[k]``:
    on all of them, or on ``MAX_LR_ROWS`` spread evenly over their concatenation (:func:`_kept_rows`); None for
    fewer than 10 rows. Only the rows kept are copied to float64, into one array ``PREDICT_ROWS`` rows at a time: a
    copy of every row held gigabytes for millions."""
    y = _cat(ys).astype(np.int64)
    if y.size < 10:
        return None
    keep = _kept_rows(y.size)
    sizes = np.array([r.size for r in rows])
    starts = np.cumsum(sizes) - sizes
    cuts = np.searchsorted(keep, np.append(starts, y.size))  # keep[cuts[k]:cuts[k + 1]]: market k's rows
    x = np.empty((keep.size, markets[0].mossy.shape[1]))  # filled in place: no per-market copies to concatenate
    for k, (pm, r) in enumerate(zip(markets, rows, strict=True)):
        part = r[keep[cuts[k]:cuts[k + 1]] - starts[k]]
        for a in range(0, part.size, PREDICT_ROWS):
            sub = part[a:a + PREDICT_ROWS]
            x[cuts[k] + a:cuts[k] + a + sub.size] = pm.mossy[sub]
    return fit_logistic(x, y[keep], l2=choose_l2(x, y[keep]))


def choose_l2(x: np.ndarray, y: np.ndarray) -> float:
    """The logistic baseline's L2 penalty for rows ``x`` (n, d) labelled ``y``, in time order, by cross-validation in
    time: on at most ``L2_ROWS`` rows spread evenly, each penalty of ``L2_GRID`` is fitted on the first half and
    scored on the second, and vice versa; the lowest held-out log loss wins. The penalty is on the mean loss per row,
    so it is scaled by those rows / n for the n rows of the fit (the same prior per weight).

    With the weakest penalty alone, a fit on a few hundred rows (a daily file's scored ticks) of the 48 inputs
    separated its rows: held-out log losses of 2-3.5 nats against the base rates' 1.1, so that a model "beat the
    logistic regression" with an interval far below 0 against a baseline that was merely overfitted.
    """
    n = y.shape[0]
    rows = np.arange(n) if n <= L2_ROWS else np.linspace(0, n - 1, L2_ROWS).astype(np.int64)
    m = rows.size
    if m < 20:
        return L2_GRID[-1]
    half = m // 2
    first, second = rows[:half], rows[half:]
    best, best_loss = L2_GRID[0], np.inf
    for l2 in L2_GRID:
        loss = 0.0
        for fit_rows, test_rows in ((first, second), (second, first)):
            model = fit_logistic(x[fit_rows], y[fit_rows], l2=l2)
            p = model.predict_proba(x[test_rows])
            loss += float(-np.log(np.clip(p[np.arange(test_rows.size), y[test_rows]], 1e-12, 1.0)).sum())
        if loss < best_loss:
            best, best_loss = l2, loss
    return best * m / n


def _predict(model: LogisticModel, pm: PreparedMarket, rows: np.ndarray) -> np.ndarray:
    """The baseline's probabilities (len(rows), 3) for rows ``rows`` of ``pm``, ``PREDICT_ROWS`` at a time (each
    row's answer is its own: the float64 copy of a market's every row held gigabytes for millions)."""
    out = np.empty((rows.size, 3))
    for a in range(0, rows.size, PREDICT_ROWS):
        part = rows[a:a + PREDICT_ROWS]
        out[a:a + part.size] = model.predict_proba(pm.mossy[part].astype(np.float64))
    return out


def _logistic_from_train(prep: Prepared, idx: list[np.ndarray]) -> np.ndarray | None:
    """The logistic baseline fitted on the training split, for the rows ``idx`` (per market) in order."""
    rows = [np.flatnonzero(pm.labels >= 0) for pm in prep.markets]
    model = _fit_on(prep.markets, rows, [pm.labels[r] for pm, r in zip(prep.markets, rows, strict=True)])
    if model is None:
        return None
    return _cat([_predict(model, pm, i) for pm, i in zip(prep.markets, idx, strict=True)], 3).reshape(-1, 3)


def _logistic_crossfit(prep: Prepared, idx: list[np.ndarray]) -> np.ndarray | None:
    """Each market's scored ticks split in two halves by time; each half scored by a fit on the other, less the
    horizon of ticks beside the seam (their labels share returns with the other half's ticks there)."""
    parts: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])
    where: list[tuple[np.ndarray, np.ndarray]] = []
    for i in idx:
        cut = i.size // 2
        parts[0].append(i[:max(cut - prep.block, 0)])
        parts[1].append(i[cut + prep.block:])
        where.append((i[:cut], i[cut:]))
    fits = []
    for rows in parts:
        fit = _fit_on(prep.markets, rows, [pm.truth[r] for pm, r in zip(prep.markets, rows, strict=True)])
        if fit is None:
            return None
        fits.append(fit)
    out = []
    for pm, (first, second) in zip(prep.markets, where, strict=True):
        if first.size:
            out.append(_predict(fits[1], pm, first))
        if second.size:
            out.append(_predict(fits[0], pm, second))
    return _cat(out, 3).reshape(-1, 3)


def summarise(cfg: Config, weights: Weights, prep: Prepared, split: int, base_rates: np.ndarray, logistic: str = "train",
              cost_bp: float = 0.0, bootstrap: int = 1000,
              release_mossy: bool = False) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The evaluation summary (see ``evaluation.score``) and cumulative P&L series of ``split``.

    ``release_mossy``: once the model's and the logistic baseline's probabilities are made, replace each market's
    encoded inputs (``mossy``, (T, M) in the network's float type) by an empty (0, M) array, so that scoring does
    not hold them too (for a caller that reads no more of them).
    """
    inp = score_inputs(cfg, weights, prep, split, base_rates, logistic)
    if release_mossy:
        for pm in prep.markets:
            pm.mossy = pm.mossy[:0].copy()
    if inp.labels.shape[0] == 0:
        return {"samples": 0}, {}
    summary = score(inp, cost_bp=cost_bp, bootstrap=bootstrap)
    summary["labels"] = prep.spec.describe()
    summary["bounce"] = bid_ask_bounce(*_scored_returns(prep, split))
    return summary, cumulative_pnl(inp, cost_bp)
