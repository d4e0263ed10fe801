"""The time zone in which tick files' times without an offset are read (``training.data_timezone``, ``--timezone``).

A zone is written as ``UTC``, an IANA name from the system's time zone database (``America/New_York``,
``Europe/London``; daylight saving time included), or a fixed offset from UTC all year: ``+02:00``, ``-05:00``,
``UTC-05:00``, ``GMT+2``, ``-0500`` (so nobody has to know that ``Etc/GMT+5`` means UTC-05:00).
"""

from __future__ import annotations

import functools
import re
from datetime import UTC, timedelta, timezone, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from .errors import quoted

DEFAULT_ZONE = "UTC"
MAX_OFFSET = timedelta(hours=14)  # the largest offset from UTC of any place's clocks (UTC+14:00, Kiribati)
# +02:00, -0500, UTC-05:00, GMT+2: hours and minutes with or without a colon, or hours alone
_FIXED = re.compile(r"(?:UTC|GMT)?\s*([+-])(?:(\d{2}):?(\d{2})|(\d{1,2}))", re.IGNORECASE)
# A zone as an HTTP request may write it, exactly (no blanks around it; JSON Schema's regular expressions have no
# case-insensitive flag): UTC in any case, or UTC/GMT (optional) and an offset up to 14:00 either way: hours and
# minutes (with or without a colon) or hours alone, one digit or two (+5, +05, +10), as _FIXED reads them
EXACT_OFFSET_PATTERN = (r"^(?:[Uu][Tt][Cc]|(?:[Uu][Tt][Cc]|[Gg][Mm][Tt])?[+-]"
                        r"(?:(?:0[0-9]|1[0-3]):?[0-5][0-9]|14:?00|0?[0-9]|1[0-4]))$")
# files of the system's database that name no place's clocks: the host's own setting (Debian's "localtime", so a
# file would be read differently on each host), tzdata's "Factory" placeholder and the "posixrules" template
NOT_ZONES = frozenset({"localtime", "Factory", "posixrules"})
SHOWN = 200  # characters of a refused zone's repr shown in a message (a 1 MB value is not echoed back whole)
_HOW = ("write an IANA name such as America/New_York or Europe/London, UTC, or a fixed offset from UTC such as"
        " -05:00 or UTC+02:00")


def _shown(text: str) -> str:
    """``text`` quoted in a message, cut to :data:`SHOWN` characters (with the length) when longer."""
    return quoted(text, SHOWN)


def parse_zone(text: str) -> tzinfo:
    """The zone ``text`` names (see the module docstring); ValueError naming the text and what is accepted.

    ``UTC`` (any case) and a zero offset are ``datetime.UTC`` itself, so a caller can tell the default by identity.
    """
    s = text.strip()
    if s.upper() == DEFAULT_ZONE:
        return UTC
    m = _FIXED.fullmatch(s)
    if m is not None:
        return _fixed_offset(text, m)
    if not s or s[0] in "+-" or s[:1].isdigit():
        raise ValueError(f"{_shown(text)} is not a time zone: {_HOW}")
    try:
        if s not in zone_names():  # one list for the config, the command line and the request's schema
            raise ZoneInfoNotFoundError(s)
        return ZoneInfo(s)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise ValueError(f"{_shown(text)} is not a time zone of the system's time zone database: {_HOW}") from None


def _fixed_offset(text: str, m: re.Match[str]) -> tzinfo:
    """The fixed offset matched by ``_FIXED`` in ``text``; ValueError when it is no offset any clock uses."""
    hours = int(m[2] if m[4] is None else m[4])
    minutes = int(m[3] or 0)
    if minutes >= 60:
        raise ValueError(f"{_shown(text)} is not a time zone: the minutes of an offset are 00 to 59")
    offset = timedelta(hours=hours, minutes=minutes)
    if offset > MAX_OFFSET:
        raise ValueError(f"{_shown(text)} is not a time zone: an offset from UTC is at most 14:00 either way")
    return timezone(-offset if m[1] == "-" else offset)  # a zero offset is timezone.utc, which is datetime.UTC


def zone_name(zone: tzinfo) -> str:
    """How a zone is shown in notes: its IANA name, or ``UTC`` / ``UTC-05:00`` for a fixed offset."""
    if isinstance(zone, ZoneInfo):
        return zone.key
    return str(zone)


@functools.lru_cache(maxsize=1)
def zone_names() -> tuple[str, ...]:
    """The IANA names of the system's time zone database (sorted), as a request may name a zone."""
    return tuple(sorted(available_timezones() - NOT_ZONES))


def request_zone(text: str) -> str:
    """``text`` when it is a zone exactly as a request may write it (:data:`EXACT_OFFSET_PATTERN` or one of
    :func:`zone_names`: what its JSON Schema says); ValueError naming it otherwise."""
    if re.fullmatch(EXACT_OFFSET_PATTERN, text) is None and text not in zone_names():
        parse_zone(text)  # the reason when it is no zone at all; what else differs from the exact form is blanks
        raise ValueError(f"{_shown(text)} has blanks: a request writes the zone without them ({_HOW})")
    return text


def enum_member_name(zone: str) -> str:
    """A code generator's name for a zone of the enum (``x-enum-varnames``): upper case, ``_`` for the punctuation,
    and the sign of an offset spelled out, so that names no two zones share (``GMT+0``, ``GMT-0`` and ``GMT0`` became
    one ``GMT0``, which stops openapi-python-client: "Duplicate key GMT0 in enum")."""
    spelled = re.sub(r"([+-])(?=\d)", lambda m: "_PLUS_" if m[1] == "+" else "_MINUS_", zone)
    return re.sub(r"[^A-Za-z0-9]+", "_", spelled).strip("_").upper()


def request_zone_schema() -> dict[str, object]:
    """JSON Schema of :func:`request_zone`'s strings: a name of the database or an offset."""
    names = list(zone_names())
    members: list[str] = []
    taken: set[str] = set()
    for zone in names:  # unique whatever the host's database holds
        member, k = enum_member_name(zone), 2
        while member in taken:
            member, k = f"{enum_member_name(zone)}_{k}", k + 1
        members.append(member)
        taken.add(member)
    return {"anyOf": [{"type": "string", "enum": names, "x-enum-varnames": members},
                      {"type": "string", "pattern": EXACT_OFFSET_PATTERN}]}
