"""Cross-validation of the fused kernel against the Norse reference.

Both backends run the same interleaved multi-market tick stream, in batches, from the
same weights; after every batch every state array and every output is compared.

Tolerance is 1e-4 (absolute) on states and outputs. Float32 sums in different orders
(torch's dense products vs the kernel's event-driven sums) can differ in the last
bit, and a last-bit difference at a spike threshold flips a spike, after which the
trajectories legitimately part. So the gate is the float64 run (the same equations,
with rounding far below any threshold), and the float32 run is reported beside it:
its drift before the first spike flip, and the spike flips themselves.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import Config
from ..synthetic import generate_ticks
from ..ticks import validate_ticks
from .network import CerebellarNetwork

TOLERANCE = 1e-4
POPULATION_FIELDS = {
    "granule": ("v_gr", "i_gr", "golgi"),
    "purkinje": ("v_pc", "i_pc"),
    "dcn": ("v_dcn", "i_dcn"),
    "outputs": ("v_out", "i_out"),
}
SPIKE_POPULATIONS = ("granule", "purkinje", "dcn")


@dataclass
class CrossvalReport:
    """Result of one comparison run (one precision)."""

    precision: str
    ticks: int
    markets: int
    max_abs_diff: dict[str, float] = field(default_factory=lambda: dict.fromkeys(POPULATION_FIELDS, 0.0))
    first_divergence: dict[str, Any] | None = None
    spike_flips: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SPIKE_POPULATIONS, 0))
    first_spike_flip: dict[str, Any] | None = None
    max_abs_diff_before_flip: dict[str, float] = field(default_factory=lambda: dict.fromkeys(POPULATION_FIELDS, 0.0))

    @property
    def passed(self) -> bool:
        """No state or output differed by more than the tolerance."""
        return self.first_divergence is None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "precision": self.precision,
            "ticks": self.ticks,
            "markets": self.markets,
            "tolerance": TOLERANCE,
            "max_abs_diff": self.max_abs_diff,
            "first_divergence": self.first_divergence,
            "spike_flips": self.spike_flips,
            "first_spike_flip": self.first_spike_flip,
            "max_abs_diff_before_first_spike_flip": self.max_abs_diff_before_flip,
        }


def _with_precision(cfg: Config, precision: str) -> Config:
    return cfg.model_copy(update={"neural": cfg.neural.model_copy(update={"precision": precision})})


def crossval(cfg: Config, ticks: int = 1000, markets: int = 4, precision: str = "float64", seed: int = 7,
             batch: int = 8) -> CrossvalReport:
    """Run both backends on ``ticks`` generated ticks of ``markets`` markets and compare them."""
    c = _with_precision(cfg, precision)
    capacity = max(markets, 1)
    fused = CerebellarNetwork(c, backend="fused", max_markets=capacity, max_batch=batch)
    ref = CerebellarNetwork(c, backend="reference", weights=fused.weights, max_markets=capacity, max_batch=batch)
    stream = validate_ticks(generate_ticks(ticks, markets, seed))
    rep = CrossvalReport(precision, ticks, markets)
    flipped = False
    for start in range(0, len(stream), batch):
        chunk = stream[start:start + batch]
        out_f = fused.process_ticks(chunk)
        out_r = ref.process_ticks(chunk)
        # outputs: class probabilities of every tick in the batch
        for j, (a, b) in enumerate(zip(out_f, out_r, strict=True)):
            d = max(abs(a["probabilities"][k] - b["probabilities"][k]) for k in a["probabilities"])
            _record(rep, "outputs", d, start + j, a["market_id"], "probabilities", flipped)
        for pop, names in POPULATION_FIELDS.items():
            for name in names:
                diff = np.abs(getattr(fused.pool.arrays, name).astype(np.float64) - getattr(ref.pool.arrays, name).astype(np.float64))
                d = float(diff.max()) if diff.size else 0.0
                slot = int(np.unravel_index(int(diff.argmax()), diff.shape)[0]) if diff.size else 0
                market = next((m for m, s in fused.pool.table.items() if s == slot), "")
                _record(rep, pop, d, start + len(chunk) - 1, market, name, flipped)
        sf, sr = fused.last_spikes, ref.last_spikes
        for j in range(len(chunk)):
            for k, pop in enumerate(SPIKE_POPULATIONS):
                if sf[j, k] != sr[j, k]:
                    rep.spike_flips[pop] += 1
                    if rep.first_spike_flip is None:
                        rep.first_spike_flip = {"tick": start + j, "market_id": chunk[j].market_id, "population": pop,
                                                "fused_spikes": int(sf[j, k]), "reference_spikes": int(sr[j, k])}
                    flipped = True
    return rep


def _record(rep: CrossvalReport, pop: str, d: float, tick: int, market: str, name: str, flipped: bool) -> None:
    rep.max_abs_diff[pop] = max(rep.max_abs_diff[pop], d)
    if not flipped:
        rep.max_abs_diff_before_flip[pop] = max(rep.max_abs_diff_before_flip[pop], d)
    if d > TOLERANCE and rep.first_divergence is None:
        rep.first_divergence = {"tick": tick, "market_id": market, "population": pop, "variable": name, "abs_diff": d}


def run_crossval_command(cfg: Config, ticks: int, markets: int, precision: str, seed: int, as_json: bool) -> int:
    """``cerebellar-norse crossval``: exit 0 when the gating run is within tolerance, else 1.

    With ``precision="both"`` the float64 run gates and the float32 run is reported
    under the ``float32`` key (drift and spike flips).
    """
    gate = "float64" if precision == "both" else precision
    main = crossval(cfg, ticks, markets, gate, seed)
    extra = crossval(cfg, ticks, markets, "float32", seed) if precision == "both" else None
    if as_json:
        out = {"ticks": main.ticks, "max_abs_diff": main.max_abs_diff, "first_divergence": main.first_divergence,
               "precision": main.precision, "markets": markets, "tolerance": TOLERANCE, "spike_flips": main.spike_flips,
               "passed": main.passed}
        if extra is not None:
            out["float32"] = extra.as_dict()
        print(json.dumps(out))
    else:
        for rep in (main, extra):
            if rep is None:
                continue
            role = "gate" if rep is main else "reported"
            print(f"[{rep.precision}, {role}] {rep.ticks} ticks, {rep.markets} markets, tolerance {TOLERANCE:g}")
            for pop, d in rep.max_abs_diff.items():
                print(f"  max |diff| {pop:<9} {d:.3e}   (before first spike flip {rep.max_abs_diff_before_flip[pop]:.3e})")
            flips = ", ".join(f"{k} {v}" for k, v in rep.spike_flips.items())
            print(f"  spike flips: {flips}; first: {rep.first_spike_flip}")
            print(f"  first divergence: {rep.first_divergence}")
        print("crossval: PASS" if main.passed else "crossval: FAIL", file=sys.stdout if main.passed else sys.stderr)
    return 0 if main.passed else 1
