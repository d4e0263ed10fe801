"""First run: train a default model on generated data when the state dir has none.

So ``make run`` on a fresh machine serves a trained model. The data (synthetic
ticks with a learnable structure, see :mod:`cerebellar_norse.synthetic`) is written
to ``<state_dir>/bootstrap/ticks.csv``; training is bounded to about a minute.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from ..config import Config
from ..synthetic import generate_ticks
from .checkpoints import GENERATED_DATA, ModelStore, StoredModel
from .data import write_csv
from .jobs import run_training

log = logging.getLogger("cerebellar_norse.bootstrap")

BOOTSTRAP_TICKS = 40_000
BOOTSTRAP_MARKETS = 4
BOOTSTRAP_EPOCHS = 6
BOOTSTRAP_BUDGET_S = 60.0


def bootstrap_model(cfg: Config, store: ModelStore) -> StoredModel:
    """Generate data, train the default model within the time budget, store and activate it."""
    path = Path(cfg.paths.state_dir).joinpath(*GENERATED_DATA)
    t0 = time.monotonic()
    if not path.exists():
        write_csv(path, generate_ticks(BOOTSTRAP_TICKS, BOOTSTRAP_MARKETS, seed=cfg.neural.seed))
    log.warning("no trained model in the state dir: training the default model on generated data",
                extra={"fields": {"data": str(path), "ticks": BOOTSTRAP_TICKS, "budget_s": BOOTSTRAP_BUDGET_S}})

    def progress(d: dict[str, object]) -> None:
        if d.get("epoch_done"):
            log.info("bootstrap training epoch done", extra={"fields": {k: d.get(k) for k in ("epoch", "loss", "validation")}})

    res = run_training(cfg, [path], BOOTSTRAP_EPOCHS, progress, None, time_budget_s=BOOTSTRAP_BUDGET_S, generated=True)
    store.set_active(res["model_version"])
    model = store.load(res["model_version"])
    val = res["validation"]
    log.info("bootstrap model trained and activated", extra={"fields": {
        "model_version": model.version, "seconds": round(time.monotonic() - t0, 1),
        "validation_accuracy": val.get("accuracy"), "majority_baseline_accuracy": val.get("majority_baseline_accuracy"),
        "directional_accuracy": val.get("directional_accuracy")}})
    return model
