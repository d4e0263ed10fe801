"""Signal quality on generated data: learnability where there is signal, calibration where there is none.

Two series, each trained with the default config in a fresh state dir and scored on the
training job's own test split (the last ``training.test_fraction`` of every market, which
chose nothing):

* ``regimes``: ``make-data`` ticks (hidden trend / revert regimes revealed by volume and
  gaps): there is a directional signal. Reported: the model's directional accuracy edge
  over the base rate, the logistic regression's edge on the same inputs, and the share of
  the logistic regression's edge the network captures (target >= 95 %).
* ``noise``: a heavy-tailed random walk with independent volumes and gaps: no signal.
  Reported: direction log loss minus the base rate's (target <= +0.002 nats) and the
  direction ECE minus the base rate's (target within 0.02).

Usage::

    .venv/bin/python benchmarks/signal_bench.py [--ticks 60000] [--markets 3] [--epochs 5] [--json]

Timing is not measured here; the figures are deterministic for a given seed (one
training thread).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from cerebellar_norse.config import load_checked_config
from cerebellar_norse.synthetic import generate_ticks
from cerebellar_norse.training.data import write_csv
from cerebellar_norse.training.jobs import run_training


def noise_ticks(n: int, markets: int, seed: int) -> list[dict[str, Any]]:
    """Independent heavy-tailed returns, volumes and gaps: nothing to learn."""
    rng = np.random.default_rng(seed)
    out: list[dict[str, Any]] = []
    per = n // markets
    for k in range(markets):
        price = 100.0 * np.exp(np.cumsum(rng.standard_t(3, per) * 1e-3))
        ts = 1_600_000_000_000 + np.cumsum(rng.exponential(500.0, per)).astype(np.int64)
        vol = rng.lognormal(5.0, 1.0, per)
        out.extend({"timestamp": int(t), "market_id": f"N{k}", "price": float(p), "volume": float(v)}
                   for p, t, v in zip(price, ts, vol, strict=True))
    out.sort(key=lambda d: d["timestamp"])
    return out


def run(name: str, ticks: list[dict[str, Any]], epochs: int) -> dict[str, Any]:
    """Train on ``ticks`` in a fresh state dir; the test split's headline figures."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.csv"
        write_csv(path, ticks)
        cfg = load_checked_config(None, environ={"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(Path(tmp) / "var")})
        res = run_training(cfg, [path], epochs, lambda d: None, None)
    test = res["test"]
    model, base, lr = test["model"], test["baselines"]["base_rates"], test["baselines"].get("logistic", {})
    dir_base = base["directional_accuracy"]
    out: dict[str, Any] = {
        "series": name, "edge": res["edge"], "test_samples": test["samples"],
        "directional_accuracy": model["directional_accuracy"], "base_directional_accuracy": dir_base,
        "logistic_directional_accuracy": lr.get("directional_accuracy"),
        "direction_log_loss": model["direction_log_loss"], "base_direction_log_loss": base["direction_log_loss"],
        "direction_ece": model["direction_ece"], "base_direction_ece": base["direction_ece"],
        "log_loss": model["log_loss"], "base_log_loss": base["log_loss"],
        "recall": model["recall"],
    }
    lr_edge = (lr.get("directional_accuracy") or dir_base) - dir_base
    out["model_edge"] = model["directional_accuracy"] - dir_base
    out["logistic_edge"] = lr_edge
    out["share_of_logistic_edge"] = out["model_edge"] / lr_edge if lr_edge > 0 else None
    out["direction_log_loss_excess"] = model["direction_log_loss"] - base["direction_log_loss"]
    out["direction_ece_excess"] = model["direction_ece"] - base["direction_ece"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ticks", type=int, default=60_000)
    ap.add_argument("--markets", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rows = [run("regimes", generate_ticks(a.ticks, a.markets, seed=a.seed), a.epochs),
            run("noise", noise_ticks(a.ticks, a.markets, a.seed), a.epochs)]
    if a.json:
        print(json.dumps(rows))
        return 0
    keys = ("series", "edge", "test_samples", "directional_accuracy", "base_directional_accuracy",
            "logistic_directional_accuracy", "share_of_logistic_edge", "direction_log_loss_excess", "direction_ece_excess")
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(f"{r[k]:.4f}" if isinstance(r[k], float) else str(r[k]) for k in keys) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
