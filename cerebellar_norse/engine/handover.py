"""Moving one market's state between replicas (scale-out): export, import, and the markets being moved.

A market's network state lives on the one replica that HAProxy routes the market to.
When the set of replicas changes, a market whose owner changes is moved:

1. the source *freezes* the market (its ticks are refused with 503 + Retry-After,
   :class:`~cerebellar_norse.errors.MarketMovingError`), steps every tick of it already
   admitted, and exports its state (:func:`export_market`);
2. the target imports it (:func:`import_market`): checksum, network fingerprint, model
   version, market id and array shapes are checked first, and that the state is not
   older (its last tick earlier) than one the market holds there; on any error nothing
   changes;
3. once the load balancer routes the market to the target, the source *releases* it:
   its state is forgotten, and the market stays refused there (``held``) until it is
   imported back, thawed by an operator, or the process restarts, so that a stale
   connection (a WebSocket stream opened before the switch) can never restart it from
   rest on the wrong replica.

The exported bytes are a checksummed (SHA-256 header, :func:`~cerebellar_norse.storage.seal`)
``.npz`` without pickles: one array per state variable of the market's slot, and a JSON
``meta`` with the format, market id, network fingerprint, model version, last tick
time (ms since the epoch) and tick count.
"""

from __future__ import annotations

import io
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import CheckpointError, InputError, MarketMovingError, StaleStateError, StateMismatchError
from ..neurons.encoder import S_LAST_TS, S_N_TICKS
from ..neurons.state import STATE_FIELDS
from ..storage import seal, unseal
from ..ticks import Tick, check_market_id, future_error
from .persistence import check_states, network_of

if TYPE_CHECKING:
    from .engine import Engine

log = logging.getLogger("cerebellar_norse.handover")

FORMAT = 1
MEDIA_TYPE = "application/octet-stream"
RETRY_AFTER_S = 1.0  # what a refused tick of a moving market is told to wait (seconds)


@dataclass
class MarketMoves:
    """The markets whose ticks this replica refuses because they are moving (or moved away).

    ``state`` of a market is ``"moving"`` (frozen for export: this replica still holds
    its state) or ``"moved"`` (released after the move: another replica holds it).
    """

    _markets: dict[str, str] = field(default_factory=dict)
    since: dict[str, float] = field(default_factory=dict)  # wall-clock time (s) each market entered its state

    def __bool__(self) -> bool:
        return bool(self._markets)

    def __len__(self) -> int:
        return len(self._markets)

    def state(self, market_id: str) -> str | None:
        """``"moving"``, ``"moved"`` or None (served here)."""
        return self._markets.get(market_id)

    def check(self, ticks: Sequence[Tick]) -> None:
        """Raise MarketMovingError when one of ``ticks`` belongs to a market refused here."""
        markets = self._markets
        for t in ticks:
            st = markets.get(t.market_id)
            if st is not None:
                where = ("its state is being moved to another replica" if st == "moving"
                         else "its state was moved to another replica (reconnect: the load balancer routes it there)")
                raise MarketMovingError(t.market_id, f"market {t.market_id!r} is not served here right now: {where}; "
                                                     f"retry in {RETRY_AFTER_S:g} s", RETRY_AFTER_S)

    def freeze(self, market_id: str) -> None:
        """Refuse the market's ticks from now on (its state is about to be exported)."""
        if self._markets.get(market_id) != "moving":
            self._markets[market_id] = "moving"
            self.since[market_id] = time.time()

    def hold(self, market_id: str) -> None:
        """The market's state now lives elsewhere: keep refusing its ticks here."""
        self._markets[market_id] = "moved"
        self.since[market_id] = time.time()

    def thaw(self, market_id: str) -> str | None:
        """Serve the market here again; returns the state it was in (None when it was served)."""
        self.since.pop(market_id, None)
        return self._markets.pop(market_id, None)

    def listing(self) -> list[dict[str, Any]]:
        """Every refused market with its state and since when (UTC seconds)."""
        return [{"market_id": m, "state": s, "since": self.since.get(m)} for m, s in sorted(self._markets.items())]


def export_market(engine: Engine, market_id: str) -> bytes | None:
    """The checksummed state of one market (None when it holds no state here).

    Call between batches (on the loop thread) after freezing the market and
    :meth:`Engine.flush_now`, so no admitted tick of it is left unapplied.
    """
    slot = engine.pool.table.get(market_id)
    if slot is None:
        return None
    engine.backend.sync_to_host([slot])  # CUDA keeps neuron state on the device
    state = engine.arrays.read_slot(slot)
    enc = state["enc"]
    meta = {"format": FORMAT, "market_id": market_id, "fingerprint": engine.fingerprint(),
            "model_version": engine.model_version, "last_timestamp": int(enc[S_LAST_TS]), "ticks": int(enc[S_N_TICKS])}
    buf = io.BytesIO()
    np.savez(buf, meta=np.array(json.dumps(meta, sort_keys=True)), **state)  # type: ignore[arg-type]
    return seal(buf.getvalue())


def read_export(data: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Verify and decode exported bytes: (meta, arrays). CheckpointError naming what is wrong."""
    where = "request body"
    payload = unseal(data, where)
    try:
        with np.load(io.BytesIO(payload), allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        meta = json.loads(str(arrays.pop("meta")))
    except Exception as exc:  # a valid checksum over something else than an export
        # (numpy's own words for bytes that are no npz archive advise loading them with pickle, never done here)
        why = "not an npz archive of arrays" if "pickle" in str(exc) else f"{type(exc).__name__}: {exc}"
        raise CheckpointError(f"not an exported market state ({why})", where) from None
    fmt = meta.get("format") if isinstance(meta, dict) else None
    if isinstance(fmt, int) and not isinstance(fmt, bool) and fmt > FORMAT:
        raise CheckpointError(f"exported by a newer version of cerebellar-norse (export format {fmt}; this version reads "
                              f"format {FORMAT}): import it into a replica running that version, or upgrade this one "
                              "first", where)
    if not isinstance(meta, dict) or fmt != FORMAT:
        raise CheckpointError(f"unknown export format {fmt if isinstance(meta, dict) else meta!r} "
                              f"(this service reads format {FORMAT})", where)
    return meta, arrays


def check_import(engine: Engine, market_id: str, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Raise unless an export fits this engine and names ``market_id`` (nothing is changed)."""
    check_market_id(market_id)  # an id no tick can name would hold a slot (and be checkpointed) for good
    if meta.get("market_id") != market_id:
        raise InputError(f"the state is of market {meta.get('market_id')!r}, not {market_id!r}", "market_id")
    fp = meta.get("fingerprint")
    if not isinstance(fp, dict) or network_of(fp) != network_of(engine.fingerprint()):  # the model: checked next
        raise StateMismatchError(f"the state was exported by another network ({fp}); this one is {engine.fingerprint()}")
    if meta.get("model_version") != engine.model_version:
        raise StateMismatchError(f"the state was exported under model {meta.get('model_version')!r}; this replica serves "
                                 f"{engine.model_version!r} (activate the same model on every replica first)")
    for name in STATE_FIELDS:
        have = getattr(engine.arrays, name)
        got = arrays.get(name)
        if got is None or got.shape != have.shape[1:] or got.dtype != have.dtype:
            raise CheckpointError(f"state field {name!r} is {None if got is None else (got.shape, str(got.dtype))}, "
                                  f"expected {(have.shape[1:], str(have.dtype))}", "request body")
    check_states(arrays, "request body")
    ticks, last_ts = float(arrays["enc"][S_N_TICKS]), float(arrays["enc"][S_LAST_TS])
    if meta.get("ticks") != int(ticks) or meta.get("last_timestamp") != int(last_ts):
        raise CheckpointError(f"the export's summary (ticks {meta.get('ticks')!r}, last_timestamp "
                              f"{meta.get('last_timestamp')!r}) disagrees with its state ({int(ticks)}, {int(last_ts)})",
                              "request body")


def check_not_older(engine: Engine, market_id: str, meta: dict[str, Any]) -> None:
    """Raise StaleStateError when the export's last tick is earlier than the last tick the market holds here.

    Importing it would set the market back silently (its later ticks lost, ticks between
    the two times accepted again). A state of the same or a later last tick, or a market
    holding no state (or no tick) here, passes. Call after :meth:`Engine.flush_now`, so
    the market's admitted ticks are in the state compared.
    """
    held = engine.pool.last_timestamp(market_id)
    got = int(meta["last_timestamp"])
    if held is not None and got < held:
        raise StaleStateError(f"the state's last tick at {got} is older than the market's last tick here at {held}: "
                              f"importing it would set the market back (export the newest copy, or reset the market "
                              f"here first); nothing changed", "market_id")


def check_not_future(meta: dict[str, Any], now_ms: int, max_skew_ms: int) -> None:
    """Raise FutureTickError when the export's last tick is more than ``max_skew_ms`` ahead of ``now_ms``: the service
    refuses such a tick (``server.max_clock_skew_ms``), and a market holding one would refuse every tick until then
    as out of order."""
    got = int(meta["last_timestamp"])
    if got > now_ms + max_skew_ms:
        raise future_error("the state's last tick", got, now_ms, max_skew_ms, "market_id",
                           ": the market would refuse every tick until then; nothing changed")


def import_market(engine: Engine, market_id: str, data: bytes, max_skew_ms: int | None = None) -> dict[str, Any]:
    """Load an exported state as ``market_id``'s (replacing any state it holds here, unless that one is newer);
    returns a summary. ``max_skew_ms``: refuse a state whose last tick is further ahead of the clock than this
    (``server.max_clock_skew_ms``, as for a tick); None: no such check.

    Every check runs before anything changes. The new state is made durable at once
    (a checkpoint, when the engine journals): replaying the journal alone could not
    rebuild a state that came from another replica.
    """
    meta, arrays = read_export(data)
    check_import(engine, market_id, meta, arrays)
    check_not_older(engine, market_id, meta)
    if max_skew_ms is not None:
        check_not_future(meta, time.time_ns() // 1_000_000, max_skew_ms)
    refused = engine.write_refusal()
    if refused is not None:  # the import could not be made durable: change nothing
        raise refused
    journal = engine.journal
    table = engine.pool.table
    held = table.get(market_id)
    replaced = held is not None
    # the slot the import takes: the market's own, else a free one, else the least recently used market's (evicted)
    victim = None if held is not None or table.spare() is not None or not len(table) else table.markets()[0]
    kept = [s for s in (held, None if victim is None else table.get(victim)) if s is not None]
    if kept:
        engine.backend.sync_to_host(kept)
    before = {s: engine.arrays.read_slot(s) for s in kept}  # copies
    bookkeeping = table.bookkeeping()
    slot = table.acquire(market_id)
    engine.arrays.write_slot(slot, {name: arrays[name] for name in STATE_FIELDS})
    if journal is not None:
        try:
            journal.checkpoint_now()
        except BaseException:  # refused (full disk): every market as it was (an evicted one back in its slot, with its
            table.put_back(bookkeeping)  # state and place), so no later save keeps the import or loses the evicted one
            for s, state in before.items():
                engine.arrays.write_slot(s, state)
            raise
    if engine.learner is not None:
        engine.learner.pending.pop(market_id, None)
    if engine.scorer is not None:
        engine.scorer.forget(market_id)
    log.info("market state imported", extra={"fields": {"market_id": market_id, "ticks": meta.get("ticks"),
                                                          "replaced": replaced}})
    return {"market_id": market_id, "ticks": int(meta["ticks"]), "last_timestamp": int(meta["last_timestamp"]),
            "model_version": engine.model_version, "replaced": replaced}
