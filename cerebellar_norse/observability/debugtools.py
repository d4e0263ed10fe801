"""Debugging tools: one market's state as JSON, a field-by-field diff of two dumps, thread stacks, redacted config.

Market state dump (``GET /debug/markets/{id}/state``, ``cerebellar-norse state dump``)
    A JSON object describing one market's slot: encoder statistics (the running mean,
    variance and count of each feature), the last tick the state holds (time and
    price), per-population membrane summaries (mean, standard deviation, minimum and
    maximum of the membrane potential ``v`` and synaptic current ``i`` of the granule,
    Purkinje, DCN and readout populations, plus the Golgi inhibition), spike counts and
    the warm-up status. It is read on the event loop's thread, between two batches, so
    it is one consistent state; on CUDA the device state is brought to the host first.

Spike counts
    The state itself holds no spike history. Per-market counts are kept by a small
    observer of the engine's batches that is attached on the first state request (so
    serving pays nothing until someone asks; afterwards a few numpy operations per
    batch): ``spike_counts`` gives the counts of the market's last tick and its totals
    since tracking began (``tracking_since``), or nulls for a market not stepped since.

Diff (``cerebellar-norse state diff A.json B.json``)
    Walks both dumps together: objects key by key, arrays index by index; numbers differ
    when ``|a - b| > tolerance``, anything else when not equal. Each difference is one
    ``path: A -> B`` line. Fields that always differ between two captures
    (:data:`IGNORED`) are skipped.
"""

from __future__ import annotations

import math
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

from ..errors import ServiceCallError
from ..httpcalls import answer_message, bearer, call_failure, path_id, request_errors, service_error_message
from ..neurons.encoder import S_COUNT, S_LAST_PRICE, S_LAST_TS, S_MEAN, S_N_TICKS, S_VAR

if TYPE_CHECKING:
    from ..config import Config
    from ..engine.engine import Engine
    from ..engine.records import BatchRecord

FEATURES = ("log_return", "log_volume", "log_gap")
POPULATIONS = {"granule": ("v_gr", "i_gr"), "purkinje": ("v_pc", "i_pc"), "dcn": ("v_dcn", "i_dcn"),
               "readout": ("v_out", "i_out")}
SPIKING = ("granule", "purkinje", "dcn")  # the populations whose spikes a step counts, in its order
IGNORED = frozenset({"captured_at", "spike_counts.tracking_since"})  # differ between any two captures
TRACKER_KEY = "spike_tracker"


class EngineSink(Protocol):
    """A debug tracker fed by an engine's batch records."""

    engine: Engine

    def __init__(self, engine: Engine) -> None: ...

    def observe(self, rec: BatchRecord) -> None: ...


A = TypeVar("A", bound=EngineSink)


def attach_once(cls: type[A], engine: Engine, registry: dict[str, Any], key: str) -> A:
    """The ``cls(engine)`` kept in ``registry[key]``, its ``observe`` made a sink of
    ``engine`` when first created (again after the engine was replaced)."""
    obj = registry.get(key)
    if not isinstance(obj, cls) or obj.engine is not engine:
        obj = registry[key] = cls(engine)
        engine.sinks.append(obj.observe)
    return obj
REDACTED = "***"


def utc_iso(seconds: float) -> str:
    """``2024-01-01T00:00:00.123Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int(seconds * 1000) % 1000:03d}Z"


def summary(a: np.ndarray) -> dict[str, float]:
    """Mean, standard deviation, minimum and maximum of an array (as float64)."""
    x = np.asarray(a, dtype=np.float64)
    return {"mean": float(x.mean()), "std": float(x.std()), "min": float(x.min()), "max": float(x.max())}


class SpikeTracker:
    """Per-slot spike counts of an engine, kept by one of its batch-record sinks.

    ``observe`` runs after every backend step on the loop thread and reads the slots of
    the step from the engine's step buffers. A slot whose market changed (eviction,
    reset) since the last step it was seen in starts its counts again.
    """

    def __init__(self, engine: Engine) -> None:
        slots = engine.pool.capacity
        self.engine = engine
        self.since = time.time()
        self.total = np.zeros((slots, 3), dtype=np.int64)
        self.last = np.zeros((slots, 3), dtype=np.int64)
        self.ticks = np.zeros(slots, dtype=np.int64)
        self.seen = np.zeros(slots)  # the slot's tick count (encoder S_N_TICKS) after the last step it was in

    @classmethod
    def attach(cls, engine: Engine, registry: dict[str, Any]) -> SpikeTracker:
        """The tracker kept in ``registry`` (the service's extras), attached to ``engine`` on first use."""
        return attach_once(cls, engine, registry, TRACKER_KEY)

    def observe(self, rec: BatchRecord) -> None:
        """Add one step's spikes (B, 3) to the slots of its ticks (engine sink)."""
        b, spikes = rec.size, rec.spikes
        if b == 0:
            return
        slots = np.asarray(rec.slots)
        enc = self.engine.pool.arrays.enc
        uniq, counts = np.unique(slots, return_counts=True)
        now = enc[uniq, S_N_TICKS]
        fresh = uniq[now != self.seen[uniq] + counts]
        self.total[fresh] = 0
        self.ticks[fresh] = 0
        self.last[fresh] = 0
        np.add.at(self.total, slots, spikes[:b])
        np.add.at(self.ticks, slots, 1)
        for j, s in enumerate(slots.tolist()):  # the market's last tick of the batch wins
            self.last[s] = spikes[j]
        self.seen[uniq] = now

    def counts(self, slot: int) -> dict[str, Any]:
        """The counts of one slot for a dump."""
        stepped = int(self.ticks[slot]) > 0 and self.seen[slot] == self.engine.pool.arrays.enc[slot, S_N_TICKS]
        return {
            "tracking_since": utc_iso(self.since),
            "ticks": int(self.ticks[slot]) if stepped else 0,
            "total": dict(zip(SPIKING, self.total[slot].tolist(), strict=True)) if stepped else None,
            "last_tick": dict(zip(SPIKING, self.last[slot].tolist(), strict=True)) if stepped else None,
        }


def market_state(engine: Engine, market_id: str, tracker: SpikeTracker | None = None) -> dict[str, Any] | None:
    """One market's state as a JSON-able dict, or None when the market holds no state.

    Call on the engine's loop thread (between batches).
    """
    slot = engine.pool.table.get(market_id)
    if slot is None:
        return None
    engine.backend.sync_to_host([slot])  # CUDA keeps neuron state on the device: bring this slot's to the host
    arrays = engine.pool.arrays
    enc = np.asarray(arrays.enc[slot], dtype=np.float64)
    seen = int(enc[S_N_TICKS])
    warmup = engine.cfg.neural.warmup_ticks
    populations: dict[str, Any] = {}
    for name, (v, i) in POPULATIONS.items():
        v_arr, i_arr = getattr(arrays, v)[slot], getattr(arrays, i)[slot]
        populations[name] = {"size": int(np.size(v_arr)), "v": summary(v_arr), "i": summary(i_arr)}
    populations["golgi"] = {"inhibition": float(arrays.golgi[slot])}
    last_ts = int(enc[S_LAST_TS])
    return {
        "market_id": market_id,
        "captured_at": utc_iso(time.time()),
        "model_version": engine.model_version,
        "precision": engine.cfg.neural.precision,
        "warmup": {"warming_up": seen <= warmup, "ticks_seen": seen, "warmup_ticks": warmup,
                   "ticks_until_warm": max(0, warmup + 1 - seen)},
        "last_tick": {"timestamp": last_ts, "time": utc_iso(last_ts / 1000.0), "price": float(enc[S_LAST_PRICE])}
        if seen else None,
        "encoder": {"ticks_seen": seen, "features": {
            f: {"mean": float(enc[S_MEAN + k]), "var": float(enc[S_VAR + k]), "count": int(enc[S_COUNT + k])}
            for k, f in enumerate(FEATURES)}},
        "populations": populations,
        "spike_counts": tracker.counts(slot) if tracker is not None else None,
    }


def busiest_markets(engine: Engine, limit: int) -> list[dict[str, Any]]:
    """Markets holding state, most ticks seen first (the encoder's count since the market's state began).

    Call on the engine's loop thread (between batches).
    """
    items = engine.pool.table.items()
    if not items:
        return []
    slots = np.array([s for _, s in items], dtype=np.int64)  # encoder state (ticks seen) is always on the host
    enc = engine.pool.arrays.enc
    seen = enc[slots, S_N_TICKS]
    order = np.argsort(-seen, kind="stable")[:limit]
    return [{"market_id": items[k][0], "ticks_seen": int(seen[k]), "last_timestamp": int(enc[slots[k], S_LAST_TS])}
            for k in order.tolist()]


# -- diff ---------------------------------------------------------------------------------------------


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def diff_values(a: Any, b: Any, tolerance: float = 0.0, path: str = "",
                ignored: frozenset[str] = IGNORED) -> list[tuple[str, Any, Any]]:
    """Differences between two JSON values as ``(path, a, b)``; a missing field is ``<missing>``."""
    if path in ignored:
        return []
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[tuple[str, Any, Any]] = []
        for k in [*a, *(k for k in b if k not in a)]:
            p = _join(path, k)
            if k not in a or k not in b:
                if p not in ignored:
                    out.append((p, a.get(k, MISSING), b.get(k, MISSING)))
            else:
                out += diff_values(a[k], b[k], tolerance, p, ignored)
        return out
    if isinstance(a, list) and isinstance(b, list):
        out = []
        for k in range(max(len(a), len(b))):
            if k >= len(a) or k >= len(b):
                out.append((_join(path, k), a[k] if k < len(a) else MISSING, b[k] if k < len(b) else MISSING))
            else:
                out += diff_values(a[k], b[k], tolerance, _join(path, k), ignored)
        return out
    if _is_number(a) and _is_number(b):
        fa, fb = float(a), float(b)
        if fa == fb or (math.isnan(fa) and math.isnan(fb)):
            return []
        return [(path, a, b)] if not abs(fa - fb) <= tolerance else []
    if isinstance(a, bool) != isinstance(b, bool):  # True == 1 in Python, not in a dump
        return [(path, a, b)]
    return [] if a == b else [(path, a, b)]


class _Missing:
    def __repr__(self) -> str:
        return "<missing>"


MISSING = _Missing()


def format_difference(path: str, a: Any, b: Any) -> str:
    """``path: A -> B`` (with ``|diff|`` for numbers)."""
    import json

    def show(x: Any) -> str:
        return repr(x) if x is MISSING else json.dumps(x)

    line = f"{path or '<root>'}: {show(a)} -> {show(b)}"
    if _is_number(a) and _is_number(b):
        line += f" (|diff| {abs(float(a) - float(b)):.3g})"
    return line


# -- live introspection ------------------------------------------------------------------------------


def thread_stacks() -> list[dict[str, Any]]:
    """The current stack of every thread of this process, innermost frame last (like a traceback)."""
    frames = sys._current_frames()
    threads = {t.ident: t for t in threading.enumerate()}
    out = []
    for ident, frame in sorted(frames.items(), key=lambda kv: kv[0]):
        t = threads.get(ident)
        stack = traceback.extract_stack(frame)
        out.append({
            "thread_id": ident,
            "name": t.name if t is not None else f"<unknown {ident}>",
            "daemon": t.daemon if t is not None else None,
            "frames": [{"file": f.filename, "line": f.lineno, "function": f.name, "code": f.line or ""} for f in stack],
            "text": "".join(traceback.format_list(stack)),
        })
    return out


def format_stacks(stacks: list[dict[str, Any]]) -> str:
    """Thread stacks as text, one block per thread (``py-spy dump`` style)."""
    parts = []
    for s in stacks:
        parts.append(f"Thread {s['thread_id']} ({s['name']}{', daemon' if s['daemon'] else ''}):\n{s['text']}")
    return "\n".join(parts)


def redacted_config(cfg: Config, secret_keys: frozenset[str] = frozenset({"api_token"})) -> dict[str, Any]:
    """The effective configuration as JSON with every secret replaced by ``***`` (an unset one stays null).

    Secrets are the fields typed ``SecretStr`` and, whatever their type, the keys in
    ``secret_keys``. ``logging.level`` is the level in force: ``CEREBELLAR_NORSE_LOG`` wins over the file's.
    """
    from pydantic import SecretStr

    from .logging import effective_level

    data: dict[str, Any] = cfg.model_dump(mode="json")
    raw: dict[str, Any] = cfg.model_dump(mode="python")

    def walk(node: dict[str, Any], py: Any) -> None:
        for k, v in node.items():
            pv = py.get(k) if isinstance(py, dict) else None
            if (k in secret_keys or isinstance(pv, SecretStr)) and v is not None:
                node[k] = REDACTED
            elif isinstance(v, dict):
                walk(v, pv)

    walk(data, raw)
    data["logging"]["level"] = effective_level(cfg.logging)
    return data


# -- commands --------------------------------------------------------------------------------------


def service_url(cfg: Config) -> str:
    """``http://<server.host>:<server.port>``, with a wildcard listen address replaced by loopback."""
    from ..config import listen_address

    host = listen_address(cfg.server.host)  # (an IPv6 address may be written with a URL's brackets)
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{cfg.server.port}"


def config_token(cfg: Config) -> str | None:
    """The configured API token (None when there is none, or it is blank)."""
    token = cfg.server.api_token
    value = token.get_secret_value().strip() if token is not None else ""
    return value or None


def fetch_json(url: str, path: str, token: str | None, timeout_s: float = 10.0) -> Any:
    """GET ``url + path`` with the bearer token; the decoded JSON, or ServiceCallError naming what failed."""
    import httpx

    headers = bearer(token)
    target = url.rstrip("/") + path
    try:
        r = httpx.get(target, headers=headers, timeout=timeout_s)
    except request_errors() as exc:
        raise ServiceCallError(call_failure(url, exc)) from None
    if r.status_code == 401:
        raise ServiceCallError(f"{target}: 401 unauthorized: pass the service's token (--token, or server.api_token "
                               "in --config, or CEREBELLAR_NORSE_SERVER__API_TOKEN)")
    if r.status_code != 200:
        said = service_error_message(r)
        if said is not None:  # the service's own error answer (404: no such market or request): it is the service
            raise ServiceCallError(f"{target}: {r.status_code}: {said}")
        raise ServiceCallError(f"{target}: {r.status_code}: {answer_message(r)} (is the service at {url} cerebellar-norse?)")
    try:
        return r.json()
    except ValueError:
        raise ServiceCallError(f"{target}: answer is not JSON") from None


def cmd_trace(cfg: Config, request_id: str | None, url: str | None, token: str | None, slow: int | None,
              as_json: bool) -> int:
    """``cerebellar-norse trace REQUEST_ID`` (or ``--slow N``): a request's timeline from the running service, drawn as text."""
    import json

    from .timelines import ascii_timeline

    url = url or service_url(cfg)
    path = f"/debug/requests?slow=true&limit={slow}" if slow else f"/debug/requests/{path_id(request_id or '')}"
    try:
        doc = fetch_json(url, path, token if token is not None else config_token(cfg))
    except ServiceCallError as exc:
        print(f"cerebellar-norse: {exc}", file=sys.stderr)
        return 1
    timelines = doc.get("requests") if slow and isinstance(doc, dict) else [doc]
    try:  # another server's JSON (or an older service's) is no timeline: say so, not a KeyError
        drawing = "\n\n".join(ascii_timeline(tl) for tl in timelines) if timelines else "no request timelines kept yet"
    except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError):
        drawing = None
    if not isinstance(timelines, list) or drawing is None:
        print(f"cerebellar-norse: {url.rstrip('/')}{path.split('?')[0]}: the answer is not a request timeline "
              f"(is the service at {url} cerebellar-norse?)", file=sys.stderr)
        return 1
    print(json.dumps(doc, indent=2) if as_json else drawing)
    return 0


def market_state_path(market_id: str) -> str:
    """The URL path of a market's state (the id percent-encoded)."""
    return f"/debug/markets/{path_id(market_id)}/state"


def cmd_state_dump(cfg: Config, market: str, url: str | None, token: str | None) -> int:
    """``cerebellar-norse state dump --market M``: print the market's state from the running service as JSON."""
    import json

    url = url or service_url(cfg)
    try:
        state = fetch_json(url, market_state_path(market), token if token is not None else config_token(cfg))
    except ServiceCallError as exc:
        print(f"cerebellar-norse: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(state, indent=2))
    return 0


def _load_dump(path: str) -> Any:
    import json

    from ..errors import InputError

    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise InputError(f"{path}: not a JSON state dump ({type(exc).__name__}: {exc})") from None


def cmd_state_diff(a_path: str, b_path: str, tolerance: float) -> int:
    """``cerebellar-norse state diff A.json B.json``: each differing field as ``path: A -> B``; exit 1 when any."""
    from ..errors import InputError

    if not (tolerance >= 0 and math.isfinite(tolerance)):
        raise InputError(f"--tolerance {tolerance} must be a finite number >= 0", "--tolerance")
    a, b = _load_dump(a_path), _load_dump(b_path)
    diffs = diff_values(a, b, tolerance)
    print(f"--- {a_path}\n+++ {b_path}")
    for path, x, y in diffs:
        print(format_difference(path, x, y))
    print(f"{len(diffs)} field(s) differ (tolerance {tolerance:g})" if diffs else f"no differences (tolerance {tolerance:g})")
    return 1 if diffs else 0
