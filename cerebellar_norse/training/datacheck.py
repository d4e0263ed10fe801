"""``cerebellar-norse inspect-data``: how tick files are read, before anything is trained on them.

Loads the files as ``train`` and ``evaluate`` do (same rules, same ``max_bad_row_fraction``)
and says, per file, which separator, header lines and columns were used and how dates and
row order were understood; then the bad rows, the notes, per market its ticks, time
span and median gap between ticks, data checks (exact repeats, a gap or a move that
dwarfs the usual ones), and the labels training would see (the config's
horizon and flat band): the classes of each split, or why training would refuse the
files. Nothing is written.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from ..config import Config
from ..errors import CerebellarNorseError
from .csvcolumns import FileFormat
from .csvtime import UNIT_WORDS
from .data import CLASS_NAMES, MarketSeries, TickData, iso_ms
from .labels import LabelSpec, label_series

SHOWN_BAD_ROWS = 10


def span(ms: float) -> str:
    """A duration in ms as ``1d 02:03:04`` (days only when there are some; ``.250`` for ms)."""
    total_s, rest_ms = divmod(round(ms), 1000)
    days, s = divmod(total_s, 86_400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    text = f"{h:02d}:{m:02d}:{s:02d}" + (f".{rest_ms:03d}" if rest_ms else "")
    return f"{days}d {text}" if days else text


BAR_GAP_MS = 60_000  # a median gap of this or more: bars, two of which at one time are told
GAP_FACTOR = 50.0  # a gap this many times the median gap (and over a day) is named
MOVE_FACTOR = 25.0  # a tick-to-tick move this many times the median move (and over 5%) is named
MOVE_MIN = 0.05  # log-return units


DAY_MS = 86_400_000
CLOSED_SPAN_DAYS = 14  # a market whose ticks span this many days shows the days of the week it never trades
HOLIDAYS_PER_GAP = 2  # whole trading days without a tick a gap may hold as holidays (Good Friday and Easter Monday)
HOLIDAYS_PER_YEAR = 20  # ... and over the series, a year (exchanges close 8 to 19 weekdays a year)
WEEKDAY_NAMES = ("Mondays", "Tuesdays", "Wednesdays", "Thursdays", "Fridays", "Saturdays", "Sundays")


def _closed_weekdays(t: np.ndarray) -> frozenset[int]:
    """The days of the week (UTC, 0 Monday … 6 Sunday) on which a market has no tick, where its ticks span
    ``CLOSED_SPAN_DAYS`` days or more (an exchange's weekend); none otherwise, or where it has a tick every day."""
    if t[-1] - t[0] < CLOSED_SPAN_DAYS * DAY_MS:
        return frozenset()
    days = np.floor_divide(t, DAY_MS).astype(np.int64)
    traded = set(((np.unique(days) + 3) % 7).tolist())  # 1970-01-01 was a Thursday (3)
    return frozenset(range(7)) - traded if len(traded) < 7 else frozenset()


def _closed_ms(start: float, end: float, closed: frozenset[int]) -> float:
    """The ms from ``start`` to ``end`` that fall on the days of the week in ``closed`` (UTC)."""
    if not closed:
        return 0.0
    total = 0.0
    day = int(start // DAY_MS)
    while day * DAY_MS < end:
        if (day + 3) % 7 in closed:
            total += min(end, (day + 1) * DAY_MS) - max(start, day * DAY_MS)
        day += 1
    return total


def _missing_open_days(start: float, end: float, closed: frozenset[int]) -> int:
    """The whole days (UTC) strictly between ``start`` and ``end`` that are not in ``closed``: days the market trades
    on other weeks but has no tick on here (a holiday, or data missing)."""
    first = int(-(-start // DAY_MS))  # the first midnight at or after start
    if first * DAY_MS == start:
        first += 1  # a day that starts at the gap's first tick holds that tick
    last = int(end // DAY_MS)  # the day holding end (or starting at it) is not whole inside the gap
    return sum((day + 3) % 7 not in closed for day in range(first, last))


def _judged_gaps(t: np.ndarray, gaps: np.ndarray, closed: frozenset[int]) -> tuple[dict[int, float], dict[int, float]]:
    """For each gap over a day (by its index): its length less the closed days of the week it spans (``open``), and
    the length it is judged by (``judged``): ``open`` less, for a gap that spans a closed day, the market's usual weekend
    (the median ``open`` of such gaps: a futures market's Sunday evening, FX's Sunday until 22:00 UTC, an exchange's
    night), and less up to ``HOLIDAYS_PER_GAP`` whole days of the week it trades on but has no tick in the gap
    (holidays: Good Friday beside a weekend, a midweek holiday), as long as those come to ``HOLIDAYS_PER_YEAR`` a year
    or less over the series (more would be data missing, not holidays); none for a market with no closed days."""
    day_gaps = np.flatnonzero(gaps > DAY_MS).tolist()
    open_: dict[int, float] = {}
    weekend: list[int] = []
    for i in day_gaps:
        open_[i] = float(gaps[i]) - _closed_ms(float(t[i]), float(t[i + 1]), closed)
        if open_[i] < gaps[i]:
            weekend.append(i)
    usual = float(np.median([open_[i] for i in weekend])) if len(weekend) >= 2 else 0.0
    holidays = {i: min(HOLIDAYS_PER_GAP, _missing_open_days(float(t[i]), float(t[i + 1]), closed)) if closed else 0
                for i in day_gaps}
    years = max(1.0, (float(t[-1]) - float(t[0])) / (365.25 * DAY_MS))
    if sum(holidays.values()) > HOLIDAYS_PER_YEAR * years:
        holidays = dict.fromkeys(day_gaps, 0)
    judged = {i: open_[i] - (min(usual, open_[i]) if i in weekend else 0.0) - holidays[i] * DAY_MS for i in day_gaps}
    return open_, judged


def _day_names(closed: frozenset[int]) -> str:
    names = [WEEKDAY_NAMES[d] for d in sorted(closed)]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def market_checks(m: MarketSeries, spec: LabelSpec | None = None) -> list[str]:
    """What a trader would want to know before trusting a market's series: exact repeats of the previous tick
    (a file appended twice, a feed that resent), the longest gap when it dwarfs the median gap (a missing year),
    and the largest tick-to-tick move when it dwarfs the median move (a fat-finger or unadjusted split); with the
    labels' ``spec`` (a flat band scaled by the volatility), how much more often the labels after that move are flat
    (:func:`_flat_after`)."""
    out: list[str] = []
    if len(m) < 2:
        return out
    t, p, v = m.timestamp, m.price, m.volume
    repeats = int(np.count_nonzero((np.diff(t) == 0) & (np.diff(p) == 0) & (np.diff(v) == 0)))
    if repeats:
        out.append(f"{repeats} tick{'s repeat' if repeats != 1 else ' repeats'} the previous one exactly (same time,"
                   " price and volume): a file read twice, or a feed that resent?")
    gaps = np.diff(t)
    median_gap = float(np.median(gaps))
    if median_gap >= BAR_GAP_MS:  # bars: two at one time are no trades in a burst
        same = np.flatnonzero((gaps == 0) & ((np.diff(p) != 0) | (np.diff(v) != 0)))
        if same.size:
            out.append(f"{same.size} tick{'s share their' if same.size != 1 else ' shares its'} time with the previous"
                       f" one but not its price or volume (the first at {iso_ms(float(t[same[0] + 1]))}), though the"
                       f" median gap is {span(median_gap)}: two bars at one time, as bars stamped in local time give in"
                       " the hour the clocks go back (01:00 twice, which no time zone tells apart), or two sources"
                       " merged?")
    floor = max(float(DAY_MS), GAP_FACTOR * max(median_gap, 1.0))
    candidates = np.flatnonzero(gaps > floor)
    if candidates.size:
        closed = _closed_weekdays(t)
        open_, judged = _judged_gaps(t, gaps, closed)
        worst, k = max((judged[int(i)], int(i)) for i in candidates)
        # what is left once a weekend or holidays are out is told from a day on: 3 trading days missing beside a
        # weekend leave a day exactly
        if worst > floor or (worst == floor and worst < open_[k]):
            longest = open_[k]
            without = (f", {span(longest)} without the {_day_names(closed)} it spans, on which the market has no ticks"
                       if longest < gaps[k] else "")
            out.append(f"a gap of {span(float(gaps[k]))} before {iso_ms(float(t[k + 1]))},"
                       f" {gaps[k] / max(median_gap, 1.0):.0f} times the median gap ({span(median_gap)}){without}")
    with np.errstate(divide="ignore", invalid="ignore"):
        moves = np.abs(np.diff(np.log(p)))
    moves = np.where(np.isfinite(moves), moves, 0.0)
    j = int(np.argmax(moves))
    median_move = float(np.median(moves[moves > 0])) if np.any(moves > 0) else 0.0
    if moves[j] > MOVE_MIN and moves[j] > MOVE_FACTOR * median_move:
        times = f", {moves[j] / median_move:.0f} times the median move" if median_move > 0 else ""
        out.append(f"a move of {np.expm1(np.log(p[j + 1] / p[j])) * 100:+.1f}% at {iso_ms(float(t[j + 1]))} "
                   f"({p[j]:g} -> {p[j + 1]:g}){times}: a bad print, an unadjusted split or a futures roll?"
                   + (_flat_after(m, j + 1, spec) if spec is not None and spec.volatility_band else ""))
    return out


FLAT_AFTER_WINDOWS = 3  # the labels after an outsized move compared: this many volatility windows of ticks
FLAT_AFTER_EXCESS = 0.1  # told when their flat share is this much above the share of the market's other labels


def _flat_after(m: MarketSeries, at: int, spec: LabelSpec) -> str:
    """``" The flat band …"``: the share of flat labels in the ``FLAT_AFTER_WINDOWS`` × ``volatility_window`` ticks
    from tick ``at`` (an outsized move) on, against that of the market's other labels, when it is
    ``FLAT_AFTER_EXCESS`` above it: the move's square weighs in the running volatility that scales the flat band
    until the window forgets it, so a split read as a crash leaves the labels after it flat. Else ``""``."""
    labels = label_series(m.timestamp, m.price, spec).labels
    after = np.zeros(labels.shape[0], dtype=bool)
    after[at:at + FLAT_AFTER_WINDOWS * spec.volatility_window] = True
    labelled = labels >= 0
    n_after, n_other = int(np.count_nonzero(after & labelled)), int(np.count_nonzero(~after & labelled))
    if not n_after or not n_other:
        return ""
    share_after = np.count_nonzero(after & (labels == 1)) / n_after
    share_other = np.count_nonzero(~after & (labels == 1)) / n_other
    if share_after < share_other + FLAT_AFTER_EXCESS:
        return ""
    return (f" The flat band scales with the running volatility, which the move inflates: {share_after:.0%} of the"
            f" {n_after} labels of the {FLAT_AFTER_WINDOWS * spec.volatility_window} ticks from it on are flat,"
            f" against {share_other:.0%} of the others")


def check_warning(market_id: str, check: str, included_in: str) -> str:
    """One of :func:`market_checks` as the warning ``train`` and ``evaluate`` give: told, not acted on, and what
    includes it where it falls (``included_in``, e.g. "the scored ticks, the labels and the P&L")."""
    return f"data check: {market_id}: {check} (in the files; told, not acted on: where it falls in {included_in} include it)"


def market_summary(m: MarketSeries, spec: LabelSpec | None = None) -> dict[str, Any]:
    """Ticks, first and last time, the median gap between ticks (ms; None for one tick) and the checks
    (:func:`market_checks`, with the labels' ``spec``) of a market."""
    gaps = np.diff(m.timestamp)
    return {"market_id": m.market_id, "ticks": len(m), "first": iso_ms(float(m.timestamp[0])),
            "last": iso_ms(float(m.timestamp[-1])), "median_gap_ms": float(np.median(gaps)) if gaps.size else None,
            "checks": market_checks(m, spec)}


def labels_summary(cfg: Config, data: TickData) -> dict[str, Any]:
    """The labels training on ``data`` would see: per split the classes (down, flat, up) and the warnings; or,
    when training would refuse the data, ``refused`` with the reason."""
    from .trainer import prepare

    try:
        prep = prepare(cfg, data, encode=False)  # labels only: encoded inputs took 192 bytes a tick, unread
    except CerebellarNorseError as exc:
        return {"refused": str(exc)}
    splits = {"train": prep.train_counts, "validation": prep.val_counts, "test": prep.test_counts}
    return {"labels": prep.spec.describe(), "warnings": prep.warnings,
            **{name: {c: int(n[k]) for k, c in enumerate(CLASS_NAMES)} for name, n in splits.items()}}


def summary(data: TickData, labels: dict[str, Any], spec: LabelSpec | None = None) -> dict[str, Any]:
    """The JSON object ``inspect-data --json`` prints."""
    return {"files": [asdict(f) for f in data.formats], "rows": data.rows, "bad_rows": data.bad_rows,
            "skipped_rows": data.skipped_rows, "ticks": data.ticks, "report": data.report, "notes": data.notes,
            "stock_splits": data.stock_splits, "markets": [market_summary(m, spec) for m in data.markets], "training": labels}


def describe_format(f: FileFormat) -> list[str]:
    """Two lines on how one file was read."""
    order = "newest first (read in reverse)" if f.newest_first else "oldest first"
    numbers = "; decimal commas" if f.decimal_comma else ""
    lines = f"{f.header_lines} header line" + ("s" if f.header_lines != 1 else "") if f.header_lines else "no header line"
    first = f"{f.path}: separator '{f.separator}', {lines}, rows {order}{numbers}"
    market = f"'{f.market}'" if f.market is not None else f"{f.default_market!r} for every row"
    volume = f"'{f.volume}'" if f.volume is not None else "none (0)"
    if f.ask_volume is not None:
        volume += f" + '{f.ask_volume}'"
    price = f"'{f.price}'" + (f" and '{f.ask}' (mid)" if f.ask is not None else "")
    dates = f" ({f.dates})" if f.dates else ""
    unit = f" ({UNIT_WORDS[f.time_unit]})" if f.time_unit not in (None, "ms") else ""
    time = f"'{f.time}'" if f.time else "the unnamed first column"
    return [first, f"  time {time}{dates}{unit}, price {price}, volume {volume}, market {market}"]


def format_text(data: TickData, labels: dict[str, Any], spec: LabelSpec | None = None) -> str:
    """The text ``inspect-data`` prints."""
    out = [line for f in data.formats for line in describe_format(f)]
    skipped = f", skipped {data.skipped_rows}" if data.skipped_rows else ""
    out.append(f"rows {data.rows}, bad {data.bad_rows}{skipped}, ticks {data.ticks} in {len(data.markets)} "
               f"market{'s' if len(data.markets) != 1 else ''}")
    if data.report:
        out.append("bad rows:")
        out += [f"  {r}" for r in data.report[:SHOWN_BAD_ROWS]]
        if len(data.report) > SHOWN_BAD_ROWS:
            out.append(f"  … and {len(data.report) - SHOWN_BAD_ROWS} more")
    if data.notes:
        out.append("notes:")
        out += [f"  {n}" for n in data.notes]
    rows = [market_summary(m, spec) for m in data.markets]
    width = max([len("market"), *(len(r["market_id"]) for r in rows)])
    out.append(f"{'market':<{width}}  {'ticks':>8}  {'first':<24}  {'last':<24}  median gap")
    for r in rows:
        gap = span(r["median_gap_ms"]) if r["median_gap_ms"] is not None else "-"
        out.append(f"{r['market_id']:<{width}}  {r['ticks']:>8}  {r['first']:<24}  {r['last']:<24}  {gap}")
    checks = [f"  {r['market_id']}: {c}" for r in rows for c in r["checks"]]
    if checks:
        out.append("data checks:")
        out += checks
    if "refused" in labels:
        out.append(f"training would refuse these files: {labels['refused']}")
    else:
        out.append(f"labels for training ({labels['labels']}; down / flat / up):")
        out += [f"  {name:<10} {' / '.join(str(labels[name][c]) for c in CLASS_NAMES)}"
                for name in ("train", "validation", "test")]
        out += [f"  warning: {w}" for w in labels["warnings"]]
    return "\n".join(out)


def print_inspection(cfg: Config, files: list[Path], as_json: bool) -> int:
    """Load ``files`` as training would with ``cfg`` and print how they were read and labelled; a load that
    fails raises its ``DataError`` (exit 1)."""
    from .data import load_training_files

    data = load_training_files(files, cfg.training)
    labels = labels_summary(cfg, data)
    spec = LabelSpec.from_config(cfg)
    print(json.dumps(summary(data, labels, spec), allow_nan=False) if as_json else format_text(data, labels, spec))
    return 0
