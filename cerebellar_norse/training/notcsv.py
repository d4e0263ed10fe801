"""Telling a tick file that is no CSV text by its first characters: JSON as exchanges' APIs return candles, and the
binary tables that pandas and trading frameworks save (Feather, Parquet, HDF5, pickle, legacy Excel), each with the
message a refusal gives: what the file is and the pandas line that converts it to a CSV file the reader takes.

The first characters are those of the file as :func:`cerebellar_norse.training.compressed.open_tick_file` reads it
(decompressed, bytes that are not UTF-8 as lone surrogates ``\\udc80``-``\\udcff``).
"""

from __future__ import annotations

import json

# field names of arrays without names, by their number of fields: the order ccxt and freqtrade write candles
# ([time, open, high, low, close, volume]) and trades ([time, id, type, side, price, amount, cost]) in, and Binance's
# klines API (its files' layout, csvheaderless)
_ARRAY_FIELDS: dict[int, tuple[str, tuple[str, ...]]] = {
    6: ("candles as ccxt and freqtrade write them", ("timestamp", "open", "high", "low", "close", "volume")),
    7: ("trades as freqtrade writes them", ("timestamp", "id", "type", "side", "price", "amount", "cost")),
    12: ("Binance's klines", ("open_time", "open", "high", "low", "close", "volume", "close_time", "quote_volume",
                              "count", "taker_buy_volume", "taker_buy_quote_volume", "ignore")),
}

# (the file's first bytes, the format's name, the pandas call that reads it)
_BINARY_TABLES: tuple[tuple[bytes, str, str], ...] = (
    (b"ARROW1\x00", "a Feather (Apache Arrow IPC) file", "pd.read_feather(FILE)"),
    (b"FEA1", "a Feather (version 1) file", "pd.read_feather(FILE)"),
    (b"PAR1", "a Parquet file", "pd.read_parquet(FILE)"),
    (b"\x89HDF\r\n\x1a\n", "an HDF5 file", "pd.read_hdf(FILE)  (key=… for a file of several tables)"),
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "an Excel 97-2003 (.xls) workbook", "pd.read_excel(FILE)"),
    (b"\x80\x04\x95", "a Python pickle", "pd.read_pickle(FILE)"),
    (b"\x80\x05\x95", "a Python pickle", "pd.read_pickle(FILE)"),
)


def json_start(head: str) -> str:
    """The first characters of a file (``head``, its first few dozen) that open a JSON document (``[{"time": …``,
    ``{"candles": …``, an array of arrays ``[[1556668800000, …``, pretty-printed or not) or JSON Lines, as exchanges'
    and brokers' APIs return candles; "" for any other text (a CSV header never starts with ``{``, nor with ``[``
    followed by a quote, brace or bracket)."""
    text = head.lstrip("\ufeff \t\r\n")
    if text.startswith("{") or (text[:1] == "[" and text[1:].lstrip(" \t\r\n")[:1] in ('{', '[', '"')):
        first = " ".join(text.split())
        return first[:24] + ("…" if len(first) > 24 else "")
    return ""


def _first_array(head: str) -> list[object] | None:
    """The first row of a JSON array of arrays whose start is ``head`` (a few kB of the file), None when it is no
    such array or its first row does not end within ``head``."""
    text = head.lstrip("\ufeff \t\r\n")
    if text[:1] != "[":
        return None
    inner = text[1:].lstrip(" \t\r\n")
    if inner[:1] != "[":
        return None
    try:
        row, _ = json.JSONDecoder().raw_decode(inner)
    except ValueError:
        return None
    return row if isinstance(row, list) else None


def json_refusal(path: object, head: str) -> str:
    """The refusal of a JSON file (``head``: its first few kB, which :func:`json_start` takes for JSON): it says the
    file is JSON and how to convert it with pandas. A file of arrays without field names (``[[1509836520000, 0.0016,
    …], …]``) converts to columns named 0, 1, 2, …, which name no time or price: the line names them, in the order
    of the layout with that number of fields (ccxt's and freqtrade's candles, freqtrade's trades, Binance's klines),
    or says to name them."""
    start = json_start(head[:64])
    msg = (f"{path}:1: JSON, not CSV (the file starts with {start!r}): tick files are CSV with a header line naming"
           " the columns; ")
    row = _first_array(head)
    if row is None:
        return msg + ("convert it, e.g. with pandas: pd.read_json(FILE).to_csv('ticks.csv', index=False) (JSON Lines, one object a line:"
                      " pd.read_json(FILE, lines=True))")
    known = _ARRAY_FIELDS.get(len(row))
    if known is None:
        return msg + (f"its rows are arrays of {len(row)} unnamed fields: name them as their source documents them (a"
                      " time and a close or price at least), e.g. pd.read_json(FILE).to_csv('ticks.csv', index=False,"
                      " header='timestamp … close …'.split())")
    what, names = known
    return msg + (f"its rows are arrays of {len(row)} unnamed fields; if {what}: pd.read_json(FILE).to_csv("
                  f"'ticks.csv', index=False, header='{' '.join(names)}'.split())")


def binary_refusal(path: object, head: str) -> str:
    """The refusal of a binary table (``head``: the file's first characters), naming its format and the pandas line
    that converts it (with its index, which the reader takes as the time when it holds dates and ignores when it
    counts the rows); "" for a file that starts as none does."""
    if not any((ch < " " and ch not in "\t\r\n") or "\udc80" <= ch <= "\udcff" for ch in head[:64]):
        return ""  # text (a CSV header may start with PAR1): each format's first bytes hold a control byte or non-UTF-8
    raw = head.encode("utf-8", "surrogateescape")  # the bytes as read: those that are not UTF-8 back from surrogates
    for magic, name, reader in _BINARY_TABLES:
        if raw.startswith(magic):
            call, _, extra = reader.partition("  ")
            return (f"{path}:1: {name}, not CSV: tick files are CSV text with a header line naming the columns;"
                    f" convert it, e.g. with pandas: {call}.to_csv('ticks.csv'){(' ' + extra) if extra else ''}")
    return ""


def workbook_refusal(path: object, names: list[str]) -> str:
    """The refusal of a zip archive that is a spreadsheet workbook (``names``: its files): Excel's ``.xlsx``
    (``xl/workbook.xml``) or an OpenDocument spreadsheet (``content.xml`` beside ``mimetype``), naming it and how to
    save it as CSV; "" for any other archive."""
    if "xl/workbook.xml" in names:
        what, call = "an Excel workbook (.xlsx)", "pd.read_excel(FILE)"
    elif "mimetype" in names and "content.xml" in names:
        what, call = "an OpenDocument spreadsheet (.ods)", "pd.read_excel(FILE, engine='odf')"
    else:
        return ""
    return (f"{path}: {what}, not CSV: tick files are CSV text with a header line naming the columns; save the sheet as"
            f" CSV (UTF-8) from the spreadsheet, or convert it, e.g. with pandas: {call}.to_csv('ticks.csv',"
            " index=False)")
