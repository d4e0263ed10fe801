"""Reading and verification of tick recordings (``replay``, ``--verify-data``).

The file format is in :mod:`~cerebellar_norse.engine.recording_format`; the files are
written by :mod:`~cerebellar_norse.engine.recorder`. Timestamps are ms since the epoch.

Verification
    :func:`verify_recordings` (``cerebellar-norse --verify-data DIR``) checks each
    closed file (and companion) against its checksum and line by line (record by
    record), and the open file (locked by a writer, or the newest of its directory
    without a checksum: left by a crash) line by line. A missing or mismatching
    checksum, a malformed line, a malformed or mismatching state record and a
    ``state`` start without its record are problems naming the file (and line); a
    last line or state record without its end (cut by a crash) is only a warning.
    :func:`read_recording` (``replay``) applies the same checks and refuses a
    malformed recording with ``file:line: reason``.
"""

from __future__ import annotations

import csv
import fcntl
import hashlib
import json
import math
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DataError
from ..storage import read_file
from ..ticks import MARKET_ID_MAX, TS_MAX_MS, TS_MIN_MS, Tick
from .recording_format import (
    CHECKSUM_SUFFIX,
    COLUMNS,
    COLUMNS_V1,
    FILE_RE,
    HEADER,
    HEADER_V1,
    LEGACY_RE,
    NON_PRINTABLE,
    START_REST,
    START_STATE,
    STATES_MAGIC,
    STATES_RE,
    STATES_SUFFIX,
    checksum_path,
    file_sort_key,
    states_path,
)

MAX_PROBLEMS_PER_FILE = 20
_SIDECAR_RE = re.compile(r"([0-9a-f]{64})  (\S.*)\n")
_DIGITS = re.compile(r"\d{1,18}")


def _in_use(path: Path) -> bool:
    """True while a recorder holds the file open (an exclusive ``flock``)."""
    try:
        fh = open(path, "rb")  # noqa: SIM115 (closed below)
    except OSError:
        return False
    with fh:
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:
            return False
        return False


@dataclass(frozen=True)
class RecordedTick:
    """One record: the tick, what was served for it (None/"" when not recorded) and its line in the file.

    ``batch`` and ``seq`` (the step and the position in it) and ``start`` (``"rest"``,
    ``"state"`` or ``""``) are None in version 1 files.
    """

    tick: Tick
    probabilities: tuple[float, float, float] | None
    model_version: str
    request_id: str
    line: int
    batch: int | None = None
    seq: int | None = None
    start: str | None = None


@dataclass(frozen=True)
class StartState:
    """A market's full state just before the tick on ``line`` (``read_slot`` arrays)."""

    market_id: str
    line: int
    state: dict[str, np.ndarray]


@dataclass
class Scan:
    """What reading a recording found."""

    path: Path
    records: list[RecordedTick] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # "file:line: reason"
    warnings: list[str] = field(default_factory=list)
    sha256: str = ""
    checksum: str | None = None  # "ok", "mismatch", "missing", or a problem with the checksum file
    version: int = 0  # format version from the header (1 or 2); 0 when unread
    states: dict[int, StartState] = field(default_factory=dict)  # by line of the tick they precede
    states_checksum: str | None = None  # as ``checksum``, for the companion; None when there is none

    @property
    def ticks(self) -> list[Tick]:
        """The recorded ticks in file (= applied) order."""
        return [r.tick for r in self.records]


def is_recording(path: Path) -> bool:
    """True for a file named like a recording or starting with its header (else it is a plain tick CSV)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO's open would wait for a writer
            return False
        with open(path, "rb") as fh:
            head = fh.read(max(len(HEADER), len(HEADER_V1)))
    except OSError:
        return False
    return (head.startswith(HEADER.encode("ascii")) or head.startswith(HEADER_V1.encode("ascii"))
            or FILE_RE.fullmatch(Path(path).name) is not None)


def _float(text: str, name: str) -> float:
    try:
        x = float(text)
    except ValueError:
        raise ValueError(f"{name} {text!r} is not a number") from None
    if not math.isfinite(x):
        raise ValueError(f"{name} {text!r} is not finite")
    return x


def _parse(fields: list[str], version: int, line: int) -> RecordedTick:
    columns = COLUMNS if version == 2 else COLUMNS_V1
    if len(fields) != len(columns):
        raise ValueError(f"expected {len(columns)} fields, got {len(fields)}")
    ts_text, market, price_text, volume_text, pd, pf, pu, version_text, rid = fields[:9]
    if not ts_text.isdigit():
        raise ValueError(f"timestamp {ts_text!r} is not an integer (ms since epoch)")
    ts = int(ts_text)
    if not TS_MIN_MS <= ts < TS_MAX_MS:
        raise ValueError(f"timestamp {ts} is not between 1971-01-01 and 2100-01-01 in ms")
    if not 1 <= len(market) <= MARKET_ID_MAX or NON_PRINTABLE.search(market):
        raise ValueError(f"market_id {market!r} is not 1-{MARKET_ID_MAX} printable ASCII characters")
    price = _float(price_text, "price")
    if not price > 0:
        raise ValueError(f"price {price_text!r} is not > 0")
    volume = _float(volume_text, "volume")
    if not volume >= 0:
        raise ValueError(f"volume {volume_text!r} is negative")
    probs: tuple[float, float, float] | None = None
    if pd or pf or pu:
        ps = tuple(_float(t, n) for t, n in ((pd, "p_down"), (pf, "p_flat"), (pu, "p_up")))
        if not all(0.0 <= p <= 1.0 for p in ps):
            raise ValueError(f"probabilities {pd}, {pf}, {pu} are not in [0, 1]")
        probs = (ps[0], ps[1], ps[2])
    if NON_PRINTABLE.search(version_text) or NON_PRINTABLE.search(rid):
        raise ValueError("model_version or request_id holds characters other than printable ASCII")
    tick = Tick(price, volume, ts, market)
    if version != 2:
        return RecordedTick(tick, probs, version_text, rid, line)
    batch_text, seq_text, start = fields[9:]
    if not _DIGITS.fullmatch(batch_text) or not _DIGITS.fullmatch(seq_text):
        raise ValueError(f"batch {batch_text!r} and seq {seq_text!r} must be integers >= 0")
    if start not in ("", START_REST, START_STATE):
        raise ValueError(f"start {start!r} is not empty, {START_REST!r} or {START_STATE!r}")
    return RecordedTick(tick, probs, version_text, rid, line, int(batch_text), int(seq_text), start)


def _check_sidecar(path: Path, digest: str) -> tuple[str, str | None]:
    """(``ok``/``mismatch``/``missing``/a problem with the sidecar, the mismatch problem or None)."""
    side = checksum_path(path)
    if not side.exists() and not side.is_symlink():  # (a link to nothing is an unreadable checksum file, not none)
        return "missing", None
    try:
        text = read_file(side).decode("ascii")
    except (OSError, UnicodeDecodeError) as exc:
        return f"{side}: unreadable checksum file ({getattr(exc, 'strerror', None) or exc})", None
    m = _SIDECAR_RE.fullmatch(text)
    if m is None:
        return f"{side}: not a sha256sum line for {path.name}", None
    if m.group(2) != path.name:
        return f"{side}: names {m.group(2)!r}, not {path.name}", None
    if m.group(1) != digest:
        return "mismatch", (f"{path}: checksum mismatch (expected {m.group(1)[:16]}…, file has {digest[:16]}…): "
                            "the file was truncated or edited after it was closed")
    return "ok", None


def _state_header(text: bytes) -> tuple[int, str, list[tuple[str, np.dtype[Any], tuple[int, ...]]], int, str]:
    """A companion record's JSON header, checked: (line, market, fields, nbytes, sha256); ValueError."""
    try:
        head = json.loads(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise ValueError("record header is not a JSON line") from None
    if not isinstance(head, dict) or set(head) != {"line", "market_id", "fields", "nbytes", "sha256"}:
        raise ValueError("record header must hold exactly line, market_id, fields, nbytes, sha256")
    line, market, fields, nbytes, digest = (head[k] for k in ("line", "market_id", "fields", "nbytes", "sha256"))
    if type(line) is not int or line < 2 or type(nbytes) is not int or nbytes < 0:
        raise ValueError(f"line {line!r} or nbytes {nbytes!r} is not a valid integer")
    if not isinstance(market, str) or not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise ValueError("market_id must be a string and sha256 64 hex digits")
    if not isinstance(fields, list) or not fields:
        raise ValueError("fields must be a non-empty list")
    out: list[tuple[str, np.dtype[Any], tuple[int, ...]]] = []
    total = 0
    for f in fields:
        if not (isinstance(f, dict) and set(f) == {"name", "dtype", "shape"} and isinstance(f["name"], str)
                and isinstance(f["dtype"], str) and re.fullmatch(r"<[fiu][1248]|\|[iu]1", f["dtype"])
                and isinstance(f["shape"], list) and all(type(d) is int and d >= 0 for d in f["shape"])):
            raise ValueError(f"field {f!r} is not {{name, dtype (little-endian number), shape}}")
        dt = np.dtype(f["dtype"])
        shape = tuple(f["shape"])
        out.append((f["name"], dt, shape))
        total += dt.itemsize * math.prod(shape)
    if total != nbytes:
        raise ValueError(f"fields hold {total} bytes, nbytes says {nbytes}")
    return line, market, out, nbytes, digest


def scan_states(path: Path, check_sum: bool = True) -> tuple[dict[int, StartState], list[str], list[str], str | None]:
    """Read a companion (starting states): (states by line, problems, warnings, checksum status).

    Problems name the file and the byte offset of the bad record; a last record cut
    short (a crash while it was written) is a warning and is not returned.
    """
    states: dict[int, StartState] = {}
    problems: list[str] = []
    warnings: list[str] = []
    try:
        data = read_file(path)
    except OSError as exc:
        return states, [f"{path}: cannot read: {exc.strerror}"], warnings, None
    status: str | None = None
    if check_sum:
        status, problem = _check_sidecar(path, hashlib.sha256(data).hexdigest())
        if problem is not None:
            problems.append(problem)
        elif status not in ("ok", "missing"):
            problems.append(status)
    if not data.startswith(STATES_MAGIC):
        problems.append(f"{path}: not a starting-state file (expected first line {STATES_MAGIC.decode().strip()!r})")
        return states, problems, warnings, status
    pos = len(STATES_MAGIC)
    while pos < len(data):
        end = data.find(b"\n", pos)
        if end < 0:
            warnings.append(f"{path}: last record (byte {pos}) is incomplete (cut by a crash while it was written); ignored")
            break
        record_at = pos
        try:
            line, market, fields, nbytes, digest = _state_header(data[pos:end])
        except ValueError as exc:
            problems.append(f"{path}: record at byte {pos}: {exc}")
            break  # the next record cannot be found
        body = end + 1
        if body + nbytes + 1 > len(data):
            warnings.append(f"{path}: last record (byte {pos}, market {market!r}) is incomplete (cut by a crash while "
                            "it was written); ignored")
            break
        payload = data[body:body + nbytes]
        if data[body + nbytes:body + nbytes + 1] != b"\n":
            problems.append(f"{path}: record at byte {pos} (market {market!r}): payload not followed by a line end")
            break
        pos = body + nbytes + 1
        if hashlib.sha256(payload).hexdigest() != digest:
            problems.append(f"{path}: record at byte {record_at} (market {market!r}, line {line}): payload does not "
                            "match its sha256 (the file was edited or damaged)")
            continue
        if line in states:
            problems.append(f"{path}: two states for line {line}")
            continue
        arrays: dict[str, np.ndarray] = {}
        offset = 0
        for name, dt, shape in fields:
            n = dt.itemsize * math.prod(shape)
            arrays[name] = np.frombuffer(payload, dt, count=math.prod(shape), offset=offset).reshape(shape).copy()
            offset += n
        states[line] = StartState(market, line, arrays)
        if len(problems) >= MAX_PROBLEMS_PER_FILE:
            break
    return states, problems, warnings, status


def scan_recording(path: Path, check_sum: bool = True) -> Scan:
    """Read a recording line by line (and against its checksum file when present and ``check_sum``), with its states.

    Malformed lines, time going backwards within a market, a checksum mismatch, and
    (version 2) a ``state`` start without its record in the companion or a companion
    record without its ``state`` line are problems; a last line without its line end
    (a crash cut it) is a warning and is not returned.
    """
    path = Path(path)
    scan = Scan(path)
    try:
        data = read_file(path)
    except OSError as exc:
        scan.problems.append(f"{path}: cannot read: {exc.strerror}")
        return scan
    scan.sha256 = hashlib.sha256(data).hexdigest()
    if check_sum:
        scan.checksum, problem = _check_sidecar(path, scan.sha256)
        if problem is not None:
            scan.problems.append(problem.replace("the file was", "the recording was"))
        elif scan.checksum not in ("ok", "missing"):
            scan.problems.append(scan.checksum)
    lines = data.split(b"\n")
    tail = lines.pop()  # b"" when the file ends with a line end
    if tail:
        scan.warnings.append(f"{path}:{len(lines) + 1}: last line is incomplete (cut by a crash while it was written); ignored")
    if not lines:
        if not tail:
            scan.warnings.append(f"{path}: empty (created just before a crash?)")
        return scan
    header = lines[0] + b"\n"
    if header == HEADER.encode("ascii"):
        scan.version = 2
    elif header == HEADER_V1.encode("ascii"):
        scan.version = 1
    else:
        scan.problems.append(f"{path}:1: not a recording header (expected {HEADER.strip()!r})")
        return scan
    last_ts: dict[str, tuple[int, int]] = {}
    for no, raw in enumerate(lines[1:], start=2):
        try:
            text = raw.decode("ascii")
            fields = next(csv.reader([text], strict=True))
            rec = _parse(fields, scan.version, no)
            tick = rec.tick
            prev = last_ts.get(tick.market_id)
            if prev is not None and tick.timestamp < prev[0]:
                raise ValueError(f"market {tick.market_id!r} goes back in time: {tick.timestamp} after {prev[0]} "
                                 f"(line {prev[1]})")
        except (UnicodeDecodeError, csv.Error, ValueError) as exc:
            reason = "not ASCII" if isinstance(exc, UnicodeDecodeError) else str(exc)
            scan.problems.append(f"{path}:{no}: {reason}")
            if len(scan.problems) >= MAX_PROBLEMS_PER_FILE:
                scan.problems.append(f"{path}: further lines not checked")
                break
            continue
        last_ts[tick.market_id] = (tick.timestamp, no)
        scan.records.append(rec)
    if scan.version == 2:
        _scan_companion(scan, check_sum, last_line=len(lines))
    return scan


def _scan_companion(scan: Scan, check_sum: bool, last_line: int) -> None:
    """Read the companion of a version 2 recording and match its records with the ``state`` starts."""
    path, companion = scan.path, states_path(scan.path)
    wanted = {r.line: r.tick.market_id for r in scan.records if r.start == START_STATE}
    if not companion.exists():
        if wanted:
            line = min(wanted)
            scan.problems.append(f"{path}:{line}: the starting state of market {wanted[line]!r} is in {companion.name}, "
                                 "which is missing" + (f" ({len(wanted)} states)" if len(wanted) > 1 else ""))
        return
    # the companion is checked against its sidecar whenever the recording is (a closed recording's companion must have one)
    states, problems, warnings, status = scan_states(companion, check_sum)
    scan.states_checksum = status
    if check_sum and scan.checksum == "ok" and status == "missing":
        problems.append(f"{companion}: checksum file {checksum_path(companion).name} missing (the recording is closed)")
    scan.problems += problems
    scan.warnings += warnings
    if problems:
        return
    for line, market in sorted(wanted.items()):
        st = states.get(line)
        if st is None:
            scan.problems.append(f"{path}:{line}: the starting state of market {market!r} is missing from {companion}")
        elif st.market_id != market:
            scan.problems.append(f"{companion}: the state for line {line} is of market {st.market_id!r}, the line is of "
                                 f"{market!r}")
    for line, st in sorted(states.items()):
        if line not in wanted and line <= last_line:
            scan.problems.append(f"{companion}: a state of market {st.market_id!r} for line {line}, which does not start "
                                 "from a recorded state")
    scan.states = {line: st for line, st in states.items() if line in wanted}


def read_recording(path: Path) -> Scan:
    """A recording's records (and starting states) for replay; DataError (``file:line: reason``) on any problem.

    The checksum files, when present, must match. Without one (the open file, or a copy)
    the lines are checked alone and a warning says so.
    """
    scan = scan_recording(path)
    if scan.problems:
        more = len(scan.problems) - 1
        raise DataError(scan.problems[0] + (f" (and {more} more problems)" if more else ""), scan.problems)
    if scan.checksum == "missing":
        scan.warnings.insert(0, f"{path}: no checksum file ({checksum_path(path).name}): lines checked one by one only")
    return scan


@dataclass
class Verification:
    """Lines printed by ``--verify-data``."""

    ok: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def verify_recordings(root: Path) -> Verification:
    """Verify every recording (and companion) under ``root`` (see the module docstring)."""
    out = Verification()
    root = Path(root)
    if not root.is_dir():
        return out
    by_dir: dict[Path, list[Path]] = {}
    for p in root.rglob("ticks-*"):
        if any(part.startswith(".") for part in p.relative_to(root).parts):
            continue
        name = p.name
        if name.endswith(CHECKSUM_SUFFIX):
            target = p.with_name(name[:-len(CHECKSUM_SUFFIX)])
            if (FILE_RE.fullmatch(target.name) or STATES_RE.fullmatch(target.name)) and not target.exists():
                out.problems.append(f"{target}: {'recording' if FILE_RE.fullmatch(target.name) else 'starting-state file'}"
                                    f" missing (its checksum file {p.name} is there)")
        elif FILE_RE.fullmatch(name):
            by_dir.setdefault(p.parent, []).append(p)
        elif STATES_RE.fullmatch(name):
            if not p.with_name(name[:-len(STATES_SUFFIX)] + ".csv").exists():
                out.problems.append(f"{p}: starting states without their recording "
                                    f"{name[:-len(STATES_SUFFIX)]}.csv")
        elif LEGACY_RE.fullmatch(name) and p.parent.name == "recordings":
            out.warnings.append(f"{p}: recording in the old format (market ids not escaped, no checksum): not verified")
    for files in by_dir.values():
        files.sort(key=file_sort_key)
        newest = files[-1]
        for path in files:
            sealed = checksum_path(path).exists() or checksum_path(path).is_symlink()  # (a link to nothing: unreadable)
            open_now = not sealed and (path == newest or _in_use(path))
            if not sealed and not open_now:
                out.problems.append(f"{path}: checksum file {checksum_path(path).name} missing "
                                    "(a closed recording must have one)")
                continue
            scan = scan_recording(path, check_sum=sealed)
            out.problems += scan.problems
            out.warnings += scan.warnings
            if not scan.problems:
                n = len(scan.records)
                states = f", {len(scan.states)} starting states" if scan.states else ""
                out.ok.append(f"{path}: recording OK ({n} ticks{states}, checksum verified)" if sealed else
                              f"{path}: open recording OK so far ({n} ticks{states} checked line by line; "
                              "checksummed when closed)")
    return out


def summary(scan: Scan) -> dict[str, Any]:
    """Counts of a scan (markets, ticks, model versions, with results, starting states)."""
    return {"ticks": len(scan.records), "markets": len({r.tick.market_id for r in scan.records}),
            "model_versions": sorted({r.model_version for r in scan.records if r.model_version}),
            "with_probabilities": sum(r.probabilities is not None for r in scan.records),
            "starting_states": len(scan.states),
            "starting_from_rest": sum(r.start == START_REST for r in scan.records)}
