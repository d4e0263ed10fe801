"""Reading the numbers of a tick file's price and volume fields as quote sites and spreadsheets write them.

Digit groups (``1,234.50``; with decimal commas ``1.234,50``; blanks or apostrophes between groups, ``43 000,00``,
``1'234.5``), a currency sign or three-letter code beside a price (``$300.35``, ``1.50 EUR``), and a K, M or B
suffix on a volume (``1.23M``); a refusal says what to change. Whether a file has decimal commas is
:mod:`.csvformat`'s to decide.
"""

from __future__ import annotations

import re

_GROUPED = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d*)?$")  # 1,234.50: digits in groups of three
_EU_NUMBER = re.compile(r"[+-]?(?:\d{1,3}(?:\.\d{3})+|\d*)(?:,\d*)?$")  # 1.234,50, 1,5, 7 (decimal commas)
_SUFFIX = {"K": 1e3, "M": 1e6, "B": 1e9}  # volume suffixes of quote sites (1.23M)
# a currency sign or three-letter code before or after a price: $300.35, EUR 1.50, 1,50 €, 1.50 EUR
_CURRENCY_BEFORE = re.compile(r"(?:[$€£¥]\s*|[A-Z]{3}\s+)([+-]?[\d.,].*)$")
_CURRENCY_AFTER = re.compile(r"(.*[\d.,])(?:\s*[$€£¥]|\s+[A-Z]{3})$")
# digits grouped by blanks (a space, a no-break or thin space) or apostrophes, the same one throughout: 43 000,00,
# 1'234.5; the point or comma after the groups is the decimal mark
_BLANK_GROUPED = re.compile(r"[+-]?\d{1,3}([ \u00a0\u2009\u202f'’])\d{3}(?:\1\d{3})*(?:[.,]\d*)?$")
_BESIDE_NUMBER = re.compile(r"(\D*?)\s*[+-]?\d[\d.,]*\s*(\D*)$")  # text before or after one number (1.50 euro)
_GROUP_MARKS = re.compile(r"(?<=\d)[ \u00a0\u2009\u202f'’](?=\d)")  # a blank or apostrophe between digits


def is_number(text: str) -> bool:
    """Whether ``float`` reads ``text`` as it is."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def quoted_number(text: str, name: str, volume: bool, decimal_comma: bool = False) -> float:
    """A number as quote sites and spreadsheets write it, for a field ``float`` refused: digit groups
    (``1,234.50``; with ``decimal_comma``, a file separated by ';', ``1.234,50`` and ``1,5``; in any file, groups
    separated by blanks or apostrophes, ``43 000,00`` and ``1'234.5``, whose point or comma is the decimal mark), for a
    price a currency sign or three-letter code before or after it (``$300.35``, ``1,50 €``, ``1.50 EUR``), and for a
    volume a K, M or B suffix (``1.23M``); ValueError naming the column otherwise."""
    s = text.strip()
    signed = False
    if not volume:  # $300.35, 1.50 EUR: as quote sites and banks write prices
        s, signed = _without_currency(s)
    scale = 1.0
    if volume and s[-1:].upper() in _SUFFIX:
        s, scale = s[:-1], _SUFFIX[s[-1].upper()]
    if _BLANK_GROUPED.match(s):
        s = _GROUP_MARKS.sub("", s).replace(",", ".")
    elif decimal_comma and _EU_NUMBER.match(s) and any(ch.isdigit() for ch in s):
        s = s.replace(".", "").replace(",", ".")
    elif not decimal_comma and _GROUPED.match(s):
        s = s.replace(",", "")
    elif scale == 1.0 and not signed:
        raise ValueError(_not_a_number(name, text, not decimal_comma, volume))
    try:
        return float(s) * scale
    except ValueError:
        raise ValueError(_not_a_number(name, text, not decimal_comma, volume)) from None


def _without_currency(s: str) -> tuple[str, bool]:
    """A price field without the currency sign or three-letter code before or after its number (``$300.35``,
    ``EUR 1.50``, ``1,50 €``, ``1.50 EUR``; a code is apart from the number), and whether it had one."""
    m = _CURRENCY_BEFORE.match(s) or _CURRENCY_AFTER.match(s)
    return (m[1].strip(), True) if m else (s, False)


def _currency_like(text: str) -> bool:
    """Whether text beside a number could be a currency written otherwise than read (``euro``, ``usd``, ``₹``): a word,
    or a sign; not a stray letter (``x1``)."""
    return (len(text) >= 2 and text.isalpha()) or (len(text) == 1 and not text.isalnum() and not text.isspace())


def _not_a_number(name: str, text: str, comma_hint: bool = True, volume: bool = False) -> str:
    """Why a price or volume field is refused; says what to change when a comma other than a digit-group separator, a
    blank or apostrophe between digits, or a currency (beside a volume, or written otherwise) stops it."""
    s = text.strip()
    bare = s if volume else _without_currency(s)[0]
    hint = ""
    if comma_hint and "," in bare and is_number(bare.replace(",", ".", 1)):
        hint = " (a comma is read only between groups of three digits, as in 1,234.5: write decimals with a point)"
    elif _GROUP_MARKS.search(bare) and is_number(_GROUP_MARKS.sub("", bare).replace(",", ".", 1)):
        hint = (" (a blank or an apostrophe is read only between groups of three digits, the same one throughout, as"
                " in 43 000,00 or 1'234.5)")
    elif volume and _without_currency(s)[1]:
        hint = " (a volume is a number of units, without a currency)"
    elif not volume and (m := _BESIDE_NUMBER.match(bare)) is not None and _currency_like(m[1].strip() + m[2].strip()):
        hint = (" (beside a price only a currency sign, $, €, £ or ¥, or a three-letter code in capitals apart from"
                " the number, as in 1.50 EUR, is read)")
    return f"{name} {s!r} is not a number{hint}"
