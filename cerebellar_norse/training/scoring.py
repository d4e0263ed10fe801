"""Scoring a model on prepared ticks: the served probabilities against the baselines.

Used by ``train`` (on its test split, after every choice is made) and by
``cerebellar-norse evaluate`` (on any data, every tick past the warm-up). The logistic
regression baseline sees the same inputs as the network: the mossy-fibre currents of
the tick (the encoder's population code of its z-scored return, volume and gap).
``train`` fits it on the training split; ``evaluate`` has no training split and
cross-fits it in time (the model for the second half of each market is fitted on
the first half and vice versa, with one horizon dropped at the seam), which if
anything flatters the baseline.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..config import Config
from ..neurons.topology import Weights
from .calibration import apply_head
from .evaluation import ScoreInputs, cumulative_pnl, fit_logistic, score
from .trainer import Prepared, network_logp

MAX_LR_ROWS = 200_000


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
    fwd = _cat([pm.fwd_ret[i] for pm, i in zip(prep.markets, idx, strict=True)])
    past = _cat([pm.past_ret[i] for pm, i in zip(prep.markets, idx, strict=True)])
    markets = np.array([pm.market_id for pm, i in zip(prep.markets, idx, strict=True) for _ in range(i.size)], dtype=object)
    lr = None
    if logistic == "train":
        lr = _logistic_from_train(prep, idx)
    elif logistic == "crossfit":
        lr = _logistic_crossfit(prep, idx)
    return ScoreInputs(probs, labels, fwd, past, base_rates, lr, prep.block, markets)


def _kept_rows(n: int) -> np.ndarray:
    """Which of ``n`` rows the logistic baseline is fitted on: all, or ``MAX_LR_ROWS`` spread evenly (ascending)."""
    return np.arange(n) if n <= MAX_LR_ROWS else np.linspace(0, n - 1, MAX_LR_ROWS).astype(np.int64)


def _subsample(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if y.shape[0] <= MAX_LR_ROWS:
        return x, y
    keep = _kept_rows(y.shape[0])
    return x[keep], y[keep]


def _logistic_from_train(prep: Prepared, idx: list[np.ndarray]) -> np.ndarray | None:
    rows = [np.flatnonzero(pm.labels >= 0) for pm in prep.markets]
    y = _cat([pm.labels[r] for pm, r in zip(prep.markets, rows, strict=True)]).astype(np.int64)
    if y.size < 10:
        return None
    # the rows _subsample keeps, gathered per market: copying every training row to float64 first held two
    # float64 copies of the whole training split (over 1 GB for 2 million ticks) to fit on 200,000 of them
    keep = _kept_rows(y.size)
    ends = np.cumsum([r.size for r in rows])
    starts = ends - np.array([r.size for r in rows])
    cuts = np.searchsorted(keep, np.concatenate([starts, ends[-1:]]))  # keep[cuts[k]:cuts[k + 1]]: market k's rows
    xs = [pm.mossy[r[keep[cuts[k]:cuts[k + 1]] - a]].astype(np.float64)
          for k, (pm, r, a) in enumerate(zip(prep.markets, rows, starts, strict=True))]
    model = fit_logistic(_cat(xs, prep.markets[0].mossy.shape[1]), y[keep])
    x_eval = _cat([pm.mossy[i].astype(np.float64) for pm, i in zip(prep.markets, idx, strict=True)], prep.markets[0].mossy.shape[1])
    return model.predict_proba(x_eval)


def _logistic_crossfit(prep: Prepared, idx: list[np.ndarray]) -> np.ndarray | None:
    """Each market's scored ticks split in two halves by time; each half scored by a fit on the other."""
    m = prep.markets[0].mossy.shape[1]
    halves: list[tuple[list[np.ndarray], list[np.ndarray]]] = [([], []), ([], [])]
    where: list[tuple[np.ndarray, np.ndarray]] = []
    for pm, i in zip(prep.markets, idx, strict=True):
        cut = i.size // 2
        a, b = i[:max(cut - prep.block, 0)], i[cut:]
        where.append((i[:cut], b))
        for k, part in enumerate((a, b)):
            halves[k][0].append(pm.mossy[part].astype(np.float64))
            halves[k][1].append(pm.truth[part])
    fits = []
    for xs, ys in halves:
        y = _cat(ys).astype(np.int64)
        if y.size < 10:
            return None
        fits.append(fit_logistic(*_subsample(_cat(xs, m), y)))
    out = []
    for pm, (first, second) in zip(prep.markets, where, strict=True):
        if first.size:
            out.append(fits[1].predict_proba(pm.mossy[first].astype(np.float64)))
        if second.size:
            out.append(fits[0].predict_proba(pm.mossy[second].astype(np.float64)))
    return _cat(out, 3).reshape(-1, 3)


def summarise(cfg: Config, weights: Weights, prep: Prepared, split: int, base_rates: np.ndarray, logistic: str = "train",
              cost_bp: float = 0.0, bootstrap: int = 1000) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The evaluation summary (see ``evaluation.score``) and cumulative P&L series of ``split``."""
    inp = score_inputs(cfg, weights, prep, split, base_rates, logistic)
    if inp.labels.shape[0] == 0:
        return {"samples": 0}, {}
    summary = score(inp, cost_bp=cost_bp, bootstrap=bootstrap)
    summary["labels"] = prep.spec.describe()
    return summary, cumulative_pnl(inp, cost_bp)
