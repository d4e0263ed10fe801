"""Golden values: both backends against an independent plain numpy re-implementation.

:class:`GoldenNetwork` re-implements, step by step and without any package code but
the weights, the equations of ``cerebellar_norse.neurons.functional``'s docstring and
the encoder of ``cerebellar_norse.neurons.encoder``'s docstring:

* encoder: x = (log(p/p_prev), log1p(volume), log1p(gap_ms/1000)); z = (x - mean)/sqrt(var + floor)
  against the statistics before the tick (0 while fewer than two observations, return
  and gap 0 on a market's first tick), clipped to ±clip; mean/var exponentially
  weighted with alpha = max(1/(n+1), 1/window); Gaussian population code;
* LIF (Norse ``lif_feed_forward_step``): i' = i + I; v_dec = v + dt/tau_mem ((v_leak - v) + i');
  i_dec = i' - dt/tau_syn i'; spike if v_dec > v_th, then v = v_reset;
* Golgi g = max(0, g + rate (mean(z_gr) - target)); Purkinje input z_gr W_pf + b_pc;
  DCN input (W_md m + b_dcn) - W_pd z_pc; readout LI of W_out z_dcn;
  logits = readout_scale v_out, probabilities = softmax(logits).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from cerebellar_norse.config import Config
from cerebellar_norse.neurons.encoder import VAR_FLOOR
from cerebellar_norse.neurons.network import CerebellarNetwork
from cerebellar_norse.neurons.topology import Weights

N_TICKS = 50
N_MARKETS = 3
STREAM_SEED = 2024


class GoldenLIF:
    """Plain float64 LIF (or LI when ``spiking`` is False) population."""

    def __init__(self, cfg: Any, dt: float, n: int, spiking: bool = True) -> None:
        self.c_mem = dt * (1000.0 / cfg.tau_mem_ms)
        self.c_syn = dt * (1000.0 / cfg.tau_syn_ms)
        self.v_leak, self.v_th, self.v_reset = cfg.v_leak, cfg.v_th, cfg.v_reset
        self.spiking = spiking
        self.v = np.full(n, float(cfg.v_leak))
        self.i = np.zeros(n)

    def step(self, current: np.ndarray) -> np.ndarray:
        i_new = self.i + current
        v_dec = self.v + self.c_mem * ((self.v_leak - self.v) + i_new)
        self.i = i_new - self.c_syn * i_new
        if not self.spiking:
            self.v = v_dec
            return v_dec
        z = (v_dec > self.v_th).astype(np.float64)
        self.v = np.where(z > 0, self.v_reset, v_dec)
        return z


class GoldenEncoder:
    """One market's running normaliser and population code, in plain Python floats."""

    def __init__(self, n: Any) -> None:
        self.window, self.clip, self.gain = float(n.norm_window), float(n.feature_clip), float(n.mossy_gain)
        self.per_feature = n.mossy_size // 3
        self.last_price = 0.0
        self.last_ts = 0.0
        self.n_ticks = 0
        self.mean = [0.0, 0.0, 0.0]
        self.var = [0.0, 0.0, 0.0]
        self.count = [0.0, 0.0, 0.0]

    def features(self, price: float, volume: float, ts_ms: float) -> list[float]:
        first = self.n_ticks == 0
        xs = [
            0.0 if first else math.log(price / self.last_price),
            math.log1p(volume),
            0.0 if first else math.log1p(max(ts_ms - self.last_ts, 0.0) / 1000.0),
        ]
        z = [0.0, 0.0, 0.0]
        for f, x in enumerate(xs):
            if first and f != 1:
                continue  # no return and no gap on the first tick: z = 0, statistics untouched
            if self.count[f] >= 2:
                scaled = (x / math.sqrt(self.var[f] + self.mean[f] * self.mean[f] + VAR_FLOOR) if f == 0
                          else (x - self.mean[f]) / math.sqrt(self.var[f] + VAR_FLOOR))  # returns: not demeaned
                z[f] = min(max(scaled, -self.clip), self.clip)
            alpha = max(1.0 / (self.count[f] + 1.0), 1.0 / self.window)
            delta = x - self.mean[f]
            self.mean[f] += alpha * delta
            self.var[f] = (1.0 - alpha) * (self.var[f] + alpha * delta * delta)
            self.count[f] += 1.0
        self.last_price, self.last_ts = price, ts_ms
        self.n_ticks += 1
        return z

    def mossy(self, z: list[float]) -> np.ndarray:
        k = self.per_feature
        spacing = 2.0 * self.clip / (k - 1)
        out = np.empty(3 * k)
        for f in range(3):
            for j in range(k):
                d = (z[f] - (-self.clip + spacing * j)) / spacing
                out[f * k + j] = self.gain * math.exp(-0.5 * d * d)
        return out


class GoldenMarket:
    """The whole network for one market, float64, dense weights."""

    def __init__(self, cfg: Config, w: Weights) -> None:
        n = cfg.neural
        dt = n.dt_ms / 1000.0
        s = w.shape
        self.n = n
        self.encoder = GoldenEncoder(n)
        self.w_mg = np.zeros((s.granule, s.mossy))
        for g in range(s.granule):
            for d in range(s.dendrites):
                self.w_mg[g, int(w.mg_idx[g, d])] = float(w.mg_w[g, d])
        self.w_pf = np.zeros((s.granule, s.purkinje))
        for p in range(s.purkinje):
            for c in range(s.pf_per_purkinje):
                self.w_pf[int(w.pf_pre[p, c]), p] = float(w.pf_w[p, c])
        f64 = lambda a: np.asarray(a, dtype=np.float64)  # noqa: E731
        self.pc_bias, self.w_md, self.w_pd = f64(w.pc_bias), f64(w.w_md), f64(w.w_pd)
        self.dcn_bias, self.w_out = f64(w.dcn_bias), f64(w.w_out)
        self.golgi = float(w.golgi_init)
        self.golgi_init = float(w.golgi_init)
        self.gr = GoldenLIF(n.granule, dt, s.granule)
        self.pc = GoldenLIF(n.purkinje, dt, s.purkinje)
        self.dcn = GoldenLIF(n.dcn, dt, s.dcn)
        self.out = GoldenLIF(n.readout, dt, s.classes, spiking=False)

    def tick(self, price: float, volume: float, ts_ms: float) -> tuple[np.ndarray, np.ndarray]:
        """(probabilities (3,), spikes per population (3,)) of one tick."""
        m = self.encoder.mossy(self.encoder.features(price, volume, ts_ms))
        mf_gr = self.w_mg @ m
        drive = self.w_md @ m + self.dcn_bias
        spikes = np.zeros(3)
        v_out = self.out.v
        for _ in range(self.n.steps_per_tick):
            z_gr = self.gr.step(mf_gr - self.golgi)
            self.golgi = max(0.0, self.golgi * (1.0 - self.n.golgi_leak) + self.n.golgi_leak * self.golgi_init
                             + self.n.golgi_rate * (z_gr.mean() - self.n.target_sparsity))
            z_pc = self.pc.step(z_gr @ self.w_pf + self.pc_bias)
            z_dcn = self.dcn.step(drive - self.w_pd @ z_pc)
            v_out = self.out.step(self.w_out @ z_dcn)
            spikes += (z_gr.sum(), z_pc.sum(), z_dcn.sum())
        logits = self.n.readout_scale * v_out
        e = np.exp(logits - logits.max())
        return e / e.sum(), spikes

    def state(self) -> dict[str, np.ndarray]:
        """State in the layout of ``CerebellarNetwork.snapshot`` (neurons only)."""
        return {"v_gr": self.gr.v, "i_gr": self.gr.i, "golgi": np.array(self.golgi), "v_pc": self.pc.v, "i_pc": self.pc.i,
                "v_dcn": self.dcn.v, "i_dcn": self.dcn.i, "v_out": self.out.v, "i_out": self.out.i}


def _max_state_diff(snap: dict[str, np.ndarray], golden: dict[str, np.ndarray]) -> float:
    return max(float(np.max(np.abs(np.asarray(snap[k], dtype=np.float64) - golden[k]))) for k in golden)


def golden_stream(n: int = N_TICKS, markets: int = N_MARKETS, seed: int = STREAM_SEED) -> list[dict[str, Any]]:
    """Interleaved random-walk ticks made here (not by the package), with repeated times and zero volumes."""
    rng = np.random.default_rng(seed)
    price = rng.uniform(20.0, 200.0, markets)
    clock = np.full(markets, 1_640_995_200_000) + rng.integers(0, 1000, markets)
    out = []
    for _ in range(n):
        m = int(rng.integers(0, markets))
        price[m] *= float(np.exp(rng.normal(0.0, 2e-3)))
        clock[m] += int(rng.choice([0, int(rng.integers(1, 800))]))
        volume = 0.0 if rng.random() < 0.1 else round(float(rng.lognormal(6.0, 0.8)), 2)
        out.append({"price": round(float(price[m]), 6), "volume": volume, "timestamp": int(clock[m]), "market_id": f"M{m}"})
    return out


@pytest.fixture(scope="module")
def stream() -> list[dict[str, Any]]:
    return golden_stream()


@pytest.mark.parametrize("backend", ["fused", "reference"])
def test_backend_matches_the_golden_reimplementation(backend: str, tiny_config: Config, stream: list[dict[str, Any]]) -> None:
    net = CerebellarNetwork(tiny_config, backend=backend, max_markets=N_MARKETS, max_batch=8)
    golden: dict[str, GoldenMarket] = {}
    totals = np.zeros(3)
    for j, t in enumerate(stream):
        market = golden.setdefault(str(t["market_id"]), GoldenMarket(tiny_config, net.weights))
        probs, spikes = market.tick(float(t["price"]), float(t["volume"]), float(t["timestamp"]))
        r = net.process(t)
        got = np.array([r["probabilities"][c] for c in ("down", "flat", "up")])
        np.testing.assert_array_equal(net.last_spikes[0], spikes, err_msg=f"tick {j}: spikes differ")
        assert r["spike_count"] == int(spikes.sum())
        d = max(float(np.max(np.abs(got - probs))), _max_state_diff(net.snapshot(str(t["market_id"])), market.state()))
        assert d < 1e-9, f"tick {j} ({t['market_id']}): max |diff| {d:.3e}"
        totals += spikes
    # The check means something only if every population spiked.
    assert (totals > 0).all(), totals


def test_golden_encoder_matches_the_package_encoder(tiny_config: Config, stream: list[dict[str, Any]]) -> None:
    net = CerebellarNetwork(tiny_config, max_markets=N_MARKETS)
    golden: dict[str, GoldenEncoder] = {}
    for t in stream:
        enc = golden.setdefault(str(t["market_id"]), GoldenEncoder(tiny_config.neural))
        enc.features(float(t["price"]), float(t["volume"]), float(t["timestamp"]))
        net.process(t)
        s = net.snapshot(str(t["market_id"]))["enc"]
        expect = [enc.last_price, enc.last_ts, enc.n_ticks, *enc.mean, *enc.var, *enc.count]
        np.testing.assert_allclose(s, expect, rtol=1e-12, atol=1e-15)


# Regression guard, produced once with this file's own GoldenMarket (and checked equal to
# both backends) on the tiny config (conftest.TINY_NEURAL, every value pinned, seed 42) and
# the stream golden_stream() (50 ticks, 3 markets, seed 2024): probabilities (down, flat, up)
# of ticks 10, 26 and 49 (one per market) and the spikes per population (granule, Purkinje,
# DCN) over the 50 ticks. They change only when the topology generation or the dynamics do;
# after such a deliberate change, `.venv/bin/python tests/neurons/test_golden.py` prints the
# new values to paste here.
FROZEN_PROBS = {
    10: (0.3085500467745022, 0.28279429661791633, 0.4086556566075816),
    26: (0.3120526018844599, 0.2634266531588078, 0.42452074495673225),
    49: (0.31666835623115597, 0.2768482695669846, 0.40648337420185954),
}
FROZEN_SPIKE_TOTALS = (371, 137, 48)


@pytest.mark.parametrize("backend", ["fused", "reference"])
def test_frozen_golden_numbers(backend: str, tiny_config: Config, stream: list[dict[str, Any]]) -> None:
    assert tiny_config.neural.seed == 42
    net = CerebellarNetwork(tiny_config, backend=backend, max_markets=N_MARKETS)
    results = net.process_batch(stream)
    for tick, expected in FROZEN_PROBS.items():
        got = tuple(results[tick]["probabilities"][c] for c in ("down", "flat", "up"))
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12, err_msg=f"tick {tick}")
    totals = np.zeros(3, dtype=np.int64)
    for r, s in zip(results, net.last_spikes, strict=True):
        assert r["spike_count"] == int(s.sum())
        totals += s
    assert tuple(int(x) for x in totals) == FROZEN_SPIKE_TOTALS


def frozen_values(cfg: Config) -> tuple[dict[int, tuple[float, ...]], tuple[int, ...]]:
    """The values frozen above, recomputed with GoldenMarket from the package's weights."""
    from cerebellar_norse.neurons.topology import generate_weights

    w = generate_weights(cfg)
    markets: dict[str, GoldenMarket] = {}
    probs: dict[int, tuple[float, ...]] = {}
    totals = np.zeros(3)
    for j, t in enumerate(golden_stream()):
        p, s = markets.setdefault(str(t["market_id"]), GoldenMarket(cfg, w)).tick(float(t["price"]), float(t["volume"]),
                                                                                 float(t["timestamp"]))
        totals += s
        if j in FROZEN_PROBS:
            probs[j] = tuple(float(x) for x in p)
    return probs, tuple(int(x) for x in totals)


if __name__ == "__main__":
    from conftest import TINY_NEURAL, config_environ

    from cerebellar_norse.config import load_config

    values, spike_totals = frozen_values(load_config(None, environ=config_environ({"neural": TINY_NEURAL})))
    print("FROZEN_PROBS = {")
    for k, v in values.items():
        print(f"    {k}: {v!r},")
    print("}")
    print(f"FROZEN_SPIKE_TOTALS = {spike_totals!r}")
