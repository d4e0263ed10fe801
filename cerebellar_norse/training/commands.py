"""CLI commands of the training and model side: train, make-data, dump-weights, verify-data, validate-model."""

from __future__ import annotations

import io
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config import Config, fmt_bytes
from ..errors import CheckpointError, InputError, StorageError
from ..neurons.topology import HEAD_LAYERS, LAYERS, Weights
from ..storage import write_output
from .checkpoints import (
    MANIFEST,
    ModelStore,
    lineage_metrics,
    load_model_dir,
    seen_periods,
    seen_until,  # noqa: F401  (imported from here by callers)
    served_weights,
    shape_mismatch,
    trained_on_generated,
    verify_tree,
    weights_to_bytes,
)

if TYPE_CHECKING:
    from datetime import tzinfo

    from .data import TickData


PLAIN_PROGRESS_S = 30.0  # without a terminal: a progress line at most this often (an epoch of millions of ticks runs minutes)


def _figure(x: float | None, digits: int = 3) -> str:
    """A figure of an epoch line; ``n/a`` where there is none (no labelled window, no moving label)."""
    return "n/a" if x is None else f"{x:.{digits}f}"


def _progress_printer(enabled: bool, printed: set[str]) -> Any:
    """The progress callback of ``train``: warnings and notes always (each added to ``printed``), epoch lines,
    and a progress bar when ``enabled`` (else, for a log, a plain line every ``PLAIN_PROGRESS_S`` seconds)."""
    last = [0.0]
    plain = [time.monotonic()]

    def show(d: dict[str, Any]) -> None:
        if "warning" in d:
            print(f"{'note' if d.get('note') else 'warning'}: {d['warning']}", file=sys.stderr)
            printed.add(d["warning"])
            return
        if d.get("epoch_done"):
            v = d.get("validation") or {}
            line = (f"epoch {d['epoch']}/{d['epochs']}: train loss {_figure(d.get('loss'), 4)}, validation loss"
                    f" {_figure(v.get('loss'), 4)}, accuracy {_figure(v.get('accuracy'))} (majority baseline"
                    f" {_figure(v.get('majority_baseline_accuracy'))}), directional {_figure(v.get('directional_accuracy'))}"
                    f" (more common direction {_figure(v.get('directional_baseline_accuracy'))})")
            print(("\r" if enabled else "") + line + (" " * 10 if enabled else ""), file=sys.stderr)
            return
        if not enabled:
            now = time.monotonic()
            if now - plain[0] >= PLAIN_PROGRESS_S:
                plain[0] = now
                print(f"epoch {d['epoch']}/{d['epochs']}: step {d['step']}/{d['steps']} "
                      f"({d['step'] / max(d['steps'], 1):.0%}), loss {d['loss']:.4f}, "
                      f"{d.get('ticks_per_second', 0):.0f} ticks/s", file=sys.stderr, flush=True)
            return
        if time.monotonic() - last[0] < 0.2:
            return
        last[0] = time.monotonic()
        width = 30
        frac = d["step"] / max(d["steps"], 1)
        bar = "#" * int(width * frac) + "-" * (width - int(width * frac))
        print(f"\repoch {d['epoch']}/{d['epochs']} [{bar}] loss {d['loss']:.4f} {d.get('ticks_per_second', 0):.0f} ticks/s",
              end="", file=sys.stderr, flush=True)

    return show


def _stage_printer(enabled: bool) -> Any:
    """``evaluate``'s stage lines on a terminal: what it does next and the seconds since it began (a file of millions
    of ticks is read, stepped through the network and resampled for minutes); nothing when not ``enabled``."""
    t0 = time.monotonic()

    def stage(what: str) -> None:
        if enabled:
            print(f"[{time.monotonic() - t0:5.0f} s] {what}", file=sys.stderr, flush=True)

    return stage


# What ``evaluate`` holds per tick beyond its encoded inputs (mossy_size values of the network's float type, until
# the probabilities are made): probabilities, labels, per-row scores, the books (docs/training.md, "Large files": about
# 550 bytes a tick in all with the built-in 48 float32 inputs).
EVALUATE_BYTES_PER_TICK = 360


def evaluate_memory_warning(ticks: int, cfg: Config, available: int | None) -> str | None:
    """A warning when ``evaluate`` of ``ticks`` ticks needs more than the ``available`` bytes (None: unknown, no
    warning): said before the work, not after an out-of-memory kill minutes into it."""
    per_tick = cfg.neural.mossy_size * cfg.dtype_bytes + EVALUATE_BYTES_PER_TICK
    need = ticks * per_tick
    if available is None or need <= available:
        return None
    return (f"evaluating {ticks:,} ticks needs about {fmt_bytes(need)} of memory (about {per_tick} bytes a tick) and "
            f"this host has {fmt_bytes(available)} available: it may be killed for want of memory; evaluate a few "
            "markets or a shorter period at a time, as separate files (--since does not lower it)")


def _resolve(cfg: Config, files: list[str]) -> list[Path]:
    from .data import resolve_data_file

    paths = []
    for f in files:
        p = Path(f)
        if p.is_absolute() or p.exists():
            try:
                paths.append(p.resolve())
            except RuntimeError:  # a loop of symbolic links (Python 3.11/3.12; OSError ELOOP from 3.13)
                raise InputError(f"{f}: cannot open: a loop of symbolic links", "files") from None
            if p.is_symlink() and not p.exists():  # named as given: the target alone is a path never typed
                raise InputError(f"{f}: cannot open: a symbolic link to {os.readlink(p)!r}, which does not exist",
                                 "files")
        else:
            paths.append(resolve_data_file(Path(cfg.paths.data_dir), f))
    return paths


def _activate_offline(cfg: Config, version: str | None) -> None:
    """Name ``version`` the active model, holding the state dir's lock (None: only check that it is free).

    A service running on the state dir would keep serving its model and switch to this one, unannounced, at its
    next restart: InputError, naming how to activate the model through the service instead.
    """
    from ..engine.state_dir import StateDirLock

    state_dir = Path(cfg.paths.state_dir)
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        lock = StateDirLock(state_dir).acquire()
    except OSError as exc:
        raise StorageError.from_os_error("cannot create the state dir", state_dir, exc) from None
    except StorageError as exc:
        if exc.errno is not None:  # not writable: not a service's lock
            raise
        stored = f"model {version} is stored but not active" if version else "nothing was trained"
        how = f"/models/{version or '<version>'}/activate"
        raise InputError(f"--activate refused: {exc}; the service would keep serving its model and switch to this one"
                         f" at its next restart: {stored}; activate it through the service (curl -X POST -H \"Authorization:"
                         f" Bearer $TOKEN\" http://{cfg.server.host}:{cfg.server.port}{how})") from None
    try:
        if version is not None:
            ModelStore(Path(cfg.paths.state_dir)).set_active(version)
    finally:
        lock.release()


def cmd_train(cfg: Config, files: list[str], epochs: int | None, activate: bool, as_json: bool,
              from_scratch: bool = False) -> int:
    """``cerebellar-norse train``: train offline on CSV files, score the test split, store the model."""
    from .jobs import run_training
    from .report import format_summary, headline

    if activate:
        _activate_offline(cfg, None)  # refused before hours of training rather than after
    printed: set[str] = set()
    res = run_training(cfg, _resolve(cfg, files), epochs, _progress_printer(sys.stderr.isatty() and not as_json, printed),
                       None, from_scratch=from_scratch)
    if activate:
        _activate_offline(cfg, res["model_version"])
    res["activated"] = activate
    if not activate and ModelStore(Path(cfg.paths.state_dir)).active_version() is None:
        res["warnings"].append(f"models/ACTIVE names no model, so a service on this state dir serves the newest stored"
                               f" model: this one ({res['model_version']}); activate the one to serve")
    for w in res["warnings"]:
        if w not in printed:  # those the progress callback showed during the run are not said twice
            print(f"warning: {w}", file=sys.stderr)
    test = res.get("test") or {}
    until = (res.get("splits") or {}).get("validation_until")
    seen = res.get("test_seen_until")  # the end of a period the starting weights saw that reaches into the test split
    partly_in_sample = isinstance(seen, int) and until is not None and seen > until
    if as_json:
        from .jobs import finite_or_none

        print(json.dumps(finite_or_none(res), default=float, allow_nan=False))  # NaN (no moving labels) is null, as over HTTP
        return 0
    v = res["validation"]
    print(f"model {res['model_version']} stored in {Path(cfg.paths.state_dir) / 'models'}{' and activated' if activate else ''}")
    print(f"trained {res['started']}; edge on validation: {res['edge']}"
          + (" (no edge found: the model serves the base rates)" if res["edge"] == "none" else ""))
    print(f"validation (chose the epoch and the calibration): loss {v['loss']:.4f}, "
          f"accuracy {v['accuracy']:.3f} (majority baseline {v['majority_baseline_accuracy']:.3f}), "
          f"directional accuracy {v['directional_accuracy']:.3f} "
          f"(more common direction {v['directional_baseline_accuracy']:.3f})")
    if test.get("samples"):
        if partly_in_sample:
            assert isinstance(seen, int)
            what = (f"partly in sample: the model started from {res['lineage']['from']}, trained and validated up to "
                    f"{_unseen_since(seen - 1)}; evaluate --since {_unseen_since(seen)} scores only unseen ticks")
        else:
            what = "unseen, used for nothing" + (f"; evaluate --since {_unseen_since(until)} scores only ticks after the "
                                                 "model's training and validation data" if until is not None else "")
        print(f"\ntest split ({what}):")
        for line in headline({**test, "edge": res["edge"]}):
            print(line)
        print(format_summary(test))
    return 0


def _recorded_counts(metrics: dict[str, Any]) -> tuple[np.ndarray | None, str]:
    """The class counts a stored model's base rates come from, and where from: its training and validation
    splits (what a model without an edge serves); the training split for a model that recorded only that."""
    data = metrics.get("data")
    data = data if isinstance(data, dict) else {}

    def counts(key: str) -> np.ndarray | None:
        c = data.get(key)
        ok = isinstance(c, list) and len(c) == 3 and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in c)
        return np.asarray(c, dtype=np.int64) if ok else None

    train, val = counts("train_class_counts"), counts("validation_class_counts")
    if train is None:
        return None, ""
    if val is None:
        return train, "the model's training data"
    return train + val, "the model's training and validation data"


def _since_ms(text: str, data: TickData, zone: tzinfo) -> int:
    """``--since`` as ms since the epoch: written in the files' own compact form (``20130305`` where every file's
    times are YYYYMMDD dates, and likewise YYYYMMDDHH and YYYYMMDDHHMM[SS]), as they are read, in ``zone``; else a
    number is ms since the epoch and a date or date-time ISO 8601 (see :func:`~.csvtime.parse_time_ms`). A date
    written with slashes or dots (``3/8/2011``) is read in the order of the files' own such dates (month/day/year
    where they are so); where they have none, or both orders, only when both orders read it alike (``3/3/2011``)
    or one alone is a date (``13/8/2011``); else ValueError naming the ISO 8601 forms of both."""
    from .csvcolumns import DATE_ORDER
    from .csvtime import compact_form_ms, from_slash, parse_time_ms, slash_readings

    units = {f.time_unit or "" for f in data.formats}  # "" for ISO dates: no compact form
    compact = compact_form_ms(text, units.pop(), zone) if len(units) == 1 else None
    if compact is not None:
        return compact
    readings = slash_readings(text, "--since", zone)
    if not readings:
        return parse_time_ms(text, "--since", zone)
    orders = {f.dates for f in data.formats if f.dates is not None}
    if len(orders) == 1:
        day_first = orders.pop() == DATE_ORDER[True]
        if day_first not in readings:
            order = "D/M/YYYY" if day_first else "M/D/YYYY"
            raise ValueError(f"--since {text!r} is not a valid date read as {order}, as the files' dates are written")
        return readings[day_first]
    if len(set(readings.values())) == 1:
        return next(iter(readings.values()))
    why = "the files write both orders" if orders else "the files' dates do not say which comes first"
    raise ValueError(f"--since {text!r} could be day/month or month/day ({why}): write it as ISO 8601, "
                     f"{from_slash(text.strip(), False)} (month/day) or {from_slash(text.strip(), True)} (day/month)")


def _check_since(text: str | None, since_ms: int, data: TickData) -> None:
    """``--since`` after the files' last tick is an InputError; before their first tick it selects nothing, noted
    (a number is ms since the epoch, whatever unit the files' times are in, unless written as their dates are)."""
    from .datacheck import iso_ms

    first = min(float(m.timestamp[0]) for m in data.markets)
    last = max(float(m.timestamp[-1]) for m in data.markets)
    when = iso_ms(since_ms)
    if since_ms > last:
        raise InputError(f"{text} ({when}) is after the last tick of the files ({iso_ms(last)}): nothing to score",
                         "--since")
    if since_ms <= first:
        print(f"note: --since {text} ({when}) is not after the files' first tick ({iso_ms(first)}): every tick is scored"
              " (a number is ms since the epoch; an ISO time such as 2020-01-02T00:00:00Z needs no unit)", file=sys.stderr)


def _unseen_since(validation_until: int) -> str:
    """The ``--since`` that scores only ticks after a model's training and validation data."""
    from .datacheck import iso_ms

    return iso_ms(validation_until + 1)


def _in_sample(metrics: dict[str, Any], prep: Any, store: ModelStore | None = None) -> dict[str, Any] | None:
    """The scored ticks from the period a model was trained and validated on (from its ``train_from`` up to its
    ``validation_until``, whatever the market: markets of one period move together), or from the period any model it
    was trained from was (:func:`.checkpoints.seen_periods`; ticks between those periods are unseen), from the split
    times stored with them; None when there are none or the
    model did not record them. Without a recorded start (older models) every tick up to the end is counted. A tick
    before the period whose horizon ends in it is counted too: its label is a return the model was fitted on in part
    (the first training labels' returns), as a training label reaching into validation would be (the embargo). So are
    the scored ticks, of any time, of a span that repeats the training and validation data of the model, or of a
    stored model its training started from, under other dates or another name (:func:`.fingerprint.copied`;
    ``repeats``: per such market, its ticks and its stretches matched of those picked)."""
    from .datacheck import iso_ms
    from .fingerprint import WINDOW, copied, stretch_hashes
    from .trainer import market_list

    periods = seen_periods(metrics, store)  # ticks outside every one (before, between, after) are unseen
    hit: set[int] = set()  # the periods that hold scored ticks
    prints = [m["data"].get("fingerprint") for _, m in lineage_metrics(metrics, store) if isinstance(m.get("data"), dict)]
    by_time: dict[str, int] = {}
    copies: dict[str, tuple[int, int, int]] = {}  # market -> ticks, stretches matched, stretches picked
    total = 0
    for pm in prep.markets:
        total += int(pm.scored.sum())
        seen = np.zeros_like(pm.scored)
        ts = pm.ticks.timestamp
        end_ts = ts[np.maximum(pm.end, 0)]  # the time of each tick's horizon end (scored ticks all have one)
        for i, (first, last, _) in enumerate(periods):
            inside = pm.scored & (ts <= last) & (end_ts >= (first if first is not None else np.iinfo(np.int64).min))
            if inside.any():
                hit.add(i)
                seen |= inside
        if seen.any():
            by_time[pm.market_id] = int(seen.sum())
        hashes = stretch_hashes(pm.ticks.price)
        found = [c for c in (copied(fp, hashes, pm.scored & ~seen) for fp in prints) if c is not None]
        if found:  # the model's own data, or a model's it started from (whose weights it holds)
            mask = np.logical_or.reduce([c[0] for c in found])
            if mask.any():
                copies[pm.market_id] = (int(mask.sum()), sum(c[1] for c in found), sum(c[2] for c in found))
    per_market = {pm.market_id: by_time.get(pm.market_id, 0) + copies.get(pm.market_id, (0, 0, 0))[0]
                  for pm in prep.markets if pm.market_id in by_time or pm.market_id in copies}
    if not per_market:
        return None
    n = sum(per_market.values())
    parts = []
    used = [periods[i] for i in sorted(hit)]
    until = max((last for _, last, _ in used), default=None)  # the end of the latest period holding scored ticks
    start = min((first for first, _, _ in used if first is not None), default=None)
    if any(first is None for first, _, _ in used):
        start = None
    ancestor = next((who for _, last, who in used if last == until), None)
    if by_time:
        assert until is not None
        whose = ("the model was trained and validated on" if ancestor is None and len(used) == 1 else
                 f"the model it was trained from ({ancestor}, whose weights it started from) was trained and validated on"
                 if len(used) == 1 else
                 "the model and the models it was trained from (whose weights it started from) were trained and validated on")
        spans = ", ".join(f"{'' if first is None else f'from {iso_ms(first)} '}up to {iso_ms(last)}" for first, last, _ in used)
        parts.append(f"{sum(by_time.values())} are from the period{'s' if len(used) > 1 else ''} {whose} ({spans}"
                     f"{'' if start is None else ', or their horizon ends in it'})")
    if copies:
        matched = sum(c[1] for c in copies.values())
        picked = sum(c[2] for c in copies.values())
        parts.append(f"{sum(c[0] for c in copies.values())}, of {market_list({m: c[0] for m, c in copies.items()})}, "
                     "repeat the ticks the model (or one it started from) was trained and validated on under other "
                     f"dates or names ({matched} of {picked} stretches of {WINDOW} returns picked from them are the "
                     "training data's)")
    since = _unseen_since(until) if until is not None and by_time and not copies else None
    return {"ticks": n, "of": total, "markets": per_market, "train_from": start, "validation_until": until,
            "from_model": ancestor, "since": since,
            "repeats": {m: {"ticks": c[0], "matched": c[1], "picked": c[2]} for m, c in copies.items()} or None,
            "message": f"of the {total} scored ticks, {'; '.join(parts)}: these figures are in sample, not an estimate "
                       "on unseen data; " + (f"score only later ticks with --since {since}" if since else
                                            "score the model on ticks it was not trained on")}


def _in_sample_unknown(metrics: dict[str, Any], version: str, store: ModelStore | None = None) -> str | None:
    """Why the in-sample check (:func:`_in_sample`) cannot be made for a model, or None when it can: a model stored by
    an earlier version that recorded neither the split times of its data (``data.splits``) nor its fingerprint, nor
    does any model its training started from. Its training ticks would be scored as unseen, without a word."""
    data = metrics.get("data")
    if trained_on_generated(metrics) or seen_periods(metrics, store) or (isinstance(data, dict) and data.get("fingerprint")):
        return None
    return (f"model {version} records neither the period nor a fingerprint of the data it was trained and validated on "
            "(its metrics.json has no data.splits: it was stored by an earlier version of cerebellar-norse), so whether "
            "the scored ticks are in sample cannot be told; score it only on ticks it cannot have been trained on, or "
            "train it again with this version")


def cmd_evaluate(cfg: Config, files: list[str], version: str | None, report: str | None, cost_bp: float, bootstrap: int,
                 as_json: bool, since: str | None = None, mid_prices: bool = False) -> int:
    """``cerebellar-norse evaluate``: score a stored model on CSV ticks (warm-up excluded) against baselines.

    ``mid_prices`` (``--mid-prices``): the prices are mids or index levels, so no bid-ask bounce is read from them:
    ``summary["bounce"]`` keeps its figures with ``mid_prices`` true and no spread, and the verdict holds no spread
    against ``cost_bp``."""
    from .calibration import base_rates
    from .data import load_training_files
    from .report import format_summary, headline, render_html, verdict
    from .scoring import summarise
    from .trainer import market_list, prepare_for_scoring

    store = ModelStore(Path(cfg.paths.state_dir))
    version = version or store.active_version()
    if version is None:
        raise InputError(f"no active model in {store.root}: name one with --model (see GET /models)", "--model")
    if version not in store.versions():
        raise InputError(f"no model {version!r} in {store.root}", "--model")
    model = store.load(version)
    bad = shape_mismatch(model.neural, cfg.neural)
    if bad:
        raise InputError(f"model {version} does not fit this config ({', '.join(bad)} differ)", "--model")
    stage = _stage_printer(sys.stderr.isatty() and not as_json)
    stage(f"reading {len(files)} file(s)")
    data = load_training_files(_resolve(cfg, files), cfg.training)
    for note in data.notes:
        print(f"note: {note}", file=sys.stderr)
    from ..hostcheck import available_ram_bytes

    short = evaluate_memory_warning(data.ticks, cfg, available_ram_bytes())
    if short is not None:
        print(f"warning: {short}", file=sys.stderr)
    try:
        since_ms = _since_ms(since, data, cfg.training.data_zone) if since else None
    except ValueError as exc:
        raise InputError(str(exc).removeprefix("--since "), "--since") from None
    if since_ms is not None:
        _check_since(since, since_ms, data)
    prep = prepare_for_scoring(cfg, data, since_ms)
    counts, base_source = _recorded_counts(model.metrics)
    if counts is None:
        counts = np.bincount(prep.rows(2)[1], minlength=3)
        base_source = "the evaluated data (the model has no recorded training counts)"
    base = base_rates(counts)
    stage(f"running model {version} and the baselines over {sum(len(pm.ticks) for pm in prep.markets):,} ticks of "
          f"{len(prep.markets)} market(s)" + (", with bootstrap intervals" if bootstrap else ", no intervals"))
    summary, cumulative = summarise(cfg, model.weights, prep, 2, base, logistic="crossfit", cost_bp=cost_bp,
                                    bootstrap=bootstrap, release_mossy=True)
    if not summary.get("samples"):
        raise InputError(f"no tick to score: each market needs more than neural.warmup_ticks ({cfg.neural.warmup_ticks}) "
                         "ticks plus one horizon", "files")
    from .datacheck import check_warning, iso_ms, market_checks

    checks = {m.market_id: market_checks(m, prep.spec) for m in data.markets}
    checks = {k: v for k, v in checks.items() if v}
    for market_id, lines in checks.items():
        for line in lines:
            print(f"warning: {check_warning(market_id, line, 'the scored ticks, the labels and the P&L')}", file=sys.stderr)
    in_sample = _in_sample(model.metrics, prep, store)
    in_sample_unknown = None if in_sample else _in_sample_unknown(model.metrics, version, store)
    unscored = {pm.market_id: len(pm.ticks) for pm in prep.markets if not pm.scored.any()}
    summary.update({"model_version": version, "edge": model.metrics.get("edge"), "base_rates_from": base_source,
                    "warmup_ticks": cfg.neural.warmup_ticks, "files": [str(f) for f in files], "since": since,
                    "since_utc": None if since_ms is None else iso_ms(since_ms),
                    "in_sample": in_sample, "in_sample_unknown": in_sample_unknown, "unscored_markets": unscored, "data_checks": checks,
                    "stock_splits": data.stock_splits})
    if mid_prices and isinstance(summary.get("bounce"), dict):
        summary["bounce"] = {**summary["bounce"], "mid_prices": True, "spread_bp": None, "pooled_spread_bp": None,
                             "markets": {}}
    summary["verdict"] = verdict(summary)
    stage("scored")
    if unscored:
        print(f"note: {len(unscored)} market(s) have no scored tick and are not in the figures: {market_list(unscored)} (a "
              f"market's first neural.warmup_ticks = {cfg.neural.warmup_ticks} ticks only warm the network up, a scored "
              "tick needs one horizon after it" + (", and only ticks from --since on are scored" if since else "") + ")",
              file=sys.stderr)
    if in_sample:
        print(f"warning: {in_sample['message']}", file=sys.stderr)
    if in_sample_unknown:
        print(f"warning: {in_sample_unknown}", file=sys.stderr)
    if report:
        html = render_html(summary, cumulative, model.metrics.get("history"), title=f"cerebellar-norse evaluation of {version}")
        write_output(Path(report), html.encode("utf-8"))
    if as_json:
        print(json.dumps(summary, allow_nan=False))
    else:
        since_part = f"; from --since {since} = {iso_ms(since_ms)}" if since_ms is not None else ""
        print(f"model {version} on {summary['samples']} ticks ({summary['labels']}; first {cfg.neural.warmup_ticks} "
              f"ticks of each market excluded{since_part}; base rates from {base_source})")
        for line in headline(summary):
            print(line)
        print(format_summary(summary))
        if report:
            print(f"report written to {report}")
    return 0


def cmd_inspect_data(cfg: Config, files: list[str], as_json: bool) -> int:
    """``cerebellar-norse inspect-data``: how tick CSV files are read (columns, formats, bad rows, markets)."""
    from .datacheck import print_inspection

    return print_inspection(cfg, _resolve(cfg, files), as_json)


def cmd_make_data(output: Path, ticks: int, markets: int, seed: int) -> int:
    """``cerebellar-norse make-data``: write synthetic ticks as CSV."""
    from ..synthetic import iter_ticks
    from .data import csv_bytes

    # like every output file: through a link to its target, into a device or pipe (/dev/stdout), the umask's mode;
    # the ticks are turned into lines as they are generated (no list of them all: about 0.2 KB per tick at most)
    write_output(output, csv_bytes(iter_ticks(ticks, markets, seed)))
    print(f"wrote {ticks} ticks of {markets} markets to {output}")
    return 0


def served_weights_named(cfg: Config, command: str) -> tuple[Weights, str]:
    """The served weights (:func:`checkpoints.served_weights`) with a name for people.

    With no stored model to serve in the config's state dir these are the seed's untrained network, and ``command``
    says so on stderr with the models directory it looked in: run without ``--config`` on a service's host, the
    built-in default's state dir is ``./var`` of the working directory, not the service's."""
    w, version = served_weights(cfg)
    if version is None:
        models = Path(cfg.paths.state_dir) / "models"
        print(f"cerebellar-norse: {command}: no model to serve is stored in {models.resolve()}: these are the "
              f"untrained network's weights of seed {cfg.neural.seed}, not a trained model's (fix: pass the service's "
              "config, e.g. --config /etc/cerebellar-norse/production.toml, whose paths.state_dir holds its models)",
              file=sys.stderr)
    return w, version or f"untrained (seed {cfg.neural.seed})"


def layer_stats(w: Any) -> dict[str, dict[str, float]]:
    """Per-layer statistics of a weights object: the weight layers and the calibrated head, as analyze-weights names them."""
    out = {}
    for name, attr in {**LAYERS, **HEAD_LAYERS}.items():
        a = np.asarray(getattr(w, attr), dtype=np.float64)
        out[name] = {"count": int(a.size), "mean": float(a.mean()), "std": float(a.std()), "min": float(a.min()),
                     "max": float(a.max()), "abs_mean": float(np.abs(a).mean()), "zero_fraction": float(np.mean(a == 0))}
    return out


def cmd_dump_weights(cfg: Config, fmt: str, output: str | None) -> int:
    """``--dump-weights``: statistics per layer of the served model (or all weights as npz), to stdout or ``output``
    (the untrained network's said on stderr, :func:`served_weights_named`)."""
    w, version = served_weights_named(cfg, "--dump-weights")
    if fmt == "npz":
        _dump(weights_to_bytes(w), output, f"weights of model {version}")
        return 0
    stats = layer_stats(w)
    if fmt == "json":
        _dump(json.dumps({"model_version": version, "layers": stats}) + "\n", output,
              f"weight statistics of model {version}")
        return 0
    buf = io.StringIO()
    print(f"model {version}", file=buf)
    print(f"{'layer':<26}{'count':>9}{'mean':>12}{'std':>12}{'min':>12}{'max':>12}", file=buf)
    for name, s in stats.items():
        print(f"{name:<26}{s['count']:>9}{s['mean']:>12.5f}{s['std']:>12.5f}{s['min']:>12.5f}{s['max']:>12.5f}", file=buf)
    _dump(buf.getvalue(), output, f"weight statistics of model {version}")
    return 0


def _dump(data: str | bytes, output: str | None, what: str) -> None:
    """``data`` (text, or bytes) to stdout, or written to ``output`` as every output file is, and said so on stderr."""
    if output is None:
        if isinstance(data, str):
            sys.stdout.write(data)
        else:
            sys.stdout.buffer.write(data)
        return
    write_output(Path(output), data.encode() if isinstance(data, str) else data)
    print(f"wrote {what} to {output}", file=sys.stderr)


STATE_DIR_FIX = "pass the state dir, e.g. /var/lib/cerebellar-norse/"
MODEL_DIR_FIX = (f"pass a model directory, the one holding {MANIFEST}, or a directory of them, "
                 "e.g. /var/lib/cerebellar-norse/models/")


def not_a_directory(path: Path) -> str | None:
    """Why ``path`` cannot be read as a directory ("does not exist", "is not a directory"), or None when it can."""
    if path.is_dir():
        return None
    if not path.exists():
        return "does not exist"
    return "is not a directory"


def cmd_verify_data(root: str) -> int:
    """``--verify-data DIR``: SHA-256 manifests of every model and market state file, and every recording, under DIR.

    Problems (exit 1) and warnings (e.g. the last line of an open recording cut by a
    crash) go to stderr, one line each naming the file.
    """
    from ..engine.recording import verify_recordings

    why = not_a_directory(Path(root))
    if why is not None:
        print(f"cerebellar-norse: {root}: {why} (fix: {STATE_DIR_FIX})", file=sys.stderr)
        return 1
    try:
        ok, problems = verify_tree(Path(root))
    except OSError as exc:  # a file or directory it cannot read (permissions): named as such, not as a failed write
        where = exc.filename or root
        print(f"cerebellar-norse: {StorageError.from_os_error('cannot read', where, exc)}: verification stopped there; make "
              "it readable (by the service's user too) and verify again", file=sys.stderr)
        return 1
    recordings = verify_recordings(Path(root))
    ok += recordings.ok
    problems += recordings.problems
    for line in ok:
        print(line)
    for line in recordings.warnings:
        print(f"cerebellar-norse: warning: {line}", file=sys.stderr)
    for line in problems:
        print(f"cerebellar-norse: {line}", file=sys.stderr)
    if not ok and not problems and not recordings.warnings:
        print(f"cerebellar-norse: {root}: no models or state files found, and no recordings", file=sys.stderr)
        return 1
    return 1 if problems else 0


def cmd_validate_model(path: str) -> int:
    """``--validate-model DIR``: a model directory, or every model directory in DIR."""
    p = Path(path)
    why = not_a_directory(p)
    if why is not None:
        print(f"cerebellar-norse: {path}: {why} (fix: {MODEL_DIR_FIX})", file=sys.stderr)
        return 1
    try:
        dirs = [p] if (p / MANIFEST).exists() else sorted(d for d in p.iterdir() if d.is_dir() and not d.name.startswith("."))
    except OSError as exc:  # a directory it may not list (permissions): named as a read, not as a failed write
        print(f"cerebellar-norse: {StorageError.from_os_error('cannot read', path, exc)}: nothing in it "
              "was verified; make it readable (by the service's user too) and verify again", file=sys.stderr)
        return 1
    if not dirs:
        print(f"cerebellar-norse: {path}: no model directory found: neither {MANIFEST} nor a model directory in it "
              f"(fix: {MODEL_DIR_FIX})", file=sys.stderr)
        return 1
    bad = 0
    for d in dirs:
        try:
            m = load_model_dir(d)
            s = m.weights.shape
            print(f"{d}: model {m.version} OK ({s.granule} granule, {s.purkinje} Purkinje, {s.dcn} DCN)")
        except CheckpointError as exc:
            bad += 1
            print(f"cerebellar-norse: {exc}", file=sys.stderr)
    return 1 if bad else 0


def cmd_replay(cfg: Config, path: Path, as_json: bool, market: str | None = None, detect_divergence: bool = False,
               tolerance: float | None = None) -> int:
    """``cerebellar-norse replay FILE``: feed a recording (with its recorded model versions) or a tick CSV through a fresh network.

    See :mod:`cerebellar_norse.training.replay`; ``detect_divergence`` compares every
    result with what was served (exit 1 when a market diverges beyond ``tolerance``).
    """
    from .replay import DEFAULT_TOLERANCE, run_replay

    return run_replay(cfg, path, as_json, market, detect_divergence, DEFAULT_TOLERANCE if tolerance is None else tolerance)
