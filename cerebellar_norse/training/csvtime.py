"""Reading the time field of a tick file: ms since the epoch from any form :mod:`.csvformat` accepts.

Numbers since the epoch in a file's unit (``TIME_UNITS``: seconds, ms, µs, ns), dates and date-times written as one
number (``YYYYMMDD``, ``YYYYMMDDHH``, ``YYYYMMDDHHMM[SS]``), ISO 8601 (with ``GMT+0100`` or ``UTC`` read as an
offset), dates year first with dots, slashes or dashes (``2020-6-19``), dates with an English month name
(``Jan 1 2000``), day and month with slashes or dots in a file's order, and trading
platforms' date-times with a zone name (Interactive Brokers, NinjaTrader). A time without an offset is a wall-clock
time in the file's zone; one the zone skips when its clocks go forward is refused, one it repeats is its first
occurrence. Which form and unit a file's times have is :mod:`.csvformat`'s to decide (``time_unit_of``,
``slash_order``).
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta, tzinfo
from decimal import ROUND_FLOOR, Decimal, InvalidOperation
from typing import NamedTuple
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..ticks import TS_MAX_MS
from .csvnumbers import is_number

SECONDS_HINT_MS = 100_000_000  # ms times below this (1970-01-02) are noted as possibly seconds
# Numeric times are in the unit whose span 1973-03-03 .. 2100-01-01 holds the file's first time (ms otherwise):
# as ms, those ranges are 1970-01-02 .. 1970-02-17, after 2100, or later still.
TIME_UNITS = {"s": (100_000_000, TS_MAX_MS // 1000), "µs": (10**14, TS_MAX_MS * 1000), "ns": (10**17, TS_MAX_MS * 10**6)}
UNIT_WORDS = {"s": "seconds", "ms": "ms", "µs": "µs", "ns": "ns", "date": "YYYYMMDD dates",
              "datehour": "YYYYMMDDHH date-hours", "datetime": "YYYYMMDDHHMM[SS] date-times"}
_TO_MS = {"s": Decimal(1000), "µs": Decimal("0.001"), "ns": Decimal("0.000001")}
_GMT_OFFSET = re.compile(r"\s*(?:GMT|UTC)\s*(?:([+-])(\d{2}):?(\d{2}))?$")  # Dukascopy's "… GMT+0100"
# 2020.01.02 (MetaTrader), 2020/01/02, and year-first dates without leading zeros (2020-6-19, as pandas-ta's data has)
_YMD_DATE = re.compile(r"(\d{4})([./-])(\d{1,2})\2(\d{1,2})(?:([ T])(.*))?$")
_MONTHS = {name: i for i, names in enumerate((("jan", "january"), ("feb", "february"), ("mar", "march"),
           ("apr", "april"), ("may",), ("jun", "june"), ("jul", "july"), ("aug", "august"),
           ("sep", "sept", "september"), ("oct", "october"), ("nov", "november"), ("dec", "december")), 1)
           for name in names}
# dates with an English month name and a four-digit year, maybe followed by a time: "Jan 1 2000" (vega_datasets),
# "Jan 02, 2020" (Investing.com), "02-Jan-2020", "2 January 2020"; day first also with a two-digit year, as
# spreadsheets write dates by default ("3-Jan-22", d-mmm-yy) and StockCharts' and Oracle's exports do ("03-JAN-22")
_NAMED_MONTH_FIRST = re.compile(r"([A-Za-z]{3,9})\.? (\d{1,2}),? (\d{4})(?:( )(.*))?$")
_NAMED_DAY_FIRST = re.compile(r"(\d{1,2})([ -])([A-Za-z]{3,9})\2(\d{4}|\d{2})(?:( )(.*))?$")
# the time after a date written with slashes, as spreadsheets write it: 0:15, 1:00:00 AM, 13:05:09.5
_ONE_DIGIT_HOUR = re.compile(r"\d:\d{2}")  # 9:30 after a date (pandas-ta-style unpadded date-times)
_SHEET_CLOCK = re.compile(r"(\d{1,2}):(\d{2})(?::(\d{2})(\.\d+)?)?\s*([AaPp][Mm])?$")
_DATE_DIGITS = re.compile(r"(\d{8})(?:\.0*)?")  # 20080102, or 20080102.0 as a float column (pandas with gaps) writes it
# 202401020930 or 20240102093000 (date and time of day as one number): as ms they would be 1976 or after 2100
_DATETIME_DIGITS = re.compile(r"(\d{12}|\d{14})(?:\.0*)?")
# 2024010209 (date and hour as one number, as some hourly exports write it): as seconds it would be 2034 or later
_DATEHOUR_DIGITS = re.compile(r"(\d{10})(?:\.0*)?")
_EXPONENT = re.compile(r"[+-]?(\d*)\.?(\d*)[eE]")  # a number in scientific notation: its mantissa's digits
# M/D/YYYY or D/M/YYYY (slashes or dots), then maybe a time
SLASH_DATE = re.compile(r"(\d{1,2})([/.])(\d{1,2})\2(\d{4})(?:([ T])(.*))?$")
# units of a file of dates or date-times written as one number: their digits, and how the form is named in errors
_COMPACT_UNITS = {"date": (_DATE_DIGITS, "a date written YYYYMMDD"), "datehour": (_DATEHOUR_DIGITS, "a date-hour"
                  " written YYYYMMDDHH"), "datetime": (_DATETIME_DIGITS, "a date-time written YYYYMMDDHHMM or YYYYMMDDHHMMSS")}

BEFORE_1970 = "is before 1970-01-01"  # how a date before the first time read ends its error
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
EPOCH_NAIVE = datetime(1970, 1, 1)
ONE_MS = timedelta(milliseconds=1)
SERIAL_DAYS = (25_569, 73_051)  # spreadsheet serial dates (days since 1899-12-30) of 1970-01-01 up to 2100-01-01
_SERIAL_EPOCH = datetime(1899, 12, 30)


def datetime_ms(dt: datetime) -> int:
    """ms since the epoch (sub-ms digits dropped); a time without an offset is UTC (see :func:`_zoned`)."""
    if dt.tzinfo is None:
        return (dt - EPOCH_NAIVE) // ONE_MS
    return (dt - EPOCH) // ONE_MS


def _zoned(dt: datetime, zone: tzinfo) -> datetime:
    """``dt`` itself when it carries an offset or zone, else ``dt`` as a wall-clock time in ``zone`` (the file's zone
    of times without an offset; a time the clocks repeat there is its first occurrence, fold 0)."""
    return dt if dt.tzinfo is not None else dt.replace(tzinfo=zone)


class TimeRead(NamedTuple):
    """A time field read: ms since the epoch, and the zone its wall-clock time was read in (its own named zone, or
    the file's zone for a time without an offset; None for a number since the epoch)."""

    ms: int
    zone: tzinfo | None
    file_zone: bool = False  # the time had no offset or zone of its own: it was read in the file's zone


def unit_time(s: str, name: str, unit: str) -> int:
    """A number of ``unit`` (a key of ``TIME_UNITS``) since the epoch as ms (digits below 1 ms dropped); ValueError
    naming the column and value when it is not a number or not in 1970-01-01 .. 2100-01-01."""
    try:
        ms = int(s) * 1000 if unit == "s" else int(s) // (1000 if unit == "µs" else 1_000_000)
    except ValueError:
        try:
            d = Decimal(s)
        except InvalidOperation:
            raise ValueError(f"{name} {s!r} is not a number of {UNIT_WORDS[unit]} since epoch (the file's unit)") from None
        if not d.is_finite():
            raise ValueError(f"{name} {s!r} is not a time (ms since epoch or ISO 8601)") from None
        ms = int((d * _TO_MS[unit]).to_integral_value(rounding=ROUND_FLOOR))
    if not 0 <= ms < TS_MAX_MS:
        raise ValueError(f"{name} {s!r} read as {UNIT_WORDS[unit]} since epoch (the file's unit) is not in 1970-01-01 .."
                         " 2100-01-01")
    return ms


def _vendor_time(s: str) -> datetime | None:
    """Date-times as trading platforms write them, or None: Interactive Brokers' ``20231002 09:30:00 US/Eastern``
    (blanks repeated, a time zone name at the end), NinjaTrader's ``20200102 093000 1230000`` (seconds' fraction in
    100 ns after a blank)."""
    parts = s.split()
    if len(parts) < 2:
        return None
    zone = None
    if "/" in parts[-1] and not parts[-1][:1].isdigit():
        try:
            zone = ZoneInfo(parts[-1])
        except (ZoneInfoNotFoundError, ValueError):
            return None
        parts = parts[:-1]
    if len(parts) == 3 and parts[2].isdigit() and len(parts[1]) == 6 and parts[1].isdigit():
        parts = [parts[0], f"{parts[1]}.{parts[2][:6]}"]
    try:
        dt = datetime.fromisoformat(" ".join(parts))
    except ValueError:
        return None
    return dt.replace(tzinfo=zone) if zone is not None and dt.tzinfo is None else dt


def _skipped_time(dt: datetime) -> str:
    """Why a wall-clock time in a named zone (Interactive Brokers' ``20240310 02:30:00 US/Eastern``, or a time without
    an offset read in a file zone such as America/New_York) does not exist there: the clocks go forward over it (the zone reads it at the offset before the change, an hour off the rows
    around it); "" for a time that exists, or names no zone."""
    zone = dt.tzinfo
    if not isinstance(zone, ZoneInfo):
        return ""
    before, after = dt.replace(fold=0).utcoffset(), dt.replace(fold=1).utcoffset()
    if before is None or after is None or after <= before or dt.astimezone(UTC).astimezone(zone).replace(
            tzinfo=None) == dt.replace(tzinfo=None):
        return ""
    return (f"does not exist in {zone.key}: the clocks go forward by {after - before} over it (when daylight saving"
            " time starts)")

def _with_offset(s: str) -> str:
    """A date-time ending in ``GMT+0100``, ``UTC`` and the like (as Dukascopy writes it) with an ISO 8601 offset."""
    m = _GMT_OFFSET.search(s)
    if m is None or m.start() == 0:
        return s
    return s[:m.start()] + (f"{m[1]}{m[2]}:{m[3]}" if m[1] else "+00:00")


def time_any(text: str, name: str, day_first: bool | None = None, unit: str = "ms", zone: tzinfo = UTC) -> int:
    """A time field of any accepted form as ms since the epoch, or ValueError naming the column and value.

    ``day_first`` is the file's slash-date order (see :func:`~.csvformat.slash_order`); None: slash dates are not
    accepted. ``unit`` is the file's unit of numeric times (see :func:`~.csvformat.time_unit_of`). ``zone`` is the
    zone of a date or date-time written without an offset or zone (a time the zone skips is a ValueError, see
    :func:`_skipped_time`).
    """
    return read_time(text, name, day_first, unit, zone).ms


def _compact_ms(s: str, raw: str, name: str, unit: str, zone: tzinfo) -> int:
    """A time of a file of YYYYMMDD dates, YYYYMMDDHH date-hours or YYYYMMDDHHMM[SS] date-times (``unit``), read in
    ``zone``, as ms since the epoch; ValueError naming the column and value when it is not one or the zone skips it."""
    digits, form = _COMPACT_UNITS[unit]
    when = _compact_datetime(s, digits)
    local = None if when is None else _zoned(when, zone)
    skipped = "" if local is None else _skipped_time(local)
    if skipped:
        raise ValueError(f"{name} {raw!r} {skipped}")
    ms = None if local is None else datetime_ms(local)
    if ms is None or not 0 <= ms < TS_MAX_MS:
        raise ValueError(f"{name} {raw!r} is not {form} (as the file's first time is)")
    return ms


def compact_form_ms(text: str, unit: str, zone: tzinfo) -> int | None:
    """ms since the epoch of ``text`` written in the compact form ``unit`` (``date``: ``20130305``, ``datehour``,
    ``datetime``: a key of ``_COMPACT_UNITS``) read in ``zone``, as a file of such times reads them; None when
    ``unit`` is no such form or ``text`` is not written in it. ValueError for one the zone skips."""
    if unit not in _COMPACT_UNITS or _compact_datetime(text.strip(), _COMPACT_UNITS[unit][0]) is None:
        return None
    return _compact_ms(text.strip(), text, "time", unit, zone)


def read_time(text: str, name: str, day_first: bool | None, unit: str, zone: tzinfo) -> TimeRead:
    """:func:`time_any`, with the zone the time's wall-clock time was read in (see :class:`TimeRead`)."""
    s = raw = text.strip()
    skipped = ""  # why a wall-clock time does not exist in its zone (see _skipped_time)
    # in a file of YYYYMMDD dates or date-times every number is one (a "0.0" or "1.5" is no ms of 1970)
    if unit in _COMPACT_UNITS and (s.isdigit() or is_number(s)):
        return TimeRead(_compact_ms(s, raw, name, unit, zone), zone, True)
    rounded = _rounded_digits(s) if "e" in s or "E" in s else None
    if rounded is not None:
        raise ValueError(f"{name} {raw!r} keeps {rounded} significant digits (scientific notation, as spreadsheets save"
                         " long numbers): save the column as a number with all its digits")
    if unit not in ("ms", "date", "datehour", "datetime") and is_number(s):
        return TimeRead(unit_time(s, name, unit), None)
    if "GMT" in s or "UTC" in s:
        s = _with_offset(s)
    iso = False
    read_in: tzinfo | None = None
    file_zone = False
    try:
        ms = int(s)
    except ValueError:
        try:
            x = float(s)
        except ValueError:
            try:
                iso_text = _iso_date(s)
                try:
                    when = datetime.fromisoformat(iso_text if day_first is None else from_slash(s, day_first))
                except ValueError:
                    vendor = _vendor_time(s)
                    if vendor is None:
                        raise
                    when = vendor
                read_in = when.tzinfo or zone
                file_zone = when.tzinfo is None
                if read_in is not UTC:  # (a time without an offset in UTC stays naive: datetime_ms reads it so)
                    when = _zoned(when, zone)
                    skipped = _skipped_time(when)
                ms = datetime_ms(when)
            except (ValueError, OverflowError):
                if day_first is not None and SLASH_DATE.match(s):
                    order = "D/M/YYYY" if day_first else "M/D/YYYY"
                    raise ValueError(f"{name} {raw!r} is not a valid date read as {order}") from None
                raise ValueError(f"{name} {raw!r} is not a time (ms since epoch or ISO 8601)") from None
            if skipped:
                raise ValueError(f"{name} {raw!r} {skipped}") from None
            iso = True
        else:
            if not math.isfinite(x):
                raise ValueError(f"{name} {raw!r} is not a time (ms since epoch or ISO 8601)") from None
            if not x.is_integer():
                if yyyymmdd(s.split(".", 1)[0]) is not None:
                    raise ValueError(f"{name} {raw!r} is a date YYYYMMDD with a fraction, which is no time format read here:"
                                     " write the time of day in its own column (HHMMSS or HH:MM:SS) or the times as"
                                     " ISO 8601 (2008-01-02T12:00:00)") from None
                hint = serial_date_hint(x) or decimal_year_hint(x) or (
                    "; if the file's times are seconds, multiply them by 1000" if 0 < x < TS_MAX_MS // 1000 else "")
                raise ValueError(f"{name} {raw!r} is not a whole number of ms since epoch{hint}") from None
            ms = int(x)
    if ms < 0:
        raise ValueError(f"{name} {raw!r} {BEFORE_1970}" + ("" if iso else " (negative ms since epoch)"))
    if ms >= TS_MAX_MS:
        if iso:
            raise ValueError(f"{name} {raw!r} is not before 2100-01-01")
        hint = "; if the file's times are µs or ns, divide them by 1000 or 1000000" if ms < 1000 * TS_MAX_MS * 1000 else ""
        raise ValueError(f"{name} {raw!r} is not a plausible time in ms since epoch (1970-01-01 .. 2100-01-01){hint}")
    return TimeRead(ms, read_in, file_zone)


def _iso_date(text: str) -> str:
    """A date written year first with dots, slashes or dashes and maybe one-digit month and day (``2020.01.02``,
    ``2020/6/19``, ``2020-6-19``), or with an English month name and a four-digit year (``Jan 1 2000``, ``Jan 02,
    2020``, ``02-Jan-2020``) or, day first, a two-digit one (``3-Jan-22``, see :func:`century_year`), as ISO 8601 (``2020-06-19``), any time after it kept; other text unchanged."""
    ymd = _YMD_DATE.match(text)
    if ymd is not None:
        return f"{ymd[1]}-{int(ymd[3]):02d}-{int(ymd[4]):02d}" + _time_after(ymd[5], ymd[6])
    named = _NAMED_MONTH_FIRST.match(text)
    if named is not None:
        month, day, year, sep, rest = _MONTHS.get(named[1].lower()), named[2], named[3], named[4], named[5]
    else:
        named = _NAMED_DAY_FIRST.match(text)
        if named is None:
            return text
        month, day, year, sep, rest = _MONTHS.get(named[3].lower()), named[1], named[4], named[5], named[6]
        if len(year) == 2:
            year = str(century_year(int(year)))
    if month is None:
        return text
    return f"{year}-{month:02d}-{int(day):02d}" + _time_after(sep, rest)


def century_year(yy: int) -> int:
    """The year of a two-digit year ``yy`` (0-99): the latest year ending in those digits that is not after the
    current year (UTC), as market data lies in the past: in 2026, 22 is 2022 and 27 is 1927 (a date before 1970 is
    then refused as such, not read a century on)."""
    this_year = datetime.now(UTC).year
    year = this_year - (this_year - yy) % 100
    return year


def _time_after(sep: str | None, rest: str | None) -> str:
    """The time that follows a date (``sep`` and the text after it), a one-digit hour written with two (``9:30``
    -> ``09:30``, as ISO 8601 needs); empty without one."""
    if not sep or rest is None:
        return ""
    return sep + ("0" + rest if _ONE_DIGIT_HOUR.match(rest) else rest)


def parse_time_ms(text: str, name: str = "time", zone: tzinfo = UTC) -> int:
    """A time given as ms since the epoch or ISO 8601 (as in the CSV time column; one without an offset read in
    ``zone``); ValueError otherwise."""
    ms = time_any(text, name, zone=zone)
    if not 0 <= ms < TS_MAX_MS:
        raise ValueError(f"{name} {text!r} is outside 1970-01-01 .. 2100-01-01")
    return ms


def slash_readings(text: str, name: str = "time", zone: tzinfo = UTC) -> dict[bool, int]:
    """A date written with slashes or dots (``3/8/2011``, ``08.03.2011 09:30``) read in each order it is a valid time
    in (``zone`` for one without an offset): day first (True) and month first (False) -> ms since the epoch; empty
    when ``text`` is no such date, ValueError naming ``name`` when it is one but no order reads it as a time."""
    if SLASH_DATE.match(text.strip()) is None:
        return {}
    readings: dict[bool, int] = {}
    problem = ""
    for day_first in (True, False):
        try:
            readings[day_first] = time_any(text, name, day_first, zone=zone)
        except ValueError as exc:
            problem = problem or str(exc)
    if not readings:
        raise ValueError(f"{name} {text!r} is not a valid date read as D/M/YYYY or as M/D/YYYY ({problem})")
    return readings


def from_slash(text: str, day_first: bool) -> str:
    """A date ``M/D/YYYY`` or ``D/M/YYYY`` (slashes or dots, maybe with a time) as ISO 8601; unchanged when not one."""
    m = SLASH_DATE.match(text)
    if m is None:
        return text
    a, b = int(m[1]), int(m[3])
    month, day = (b, a) if day_first else (a, b)
    return f"{m[4]}-{month:02d}-{day:02d}" + (f"{m[5]}{_sheet_clock(m[6])}" if m[5] else "")


def _sheet_clock(text: str) -> str:
    """A time of day as spreadsheets write it (``0:15``, ``1:00:00 PM``) as ISO 8601's ``HH:MM[:SS[.f]]``; other
    text unchanged."""
    m = _SHEET_CLOCK.match(text.strip())
    if m is None:
        return text
    hour = int(m[1])
    if m[5]:  # 12 AM is midnight, 12 PM noon
        hour = hour % 12 + (12 if m[5].lower() == "pm" else 0)
    return f"{hour:02d}:{m[2]}" + (f":{m[3]}{m[4] or ''}" if m[3] else "")


def serial_date_hint(x: float) -> str:
    """A hint for a number of a time column that is a spreadsheet's serial date (``45293`` is 2024-01-02,
    ``45293.5`` its noon, as a spreadsheet saves a date column formatted as a number); "" for any other."""
    if not SERIAL_DAYS[0] <= x < SERIAL_DAYS[1]:
        return ""
    when = _SERIAL_EPOCH + timedelta(seconds=round(x * 86_400))
    return (f"; if the file's times are spreadsheet serial dates (days since 1899-12-30: this one is"
            f" {when:%Y-%m-%d %H:%M:%S}), format the column as dates (YYYY-MM-DD HH:MM:SS) before saving it")


def decimal_year_hint(x: float) -> str:
    """A hint for a number of a time column that is a year with a fraction (``1991.49615384615``), as R's ``time()``
    of a ``ts`` object gives a series' times (``EuStockMarkets``: 260 equal parts of each year, not its trading
    days); "" for any other (a whole year, a number outside 1970..2099)."""
    if not 1970 <= x < 2100 or x.is_integer():
        return ""
    return (f"; it looks like a decimal year ({x:.4f}: a year and a fraction of it, as R's time() of a ts object"
            " gives), which is no date: write the dates themselves (in R, a zoo or xts series written with write.zoo,"
            " or a column of as.Date values)")


def _compact_datetime(text: str, digits: re.Pattern[str]) -> datetime | None:
    """The date (and time), without an offset, written as one number matched by ``digits`` (YYYYMMDD[HH[MM[SS]]],
    maybe with a ``.0`` a float column adds); None otherwise."""
    m = digits.fullmatch(text)
    if m is None:
        return None
    d = m[1]
    try:
        hour, minute, second = (int(d[i:i + 2] or 0) for i in (8, 10, 12))
        return datetime(int(d[0:4]), int(d[4:6]), int(d[6:8]), hour, minute, second)
    except ValueError:
        return None


def _compact_time(text: str, digits: re.Pattern[str]) -> int | None:
    """ms since the epoch of a :func:`_compact_datetime` read as UTC (which form a file's times have does not depend
    on its zone), 1970 up to 2100; None otherwise."""
    when = _compact_datetime(text, digits)
    if when is None:
        return None
    ms = datetime_ms(when)
    return ms if 0 <= ms < TS_MAX_MS else None


def yyyymmdd(text: str) -> int | None:
    """A date written as eight digits (``20080102``, or ``20080102.0``): :func:`_compact_time`."""
    return _compact_time(text, _DATE_DIGITS)


def yyyymmddhh(text: str) -> int | None:
    """A date and hour written as ten digits (``2024010209``, or ``2024010209.0``): :func:`_compact_time`."""
    return _compact_time(text, _DATEHOUR_DIGITS)


def yyyymmddhhmm(text: str) -> int | None:
    """A date-time written as twelve or fourteen digits (``202401020930``, ``20240102093000``): :func:`_compact_time`."""
    return _compact_time(text, _DATETIME_DIGITS)


def _rounded_digits(text: str) -> int | None:
    """The significant digits of a number in scientific notation too short to hold its integer part (a spreadsheet's
    ``1.57784E+12`` for 1577836800123); None for any other number."""
    m = _EXPONENT.match(text)
    if m is None:
        return None
    digits = len((m[1] + m[2]).lstrip("0"))
    try:
        whole = len(str(int(abs(float(text)))))
    except (ValueError, OverflowError):
        return None
    return digits if digits < whole else None
