"""``cerebellar-norse rebalance``: move the markets whose replica changes when replicas are added or removed.

The plan
    Each old replica lists the markets it holds state for (``GET /debug/markets``);
    the new ring (:mod:`.ring`, HAProxy's own consistent hash, with HAProxy's server
    ids) names each market's new owner. A market whose holder is not its new owner
    moves from holder to owner. The plan starts from where the states are, not from
    where the old ring says they should be, so a market left on the wrong replica by an
    earlier, interrupted run is moved too. A market held by several replicas (a
    failover served it elsewhere while its replica restarted; a run stopped after the
    switch left a frozen copy at the source) moves or stays as its newest copy (latest
    last tick, then most ticks); the older copies are listed as ``stale`` and never
    moved over it.

The moves (no market restarts from rest, no tick gets a wrong answer)
    1. For each moving market: export from the holder (the market is frozen there: its
       ticks get 503 + Retry-After) and import into the new owner, which gets no
       traffic for it yet. If any export or import fails, every market already moved
       is given back (thawed at the holder, reset at the owner) and nothing else
       changes: exit 1.
    2. Switch HAProxy to the new replica set: through its runtime API
       (``--haproxy-socket``: new servers ``ready``, removed ones ``maint``, then wait
       until exactly the new set is in the ring), or by running ``--switch-command``
       (e.g. ``systemctl reload haproxy`` after editing the server list).
    3. Release every moved market at its old holder: the state is forgotten there and
       the market stays refused there, so a stream opened before the switch cannot
       restart it from rest.
    Ticks of a moving market are refused from step 1 until HAProxy routes it to the
    new owner in step 2: clients retry after ``Retry-After`` (the Python client does
    with ``retries``).

A run that failed or was interrupted
    A failed switch gives nothing back (HAProxy may have routed moved markets to their new
    replicas meanwhile): the markets stay frozen at their old holders. Running the same
    command again finishes the move from where the states are: of equal copies (frozen at
    the old holder, imported at the owner) the owner's is kept, and copies frozen by the
    earlier run are released (older copies) or thawed (at their owner) after the switch.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from ..errors import CerebellarNorseError, InputError
from ..httpcalls import client, path_id, request, request_errors
from . import REPLICA_TIMEOUT_S
from .haproxy import BACKEND, Replica, RuntimeAPI, ServerState, parse_replica
from .ring import Ring

LIST_LIMIT = 10_000  # most markets GET /debug/markets lists per replica
SETTLE_S = 2.5  # seconds the new ring must hold before the release: the shipped checks' inter x fall (2 s) and a margin
MEDIA_TYPE = "application/octet-stream"


class RebalanceError(CerebellarNorseError):
    """A move failed; what was moved was given back (the message says what failed)."""


@dataclass(frozen=True)
class Move:
    """One market moving from the replica that holds it to its new owner."""

    market_id: str
    source: str
    target: str


@dataclass
class Plan:
    """What a rebalance does: every market's new owner, the moves, markets HAProxy cannot hash."""

    moves: list[Move] = field(default_factory=list)
    markets: int = 0
    unhashable: list[str] = field(default_factory=list)  # empty routing key: HAProxy balances them round robin
    stale: list[dict[str, str]] = field(default_factory=list)  # older copies of a market held elsewhere: not moved
    thaws: list[dict[str, str]] = field(default_factory=list)  # frozen at their owner by an interrupted run: served again
    releases: list[dict[str, str]] = field(default_factory=list)  # older copies frozen by an interrupted run: released
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"markets": self.markets, "moves": [asdict(m) for m in self.moves], "unhashable": self.unhashable,
                "stale": self.stale, "thaws": self.thaws, "releases": self.releases, "added": self.added,
                "removed": self.removed}


def resolve(entries: list[str], api: RuntimeAPI | None, backend: str = BACKEND) -> list[Replica]:
    """Replicas of ``--old``/``--new``: ``ID=URL`` as given; a plain URL gets its id and weight from HAProxy's server list."""
    known = {(s.host, s.port): s for s in api.servers(backend)} if api is not None else {}
    out = []
    for j, text in enumerate(entries):
        has_id = "=" in text.split("://", 1)[0]
        r = parse_replica(text, j + 1)
        if not has_id:
            s = known.get((r.host, r.port))
            if s is None:
                where = "HAProxy's backend " + backend if api is not None else "no --haproxy-socket given"
                raise InputError(f"replica {text}: no server id ({where}); write it as ID=URL with the id of its "
                                 f"HAProxy server line", "replicas")
            r = Replica(s.server_id, r.host, r.port, s.weight or 1)
        out.append(r)
    ids = [r.server_id for r in out]
    if len(set(ids)) != len(ids):
        raise InputError(f"two replicas share a server id ({ids})", "replicas")
    return out


class Replicas:
    """HTTP calls to the replicas (direct, not through HAProxy)."""

    def __init__(self, token: str | None, timeout_s: float = REPLICA_TIMEOUT_S) -> None:
        """``timeout_s``: seconds each call waits for a replica (to connect, to send, for each part of the answer)."""
        self.http = client(token, timeout_s)

    def close(self) -> None:
        """Close the connections."""
        self.http.close()

    def _call(self, method: str, url: str, **kw: Any) -> httpx.Response:
        return request(self.http, method, url, RebalanceError, **kw)

    def markets(self, base: str) -> dict[str, tuple[int, int]]:
        """Markets holding state on a replica, each with how far its state goes: (last tick time, ticks seen)."""
        try:
            body = self._call("GET", f"{base}/debug/markets", params={"limit": LIST_LIMIT}).json()
            total = int(body["total"])
            held = {m["market_id"]: (int(m.get("last_timestamp") or 0), int(m.get("ticks_seen") or 0))
                    for m in body["markets"]}
        except (ValueError, KeyError, TypeError, AttributeError):  # JSONDecodeError is a ValueError
            raise RebalanceError(f"GET {base}/debug/markets: the answer is not a market listing (is {base} a "
                                 "cerebellar-norse replica?)") from None
        if total > LIST_LIMIT:
            raise RebalanceError(f"{base} holds {total} markets, more than the {LIST_LIMIT} one listing returns")
        return held

    def frozen(self, base: str) -> set[str]:
        """Markets frozen for a move on a replica (``GET /neural/moves``, state ``moving``): their state is still there."""
        try:
            body = self._call("GET", f"{base}/neural/moves").json()
            return {m["market_id"] for m in body["markets"] if m["state"] == "moving"}
        except (ValueError, KeyError, TypeError, AttributeError):
            raise RebalanceError(f"GET {base}/neural/moves: the answer is not a listing of moving markets (is {base} "
                                 "a cerebellar-norse replica?)") from None

    def model_version(self, base: str) -> str | None:
        """The model a replica serves (``/health``, whatever its status), or None where it does not say."""
        try:
            answer = self.http.get(f"{base}/health")
        except request_errors():  # no answer: the calls that need the replica fail on it, naming it
            return None
        try:
            v = answer.json().get("model_version")
        except (ValueError, AttributeError):  # not JSON, or not an object
            return None
        return v if isinstance(v, str) else None

    def export(self, base: str, market: str) -> bytes:
        """Freeze and export one market."""
        return self._call("POST", f"{base}/neural/markets/{path_id(market)}/export").content

    def import_(self, base: str, market: str, data: bytes) -> None:
        """Import one market's state."""
        self._call("PUT", f"{base}/neural/markets/{path_id(market)}/state", content=data,
                   headers={"Content-Type": MEDIA_TYPE})

    def release(self, base: str, market: str) -> None:
        """Forget a moved market at its old holder."""
        self._call("POST", f"{base}/neural/markets/{path_id(market)}/release")

    def thaw(self, base: str, market: str) -> None:
        """Serve a frozen market again at its holder (a move given back)."""
        self._call("POST", f"{base}/neural/markets/{path_id(market)}/thaw")

    def reset(self, base: str, market: str) -> None:
        """Forget an imported copy at the would-be owner (a move given back)."""
        try:
            self._call("DELETE", f"{base}/neural/markets/{path_id(market)}")
        except RebalanceError as exc:
            if "HTTP 404" not in str(exc):
                raise


def make_plan(old: list[Replica], new: list[Replica], holdings: Mapping[str, Mapping[str, tuple[int, int]]],
              frozen: Mapping[str, Collection[str]] | None = None) -> Plan:
    """Moves from where the states are (``holdings``: replica URL → market → (last tick time, ticks seen)) to their
    owners on the new ring; a market held by several replicas moves (or stays) as its newest copy, the others are
    ``stale``. ``frozen`` (replica URL → markets frozen there for a move, left so by an interrupted run) adds what
    finishes that run: a frozen newest copy already at its owner is thawed, a frozen older copy elsewhere released."""
    ring = Ring({r.server_id: r.weight for r in new})
    by_id = {r.server_id: r for r in new}
    old_urls = {r.url for r in old}
    new_urls = {r.url for r in new}
    frozen = frozen or {}
    plan = Plan(added=sorted(new_urls - old_urls), removed=sorted(old_urls - new_urls))
    copies: dict[str, list[tuple[tuple[int, int], str]]] = {}
    for url, markets in holdings.items():
        for market, age in markets.items():
            copies.setdefault(market, []).append((age, url))
    for market, held in copies.items():
        plan.markets += 1
        owner = ring.owner(market)
        target = None if owner is None else by_id[owner].url
        # the newest copy; of equal copies (an interrupted run imported the market at its owner) the owner's, else the
        # first listed
        url = max(held, key=lambda c: (c[0], c[1] == target))[1]
        for _, other in held:
            if other != url:
                plan.stale.append({"market_id": market, "replica": other, "newest_at": url})
                if other != target and market in frozen.get(other, ()):  # (an import at the owner replaces its copy)
                    plan.releases.append({"market_id": market, "replica": other})
        if target is None:
            plan.unhashable.append(market)
            continue
        if target != url:
            plan.moves.append(Move(market, url, target))
        elif market in frozen.get(url, ()):
            plan.thaws.append({"market_id": market, "replica": url})
    plan.moves.sort(key=lambda m: (m.source, m.market_id))
    return plan


def _tried(call: Callable[[str, str], None], url: str, market: str, left: list[str], unless: str) -> None:
    """``call(url, market)``; where it fails, ``unless`` (what stays as it is) and why are added to ``left`` instead
    of raised, so that every other call is still made."""
    try:
        call(url, market)
    except RebalanceError as exc:
        left.append(f"{unless} ({exc})")


def give_back(done: list[Move], frozen: Move | None, calls: Replicas) -> list[str]:
    """Undo the moves of a run that failed before the switch: thaw each market at its holder, forget each imported copy.
    Every call is tried; returns the ones that failed, each as the call to make and why."""
    left: list[str] = []
    for mv in [*done, *([frozen] if frozen else [])]:  # first: the market is served again where HAProxy routes it
        _tried(calls.thaw, mv.source, mv.market_id, left, f"{mv.market_id} stays frozen at {mv.source}")
    for mv in done:
        _tried(calls.reset, mv.target, mv.market_id, left, f"{mv.market_id}: its imported copy stays at {mv.target}")
    return left


def execute(plan: Plan, calls: Replicas, switch: Callable[[], None], log: Callable[[str], None]) -> None:
    """Export/import every move, switch the routing, release at the old holders (see the module docstring)."""
    done: list[Move] = []
    frozen: Move | None = None
    try:
        for mv in plan.moves:
            frozen = mv
            data = calls.export(mv.source, mv.market_id)
            calls.import_(mv.target, mv.market_id, data)
            done.append(mv)
            frozen = None
    except RebalanceError as exc:
        log(f"move failed: {exc}; giving back {len(done) + (frozen is not None)} market(s)")
        left = give_back(done, frozen, calls)
        if left:
            raise RebalanceError(f"{exc}; the routing is unchanged, but giving the moves back left {len(left)} "
                                 f"market(s) as they are: {'; '.join(left)}. Run the same rebalance again once every "
                                 "replica answers: it finishes the move (or run it with --new set to the --old "
                                 "replicas to give every market back)") from None
        raise
    log(f"moved {len(done)} market state(s); switching the routing")
    try:
        switch()
    except (RebalanceError, InputError) as exc:
        # Not given back: HAProxy may have sent the moved markets' ticks to their new replicas meanwhile, and
        # forgetting those copies would lose acknowledged ticks. Frozen at the old replicas, they get 503, never a
        # wrong answer, and a run started again finishes the move.
        raise RebalanceError(f"the switch failed: {exc}. {len(done)} market(s) stay frozen at their old replicas "
                             "(their ticks get 503 + Retry-After) with their states imported at the new ones. Fix the "
                             "cause and run the same rebalance again: it finishes the move (or run it with --new set "
                             "to the --old replicas to move them back)") from None
    left = []
    releases = [(mv.source, mv.market_id) for mv in done] + [(r["replica"], r["market_id"]) for r in plan.releases]
    for url, market in releases:
        _tried(calls.release, url, market, left, f"{market} at {url}")
    for t in plan.thaws:
        _tried(calls.thaw, t["replica"], t["market_id"], left, f"{t['market_id']} frozen at its owner {t['replica']}")
    if left:
        raise RebalanceError(f"the routing is switched, but {len(left)} market(s) were not released or thawed: "
                             f"{'; '.join(left)}. Run the same rebalance again once every replica answers")
    log(f"released {len(releases)} market(s) at their old replicas" + (f", thawed {len(plan.thaws)} at their owners"
                                                                        if plan.thaws else ""))


def haproxy_switch(api: RuntimeAPI, old: list[Replica], new: list[Replica], backend: str = BACKEND,
                   timeout_s: float = 30.0, log: Callable[[str], None] | None = None) -> Callable[[], None]:
    """A switch through HAProxy's runtime API: new servers ready, removed ones in maintenance, wait for the ring.

    If the ring does not become the new set, the servers changed are set back as they were before the error is
    raised. Done, it logs the ``haproxy-config --replicas`` argument that renders the new server lines: the runtime
    API changes HAProxy's memory only, and a reload reads the server lines of its configuration again."""

    def switch() -> None:
        servers = {s.server_id: s for s in api.servers(backend)}
        for r in new:
            if r.server_id not in servers:
                raise RebalanceError(f"HAProxy's backend {backend} has no server of id {r.server_id} ({r.url}): "
                                     f"add a server line for it and reload HAProxy first")
        keep = {r.server_id for r in new}
        changed: list[ServerState] = []
        try:
            for r in new:
                api.set_state(servers[r.server_id].name, "ready", backend)
                changed.append(servers[r.server_id])
            for r in old:
                if r.server_id not in keep and r.server_id in servers:
                    api.set_state(servers[r.server_id].name, "maint", backend)
                    changed.append(servers[r.server_id])
            api.wait_ring(keep, backend, timeout_s, SETTLE_S)
        except InputError as exc:
            undone = []
            for s in reversed(changed):
                try:
                    api.set_state(s.name, s.admin_word, backend)
                except InputError:
                    undone.append(s.name)
            back = (f"setting {backend}/{', '.join(undone)} back failed as well" if undone
                    else "HAProxy's servers are set back as they were")
            raise RebalanceError(f"{exc}; {back}") from None
        if log is not None:
            lines = ",".join(f"{s.server_id}={s.host}:{s.port}{'' if s.server_id in keep else '~'}"
                             for s in sorted(servers.values(), key=lambda s: s.server_id))
            log(f"HAProxy routes by the new servers until its next reload or restart, which reads its configuration's "
                f"server lines again: make them `cerebellar-norse haproxy-config --replicas {lines}` renders (weights "
                f"as they are) before reloading")

    return switch


def command_switch(command: str) -> Callable[[], None]:
    """A switch by running a shell command (exit 0 means HAProxy now routes by the new server list)."""

    def switch() -> None:
        proc = subprocess.run(shlex.split(command), capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            said = (proc.stderr or proc.stdout).strip()[:300]
            raise RebalanceError(f"--switch-command exited {proc.returncode}" + (f": {said}" if said else ""))

    return switch


def check_one_model(calls: Replicas, new: list[Replica]) -> None:
    """Raise RebalanceError, before any market is frozen, when the replicas of ``new`` do not all serve one model: a
    market's state is imported only under the model it was exported under (409 otherwise), and a market whose replica
    fails is served by whichever replica follows on the ring. (A replica leaving may serve another model: what it
    holds can only move where that model is served, which its imports check.)"""
    served = {r.url: calls.model_version(r.url) for r in new}
    if len({v for v in served.values() if v is not None}) > 1:
        raise RebalanceError("the replicas of --new serve different models (" + ", ".join(
            f"{u}: {v or 'unknown'}" for u, v in served.items()) + "); nothing was moved: activate one model on every "
            "replica first (cerebellar-norse rollout VERSION --replicas …), then run rebalance again")


def cmd_rebalance(old_text: str, new_text: str, token: str | None, dry_run: bool, as_json: bool,
                  socket_path: str | None, backend: str, switch_command: str | None,
                  timeout_s: float = REPLICA_TIMEOUT_S) -> int:
    """The ``rebalance`` command; exit 0 when every move is done (or planned, with ``dry_run``)."""
    api = RuntimeAPI(socket_path) if socket_path else None
    old = resolve([e for e in old_text.split(",") if e.strip()], api, backend)
    new = resolve([e for e in new_text.split(",") if e.strip()], api, backend)
    if not new:
        raise InputError("--new names no replica", "new")
    if not dry_run and api is None and not switch_command:
        raise InputError("say how to switch HAProxy: --haproxy-socket PATH or --switch-command CMD (or --dry-run)",
                         "haproxy-socket")
    calls = Replicas(token, timeout_s)
    lines: list[str] = []

    def log(msg: str) -> None:
        lines.append(msg)
        if not as_json:
            print(msg, file=sys.stderr)

    try:
        holdings = {r.url: calls.markets(r.url) for r in old}
        frozen = {r.url: calls.frozen(r.url) for r in old}
        plan = make_plan(old, new, holdings, frozen)
        if not as_json:
            print(f"{plan.markets} market(s) on {len(old)} replica(s); {len(plan.moves)} move(s) to the new ring of "
                  f"{len(new)} replica(s)")
            for mv in plan.moves:
                print(f"  {mv.market_id}: {mv.source} -> {mv.target}")
            if plan.unhashable:
                print(f"  not hashable by HAProxy (routed round robin): {plan.unhashable}")
            released = {(t["market_id"], t["replica"]) for t in plan.releases}
            for st in plan.stale:
                if (st["market_id"], st["replica"]) in released:
                    continue
                print(f"  {st['market_id']}: older copy at {st['replica']} left in place (newest at {st['newest_at']})")
            for t in plan.releases:
                print(f"  {t['market_id']}: frozen older copy at {t['replica']} released after the switch")
            for t in plan.thaws:
                print(f"  {t['market_id']}: frozen at its owner {t['replica']}, thawed after the switch")
        if not dry_run:
            check_one_model(calls, new)
            switch = haproxy_switch(api, old, new, backend, log=log) if api is not None else command_switch(switch_command or "")
            execute(plan, calls, switch, log)
    finally:
        calls.close()
    if as_json:
        print(json.dumps({**plan.as_dict(), "dry_run": dry_run, "log": lines}, indent=2))
    return 0
