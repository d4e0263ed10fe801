"""Gradient training of the Norse reference network (surrogate gradients, truncated BPTT).

Data preparation: each market's ticks are encoded once with the serving encoder (so
the running normaliser sees the whole history), labelled over ``horizon_ticks`` and
split by time at cuts common to all markets (:func:`common_cuts`): the first part of
all ticks in time order trains, the next ``validation_fraction`` validates, the last
``test_fraction`` tests, so no market is tested on a period another was trained on
(labels whose horizon reaches into the next part are dropped).

Training: the training parts of the markets are cut into about ``batch_markets``
contiguous lanes that run side by side as one batch, from the resting state, with
the state carried from window to window exactly as when serving. Each window of
``sequence_length`` ticks is one Adam step at ``learning_rate`` on the
cross-entropy of its labelled ticks, back-propagated through the window only
(truncated BPTT; Norse's SuperSpike surrogate gradient through every spike). The
first ``BURN_IN`` ticks of a lane only settle the dynamics. With ``gradient_checkpointing`` each tick's activations are
recomputed in the backward pass instead of stored.

Validation: after each epoch the exported weights run in the fused kernel over each
market's full series; metrics are computed on the held-out ticks. Training stops
early after ``early_stopping_patience`` epochs without a lower validation loss and
keeps the best epoch's weights.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import numba as nb
import numpy as np
import torch
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from .. import kernelcache  # noqa: F401  (installs the guard: a failed write of numba's cache is no error)
from ..config import Config
from ..errors import DataError
from ..neurons.encoder import N_ENC_STATE, encode_tick_to_mossy
from ..neurons.network import CerebellarNetwork
from ..neurons.parameters import encoder_parameters, network_parameters, numpy_dtype
from ..neurons.reference import CerebellarReference
from ..neurons.topology import Weights
from ..ticks import Tick
from .calibration import apply_head, choose_head, cv_score, row_losses
from .data import CLASS_NAMES, MarketSeries, TickData, class_counts, class_warnings
from .evaluation import time_order
from .labels import Labels, LabelSpec, label_series, past_returns

BURN_IN = 16
MIN_LANE_TICKS = 4 * BURN_IN  # a lane shorter than this would spend a quarter or more of its ticks burning in
LOGP_CHUNK = 65_536  # ticks per call of process_ticks in network_logp (bounds its per-tick dicts)


@nb.njit(cache=True)
def _encode_series(price: np.ndarray, volume: np.ndarray, ts: np.ndarray, enc_par: np.ndarray, out: np.ndarray) -> None:
    state = np.zeros(N_ENC_STATE)
    z = np.zeros(3)
    for t in range(price.shape[0]):
        encode_tick_to_mossy(state, price[t], volume[t], ts[t], enc_par, z, out[t])


class SeriesTicks(Sequence[Tick]):
    """A market's ticks as the network takes them (:class:`Tick`), made from its series' arrays when read: a list
    of them held ~180 bytes of Python objects per tick (0.9 GB for 5 million ticks) beside the arrays."""

    __slots__ = ("market_id", "price", "timestamp", "volume")

    def __init__(self, m: MarketSeries) -> None:
        self.market_id, self.price, self.volume, self.timestamp = m.market_id, m.price, m.volume, m.timestamp

    def __len__(self) -> int:
        return int(self.price.shape[0])

    @overload
    def __getitem__(self, i: int) -> Tick: ...

    @overload
    def __getitem__(self, i: slice) -> list[Tick]: ...

    def __getitem__(self, i: int | slice) -> Tick | list[Tick]:
        if isinstance(i, slice):
            return [Tick(p, v, int(s), self.market_id) for p, v, s in
                    zip(self.price[i].tolist(), self.volume[i].tolist(), self.timestamp[i].tolist(), strict=True)]
        return Tick(float(self.price[i]), float(self.volume[i]), int(self.timestamp[i]), self.market_id)


@dataclass
class PreparedMarket:
    """One market ready for training and scoring (arrays of the market's length T).

    ``labels`` are the training labels (-1 outside the training split, where the
    horizon reaches past it, or without an end tick); ``truth`` the labels of every
    tick; ``split`` 0 train, 1 validation, 2 test; ``scored`` marks validation and test
    ticks that count (past the warm-up, horizon inside their split).
    """

    market_id: str
    mossy: np.ndarray  # (T, M) network float type
    labels: np.ndarray  # (T,) int64
    n_train: int
    ticks: SeriesTicks  # made per read from the series' arrays (``ticks.timestamp``: the times, ms)
    truth: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    split: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int8))
    scored: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    fwd_ret: np.ndarray = field(default_factory=lambda: np.zeros(0))
    past_ret: np.ndarray = field(default_factory=lambda: np.zeros(0))
    end: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # each tick's horizon end tick (-1: none)


@dataclass
class Prepared:
    """All markets plus class statistics and warnings."""

    markets: list[PreparedMarket]
    train_counts: np.ndarray
    val_counts: np.ndarray
    warnings: list[str] = field(default_factory=list)
    test_counts: np.ndarray = field(default_factory=lambda: np.zeros(3, dtype=np.int64))
    spec: LabelSpec = field(default_factory=LabelSpec)
    block: int = 1  # ticks per horizon (median), for block statistics
    times: dict[str, int | None] = field(default_factory=dict)  # where the common splits lie (split_times)

    def rows(self, split: int) -> tuple[list[np.ndarray], np.ndarray]:
        """Per market, the scored tick indices of ``split`` (1 validation, 2 test), and their labels."""
        idx = [np.nonzero(pm.scored & (pm.split == split))[0] for pm in self.markets]
        labels = np.concatenate([pm.truth[i] for pm, i in zip(self.markets, idx, strict=True)]) if idx else np.zeros(0, np.int64)
        return idx, labels


def split_points(n: int, validation_fraction: float, test_fraction: float) -> tuple[int, int]:
    """Ends of the training and validation parts of a series of ``n`` ticks (by time)."""
    n_val_end = n - round(n * test_fraction)
    n_train = round(n * (1.0 - validation_fraction - test_fraction))
    return n_train, n_val_end


def _market(cfg: Config, m: MarketSeries, spec: LabelSpec, encode: bool = True) -> tuple[PreparedMarket, Labels]:
    """One market encoded and labelled: every tick scored in split 2, no training labels (callers split). With
    ``encode`` False its ``mossy`` is empty, (0, M), for a caller that reads only labels and splits."""
    n = cfg.neural
    mossy = np.zeros((len(m) if encode else 0, n.mossy_size), dtype=numpy_dtype(n.precision))
    if encode:
        _encode_series(m.price, m.volume, m.timestamp, encoder_parameters(n), mossy)
    lab = label_series(m.timestamp, m.price, spec)
    ticks = SeriesTicks(m)
    scored = (lab.end >= 0) & (np.arange(len(m)) >= n.warmup_ticks)
    pm = PreparedMarket(m.market_id, mossy, np.full(len(m), -1, dtype=np.int64), 0, ticks, lab.labels,
                        np.full(len(m), 2, dtype=np.int8), scored, lab.fwd_ret, past_returns(m.price, lab.end), lab.end)
    return pm, lab


def _prepared(markets: list[PreparedMarket], ends: list[np.ndarray], spec: LabelSpec) -> Prepared:
    """Markets with their class counts and the median ticks per horizon (``ends``: each market's end ticks)."""
    spans = np.concatenate([(e - np.arange(e.shape[0]))[e >= 0] for e in ends]) if ends else np.zeros(0)
    prep = Prepared(markets, class_counts([pm.labels for pm in markets]), np.zeros(3, dtype=np.int64), [], spec=spec)
    prep.val_counts = np.bincount(prep.rows(1)[1], minlength=3)
    prep.test_counts = np.bincount(prep.rows(2)[1], minlength=3)
    prep.block = max(1, int(np.median(spans))) if spans.size else 1
    return prep


def common_cuts(series: list[np.ndarray], validation_fraction: float, test_fraction: float) -> list[tuple[int, int]]:
    """Per series (ms timestamps, each ascending), the ends of its training and validation parts when all of them are
    cut at the same times: the training part is the first ``1 - validation_fraction - test_fraction`` of all ticks
    pooled in time order, the test part the last ``test_fraction``. A cut never splits one time: ticks of the time
    at a cut go to the later part, so no part holds a time an earlier part holds (markets of daily files share
    every date). One series of distinct times is cut exactly as :func:`split_points` cuts it."""
    stamps = np.sort(np.concatenate(series)) if series else np.zeros(0, dtype=np.int64)
    n_train_all, n_val_end_all = split_points(stamps.size, validation_fraction, test_fraction)

    def time_at(k: int) -> float:
        return float(stamps[k]) if k < stamps.size else math.inf

    t_val, t_test = time_at(n_train_all), time_at(n_val_end_all)
    return [(int(np.searchsorted(ts, t_val, side="left")), int(np.searchsorted(ts, t_test, side="left"))) for ts in series]


def split_times(markets: list[PreparedMarket]) -> dict[str, int | None]:
    """When the common splits lie (ms since the epoch): the first tick of the training part (``train_from``: the
    model saw nothing before it), the last tick of the training part (``train_until``) and of the validation part
    (``validation_until``: no label of training or validation uses a later price), the first tick of the test part
    (``test_from``; None without one)."""
    def last(split: int) -> int | None:
        got = [pm.ticks[int(np.nonzero(pm.split == split)[0][-1])].timestamp for pm in markets if (pm.split == split).any()]
        return max(got) if got else None

    firsts = [pm.ticks[int(np.argmax(pm.split == 2))].timestamp for pm in markets if (pm.split == 2).any()]
    train_firsts = [pm.ticks[int(np.argmax(pm.split == 0))].timestamp for pm in markets if (pm.split == 0).any()]
    validation_until = last(1)
    return {"train_from": min(train_firsts) if train_firsts else None, "train_until": last(0), "validation_until": validation_until if validation_until is not None else last(0),
            "test_from": min(firsts) if firsts else None}


def split_warnings(markets: list[PreparedMarket], times: dict[str, int | None]) -> list[str]:
    """A warning per market without a tick in the common training period (it is only scored)."""
    from .datacheck import iso_ms

    return [f"market {pm.market_id!r} has no tick in the training period (up to {iso_ms(times['train_until'] or 0)}, "
            "the markets' common time cut): it is only validated and tested on, a market the model never trained on"
            for pm in markets if pm.n_train == 0]


def market_list(ticks: Mapping[str, int], limit: int = 10) -> str:
    """``'A' (12 ticks), 'B' (3 ticks)`` for the first ``limit`` markets of ``ticks`` (market -> ticks), then
    ``and N more``."""
    shown = ", ".join(f"{m!r} ({n} ticks)" for m, n in list(ticks.items())[:limit])
    return shown + (f" and {len(ticks) - limit} more" if len(ticks) > limit else "")


def prepare(cfg: Config, data: TickData, encode: bool = True) -> Prepared:
    """Encode, label and split ``data`` for ``cfg`` (see the module docstring); with ``encode`` False the markets'
    ``mossy`` inputs are left empty, (0, M) (the labels, splits and warnings are the same)."""
    n, t = cfg.neural, cfg.training
    spec = LabelSpec.from_config(cfg)
    h = n.horizon_ticks
    out: list[PreparedMarket] = []
    ends: list[np.ndarray] = []
    need = 2 * h + BURN_IN + 2
    usable = [m for m in data.markets if len(m) >= need]
    short = [m for m in data.markets if len(m) < need]
    cuts = common_cuts([np.asarray(m.timestamp) for m in usable], t.validation_fraction, t.test_fraction)
    for m, (n_train, n_val_end) in zip(usable, cuts, strict=True):
        pm, lab = _market(cfg, m, spec, encode)
        idx = np.arange(len(m))
        pm.split = np.where(idx < n_train, 0, np.where(idx < n_val_end, 1, 2)).astype(np.int8)
        split_end = np.where(pm.split == 0, n_train, np.where(pm.split == 1, n_val_end, len(m)))
        inside = (lab.end >= 0) & (lab.end < split_end)  # the embargo: no label reaches into the next split
        pm.labels = np.where(inside & (pm.split == 0), lab.labels, -1)
        pm.scored &= inside & (pm.split > 0)
        pm.n_train = n_train
        out.append(pm)
        ends.append(lab.end)
    if not out:
        raise DataError(f"no market has enough ticks (need at least {need} per market)")
    prep = _prepared(out, ends, spec)
    prep.times = split_times(out)
    prep.warnings = class_warnings(prep.train_counts + prep.val_counts) + split_warnings(out, prep.times)
    if short:
        prep.warnings.append(f"{len(short)} market(s) left out, with fewer than the {need} ticks a market needs (2 x "
                             f"neural.horizon_ticks + {BURN_IN + 2}): {market_list({m.market_id: len(m) for m in short})}")
    if prep.val_counts.sum() == 0:
        raise DataError(no_validation_message(cfg, data.markets, dict(zip((m.market_id for m in usable), cuts,
                                                                          strict=True))))
    return prep


def _warmup_room(n_train: int, n_val_end: int, horizon: int) -> int | None:
    """The highest ``neural.warmup_ticks`` that leaves a series cut at ``n_train`` and ``n_val_end`` a scored
    validation tick (one at an index >= the warm-up in the validation part whose end tick, ``horizon`` ticks later,
    lies inside that part); None when no warm-up does (the part is no longer than the horizon)."""
    return n_val_end - horizon - 1 if n_train + horizon < n_val_end else None


def _has_validation_tick(ticks: int, warmup: int, horizon: int, validation_fraction: float,
                         test_fraction: float) -> bool:
    """Whether one series of ``ticks`` ticks at distinct times, split alone, has a scored validation tick past a
    warm-up of ``warmup`` ticks (:func:`_warmup_room`)."""
    room = _warmup_room(*split_points(ticks, validation_fraction, test_fraction), horizon)
    return room is not None and warmup <= room


def ticks_for_validation(cfg: Config) -> int:
    """The fewest ticks (at distinct times) a market needs, split alone as :func:`prepare` splits it, to have a scored
    validation tick: past ``neural.warmup_ticks``, with its horizon inside the validation part (``neural.horizon_ticks``
    ticks; 1, the least, with ``neural.horizon_ms``), and at least the ``2 x horizon_ticks + BURN_IN + 2`` ticks any
    market needs."""
    n, t = cfg.neural, cfg.training
    horizon = n.horizon_ticks if n.horizon_ms is None else 1

    def enough(ticks: int) -> bool:
        return _has_validation_tick(ticks, n.warmup_ticks, horizon, t.validation_fraction, t.test_fraction)

    low = 2 * n.horizon_ticks + BURN_IN + 2
    if enough(low):
        return low
    high = low
    while not enough(high):
        low, high = high, high * 2
    while high - low > 1:  # enough(high), not enough(low)
        mid = (low + high) // 2
        low, high = (low, mid) if enough(mid) else (mid, high)
    return high


def no_validation_message(cfg: Config, markets: list[MarketSeries], cuts: Mapping[str, tuple[int, int]]) -> str:
    """Why no market has a scored validation tick: the longest market's ticks beside the ticks a market needs
    (:func:`ticks_for_validation`), and the config keys that set them (``cuts``: each market trained on -> the ends
    of its training and validation parts, :func:`common_cuts`)."""
    n, t = cfg.neural, cfg.training
    longest = max(markets, key=len)
    need = ticks_for_validation(cfg)
    horizon = (f"neural.horizon_ticks {n.horizon_ticks}" if n.horizon_ms is None
               else f"neural.horizon_ms {n.horizon_ms} (at least 1 tick)")
    msg = (f"no validation ticks past the warm-up of {n.warmup_ticks} ticks: the series are too short: the longest"
           f" market, {longest.market_id!r}, has {len(longest)} ticks, and a market needs at least {need} (its ticks"
           f" are split by time: training.test_fraction {t.test_fraction:g} last for testing, the"
           f" training.validation_fraction {t.validation_fraction:g} before them for validation, where a tick is"
           f" scored past the first neural.warmup_ticks {n.warmup_ticks} of the market, its {horizon} ahead still"
           " inside the validation part)")
    if len(longest) >= need:
        msg += ("; the cuts are common to all markets, by time: a market that does not span the whole period"
                " gets less of the validation part")
    return msg + f"; {_remedy(cfg, cuts)}, or train on longer series (more days of ticks per market)"


def _remedy(cfg: Config, cuts: Mapping[str, tuple[int, int]]) -> str:
    """The config change that gives a market a scored validation tick with its ``cuts`` (market -> the ends of its
    training and validation parts): the highest ``neural.warmup_ticks`` that does, where the horizon is in ticks and
    some market's validation part is longer than it."""
    n = cfg.neural
    rooms = {m: _warmup_room(n_train, val_end, n.horizon_ticks) for m, (n_train, val_end) in cuts.items()}
    room = {m: r for m, r in rooms.items() if r is not None}
    if n.horizon_ms is not None or not room:
        return "lower neural.warmup_ticks and raise training.validation_fraction"
    market = max(room, key=lambda m: room[m])
    return f"set neural.warmup_ticks to {room[market]} or less (then market {market!r} has validation ticks)"


@dataclass
class Lanes:
    """The training parts of all markets cut into ``n`` contiguous lanes run side by side.

    Arrays are padded to the longest lane (labels -1 where padded or burning in).
    """

    mossy: np.ndarray  # (L, T, M)
    labels: np.ndarray  # (L, T)

    @property
    def length(self) -> int:
        """Ticks of the longest lane."""
        return int(self.labels.shape[1])


def make_lanes(prep: Prepared, n_lanes: int) -> Lanes:
    """Split each market's training part into contiguous lanes (about ``n_lanes`` in all, none shorter than
    :data:`MIN_LANE_TICKS` unless the market's whole training part is)."""
    total = sum(pm.n_train for pm in prep.markets)
    spans: list[tuple[int, int, int]] = []
    for k, pm in enumerate(prep.markets):
        parts = max(1, min(round(n_lanes * pm.n_train / total), pm.n_train // MIN_LANE_TICKS))
        bounds = np.linspace(0, pm.n_train, parts + 1).astype(int)
        spans.extend((k, int(a), int(b)) for a, b in itertools.pairwise(bounds) if b - a > BURN_IN + 1)
    if not spans:
        longest = max(pm.n_train for pm in prep.markets)
        raise DataError(f"no market has more than {BURN_IN + 1} training ticks (the longest has {longest}; the first "
                        f"{BURN_IN} of a training sequence only bring the network's state up): train on longer series "
                        "or lower training.validation_fraction and training.test_fraction")
    length = max(b - a for _, a, b in spans)
    m = prep.markets[0].mossy.shape[1]
    mossy = np.zeros((len(spans), length, m), dtype=prep.markets[0].mossy.dtype)
    labels = np.full((len(spans), length), -1, dtype=np.int64)
    for j, (k, a, b) in enumerate(spans):
        pm = prep.markets[k]
        mossy[j, :b - a] = pm.mossy[a:b]
        labels[j, :b - a] = pm.labels[a:b]
        labels[j, :BURN_IN] = -1
    return Lanes(mossy, labels)


def network_logp(cfg: Config, weights: Weights, prep: Prepared) -> list[np.ndarray]:
    """Per market, the log-probabilities (T, 3) of the network without its head, cold start, fused kernel."""
    raw = weights.with_head(np.ones(3), np.zeros(3))
    net = CerebellarNetwork(cfg, backend="fused", weights=raw, max_markets=max(len(prep.markets), 1))
    out = []
    for pm in prep.markets:
        # in chunks: process_ticks answers one dict per tick (about 1 KB each), so a market of millions of ticks
        # stepped at once held gigabytes of dicts; the pool carries each market's state from chunk to chunk
        probs = np.empty((len(pm.ticks), len(CLASS_NAMES)))
        for a in range(0, len(pm.ticks), LOGP_CHUNK):
            res = net.process_ticks(pm.ticks[a:a + LOGP_CHUNK])
            probs[a:a + len(res)] = [[r["probabilities"][c] for c in CLASS_NAMES] for r in res]
        np.clip(probs, 1e-300, 1.0, out=probs)
        out.append(np.log(probs, out=probs))
    return out


def prepare_for_scoring(cfg: Config, data: TickData, since_ms: int | None = None) -> Prepared:
    """Every tick of ``data`` as the scored split 2 (past the warm-up, with an end tick; at or after
    ``since_ms`` when given: earlier ticks only drive the network); no training part."""
    spec = LabelSpec.from_config(cfg)
    out: list[PreparedMarket] = []
    ends: list[np.ndarray] = []
    for m in data.markets:
        pm, lab = _market(cfg, m, spec)
        pm.scored &= m.timestamp >= (since_ms or 0)
        out.append(pm)
        ends.append(lab.end)
    return _prepared(out, ends, spec)


def _gather(arrays: list[np.ndarray], idx: list[np.ndarray]) -> np.ndarray:
    parts = [a[i] for a, i in zip(arrays, idx, strict=True)]
    return np.concatenate(parts) if parts else np.zeros((0,))


def evaluate(cfg: Config, weights: Weights, prep: Prepared, split: int = 1) -> dict[str, Any]:
    """Metrics of ``weights`` as served (with its head) on the scored ticks of ``split`` (1 validation, 2 test)."""
    logp = network_logp(cfg, weights, prep)
    idx, labels = prep.rows(split)
    probs = apply_head(_gather(logp, idx).reshape(-1, 3), weights.head_gain, weights.head_bias)
    return classification_metrics(probs, labels, int(np.argmax(prep.train_counts)))


def classification_metrics(probs: np.ndarray, labels: np.ndarray, majority_class: int) -> dict[str, Any]:
    """Loss, accuracy, directional accuracy, per-class recall and the majority baseline."""
    n = labels.shape[0]
    if n == 0:
        return {"samples": 0}
    ll, dl = row_losses(probs, labels)
    pred = probs.argmax(axis=1)
    acc = float(np.mean(pred == labels))
    moving = labels != 1
    signal = probs[:, 2] - probs[:, 0]
    direction = np.where(labels == 2, 1.0, -1.0)
    hits = np.where(signal[moving] == 0.0, 0.5, (np.sign(signal[moving]) == direction[moving]).astype(float))
    dir_acc = float(np.mean(hits)) if moving.any() else math.nan
    recall = {CLASS_NAMES[c]: (float(np.mean(pred[labels == c] == c)) if (labels == c).any() else None) for c in range(3)}
    baseline = float(np.mean(labels == majority_class))
    counts = np.bincount(labels, minlength=3)
    return {"samples": int(n), "loss": float(ll.mean()), "direction_log_loss": float(np.nanmean(dl)) if moving.any() else None,
            "accuracy": acc, "directional_accuracy": dir_acc, "recall": recall,
            "majority_class": CLASS_NAMES[majority_class], "majority_baseline_accuracy": baseline,
            "directional_baseline_accuracy": float(max(counts[0], counts[2]) / max(counts[0] + counts[2], 1)),
            "class_counts": {CLASS_NAMES[c]: int(counts[c]) for c in range(3)}}


def validation_order(prep: Prepared, idx: list[np.ndarray]) -> tuple[np.ndarray | None, int]:
    """The validation rows ``idx`` (per market) in time order for the head's cross-validation (None: as they are, one
    market's or markets of successive periods), and its horizon in rows of that order (``evaluation.time_order``): with
    several markets of one period, its folds are periods of every market (a head fitted on one market's ticks scored
    another's of the same minutes, which move with them) and its blocks hold every market's rows of a horizon (one
    market's blocks counted markets that move together as independent evidence of an edge)."""
    times = _cat_times([np.asarray(pm.ticks.timestamp)[i] for pm, i in zip(prep.markets, idx, strict=True)])
    ends = _cat_times([np.asarray(pm.ticks.timestamp)[pm.end[i]] for pm, i in zip(prep.markets, idx, strict=True)])
    return time_order(times, ends, sum(int(i.size > 0) for i in idx), prep.block)


def _cat_times(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts).astype(np.float64) if parts else np.zeros(0)


def validate_epoch(cfg: Config, weights: Weights, prep: Prepared) -> tuple[Weights, dict[str, Any], float]:
    """Choose the head on the validation split (cross-validated); the served weights, metrics and score."""
    logp = network_logp(cfg, weights, prep)
    idx, labels = prep.rows(1)
    lv = _gather(logp, idx).reshape(-1, 3)
    order, horizon = validation_order(prep, idx)
    choice = (choose_head(lv, labels, prep.train_counts, horizon) if order is None
              else choose_head(lv[order], labels[order], prep.train_counts, horizon))
    served = weights.with_head(choice.head.gain, choice.head.bias)
    val = classification_metrics(apply_head(lv, served.head_gain, served.head_bias), labels, int(np.argmax(prep.train_counts)))
    val.update({"edge": choice.edge, "head": choice.head.kind, "cv": choice.cv})
    score = cv_score(choice)
    return served, val, score if math.isfinite(score) else float(val.get("loss", math.inf))


ProgressFn = Callable[[dict[str, Any]], None]


@dataclass
class TrainResult:
    """Outcome of a training run."""

    weights: Weights
    history: list[dict[str, Any]]
    best_epoch: int
    validation: dict[str, Any]
    ticks_per_second: float
    stopped_early: bool
    warnings: list[str]

    @property
    def edge(self) -> str:
        """``direction``, ``flat`` or ``none`` (no edge found on validation)."""
        return str(self.validation.get("edge", "none"))


def train(cfg: Config, prep: Prepared, initial: Weights, epochs: int | None = None, progress: ProgressFn | None = None,
          should_stop: Callable[[], bool] | None = None, seed: int | None = None,
          time_budget_s: float | None = None) -> TrainResult:
    """Train from ``initial`` weights; returns the best epoch's weights and the history.

    ``should_stop`` is polled between steps (cancellation: raises InterruptedError);
    with ``time_budget_s`` no new epoch starts once the next one would not fit.
    """
    t = cfg.training
    torch.set_num_threads(t.threads)
    torch.manual_seed(cfg.neural.seed if seed is None else seed)
    params = network_parameters(cfg, float(initial.golgi_init))
    model = CerebellarReference(initial, params)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.neural.learning_rate)
    seq = t.sequence_length
    lanes = make_lanes(prep, t.batch_markets)
    n_epochs = epochs or t.epochs
    history: list[dict[str, Any]] = []
    best: tuple[float, int, Weights, dict[str, Any]] = (math.inf, 0, initial, {})
    prior = torch.nn.Parameter(torch.as_tensor(np.log((prep.train_counts + 1.0) / (prep.train_counts.sum() + 3.0)),
                                               dtype=params.dtype))
    opt.add_param_group({"params": [prior]})
    ticks_done = 0
    t_start = time.perf_counter()
    bad_epochs = 0
    stopped_early = False
    steps_per_epoch = math.ceil(lanes.length / seq)
    for epoch in range(1, n_epochs + 1):
        elapsed = time.perf_counter() - t_start
        if time_budget_s is not None and epoch > 1 and elapsed * epoch / (epoch - 1) > time_budget_s:
            stopped_early = True
            break
        losses = []
        model.train()
        state = model.initial_state(lanes.mossy.shape[0])
        for step in range(steps_per_epoch):
            if should_stop is not None and should_stop():
                raise InterruptedError("training cancelled")
            window = slice(step * seq, (step + 1) * seq)
            loss, state = _step(model, opt, lanes.mossy[:, window], lanes.labels[:, window], state, t.gradient_checkpointing,
                                prior)
            if not math.isnan(loss):
                losses.append(loss)
            ticks_done += lanes.mossy.shape[0] * lanes.mossy[:, window].shape[1]
            if progress is not None:
                progress({"epoch": epoch, "epochs": n_epochs, "step": step + 1, "steps": steps_per_epoch, "loss": loss,
                          "ticks_per_second": ticks_done / (time.perf_counter() - t_start)})
        weights, val, score = validate_epoch(cfg, model.export_weights(), prep)
        entry = {"epoch": epoch, "train_loss": float(np.mean(losses)) if losses else None, "validation": val, "score": score}
        history.append(entry)
        if progress is not None:
            progress({"epoch": epoch, "epochs": n_epochs, "step": steps_per_epoch, "steps": steps_per_epoch,
                      "loss": entry["train_loss"], "validation": val, "epoch_done": True,
                      "ticks_per_second": ticks_done / (time.perf_counter() - t_start)})
        if score < best[0]:
            best = (score, epoch, weights, val)
            bad_epochs = 0
        else:
            bad_epochs += 1
            if bad_epochs >= t.early_stopping_patience:
                stopped_early = True
                break
    elapsed = time.perf_counter() - t_start
    return TrainResult(best[2], history, best[1], best[3], ticks_done / max(elapsed, 1e-9), stopped_early, prep.warnings)


def _step(model: CerebellarReference, opt: torch.optim.Optimizer, mossy_np: np.ndarray, labels_np: np.ndarray,
          state: Any, use_checkpointing: bool, prior: torch.Tensor) -> tuple[float, Any]:
    """One truncated-BPTT window: forward from ``state`` (detached), backward, Adam step.

    ``prior`` (K,) is a trainable logit bias (the class priors), so the network's
    weights learn the signal rather than the base rates.
    """
    mossy = torch.from_numpy(np.ascontiguousarray(mossy_np))  # (L, W, M)
    labels = torch.from_numpy(np.ascontiguousarray(labels_np))  # (L, W)
    state = _detach(state)
    opt.zero_grad(set_to_none=True)
    weights = model.dense_weights()
    logits_all = []
    for i in range(mossy.shape[1]):
        if use_checkpointing:
            out, state = checkpoint(model, mossy[:, i], state, weights, use_reentrant=False)
        else:
            out, state = model(mossy[:, i], state, weights)
        logits_all.append(out.logits)
    logits = torch.stack(logits_all, dim=1).reshape(-1, 3) + prior
    target = labels.reshape(-1)
    keep = target >= 0
    if not bool(keep.any()):
        return math.nan, state
    loss = F.cross_entropy(logits[keep], target[keep])
    loss.backward()
    opt.step()
    return float(loss.detach()), state


def _detach(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach()
    return type(x)(*[_detach(y) for y in x])
