"""``cerebellar-norse replay``: re-run recorded (or CSV) ticks offline, optionally checking each result.

A recording (``debug.record_requests``) holds, per applied tick, the tick, the
probabilities served for it and the model version that served it. Replay feeds the
ticks, in the order the engine applied them, through a fresh network (the fused CPU
kernel) built with the *recorded* model version, loaded from the model store of the
state dir (``<state_dir>/models/<version>``); the untrained network a service serves
before any model is stored is version ``seed-<N>`` and is regenerated from that seed.
When the recorded version changes in the middle of a recording (a model swap), replay
swaps the weights at the same tick, and resets every market when
``training.reset_state_on_swap`` says the service did.

With ``--detect-divergence`` each replayed tick's probabilities are compared with the
recorded ones; per market the first tick whose largest absolute difference exceeds the
tolerance is reported with both values, and the command exits 1 when any market
diverged.

Starting state: a recording (format version 2) says, at each market's first tick in
the file, where the market's state stood just before it: its full state, captured by
the service before the step (in the companion ``.states`` file), or "from rest" (the
market had no state). Replay loads that state into the fresh network
(:meth:`CerebellarNetwork.restore`) or starts the market from rest, and does the same
where the recording shows a market restarting from rest later (evicted or reset in the
service). Markets without a recorded start (version 1 files, ticks handed to the
recorder without a capture) start from rest at their first recorded tick; if the
service had state for them then, they diverge at that tick and the report says so.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..config import Config
from ..errors import DataError, InputError
from ..neurons.topology import Weights, seed_version_weights
from ..ticks import Tick
from . import checkpoints
from .checkpoints import ModelStore, shape_mismatch

DEFAULT_TOLERANCE = 1e-9
CHUNK = 4096  # ticks per network call


@dataclass
class Divergence:
    """The first tick of a market whose replayed probabilities differ from the recorded ones beyond tolerance."""

    market_id: str
    tick_index: int  # 0-based position among the market's recorded ticks
    line: int  # line in the recording
    timestamp: int
    model_version: str
    recorded: list[float]  # p_down, p_flat, p_up as served
    replayed: list[float]
    max_abs_diff: float
    at_first_tick: bool  # at the market's first tick, which had no recorded start: it was probably not at rest


@dataclass
class MarketReport:
    """What replay found for one market."""

    market_id: str
    start: str = ""  # where the market started: "state" (recorded state), "rest", or "not recorded" (from rest)
    ticks: int = 0
    compared: int = 0  # ticks with recorded probabilities
    max_abs_diff: float = 0.0
    first_divergence: Divergence | None = None


@dataclass
class ReplayReport:
    """The outcome of a divergence check."""

    recording: str
    tolerance: float
    model_versions: list[str]
    ticks: int
    markets: dict[str, MarketReport] = field(default_factory=dict)

    @property
    def diverged(self) -> list[str]:
        """Markets with a divergence, in order of first appearance."""
        return [m for m, r in self.markets.items() if r.first_divergence is not None]

    def to_json(self) -> dict[str, Any]:
        """The report as one JSON object."""
        markets = []
        for r in self.markets.values():
            d = asdict(r)
            for obj in (d, d["first_divergence"] or {}):  # an infinite difference (NaN served or replayed) is null
                if "max_abs_diff" in obj and not math.isfinite(obj["max_abs_diff"]):
                    obj["max_abs_diff"] = None
            markets.append(d)
        return {"recording": self.recording, "tolerance": self.tolerance, "model_versions": self.model_versions,
                "ticks": self.ticks, "compared": sum(r.compared for r in self.markets.values()),
                "diverged": self.diverged, "markets": markets}


def weights_for_version(cfg: Config, store: ModelStore, version: str) -> Weights:
    """The weights a recording names: a stored model, or ``seed-<N>`` (the untrained network of seed N).

    InputError (exit 1) naming the store when the version is not stored, or when it does
    not fit the config's network.
    """
    if version in store.versions():
        model = store.load(version)
        bad = shape_mismatch(model.neural, cfg.neural)
        if bad:
            raise InputError(f"model {version} does not fit this config ({', '.join(bad)} differ): replay with the "
                             "service's --config", "model_version")
        return model.weights
    seeded = seed_version_weights(cfg, version)
    if seeded is not None:
        return seeded
    stored = store.versions()
    raise InputError(f"the recording was served by model {version!r}, which is not stored in {store.root} "
                     f"(stored: {', '.join(stored) if stored else 'none'}); copy that model directory there, or replay "
                     "with the --config of the service that recorded it", "model_version")


def _runs(versions: Sequence[str]) -> list[tuple[int, int, str]]:
    """(start, end, version) of each run of equal consecutive versions."""
    out: list[tuple[int, int, str]] = []
    start = 0
    for j in range(1, len(versions) + 1):
        if j == len(versions) or versions[j] != versions[start]:
            out.append((start, j, versions[start]))
            start = j
    return out


def replay_ticks(cfg: Config, ticks: Sequence[Tick], versions: Sequence[str], weights_of: Any,
                 starts: Mapping[int, Mapping[str, np.ndarray] | None] | None = None,
                 where: Callable[[int], str] | None = None) -> list[dict[str, Any]]:
    """Results of ``ticks`` through a fresh network, with ``weights_of(version)`` for each run of equal versions.

    A version change swaps the weights between two ticks as the service's model swap
    does (keeping market states unless ``training.reset_state_on_swap``). ``starts``
    maps a tick's index to the state its market is loaded with just before it, or to
    None (the market is reset: it starts from rest). A state that does not fit the
    config's network is an InputError naming ``where(index)`` (e.g. ``file:line``).
    """
    from ..neurons.network import CerebellarNetwork

    runs = _runs(versions)
    markets = len({t.market_id for t in ticks})
    net: CerebellarNetwork | None = None
    out: list[dict[str, Any]] = []
    for start, end, version in runs:
        w = weights_of(version)
        if net is None:
            net = CerebellarNetwork(cfg, weights=w, max_markets=max(markets, 1))
        elif w is not net.weights:
            net.backend.set_weights(w)
            net.weights = w
            if cfg.training.reset_state_on_swap:
                for market in net.markets:
                    net.reset(market)
        cuts = sorted(i for i in starts if start <= i < end) if starts else []
        bounds = [start, *(i for i in cuts if i > start), end]
        for a, b in itertools.pairwise(bounds):
            if starts and a in starts:
                _load_start(net, ticks[a].market_id, starts[a], where(a) if where is not None else f"tick {a}")
            for k in range(a, b, CHUNK):
                chunk = ticks[k:min(k + CHUNK, b)]
                results = net.process_ticks(chunk)
                for r in results:
                    r["model_version"] = version
                out.extend(results)
    return out


def _load_start(net: Any, market: str, state: Mapping[str, np.ndarray] | None, where: str) -> None:
    """Put a market where the recording says it started: its recorded state, or rest (None)."""
    if state is None:
        net.reset(market)
        return
    probe = net.pool.arrays.read_slot(0)
    for name, want in probe.items():
        got = state.get(name)
        if got is None or got.shape != want.shape or got.dtype != want.dtype:
            have = "missing" if got is None else f"{got.dtype.name} {list(got.shape)}"
            raise DataError(f"{where}: the recorded starting state of market {market!r} does not fit this config's "
                            f"network (field {name!r}: {have}, expected {want.dtype.name} {list(want.shape)}): replay "
                            "with the --config of the service that recorded it")
    net.restore(market, state)


def compare(scan_records: Sequence[Any], results: Sequence[dict[str, Any]], tolerance: float, recording: str,
            versions: list[str]) -> ReplayReport:
    """Compare replayed results with the recorded probabilities, market by market."""
    report = ReplayReport(recording, tolerance, versions, len(results))
    for rec, res in zip(scan_records, results, strict=True):
        m = rec.tick.market_id
        mr = report.markets.get(m)
        if mr is None:
            mr = report.markets[m] = MarketReport(m, getattr(rec, "start", None) or "not recorded")
        index = mr.ticks
        mr.ticks += 1
        if rec.probabilities is None:
            continue
        mr.compared += 1
        p = res["probabilities"]
        replayed = [p["down"], p["flat"], p["up"]]
        recorded = list(rec.probabilities)
        diff = max(abs(a - b) for a, b in zip(recorded, replayed, strict=True))
        if math.isnan(diff):
            diff = math.inf
        mr.max_abs_diff = max(mr.max_abs_diff, diff)
        if diff > tolerance and mr.first_divergence is None:
            mr.first_divergence = Divergence(m, index, rec.line, rec.tick.timestamp, rec.model_version, recorded,
                                             replayed, diff, index == 0 and mr.start == "not recorded")
    return report


def _fmt_probs(p: Sequence[float]) -> str:
    return "[" + ", ".join(repr(float(x)) for x in p) + "]"


def print_report(report: ReplayReport) -> None:
    """The text form of a divergence report (stdout)."""
    versions = ", ".join(report.model_versions) or "the served model"
    print(f"replayed {report.ticks} ticks of {len(report.markets)} markets from {report.recording} through model "
          f"{versions}; tolerance {report.tolerance:g} (largest |difference| of p_down, p_flat, p_up)")
    starts = {"state": "from its recorded state", "rest": "from rest", "not recorded": "start not recorded: from rest"}
    for m, r in report.markets.items():
        name = f"{json.dumps(m)} ({starts.get(r.start, r.start)})" if r.start else json.dumps(m)
        d = r.first_divergence
        if d is None:
            note = "" if r.compared == r.ticks else f" ({r.ticks - r.compared} without recorded probabilities)"
            print(f"market {name}: {r.ticks} ticks, {r.compared} compared, no divergence (max |diff| {r.max_abs_diff:.3g}){note}")
            continue
        print(f"market {name}: DIVERGES at tick {d.tick_index} of the market (line {d.line}, timestamp {d.timestamp}, "
              f"model {d.model_version}): recorded {_fmt_probs(d.recorded)}, replayed {_fmt_probs(d.replayed)}, "
              f"max |diff| {d.max_abs_diff:.3g}")
        if d.at_first_tick:
            print("  (at the market's first recorded tick, whose starting state the recording does not hold (written "
                  "without starting states): it was probably not at rest when recording started)")
    n = len(report.diverged)
    print(f"divergence in {n} of {len(report.markets)} markets" if n else "no divergence")


def run_replay(cfg: Config, path: Path, as_json: bool, market: str | None = None, detect: bool = False,
               tolerance: float = DEFAULT_TOLERANCE) -> int:
    """``cerebellar-norse replay FILE``: see the module docstring; returns the exit code."""
    from ..engine.recording import is_recording, read_recording
    from ..engine.recording_format import START_REST, START_STATE
    from .data import load_csv_files

    if not path.is_file():
        raise InputError(f"{path}: no such file")
    if not (tolerance >= 0 and math.isfinite(tolerance)):
        raise InputError(f"--tolerance {tolerance} must be a finite number >= 0", "--tolerance")
    if cfg.training.online_learning:
        print("cerebellar-norse: warning: training.online_learning is on: the service changed its weights while "
              "serving, replay uses the stored ones, so results drift from what was served", file=sys.stderr)
    if not is_recording(path):
        if detect:
            raise InputError(f"{path}: --detect-divergence needs a recording (it holds what was served); "
                             "this is a plain tick CSV", "--detect-divergence")
        return _replay_csv(cfg, path, as_json, market, load_csv_files, served_weights)

    scan = read_recording(path)
    for line in scan.warnings:
        print(f"cerebellar-norse: warning: {line}", file=sys.stderr)
    records = scan.records
    if market is not None:
        records = [r for r in records if r.tick.market_id == market]
        if not records:
            raise InputError(f"{path}: no tick of market {market!r} in the recording", "--market")
    if not records:
        raise InputError(f"{path}: recording holds no ticks")
    store = ModelStore(Path(cfg.paths.state_dir))
    cache: dict[str, Weights] = {}
    served: list[str] = []  # the served model's version, once it stands in for a version not stored
    fallback: set[str] = set()  # recorded versions replayed through it

    def weights_of(version: str) -> Weights:
        if version not in cache:
            try:
                if not version:
                    raise InputError("no model version recorded")
                cache[version] = weights_for_version(cfg, store, version)
            except InputError as exc:
                if detect:  # a comparison with another model than the recorded one would be meaningless
                    raise
                w, name = served_weights(cfg)  # without a comparison: the model this config serves, said loudly
                served.append(name)
                what = f"model {version!r}" if version else "ticks without a recorded model version"
                print(f"cerebellar-norse: warning: {path}: {what} replayed through the served model {name} instead "
                      f"({exc.message})", file=sys.stderr)
                cache[version] = w
        return cache[version]

    versions = [r.model_version for r in records]
    names = list(dict.fromkeys(versions))  # in order of first use
    for v in names:  # every version is resolved (or refused) before any tick is replayed
        before = len(served)
        weights_of(v)
        if len(served) > before:
            fallback.add(v)
    ticks = [r.tick for r in records]
    starts: dict[int, Mapping[str, np.ndarray] | None] = {}
    for i, rec in enumerate(records):
        if rec.start == START_REST:
            starts[i] = None
        elif rec.start == START_STATE:
            starts[i] = scan.states[rec.line].state
    results = replay_ticks(cfg, ticks, versions, weights_of, starts, lambda i: f"{path}:{records[i].line}")
    shown = list(dict.fromkeys(served[0] if v in fallback else v for v in names)) if served else names
    if detect:
        report = compare(records, results, tolerance, str(path), shown)
        if not any(r.compared for r in report.markets.values()):
            raise InputError(f"{path}: no tick has recorded probabilities (written before the service recorded what it "
                             "served): nothing to compare", "--detect-divergence")
        if as_json:
            print(json.dumps(report.to_json(), allow_nan=False))
        else:
            print_report(report)
        return 1 if report.diverged else 0
    if as_json:
        for r, v in zip(results, versions, strict=True):
            r["model_version"] = served[0] if v in fallback else v
            print(json.dumps(r))
        return 0
    preds = np.array([r["prediction"] for r in results])
    markets = len({t.market_id for t in ticks})
    print(f"replayed {len(results)} ticks of {markets} markets from {path} through model {', '.join(shown)} "
          f"({'the served model in place of a version not stored' if fallback else 'as recorded'})")
    print(f"prediction mean {preds.mean():+.4f}, std {preds.std():.4f}; bad rows skipped: none (recording)")
    return 0


def served_weights(cfg: Config) -> tuple[Weights, str]:
    """The served weights (:func:`checkpoints.served_weights`) and their model version as the engine names it."""
    w, version = checkpoints.served_weights(cfg)
    return w, version or f"seed-{cfg.neural.seed}"


def _replay_csv(cfg: Config, path: Path, as_json: bool, market: str | None, load_csv_files: Any, served_weights: Any) -> int:
    """A plain tick CSV through the served model, in time order; bad rows are skipped and named on stderr."""
    data = load_csv_files([path], max_bad_fraction=cfg.training.max_bad_row_fraction, zone=cfg.training.data_zone,
                          day_first=cfg.training.day_first)
    rows = sorted((int(ts), m.market_id, float(p), float(v)) for m in data.markets
                  for ts, p, v in zip(m.timestamp, m.price, m.volume, strict=True)
                  if market is None or m.market_id == market)
    if market is not None and not rows:
        raise InputError(f"{path}: no tick of market {market!r}", "--market")
    ticks = [Tick(p, v, ts, mid) for ts, mid, p, v in rows]
    for line in data.report[:50]:  # skipped, never silently
        print(f"cerebellar-norse: warning: row skipped: {line}", file=sys.stderr)
    if len(data.report) > 50:
        print(f"cerebellar-norse: warning: … and {len(data.report) - 50} more rows skipped", file=sys.stderr)
    weights, version = served_weights(cfg)
    results = replay_ticks(cfg, ticks, [version] * len(ticks), lambda _v: weights)
    if as_json:
        for r in results:
            print(json.dumps(r))
        return 0
    markets = len({t.market_id for t in ticks})
    preds = np.array([r["prediction"] for r in results]) if results else np.zeros(1)
    print(f"replayed {len(results)} ticks of {markets} markets from {path} through model {version}")
    print(f"prediction mean {preds.mean():+.4f}, std {preds.std():.4f}; bad rows skipped: {data.bad_rows}")
    return 0
