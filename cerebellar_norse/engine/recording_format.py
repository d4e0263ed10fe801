"""File format of tick recordings (``[debug] record_requests``): names, columns, start flags, companion.

The one place the writer (:mod:`~cerebellar_norse.engine.recorder`) and the reader
(:mod:`~cerebellar_norse.engine.recording`) take the format from. Timestamps are ms since
the epoch (UTC); sizes are bytes.

Format (version 2; version 1 files are still read)
    ``<state_dir>/recordings/ticks-<UTC date>-<NNNN>.csv``: a CSV file (Python's
    :mod:`csv`, ``QUOTE_MINIMAL``, ``\\n`` line ends, ASCII) whose header is
    :data:`COLUMNS` and whose every following line is one applied tick, in the order
    the engine applied them::

        timestamp,market_id,price,volume,p_down,p_flat,p_up,model_version,request_id,batch,seq,start
        1640995200000,"a,b",100.0,1000.0,0.25,0.5,0.25,seed-42,r-1,7,0,state
        1640995200001,"x""y",100.5,2.0,0.2,0.5,0.3,seed-42,r-2,7,1,rest
        1640995200250,"a,b",100.25,3.0,0.3,0.4,0.3,seed-42,r-3,8,0,

    Market ids holding ``,`` or ``"`` are quoted with ``"`` doubled, so every legal id
    (1–64 printable ASCII characters) reads back unchanged; prices, volumes and
    probabilities are written as Python's shortest exact ``repr``. ``p_down``,
    ``p_flat``, ``p_up`` are the probabilities served for the tick and
    ``request_id`` the caller's request id; they are empty when the caller did not
    hand them over. ``batch`` numbers the engine's backend steps (rising within a
    file) and ``seq`` is the tick's position in its step. ``start`` says where the
    market's state stood just before the tick, when the tick is the market's first in
    the file or the first after the service dropped the market's state (eviction,
    reset): ``rest`` (the market had no state: it started from rest) or ``state`` (its
    full state, captured before the step, is in the file's companion, keyed by this
    line); empty otherwise, and empty for every tick handed over without
    :meth:`~cerebellar_norse.engine.recorder.TickRecorder.before_step`. Because the
    first four columns are those of a training CSV, a recording can also be trained or
    evaluated on. Free-text fields
    (model version, request id) have characters outside printable ASCII replaced by
    ``?``, so a record is always exactly one line. Version 1 files (header
    :data:`COLUMNS_V1`, the first nine columns) have no starting states.

Starting states: ``ticks-<UTC date>-<NNNN>.states``
    The companion of a recording file, created with its first ``state`` record:
    the line :data:`STATES_MAGIC`, then per captured market a JSON header line
    (ASCII, every non-ASCII or control character escaped, so any market id fits)::

        {"line":2,"market_id":"a,b","fields":[{"name":"enc","dtype":"<f8","shape":[8]},...],
         "nbytes":5184,"sha256":"<hex of the payload>"}

    followed by ``nbytes`` bytes of payload (the fields' raw little-endian C-order
    arrays, in the header's order) and ``\\n``. ``line`` is the recording line whose
    ``start`` is ``state``. The payload digest guards each record while the file is
    open; a closed companion also gets a ``.sha256`` sidecar.
"""

from __future__ import annotations

import re
from pathlib import Path

COLUMNS_V1 = ("timestamp", "market_id", "price", "volume", "p_down", "p_flat", "p_up", "model_version", "request_id")
COLUMNS = (*COLUMNS_V1, "batch", "seq", "start")
HEADER_V1 = ",".join(COLUMNS_V1) + "\n"
HEADER = ",".join(COLUMNS) + "\n"
START_REST = "rest"  # the market had no state before this tick
START_STATE = "state"  # the market's state before this tick is in the companion file
CHECKSUM_SUFFIX = ".sha256"
STATES_SUFFIX = ".states"
STATES_MAGIC = b"cerebellar-norse recording states v1\n"

FILE_RE = re.compile(r"ticks-(\d{8})-(\d{4,})\.csv")
STATES_RE = re.compile(r"ticks-(\d{8})-(\d{4,})\.states")
LEGACY_RE = re.compile(r"ticks-\d{8}\.csv")  # one file per day, written before ids were escaped
NON_PRINTABLE = re.compile(r"[^ -~]")  # free-text characters a record must not hold


def checksum_path(path: Path) -> Path:
    """The ``<file>.sha256`` sidecar of a recording (or of its companion)."""
    return path.with_name(path.name + CHECKSUM_SUFFIX)


def states_path(path: Path) -> Path:
    """The companion ``ticks-…-NNNN.states`` of a recording ``ticks-…-NNNN.csv`` (starting states)."""
    name = path.name[:-len(".csv")] if path.name.endswith(".csv") else path.name
    return path.with_name(name + STATES_SUFFIX)


def file_sort_key(path: Path) -> tuple[str, int]:
    """(UTC date, sequence number) of a recording's name, for ordering; ("", -1) for other names."""
    m = FILE_RE.fullmatch(path.name)
    return (m.group(1), int(m.group(2))) if m else ("", -1)
