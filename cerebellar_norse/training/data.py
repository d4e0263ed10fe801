"""Training data: CSV files of ticks and the labels computed from them.

Format: a header line naming the columns ``timestamp,market_id,price,volume`` (any
order, no other columns), then one tick per line: timestamp in ms since the epoch
(integer), market id (1–64 printable characters), price (> 0) and volume (>= 0).

Bad rows (missing fields, non-numbers, non-finite or out-of-range values, time
going backwards within a market) are skipped and reported as ``file:line: reason``;
a load with more than ``max_bad_row_fraction`` bad rows fails with that report.

Labels: for tick t of a market, the log return to tick t + ``horizon`` of the same
market is ``down`` (< -flat_band), ``flat`` (|r| <= flat_band) or ``up`` (> flat_band).
The last ``horizon`` ticks of a market have no label (-1).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import numpy as np

from ..errors import DataError, InputError
from ..ticks import MARKET_ID_MAX, TS_MAX_MS, TS_MIN_MS

COLUMNS = ("timestamp", "market_id", "price", "volume")
CLASS_NAMES = ("down", "flat", "up")
MIN_SAMPLES_PER_CLASS = 10_000
MAX_REPORTED = 50


@dataclass
class MarketSeries:
    """One market's ticks in time order (float64 arrays; timestamps in ms)."""

    market_id: str
    timestamp: np.ndarray
    price: np.ndarray
    volume: np.ndarray

    def __len__(self) -> int:
        return int(self.price.shape[0])


@dataclass
class TickData:
    """Ticks loaded from CSV files, per market, with the bad-row report."""

    markets: list[MarketSeries]
    rows: int
    bad_rows: int
    report: list[str] = field(default_factory=list)

    @property
    def ticks(self) -> int:
        """Good ticks across markets."""
        return sum(len(m) for m in self.markets)


def resolve_data_file(data_dir: Path, name: str) -> Path:
    """A file name relative to the data dir; absolute paths and ``..`` are refused."""
    if not name or "\x00" in name:
        raise InputError("file name is empty or contains NUL", "files")
    pure = PurePosixPath(name)
    if pure.is_absolute() or name.startswith(("/", "\\")) or any(p == ".." for p in pure.parts):
        raise InputError(f"{name!r}: file names must be relative to the data dir, without '..'", "files")
    path = (Path(data_dir) / pure).resolve()
    base = Path(data_dir).resolve()
    if base not in path.parents and path != base:
        raise InputError(f"{name!r} resolves outside the data dir", "files")
    if not path.is_file():
        raise InputError(f"{name!r} does not exist in the data dir {base}", "files")
    return path


def _parse_row(row: list[str], idx: dict[str, int]) -> tuple[int, str, float, float]:
    if len(row) != len(COLUMNS):
        raise ValueError(f"expected {len(COLUMNS)} fields, got {len(row)}")
    ts_text = row[idx["timestamp"]].strip()
    try:
        ts = int(ts_text)
    except ValueError:
        raise ValueError(f"timestamp {ts_text!r} is not an integer (ms since epoch)") from None
    if not TS_MIN_MS <= ts < TS_MAX_MS:
        raise ValueError(f"timestamp {ts} is not a plausible time in ms since epoch")
    market = row[idx["market_id"]].strip()
    if not 1 <= len(market) <= MARKET_ID_MAX or not all(" " <= ch <= "~" for ch in market):
        raise ValueError(f"market_id {market!r} is not 1-{MARKET_ID_MAX} printable characters")
    vals = []
    for name in ("price", "volume"):
        text = row[idx[name]].strip()
        try:
            v = float(text)
        except ValueError:
            raise ValueError(f"{name} {text!r} is not a number") from None
        if not math.isfinite(v):
            raise ValueError(f"{name} {text!r} is not finite")
        vals.append(v)
    price, volume = vals
    if price <= 0:
        raise ValueError(f"price {price} is not > 0")
    if volume < 0:
        raise ValueError(f"volume {volume} is negative")
    return ts, market, price, volume


def load_csv_files(paths: list[Path], max_bad_fraction: float = 0.01) -> TickData:
    """Read tick CSV files (in the given order) into per-market series.

    Raises:
        DataError: a file has no valid header, no good rows, or too many bad rows
            (the report lists ``file:line: reason`` for each, the first 50 in the message).
    """
    per_market: dict[str, list[tuple[int, float, float]]] = {}
    last_ts: dict[str, int] = {}
    report: list[str] = []
    rows = bad = 0
    for path in paths:
        try:
            fh = open(path, newline="", encoding="utf-8")  # noqa: SIM115 (closed by the with below)
        except OSError as exc:
            raise DataError(f"{path}: cannot open: {exc.strerror}", [f"{path}: cannot open"]) from None
        with fh:
            reader = csv.reader(fh)
            try:
                header = next(reader)
            except StopIteration:
                raise DataError(f"{path}: empty file (a header {','.join(COLUMNS)} is required)", [f"{path}:1: empty file"]) from None
            except (csv.Error, UnicodeDecodeError) as exc:
                raise DataError(f"{path}:1: unreadable header: {exc}", [f"{path}:1: unreadable header"]) from None
            names = [h.strip().lower() for h in header]
            if sorted(names) != sorted(COLUMNS):
                msg = f"{path}:1: header must name the columns {','.join(COLUMNS)}, got {','.join(names)}"
                raise DataError(msg, [msg])
            idx = {n: names.index(n) for n in COLUMNS}
            line = 1
            while True:
                try:
                    row = next(reader)
                except StopIteration:
                    break
                except (csv.Error, UnicodeDecodeError) as exc:
                    line += 1
                    rows += 1
                    bad += 1
                    report.append(f"{path}:{line}: unreadable row: {exc}")
                    continue
                line = reader.line_num
                if not row or all(not c.strip() for c in row):
                    continue
                rows += 1
                try:
                    ts, market, price, volume = _parse_row(row, idx)
                    prev = last_ts.get(market)
                    if prev is not None and ts < prev:
                        raise ValueError(f"time goes backwards for market {market!r} ({ts} < {prev})")
                except ValueError as exc:
                    bad += 1
                    report.append(f"{path}:{line}: {exc}")
                    continue
                last_ts[market] = ts
                per_market.setdefault(market, []).append((ts, price, volume))
    if rows == 0 or not per_market:
        raise DataError("no valid tick rows in " + ", ".join(str(p) for p in paths), report[:MAX_REPORTED])
    if bad > max_bad_fraction * rows:
        shown = "\n".join(report[:MAX_REPORTED])
        more = f"\n… and {len(report) - MAX_REPORTED} more" if len(report) > MAX_REPORTED else ""
        raise DataError(f"{bad} of {rows} rows are bad ({bad / rows:.2%} > max_bad_row_fraction {max_bad_fraction:.2%}):\n{shown}{more}", report)
    markets = []
    for market in sorted(per_market):
        arr = np.array(per_market[market], dtype=np.float64)
        markets.append(MarketSeries(market, arr[:, 0], arr[:, 1], arr[:, 2]))
    return TickData(markets, rows, bad, report)


def horizon_labels(price: np.ndarray, horizon: int, flat_band: float) -> np.ndarray:
    """Class per tick (0 down, 1 flat, 2 up) of the log return over ``horizon`` ticks; -1 where unknown."""
    n = price.shape[0]
    labels = np.full(n, -1, dtype=np.int64)
    if n > horizon:
        r = np.log(price[horizon:] / price[:-horizon])
        labels[:-horizon] = np.where(r > flat_band, 2, np.where(r < -flat_band, 0, 1))
    return labels


def class_counts(labels: list[np.ndarray]) -> np.ndarray:
    """Samples per class (down, flat, up) over labelled ticks."""
    allv = np.concatenate(labels) if labels else np.zeros(0, dtype=np.int64)
    return np.bincount(allv[allv >= 0], minlength=3)


def class_warnings(counts: np.ndarray, minimum: int = MIN_SAMPLES_PER_CLASS) -> list[str]:
    """Warnings for classes with fewer than ``minimum`` samples (the operations guide's minimum)."""
    return [f"class {CLASS_NAMES[k]} has {int(c)} samples, fewer than the recommended {minimum}"
            for k, c in enumerate(counts) if c < minimum]


def write_csv(path: Path, ticks: list[dict[str, object]]) -> None:
    """Write ticks as a CSV with the standard header (used by ``make-data``)."""
    from ..storage import atomic_write_bytes

    lines = [",".join(COLUMNS)]
    lines.extend(f"{t['timestamp']},{t['market_id']},{t['price']!r},{t['volume']!r}" for t in ticks)
    atomic_write_bytes(path, ("\n".join(lines) + "\n").encode("utf-8"))
