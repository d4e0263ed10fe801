"""Stock splits left in a series of prices that are not adjusted for them (``training.adjust_splits``).

A daily file of a stock's closes as traded (``Date,Open,High,Low,Close,Volume`` without an adjusted close, or a
``Close`` beside an ``Adj Close`` that is not used) shows a 2:1 split as a fall of 50 % in one bar: not a price move,
but a label, a volatility that scales the flat band for hundreds of ticks after it, and a day's P&L in every model
and baseline (a model short that day "earns" the split). A move is read as a split when

- it is over ``MOVE_MIN`` (5 %) and ``MOVE_FACTOR`` (25) times the market's median move (as the data checks judge an
  outsized move),
- its two ticks fall on different days (UTC): a split takes effect at a session's open, never within one,
- its ratio is within a tight tolerance of a common split ratio (``RATIOS``: 2:1 … 100:1, 3:2, 4:3, 5:4, 5:2 and
  the reverse splits 1:2 … 1:100): what is left of the move once the split is taken out, ``|log(ratio × k)|``, is at
  most ``TOLERANCE`` (2 %) of the split's own ``|log k|``, or ``TOLERANCE_FLOOR`` (0.5 %): 0.5 % for 5:4, 0.8 % for
  3:2, 1.4 % for 2:1, 2.8 % for 4:1, 4.6 % for 10:1 (a genuine
  move of 90 % in a day is out of reach of a listed stock; one of 33 % is not, so a small ratio is matched tightly),
- both its ticks have a volume (a series without volumes, a FRED series, an index level, is no share price: WTI's
  fall of 33.4 % on 1991-01-17 is 0.1 % off 3:2), and after a reverse split the median volume of the 20 ticks from
  it on is at most 1.5 times that of the 20 up to it (a jump on news trades many more shares),
- and it is not undone by the inverse ratio within ``UNDONE_WITHIN`` ticks (a bad print of 100 times the price for a
  tick is no 1:100 reverse split followed by a 100:1 split).

Then the prices before the split are divided by its ratio and, where the volumes changed by about the ratio at the
split (volumes as traded), the volumes multiplied by it (shares before the split counted as shares after it, as
vendors adjust them; volumes that did not change were adjusted already and are left), so the series reads as an
adjusted close would, and a note names
the market, the time, the move, the ratio and what was done. A genuine move within the tolerance of a ratio (a fall of
50.3 % in a day) is taken for a split too: ``training.adjust_splits = false`` (``--no-split-adjust``) reads every
price as written. A move that matches no ratio (a crash of 34 %, a split on a day the stock moved 8 % besides, the
roll of a continuous futures series) is left as it is and told by the data checks.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import numpy as np

from .data import MarketSeries, iso_ms

__all__ = ["MOVE_FACTOR", "MOVE_MIN", "RATIOS", "TOLERANCE", "adjust_splits", "ratio_text"]

MOVE_MIN = 0.05  # a move (|log return|) read as a split is over this, as the data checks' outsized move is
MOVE_FACTOR = 25.0  # and this many times the market's median move
TOLERANCE = 0.02  # |log(ratio × k)| at most this share of |log k|
TOLERANCE_FLOOR = 0.005  # or at most this (a 5:4 split, 0.45 % by the share alone)
DAY_MS = 86_400_000
VOLUME_WINDOW = 20  # ticks each side of a reverse split whose median volumes are compared
REVERSE_VOLUME_RISE = 1.5  # the most the median volume may rise after a reverse split
UNDONE_WITHIN = 5  # ticks: a move undone by the inverse ratio this soon is a bad print (or a print of another scale)

# shares after / shares before: a 2:1 split halves the price (k = 2); a 1:10 reverse split multiplies it by 10
_FORWARD = [Fraction(n) for n in (2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 20, 25, 30, 40, 50, 100)]
_FORWARD += [Fraction(3, 2), Fraction(4, 3), Fraction(5, 4), Fraction(5, 2)]
RATIOS: tuple[Fraction, ...] = tuple(sorted(_FORWARD + [1 / k for k in _FORWARD if k.denominator == 1]))


def ratio_text(k: Fraction) -> str:
    """A split ratio as written: ``2:1``, ``3:2``, ``1:10`` (a reverse split)."""
    return f"{k.numerator}:{k.denominator}"


def _split_at(move: float) -> tuple[Fraction, float] | None:
    """The split ratio ``k`` whose log is within the tolerance of ``-move`` (a log return), with what is left of the
    move once it is out; None when no ratio is."""
    for k in RATIOS:
        log_k = float(np.log(float(k)))
        left = move + log_k
        if abs(left) <= max(TOLERANCE * abs(log_k), TOLERANCE_FLOOR):
            return k, left
    return None


def _shares_agree(volume: np.ndarray, at: int, k: Fraction) -> bool:
    """Whether the volumes around a move from tick ``at`` to the next can be a split's of ``k``: both ticks traded
    (a series without volumes, a FRED series, an index level, quotes, holds no shares to split: WTI's fall of 33.4 %
    on 1991-01-17 is 0.1 % off 3:2), and after a reverse split the median volume of the ``VOLUME_WINDOW`` ticks from
    the move on is at most ``REVERSE_VOLUME_RISE`` times that of the ``VOLUME_WINDOW`` up to it (a reverse split
    leaves fewer shares to trade, or as many where the vendor adjusted the volumes; a jump of 100 % on news trades
    many more). After a split volumes say nothing: more shares trade, as after a crash, or as many where the vendor
    adjusted the volumes and not the prices (AAPL's 7:1 split of 2014-06-09 in such a file)."""
    if volume[at] <= 0 or volume[at + 1] <= 0:
        return False
    return k > 1 or _volume_change(volume, at) <= REVERSE_VOLUME_RISE


def _volume_change(volume: np.ndarray, at: int) -> float:
    """The median volume of the ``VOLUME_WINDOW`` ticks from tick ``at + 1`` on over that of the ``VOLUME_WINDOW`` up
    to tick ``at``."""
    before = float(np.median(volume[max(0, at + 1 - VOLUME_WINDOW):at + 1]))
    after = float(np.median(volume[at + 1:at + 1 + VOLUME_WINDOW]))
    return after / before if before > 0 else float("inf")


def adjust_splits(m: MarketSeries) -> tuple[MarketSeries, list[dict[str, Any]]]:
    """``m`` with the prices before each move read as a split divided by its ratio and the volumes multiplied by it
    (the module's rule), and per split ``{"market", "time", "ratio", "move_pct", "note"}``; ``m`` itself (unchanged)
    and none when there is none."""
    if len(m) < 3:
        return m, []
    p = m.price
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = np.diff(np.log(p))
    moves = np.abs(np.where(np.isfinite(logs), logs, 0.0))
    moving = moves[moves > 0]
    if not moving.size:
        return m, []
    median_move = float(np.median(moving))
    days = np.floor(m.timestamp / DAY_MS)
    found: list[tuple[int, Fraction, float]] = []
    for at in np.flatnonzero((moves > MOVE_MIN) & (moves > MOVE_FACTOR * median_move) & (np.diff(days) > 0)):
        match = _split_at(float(logs[at]))
        if match is not None:
            found.append((int(at), *match))
    # a move undone by its inverse within a few ticks (99.9 -> 10000 -> 99.9) is a bad print, not two splits
    undone = {x for a, (i, k, _) in enumerate(found) for (j, q, _) in found[a + 1:]
              if j - i <= UNDONE_WITHIN and k * q == 1 for x in (i, j)}
    found = [f for f in found if f[0] not in undone and _shares_agree(m.volume, f[0], f[1])]
    if not found:
        return m, []
    factor = np.ones(len(m))  # what each tick's price is divided by: the product of the splits after it
    shares = np.ones(len(m))  # what each tick's volume is multiplied by (volumes as traded)
    notes: list[dict[str, Any]] = []
    for j, k, left in found:
        factor[:j + 1] *= float(k)
        change = float(np.expm1(logs[j]) * 100)
        time = iso_ms(float(m.timestamp[j + 1]))
        n = f"{float(k if k > 1 else 1 / k):g}"
        done = f"the prices before it {'divided' if k > 1 else 'multiplied'} by {n}"
        # volumes as traded change by about the ratio; volumes the vendor adjusted do not
        log_volume_change = float(np.log(_volume_change(m.volume, j)))
        if abs(log_volume_change - np.log(float(k))) < abs(log_volume_change):
            shares[:j + 1] *= float(k)
            done += f" and the volumes {'multiplied' if k > 1 else 'divided'} by {n}"
        else:
            done += " (the volumes, about as many shares a day before it as after, were left: adjusted already)"
        note = (f"market {m.market_id!r}: a move of {change:+.1f}% at {time} ({p[j]:g} -> {p[j + 1]:g}),"
                f" {moves[j] / median_move:.0f} times the median move, matches a {ratio_text(k)}"
                f" {'reverse ' if k < 1 else ''}split (with a move of {float(np.expm1(left)) * 100:+.2f}% besides):"
                f" read as the split, {done}; if it was a genuine move, set training.adjust_splits = false"
                " (or pass --no-split-adjust)")
        notes.append({"market": m.market_id, "time": time, "ratio": ratio_text(k), "move_pct": round(change, 2),
                      "note": note})
    adjusted = MarketSeries(m.market_id, m.timestamp, p / factor, m.volume * shares)
    return adjusted, notes
