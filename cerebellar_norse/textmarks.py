"""Byte-order marks of the wide Unicode encodings, as Windows tools save text (Excel's "Unicode Text", Notepad)."""

from __future__ import annotations

# UTF-32's first: its little-endian mark begins with UTF-16's. The codecs named read their mark and drop it.
WIDE_MARKS = ((b"\xff\xfe\x00\x00", "utf-32"), (b"\x00\x00\xfe\xff", "utf-32"), (b"\xff\xfe", "utf-16"),
              (b"\xfe\xff", "utf-16"))


def wide_encoding(head: bytes) -> str | None:
    """``"utf-16"`` or ``"utf-32"`` when text starting with ``head`` (its first 4 bytes suffice) starts with that
    encoding's byte-order mark, else None."""
    return next((name for mark, name in WIDE_MARKS if head.startswith(mark)), None)
