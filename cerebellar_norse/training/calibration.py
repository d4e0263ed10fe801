"""Calibrating the output head on the validation split, and deciding whether there is an edge.

The served probabilities are ``softmax(gain * log p + bias)`` of the network's
probabilities ``p`` (see ``neurons.topology.Weights``). Three head families are fitted
by maximum likelihood on validation ticks:

* ``priors``: gain 0, bias = log of the class frequencies (train + validation, +1
  each): the model knows nothing and says so;
* ``flat``: only the flat class listens to the network (gains 0, g, 0): it may know
  *when* prices move, the up/down split stays at its base rate;
* ``shared``: one gain for every class (temperature scaling) with per-class biases.

Choice. Each family is scored by blocked ``FOLDS``-fold cross-validation over the
validation ticks in time order (fit on the other folds, score the held-out one), so
the decision never sees a tick's label when fitting the head that scores it; the ticks
within a horizon of the held-out fold are left out of the fit too (purged), as their
labels' returns overlap those of the fold's first and last ticks. The
per-tick differences to ``priors`` get a standard error from blocks of
``max(horizon, 20)`` ticks (neighbouring labels overlap). ``shared`` is chosen when its
*direction* log loss beats the priors' by more than ``max(MIN_GAIN, Z * se)``
(a directional edge); else ``flat`` when its 3-class log loss does; else ``priors``
(``edge = "none"``: no edge found). On data without signal the served probabilities
are therefore the base rates; so too when every validation label is one class (a price
that never moves), where a head could only learn to repeat that class.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

FOLDS = 5
MIN_GAIN = 5e-4  # nats per tick
Z = 2.0
EPS = 1e-12
KINDS = ("priors", "flat", "shared")


@dataclass(frozen=True)
class Head:
    """A fitted head: gains and biases per class (float64), and its family."""

    gain: np.ndarray
    bias: np.ndarray
    kind: str


@dataclass
class HeadChoice:
    """The chosen head, the edge found, and the cross-validated figures behind the choice."""

    head: Head
    edge: str  # "direction", "flat" or "none"
    cv: dict[str, Any] = field(default_factory=dict)


def apply_head(logp: np.ndarray, gain: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """Probabilities ``softmax(gain * logp + bias)`` row by row (logp: (n, 3) log-probabilities)."""
    z = logp * gain + bias
    z -= z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return np.asarray(e / e.sum(axis=1, keepdims=True))


def base_rates(counts: np.ndarray) -> np.ndarray:
    """Class frequencies of ``counts`` (down, flat, up), +1 each (so none is 0)."""
    return np.asarray((np.asarray(counts, dtype=np.float64) + 1.0) / (float(np.sum(counts)) + 3.0))


def prior_head(counts: np.ndarray) -> Head:
    """The base-rate head of class ``counts`` (+1 each)."""
    return Head(np.zeros(3), np.log(base_rates(counts)), "priors")


def fit_head(logp: np.ndarray, labels: np.ndarray, kind: str, max_iter: int = 100) -> Head:
    """Maximum-likelihood head of family ``kind`` on ``logp`` (n, 3) and ``labels`` (n,) in {0, 1, 2}."""
    if kind == "priors":
        return prior_head(np.bincount(labels, minlength=3))
    x = torch.as_tensor(np.clip(logp, -700.0, 0.0), dtype=torch.float64)
    y = torch.as_tensor(labels, dtype=torch.long)
    counts = np.bincount(labels, minlength=3)
    b0 = prior_head(counts).bias
    bias = torch.tensor(b0 - b0.mean(), dtype=torch.float64, requires_grad=True)
    g = torch.tensor([1.0 if kind == "shared" else 0.5], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([1.0, 1.0, 1.0] if kind == "shared" else [0.0, 1.0, 0.0], dtype=torch.float64)
    opt = torch.optim.LBFGS([g, bias], lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        z = x * (g * mask) + bias
        # a whisper of L2 keeps the optimum unique (biases are defined up to a constant)
        loss = torch.nn.functional.cross_entropy(z, y) + 1e-6 * (bias * bias).sum()
        loss.backward()
        return loss

    opt.step(closure)
    gain = (g.detach() * mask).numpy().copy()
    b = bias.detach().numpy().copy()
    if not (np.all(np.isfinite(gain)) and np.all(np.isfinite(b))):
        return prior_head(counts)
    return Head(gain, b - b.max(), kind)


def row_losses(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-tick 3-class log loss, and per-tick direction log loss (NaN on flat labels), in nats."""
    n = labels.shape[0]
    ll = -np.log(np.clip(probs[np.arange(n), labels], EPS, 1.0))
    q = probs[:, 2] / np.maximum(probs[:, 2] + probs[:, 0], EPS)
    q = np.clip(q, EPS, 1.0 - EPS)
    dl = np.where(labels == 2, -np.log(q), np.where(labels == 0, -np.log(1.0 - q), np.nan))
    return ll, dl


def _block_se(d: np.ndarray, block: int) -> float:
    """Standard error of the mean of ``d`` (NaNs ignored) from contiguous blocks."""
    d = d[~np.isnan(d)]
    n = d.shape[0]
    if n < 2:
        return math.inf
    k = max(n // block, 1)
    sums = np.array([c.sum() for c in np.array_split(d, k)])
    sizes = np.array([c.shape[0] for c in np.array_split(d, k)])
    mean = d.mean()
    if k < 2:
        return float(d.std(ddof=1) / math.sqrt(n))
    return float(math.sqrt(np.sum((sums - sizes * mean) ** 2) * k / (k - 1)) / n)


def choose_head(logp: np.ndarray, labels: np.ndarray, train_counts: np.ndarray, horizon: int) -> HeadChoice:
    """Fit and choose the head on validation ticks (``logp`` (n, 3) network log-probabilities, in time order).

    ``train_counts`` are the training split's class counts (the priors also count the
    validation labels). See the module docstring for the rule.
    """
    n = labels.shape[0]
    all_counts = np.asarray(train_counts) + np.bincount(labels, minlength=3)
    if n < 10 * FOLDS:
        return HeadChoice(prior_head(all_counts), "none", {"reason": f"only {n} validation ticks"})
    seen = np.flatnonzero(np.bincount(labels, minlength=3))
    if seen.size < 2:  # a fitted head can put all its mass on the one class: a "gain" that predicts nothing
        only = ("down", "flat", "up")[int(seen[0])]
        return HeadChoice(prior_head(all_counts), "none",
                          {"reason": f"every validation label is {only}: there is nothing to predict"})
    rows = np.arange(n)
    folds = np.array_split(rows, FOLDS)
    ll = {k: np.empty(n) for k in KINDS}
    dl = {k: np.empty(n) for k in KINDS}
    for idx in folds:
        # purged: a tick within a horizon of the fold shares part of its label's return with the fold's edge ticks
        rest = rows[(rows < idx[0] - horizon) | (rows > idx[-1] + horizon)]
        for kind in KINDS:
            if kind == "priors":
                head = prior_head(np.asarray(train_counts) + np.bincount(labels[rest], minlength=3))
            else:
                head = fit_head(logp[rest], labels[rest], kind)
            a, b = row_losses(apply_head(logp[idx], head.gain, head.bias), labels[idx])
            ll[kind][idx], dl[kind][idx] = a, b
    block = max(horizon, 20)
    cv: dict[str, Any] = {"folds": FOLDS, "samples": int(n), "block": block}
    for kind in KINDS:
        cv[kind] = {"log_loss": float(ll[kind].mean()), "direction_log_loss": _nanmean(dl[kind])}
    d_dir = dl["shared"] - dl["priors"]
    d_flat = ll["flat"] - ll["priors"]
    dir_margin = max(MIN_GAIN, Z * _block_se(d_dir, block))
    flat_margin = max(MIN_GAIN, Z * _block_se(d_flat, block))
    cv["direction_gain"] = -_nanmean(d_dir) if not math.isnan(_nanmean(d_dir)) else None
    cv["direction_margin"] = dir_margin
    cv["flat_gain"] = float(-d_flat.mean())
    cv["flat_margin"] = flat_margin
    if cv["direction_gain"] is not None and cv["direction_gain"] > dir_margin \
            and cv["shared"]["log_loss"] < cv["priors"]["log_loss"]:
        return HeadChoice(fit_head(logp, labels, "shared"), "direction", cv)
    if cv["flat_gain"] > flat_margin:
        return HeadChoice(fit_head(logp, labels, "flat"), "flat", cv)
    return HeadChoice(prior_head(all_counts), "none", cv)


def _nanmean(x: np.ndarray) -> float:
    x = x[~np.isnan(x)]
    return float(x.mean()) if x.size else math.nan


def cv_score(choice: HeadChoice) -> float:
    """The cross-validated 3-class log loss of the chosen head's family (lower is better)."""
    kind = choice.head.kind
    v = choice.cv.get(kind, {}).get("log_loss")
    return float(v) if isinstance(v, float) else math.inf
