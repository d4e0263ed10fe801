"""What a prediction at tick t sees: only ticks up to t.

A file cut after tick T, and the same file with every tick after T replaced by another path, give every tick up to T
the same probabilities as the whole file, to the bit, on the path `evaluate` scores (reading, split adjustment,
encoder, network, calibrated head) and in the live service; and `evaluate` serves what the service serves.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from training_helpers import TINY_NEURAL, ConfigFactory, config_environ, server_environ, start

from cerebellar_norse.config import Config
from cerebellar_norse.neurons.topology import Weights, generate_weights
from cerebellar_norse.synthetic import generate_ticks
from cerebellar_norse.training.calibration import base_rates
from cerebellar_norse.training.checkpoints import ModelStore
from cerebellar_norse.training.data import load_training_files, write_csv
from cerebellar_norse.training.scoring import score_inputs
from cerebellar_norse.training.trainer import prepare_for_scoring

CUT = 1000  # rows of the file kept up to T


def _weights(cfg: Config) -> Weights:
    """The config's network with a calibrated head that listens to it (a model without an edge serves constants,
    which would prove nothing)."""
    return generate_weights(cfg).with_head(np.array([1.0, 1.3, 0.8]), np.array([0.1, -0.2, 0.05]))


def _rows(n: int = 1600) -> list[dict[str, Any]]:
    return generate_ticks(n, 2, seed=4)


def _other_future(rows: list[dict[str, Any]], seed: int = 1) -> list[dict[str, Any]]:
    """``rows`` with every price and volume after the first ``CUT`` rows moved at random (times kept)."""
    rng = np.random.default_rng(seed)
    return rows[:CUT] + [{**r, "price": float(r["price"]) * float(np.exp(rng.normal(0.0, 0.02))),
                          "volume": float(r["volume"]) * float(rng.uniform(0.2, 5.0))} for r in rows[CUT:]]


Key = tuple[str, float, int]  # market, time, and which of the market's ticks at that time


def _scored(cfg: Config, weights: Weights, path: Path) -> dict[Key, tuple[np.ndarray, int, float]]:
    """Per scored tick: the probabilities `evaluate` scores, the label and the past horizon's return (the rules'
    input), from the same functions `evaluate` runs."""
    prep = prepare_for_scoring(cfg, load_training_files([path], cfg.training))
    inp = score_inputs(cfg, weights, prep, 2, base_rates(np.ones(3)), logistic="none")
    assert inp.markets is not None and inp.times_ms is not None
    out: dict[Key, tuple[np.ndarray, int, float]] = {}
    for m, t, p, y, r in zip(inp.markets, inp.times_ms, inp.probs, inp.labels, inp.past_ret, strict=True):
        k = 0
        while (str(m), float(t), k) in out:
            k += 1
        out[(str(m), float(t), k)] = (p, int(y), float(r))
    return out


def test_evaluate_predictions_up_to_t_do_not_depend_on_later_ticks(tmp_path: Path, make_config: ConfigFactory) -> None:
    cfg = make_config(neural=TINY_NEURAL)
    w = _weights(cfg)
    rows = _rows()
    for name, part in (("full", rows), ("cut", rows[:CUT]), ("other", _other_future(rows))):
        write_csv(tmp_path / f"{name}.csv", part)
    full, cut, other = (_scored(cfg, w, tmp_path / f"{name}.csv") for name in ("full", "cut", "other"))
    t_cut = float(rows[CUT - 1]["timestamp"])
    up_to_t = [k for k in full if k[1] <= t_cut]
    assert len(up_to_t) > 700
    for k in up_to_t:
        p, label, past = full[k]
        for seen in (other, cut):
            if k in seen:  # in the cut file, a tick whose horizon ends after T has no label and is not scored
                q, _, past_q = seen[k]
                assert np.array_equal(p, q), k
                assert past == past_q or (np.isnan(past) and np.isnan(past_q)), k
        assert k in other
        if k in cut:  # its horizon ends by T: the label is the same too (one after T is the later path's)
            assert label == cut[k][1] == other[k][1], k
    # every tick of the cut file whose horizon ends inside it is scored there, as in the whole file
    horizon = cfg.neural.horizon_ticks
    per_market = {m: sum(1 for r in rows[:CUT] if r["market_id"] == m) for m in {r["market_id"] for r in rows}}
    assert len(cut) == sum(n - horizon - cfg.neural.warmup_ticks for n in per_market.values())
    # and the other path does change what comes after T: the check above would catch a look-ahead
    later = [k for k in full if k[1] > t_cut]
    assert any(not np.array_equal(full[k][0], other[k][0]) for k in later)


def test_a_split_after_t_leaves_the_predictions_up_to_t_as_they_were(tmp_path: Path,
                                                                      make_config: ConfigFactory) -> None:
    """A 3:1 split after T divides the prices before it by 3 (the file is read as an adjusted close would be) and
    multiplies the volumes by 3: the network reads log returns and z-scored log volumes, so what it serves up to T
    is what the file cut at T (no split in it, nothing adjusted) gives."""
    cfg = make_config(neural=TINY_NEURAL)
    w = _weights(cfg)
    rng = np.random.default_rng(3)
    n, split = 1400, 1200
    price = 50.0 * np.exp(np.cumsum(rng.normal(0.0, 0.01, n)))
    volume = rng.integers(1_000_000, 3_000_000, n).astype(float)
    price[split:] /= 3.0
    volume[split:] *= 3.0
    rows = [{"timestamp": 1_500_000_000_000 + k * 86_400_000, "market_id": "S", "price": round(float(p), 4),
             "volume": float(v)} for k, (p, v) in enumerate(zip(price, volume, strict=True))]
    write_csv(tmp_path / "full.csv", rows)
    write_csv(tmp_path / "cut.csv", rows[:CUT])
    assert load_training_files([tmp_path / "full.csv"], cfg.training).stock_splits  # read as the split
    full, cut = _scored(cfg, w, tmp_path / "full.csv"), _scored(cfg, w, tmp_path / "cut.csv")
    assert len(cut) > 800
    for k, (q, label, _) in cut.items():
        p, label_full, _ = full[k]
        # the prices divided by 3 round differently in their last bit: the log returns agree to ~1e-16
        assert np.allclose(p, q, rtol=0.0, atol=1e-9) and label == label_full, k


@pytest.mark.slow  # a server's start: several seconds
def test_the_live_service_serves_what_evaluate_scores_and_only_from_earlier_ticks(
        tmp_path: Path, make_config: ConfigFactory) -> None:
    """The same ticks posted to the service as three markets (the whole series, the series cut after T, and the
    series with another path after T) get the same answers up to T, to the bit, and those answers are the
    probabilities `evaluate` scores for the file."""
    cfg = make_config(neural=TINY_NEURAL, state_dir=tmp_path / "state")
    w = _weights(cfg)
    store = ModelStore(tmp_path / "state")
    store.set_active(store.save(w, cfg, {"edge": "direction"}))
    rows = [r for r in _rows() if r["market_id"] == "M000"]
    cut = CUT // 2
    write_csv(tmp_path / "m.csv", rows)
    scored = _scored(cfg, w, tmp_path / "m.csv")

    env = server_environ(tmp_path / "state", {**config_environ({"neural": TINY_NEURAL}),
                                              "CEREBELLAR_NORSE_TRAINING__ONLINE_LEARNING": "false"})
    srv = start(tmp_path / "state", tmp_path / "server.log", env)
    try:
        def post(market: str, ticks: list[dict[str, Any]]) -> np.ndarray:
            body = {"ticks": [{"price": float(t["price"]), "volume": float(t["volume"]),
                               "timestamp": int(t["timestamp"]), "market_id": market} for t in ticks]}
            res = httpx.post(f"{srv.url}/neural/process/batch", content=json.dumps(body),
                             headers={"Content-Type": "application/json"}, timeout=30.0)
            assert res.status_code == 200, res.text
            return np.array([[r["probabilities"][c] for c in ("down", "flat", "up")] for r in res.json()["results"]])

        rng = np.random.default_rng(2)
        other = rows[:cut] + [{**t, "price": float(t["price"]) * float(np.exp(rng.normal(0.0, 0.02)))}
                              for t in rows[cut:]]
        whole, first, changed = post("WHOLE", rows), post("CUT", rows[:cut]), post("OTHER", other)
    finally:
        assert srv.stop() == 0
    assert np.array_equal(first, whole[:cut]) and np.array_equal(changed[:cut], whole[:cut])
    assert not np.array_equal(changed[cut:], whole[cut:])
    times = [float(t["timestamp"]) for t in rows]
    got = [(k, p) for k, p in enumerate(scored.get(("M000", ts, n)) for ts, n in _occurrences(times)) if p is not None]
    assert len(got) > 400
    for k, (p, _, _) in got:  # the head applied in another order of operations: equal to rounding
        assert np.allclose(whole[k], p, rtol=0.0, atol=1e-12), k


def _occurrences(times: list[float]) -> list[tuple[float, int]]:
    """Each time with how many earlier ticks had it."""
    seen: dict[float, int] = {}
    out = []
    for t in times:
        out.append((t, seen.get(t, 0)))
        seen[t] = seen.get(t, 0) + 1
    return out


@pytest.mark.parametrize("horizon_ms", [None, 3_000])
def test_no_training_or_validation_label_uses_a_price_of_a_later_split(
        tmp_path: Path, make_config: ConfigFactory, horizon_ms: int | None) -> None:
    """The embargo, with a horizon in ticks and in time: a training label's horizon ends before the first
    validation tick, a validation label's before the first test tick, whichever market it is."""
    from cerebellar_norse.training.trainer import prepare

    neural = {**TINY_NEURAL, **({"horizon_ms": horizon_ms} if horizon_ms else {})}
    cfg = make_config(neural=neural)
    write_csv(tmp_path / "t.csv", generate_ticks(3000, 3, seed=7))
    prep = prepare(cfg, load_training_files([tmp_path / "t.csv"], cfg.training))
    first_val = min(float(pm.ticks.timestamp[pm.split == 1][0]) for pm in prep.markets if (pm.split == 1).any())
    first_test = min(float(pm.ticks.timestamp[pm.split == 2][0]) for pm in prep.markets if (pm.split == 2).any())
    for pm in prep.markets:
        ts = pm.ticks.timestamp
        train = np.flatnonzero(pm.labels >= 0)
        assert train.size and (pm.split[train] == 0).all() and ts[pm.end[train]].max() < first_val
        val = np.flatnonzero(pm.scored & (pm.split == 1))
        assert val.size and ts[pm.end[val]].max() < first_test


def test_the_logistic_baseline_of_evaluate_is_not_fitted_on_labels_that_overlap_the_half_it_scores(
        tmp_path: Path, make_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """`evaluate` cross-fits the logistic baseline: each half of a market scored by a fit on the other. A label is the
    return over the next horizon, so the horizon of ticks on either side of the seam is left out of both fits."""
    from cerebellar_norse.training import scoring

    cfg = make_config(neural=TINY_NEURAL)
    write_csv(tmp_path / "t.csv", _rows(1200))
    prep = prepare_for_scoring(cfg, load_training_files([tmp_path / "t.csv"], cfg.training))
    fits: list[list[np.ndarray]] = []
    real = scoring._fit_on

    def recording(markets: Any, rows: list[np.ndarray], ys: list[np.ndarray]) -> Any:
        fits.append([r.copy() for r in rows])
        return real(markets, rows, ys)

    monkeypatch.setattr(scoring, "_fit_on", recording)
    idx, _ = prep.rows(2)
    assert scoring._logistic_crossfit(prep, idx) is not None
    first_fit, second_fit = fits  # for the second halves, for the first halves
    for k, i in enumerate(idx):
        seam = i.size // 2
        first, second = i[:seam], i[seam:]
        assert first_fit[k].size and first_fit[k].max() < second[0] - prep.block + 1
        assert second_fit[k].size and second_fit[k].min() > first[-1] + prep.block - 1
        # what each half's fit lacks is the horizon by the seam, no more
        assert first_fit[k].size == first.size - prep.block and second_fit[k].size == second.size - prep.block
