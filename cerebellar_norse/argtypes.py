"""Value types of the command line's options (argparse ``type=``).

A value outside its range is refused while the command line is parsed: exit 2 with
``argument --FLAG: …`` naming the accepted range, before anything is loaded or written.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from datetime import UTC, tzinfo


def int_in(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: an integer from ``low`` to ``high`` (both included)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer in {low}..{high}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} is outside the range {low}..{high}")
        return value

    return parse


def non_negative(text: str) -> float:
    """An argparse type: a finite number >= 0 (a bad value is a usage error, exit 2, never a check that failed)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number >= 0")
    return value + 0.0  # -0 is 0


def seconds_up_to(high: float) -> Callable[[str], float]:
    """An argparse type: a number of seconds > 0 and at most ``high``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not 0 < value <= high:  # NaN fails too
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0 and <= {high:g}")
        return value

    return parse


def _checked(text: str, check: Callable[[str], object]) -> str:
    """``text`` as written, when ``check`` (which raises ValueError with the reason) accepts it; else a usage error."""
    try:
        check(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def time_arg(text: str) -> str:
    """An argparse type: a time as ``--since`` takes it (ms since the epoch or ISO 8601, or a date written with
    slashes or dots, ``3/8/2011``, read later in the order of the files' dates), kept as written.

    A time without an offset is checked here in UTC (a type sees no other option); in the zone of ``--timezone``
    it is checked after parsing, by :func:`zoned_time_problem`.
    """
    return _checked(text, lambda t: _since_time(t, UTC))


def _since_time(text: str, zone: tzinfo) -> None:
    """ValueError when ``text`` is no time ``--since`` takes in ``zone``: a date with slashes or dots must be a time
    in at least one order of day and month, anything else ms or ISO 8601."""
    from .training.csvtime import parse_time_ms, slash_readings

    if not slash_readings(text, "time", zone):
        parse_time_ms(text, "time", zone)


def zoned_time_problem(text: str, zone_text: str) -> str | None:
    """Why ``text`` (a value :func:`time_arg` accepted) is no time when one without an offset is read in the zone
    ``zone_text`` (a value :func:`zone_arg` accepted, as ``--timezone`` gives it): a wall-clock time the zone skips
    when its clocks go forward, or one outside 1970..2100 there; None when it is a time. A time of the hour a zone
    repeats is its first occurrence, as in the tick files."""
    from .timezones import parse_zone

    try:
        _since_time(text, parse_zone(zone_text))
    except ValueError as exc:
        return f"in --timezone {zone_text}, {exc}"
    return None


def zone_arg(text: str) -> str:
    """An argparse type: a zone as ``--timezone`` takes it (see :mod:`cerebellar_norse.timezones`), kept as written."""
    from .timezones import parse_zone

    return _checked(text, parse_zone)
