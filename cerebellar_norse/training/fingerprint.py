"""Ticks that repeat a model's training data under other dates or market names.

``evaluate`` tells ticks in sample by time (the period a model was trained and validated on). A copy of that data
moved to other dates, or saved under other market names, is the same data all the same, and a model scores on it
what it fitted. So a model stores a sample of its training and validation data's *stretches*: each run of
``WINDOW`` consecutive log returns of a market (rounded to ``QUANTUM``), hashed; a hash is kept when it is a multiple
of a power of two ``modulus`` chosen so that about ``TARGET`` are kept, whatever the data's size. Scored ticks are
hashed the same way (the stretch ending at each), the same ``modulus`` picks the same stretches, and the span of a
market from its first picked stretch among the model's to its last repeats the model's data when most
(``REPEAT_SHARE``) of the stretches picked in it are the model's: its ends are known to about ``modulus`` ticks.

Returns and not prices are hashed, so prices scaled by a constant (another currency, a split adjustment) still match
to within their rounding; a stretch in which fewer than half the returns move is not hashed (a quiet market repeats
runs of unchanged prices by chance). Two different series do not share stretches of 16 returns to 1e-9, unless their
returns take few values: a market bouncing between bid and ask, moving in ticks at the same price levels, repeats its
own stretches again and again, so a later, unseen period holds many of its earlier ones. So a market whose later half
repeats more than ``CHANCE_SHARE`` of its earlier half's stretches (:func:`distinct`) says nothing by its
stretches: such a market of the model's data keeps none, and such a scored market is not judged by them; and a
stretch that occurs twice or more in a market of the model's data is not kept, nor one that occurs twice or more in
the ticks judged of a scored market (a copy of the model's data holds its once-only stretches once, as the data did).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

WINDOW = 16  # returns per stretch
QUANTUM = 1e-9  # log returns are rounded to this before hashing
TARGET = 2048  # stretches a model keeps, about
REPEAT_SHARE = 0.5  # a market repeats the training data when at least this share of its picked stretches are the model's
CHANCE_SHARE = 0.01  # a market whose later half repeats more of its earlier half's stretches than this repeats by itself
MIN_PICKED = 10  # picked stretches below which a market's share says nothing
_PRIME = np.uint64(0x100000001B3)
_KEEP_BITS = 53  # hashes are stored in 53 bits: exact as JSON numbers for any reader


def _mix(h: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser (uint64 arrays, wrapping): every bit of the result depends on every bit of ``h``."""
    h = h ^ (h >> np.uint64(30))
    h = h * np.uint64(0xBF58476D1CE4E5B9)
    h = h ^ (h >> np.uint64(27))
    h = h * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


def stretch_hashes(price: np.ndarray) -> np.ndarray:
    """Per tick of a market's prices (in time order), the hash (uint64, below 2**53) of the ``WINDOW`` log returns
    ending at it (prices t - WINDOW .. t); 0 for the first ``WINDOW`` ticks and for a stretch in which fewer than
    half the returns move (a stretch whose hash is 0, one in 2**53, is passed over as well)."""
    n = int(price.shape[0])
    out = np.zeros(n, dtype=np.uint64)
    if n <= WINDOW:
        return out
    r = np.diff(np.log(np.asarray(price, dtype=np.float64)))
    q = np.round(r / QUANTUM).astype(np.int64)
    m = r.size - WINDOW + 1
    h = np.zeros(m, dtype=np.uint64)
    uq = q.view(np.uint64)
    for j in range(WINDOW):  # in place: a market of millions of ticks holds a few arrays of its length, no more
        h *= _PRIME
        h += uq[j:j + m]
    h = _mix(h) >> np.uint64(64 - _KEEP_BITS)
    moving = np.convolve((q != 0).astype(np.int64), np.ones(WINDOW, dtype=np.int64), "valid") >= WINDOW // 2
    h[~moving] = 0
    out[WINDOW:] = h
    return out


def distinct(hashes: np.ndarray) -> np.ndarray | None:
    """A market's hashed stretches (``hashes``, 0 for none, in time order) that tell where they come from: None when
    more than ``CHANCE_SHARE`` of the stretches of its later half occur in its earlier half (about 0 for prices that
    move by amounts of their own; much more where the returns take a few values, a bounce between bid and ask: a later
    period would repeat the data by chance as well); else ``hashes`` with every stretch that occurs more than once
    among them set to 0 (passed over). One sort of the market's stretches."""
    where = np.flatnonzero(hashes)
    if where.size < 2:
        return hashes
    order = np.argsort(hashes[where], kind="stable")
    ordered = hashes[where[order]]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    group = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, ordered.size]))
    first = order[starts][group]  # per sorted stretch: where (among the hashed) its value first occurs
    half = where.size // 2
    if int(((order >= half) & (first < half)).sum()) > CHANCE_SHARE * (where.size - half):
        return None
    repeated = np.diff(np.r_[starts, ordered.size])[group] > 1
    if not repeated.any():
        return hashes
    out = hashes.copy()
    out[where[order[repeated]]] = 0
    return out


def fingerprint(parts: Iterable[np.ndarray]) -> dict[str, Any]:
    """The stretches a model keeps of its data: ``parts`` are :func:`stretch_hashes` of each market, already limited
    to the ticks the model was trained and validated on; a market that repeats its own stretches by chance keeps
    none, and a stretch that occurs more than once in its market is not kept (:func:`distinct`).
    ``{"window", "quantum", "modulus", "hashes"}``."""
    parts = [d for d in (distinct(p) for p in parts) if d is not None]
    every = np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)
    every = every[every != 0]
    modulus = 1
    while every.size / modulus > TARGET:
        modulus *= 2
    kept = np.unique(every[every % np.uint64(modulus) == 0])
    return {"window": WINDOW, "quantum": QUANTUM, "modulus": modulus, "hashes": [int(x) for x in kept]}


def copied(stored: Mapping[str, Any] | None, hashes: np.ndarray, candidates: np.ndarray) -> tuple[np.ndarray, int, int] | None:
    """Which of a market's ticks repeat the model's data (``stored``: :func:`fingerprint`'s record; ``hashes``: the
    market's :func:`stretch_hashes`; ``candidates``: a mask of the ticks to judge): the span from the first picked
    stretch among the model's to the last (back to that stretch's first price), when at least ``REPEAT_SHARE`` of the
    stretches picked in it are the model's and ``MIN_PICKED`` were picked; a stretch that occurs more than once among
    the candidates is passed over, and candidates that repeat their own stretches by chance are not judged
    (:func:`distinct`). Returns the mask of the candidates in that
    span, and how many stretches matched of those picked in it; None without such a span, without a record, or with
    one of another window or rounding."""
    if not isinstance(stored, Mapping) or stored.get("window") != WINDOW or stored.get("quantum") != QUANTUM:
        return None
    modulus, known = stored.get("modulus"), stored.get("hashes")
    if not isinstance(modulus, int) or isinstance(modulus, bool) or modulus < 1 or not isinstance(known, list) or not known:
        return None
    if not all(type(x) is int and 0 < x < 1 << _KEEP_BITS for x in known):
        return None  # not a record this module wrote (an edited or damaged metrics.json): no evidence either way
    idx = np.flatnonzero(candidates & (hashes != 0))
    idx = idx[hashes[idx] % np.uint64(modulus) == 0]
    # judged on the picked stretches alone: they are picked by value, so a value repeats among them as among all
    judged = distinct(hashes[idx])
    if judged is None:
        return None
    picked = idx[judged != 0]
    matched = picked[np.isin(hashes[picked], np.asarray(known, dtype=np.uint64))]
    if not matched.size:
        return None
    lo, hi = int(matched[0]) - WINDOW, int(matched[-1])
    in_span = int(((picked >= lo) & (picked <= hi)).sum())
    if in_span < MIN_PICKED or matched.size < REPEAT_SHARE * in_span:
        return None
    ticks = np.arange(hashes.shape[0])
    return candidates & (ticks >= lo) & (ticks <= hi), int(matched.size), in_span
