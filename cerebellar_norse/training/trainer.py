"""Gradient training of the Norse reference network (surrogate gradients, truncated BPTT).

Data preparation: each market's ticks are encoded once with the serving encoder (so
the running normaliser sees the whole history), labelled over ``horizon_ticks`` and
split by time: the last ``validation_fraction`` of every market is held out (labels
whose horizon reaches into the held-out part are dropped from training).

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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numba as nb
import numpy as np
import torch
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from ..config import Config
from ..errors import DataError
from ..neurons.encoder import N_ENC_STATE, encode_tick_to_mossy
from ..neurons.network import CerebellarNetwork
from ..neurons.parameters import encoder_parameters, network_parameters, numpy_dtype
from ..neurons.reference import CerebellarReference
from ..neurons.topology import Weights
from ..ticks import Tick
from .data import CLASS_NAMES, TickData, class_counts, class_warnings, horizon_labels

BURN_IN = 16


@nb.njit(cache=True)
def _encode_series(price: np.ndarray, volume: np.ndarray, ts: np.ndarray, enc_par: np.ndarray, out: np.ndarray) -> None:
    state = np.zeros(N_ENC_STATE)
    z = np.zeros(3)
    for t in range(price.shape[0]):
        encode_tick_to_mossy(state, price[t], volume[t], ts[t], enc_par, z, out[t])


@dataclass
class PreparedMarket:
    """One market ready for training: mossy currents, labels, and the split point."""

    market_id: str
    mossy: np.ndarray  # (T, M) network float type
    labels: np.ndarray  # (T,) int64, -1 = no label
    n_train: int
    ticks: list[Tick]


@dataclass
class Prepared:
    """All markets plus class statistics and warnings."""

    markets: list[PreparedMarket]
    train_counts: np.ndarray
    val_counts: np.ndarray
    warnings: list[str] = field(default_factory=list)


def prepare(cfg: Config, data: TickData) -> Prepared:
    """Encode, label and split ``data`` for ``cfg`` (see the module docstring)."""
    n, t = cfg.neural, cfg.training
    enc_par = encoder_parameters(n)
    dtype = numpy_dtype(n.precision)
    h = n.horizon_ticks
    out: list[PreparedMarket] = []
    for m in data.markets:
        if len(m) < 2 * h + BURN_IN + 2:
            continue
        mossy = np.zeros((len(m), n.mossy_size), dtype=dtype)
        _encode_series(m.price, m.volume, m.timestamp, enc_par, mossy)
        labels = horizon_labels(m.price, h, t.flat_band)
        n_train = round(len(m) * (1.0 - t.validation_fraction))
        labels_train_cut = labels.copy()
        labels_train_cut[max(n_train - h, 0):n_train] = -1
        ticks = [Tick(float(p), float(v), int(s), m.market_id) for p, v, s in zip(m.price, m.volume, m.timestamp, strict=True)]
        out.append(PreparedMarket(m.market_id, mossy, labels_train_cut, n_train, ticks))
    if not out:
        raise DataError(f"no market has enough ticks (need more than {2 * h + BURN_IN + 2} per market)")
    train_counts = class_counts([pm.labels[:pm.n_train] for pm in out])
    val_counts = class_counts([pm.labels[pm.n_train:] for pm in out])
    return Prepared(out, train_counts, val_counts, class_warnings(train_counts + val_counts))


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
    """Split each market's training part into contiguous lanes (about ``n_lanes`` in all)."""
    total = sum(pm.n_train for pm in prep.markets)
    spans: list[tuple[int, int, int]] = []
    for k, pm in enumerate(prep.markets):
        parts = max(1, round(n_lanes * pm.n_train / total))
        bounds = np.linspace(0, pm.n_train, parts + 1).astype(int)
        spans.extend((k, int(a), int(b)) for a, b in itertools.pairwise(bounds) if b - a > BURN_IN + 1)
    if not spans:
        raise DataError(f"no market has more than {BURN_IN + 1} training ticks")
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


def evaluate(cfg: Config, weights: Weights, prep: Prepared) -> dict[str, Any]:
    """Held-out metrics of ``weights`` (fused kernel over each market's full series)."""
    probs_all: list[np.ndarray] = []
    labels_all: list[np.ndarray] = []
    net = CerebellarNetwork(cfg, backend="fused", weights=weights, max_markets=max(len(prep.markets), 1))
    for pm in prep.markets:
        res = net.process_ticks(pm.ticks)
        p = np.array([[r["probabilities"][c] for c in CLASS_NAMES] for r in res[pm.n_train:]])
        lab = pm.labels[pm.n_train:]
        keep = lab >= 0
        probs_all.append(p[keep])
        labels_all.append(lab[keep])
    probs = np.concatenate(probs_all) if probs_all else np.zeros((0, 3))
    labels = np.concatenate(labels_all) if labels_all else np.zeros(0, dtype=np.int64)
    return classification_metrics(probs, labels, int(np.argmax(prep.train_counts)))


def classification_metrics(probs: np.ndarray, labels: np.ndarray, majority_class: int) -> dict[str, Any]:
    """Loss, accuracy, directional accuracy, per-class recall and the majority baseline."""
    n = labels.shape[0]
    if n == 0:
        return {"samples": 0}
    eps = 1e-12
    loss = float(-np.mean(np.log(np.clip(probs[np.arange(n), labels], eps, 1.0))))
    pred = probs.argmax(axis=1)
    acc = float(np.mean(pred == labels))
    moving = labels != 1
    signal = probs[:, 2] - probs[:, 0]
    direction = np.where(labels == 2, 1.0, -1.0)
    dir_acc = float(np.mean(np.sign(signal[moving]) == direction[moving])) if moving.any() else math.nan
    recall = {CLASS_NAMES[c]: (float(np.mean(pred[labels == c] == c)) if (labels == c).any() else None) for c in range(3)}
    baseline = float(np.mean(labels == majority_class))
    counts = np.bincount(labels, minlength=3)
    return {"samples": int(n), "loss": loss, "accuracy": acc, "directional_accuracy": dir_acc, "recall": recall,
            "majority_class": CLASS_NAMES[majority_class], "majority_baseline_accuracy": baseline,
            "directional_baseline_accuracy": float(max(counts[0], counts[2]) / max(counts[0] + counts[2], 1)),
            "class_counts": {CLASS_NAMES[c]: int(counts[c]) for c in range(3)}}


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
    params = network_parameters(cfg)
    model = CerebellarReference(initial, params)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.neural.learning_rate)
    seq = t.sequence_length
    lanes = make_lanes(prep, t.batch_markets)
    n_epochs = epochs or t.epochs
    history: list[dict[str, Any]] = []
    best: tuple[float, int, Weights, dict[str, Any]] = (math.inf, 0, initial, {})
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
            loss, state = _step(model, opt, lanes.mossy[:, window], lanes.labels[:, window], state, t.gradient_checkpointing)
            if not math.isnan(loss):
                losses.append(loss)
            ticks_done += lanes.mossy.shape[0] * lanes.mossy[:, window].shape[1]
            if progress is not None:
                progress({"epoch": epoch, "epochs": n_epochs, "step": step + 1, "steps": steps_per_epoch, "loss": loss,
                          "ticks_per_second": ticks_done / (time.perf_counter() - t_start)})
        weights = model.export_weights()
        val = evaluate(cfg, weights, prep)
        entry = {"epoch": epoch, "train_loss": float(np.mean(losses)), "validation": val}
        history.append(entry)
        if progress is not None:
            progress({"epoch": epoch, "epochs": n_epochs, "step": steps_per_epoch, "steps": steps_per_epoch,
                      "loss": entry["train_loss"], "validation": val, "epoch_done": True,
                      "ticks_per_second": ticks_done / (time.perf_counter() - t_start)})
        if val.get("loss", math.inf) < best[0]:
            best = (val["loss"], epoch, weights, val)
            bad_epochs = 0
        else:
            bad_epochs += 1
            if bad_epochs >= t.early_stopping_patience:
                stopped_early = True
                break
    elapsed = time.perf_counter() - t_start
    return TrainResult(best[2], history, best[1], best[3], ticks_done / max(elapsed, 1e-9), stopped_early, prep.warnings)


def _step(model: CerebellarReference, opt: torch.optim.Optimizer, mossy_np: np.ndarray, labels_np: np.ndarray,
          state: Any, use_checkpointing: bool) -> tuple[float, Any]:
    """One truncated-BPTT window: forward from ``state`` (detached), backward, Adam step."""
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
    logits = torch.stack(logits_all, dim=1).reshape(-1, 3)
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
