"""HAProxy in front of the replicas: its configuration (rendered) and its runtime API (server states).

The configuration routes ``/neural/process``, ``/neural/process/batch`` and the
``/neural/stream`` socket by a consistent hash of ``X-Market-ID`` (see
:mod:`.ring`); a single tick without the header is routed by its body's
``market_id``, a stream by its ``market_id`` query parameter; a batch must carry the
header (a batch may hold one market only behind HAProxy: clients split batches per
market). Replicas are health-checked on ``/health``; a stats page and HAProxy's own
Prometheus metrics are served on a separate port; the runtime API socket (admin
level) lets ``cerebellar-norse rebalance`` take servers in and out of the ring.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import ConfigError, ConfigProblem, InputError

BACKEND = "replicas"
MISSING_HEADER = ('{"error":{"type":"validation","message":"a batch needs the X-Market-ID header naming its one '
                  'market (split batches per market)","field":"X-Market-ID","request_id":"%[var(txn.rid)]"}}')
MISSING_STREAM_MARKET = ('{"error":{"type":"validation","message":"a stream needs X-Market-ID or ?market_id= naming '
                         'its one market","field":"X-Market-ID","request_id":"%[var(txn.rid)]"}}')


@dataclass(frozen=True)
class Replica:
    """One replica: its HAProxy server id (the ring position), address and weight.

    Attributes:
        server_id: HAProxy's ``id`` of the server (positive, unique, never reused for
            another replica: it places the replica's points on the ring).
        host: address HAProxy connects to.
        port: its port.
        weight: HAProxy weight (1–256; points on the ring are 16 × weight).
        enabled: False to declare it in maintenance (a slot ready for a later scale-out).
    """

    server_id: int
    host: str
    port: int
    weight: int = 1
    enabled: bool = True

    @property
    def name(self) -> str:
        """HAProxy server name: ``r<id>``."""
        return f"r{self.server_id}"

    @property
    def url(self) -> str:
        """Base URL of the replica itself (not through HAProxy)."""
        return f"http://{self.host}:{self.port}"


def parse_replica(text: str, position: int) -> Replica:
    """``[ID=]HOST:PORT`` or ``[ID=]http://HOST:PORT`` (id defaults to ``position``, 1-based); a trailing ``~`` disables."""
    raw = text.strip()
    enabled = not raw.endswith("~")
    raw = raw.rstrip("~")
    sid_text, sep, rest = raw.partition("=")
    if not sep:
        sid_text, rest = str(position), raw
    if not sid_text.isdigit() or int(sid_text) < 1:
        raise InputError(f"replica {text!r}: the server id before '=' must be a positive integer", "replicas")
    url = rest if "://" in rest else f"http://{rest}"
    try:
        parts = urlsplit(url)
        port = parts.port  # a port that is no number, or outside 0..65535: ValueError
    except ValueError as exc:
        raise InputError(f"replica {text!r}: expected HOST:PORT or http://HOST:PORT ({exc})", "replicas") from None
    if not parts.hostname or port is None or not 1 <= port <= 65535:
        raise InputError(f"replica {text!r}: expected HOST:PORT or http://HOST:PORT (port 1..65535)", "replicas")
    return Replica(int(sid_text), parts.hostname, port, enabled=enabled)


def render_config(replicas: list[Replica], bind: str = "127.0.0.1:8080", stats_bind: str = "127.0.0.1:8404",
                  runtime_socket: str = "/run/haproxy/cerebellar-norse.sock", log_target: str = "/dev/log",
                  check_interval_ms: int = 1000, maxconn: int = 4096) -> str:
    """The HAProxy configuration text for ``replicas`` (HAProxy ≥ 2.4: ``json_query``, ``http-request return``).

    Raises:
        ConfigError: duplicate server ids or addresses, or no replica.
    """
    problems = []
    if not replicas:
        problems.append(ConfigProblem("replicas", "no replica given", "name at least one HOST:PORT"))
    ids = [r.server_id for r in replicas]
    addrs = [(r.host, r.port) for r in replicas]
    if len(set(ids)) != len(ids):
        problems.append(ConfigProblem("replicas", f"duplicate server ids {sorted(ids)}", "give each replica its own id"))
    if len(set(addrs)) != len(addrs):
        problems.append(ConfigProblem("replicas", "duplicate addresses", "list each replica once"))
    if problems:
        raise ConfigError(problems, "haproxy")
    servers = "\n".join(
        f"    server {r.name} {r.host}:{r.port} id {r.server_id} weight {r.weight}{'' if r.enabled else ' disabled'}"
        for r in replicas)
    return f"""# cerebellar-norse behind HAProxy: replicas sharded by market (consistent hash of X-Market-ID).
# Rendered by `cerebellar-norse haproxy-config`; see docs/scale-out.md. Needs HAProxy >= 2.4.
# A server's `id` places it on the hash ring: keep each replica's id for its whole life.
global
    log {log_target} local0
    maxconn {maxconn}
    stats socket {runtime_socket} mode 660 level admin expose-fd listeners
    stats timeout 30s
defaults
    mode http
    log global
    option httplog
    option dontlognull
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    timeout http-request 10s
    timeout tunnel 1h
    timeout client-fin 5s
    # At a reload the old process would close its clients' idle keep-alive connections at once, and a request already
    # on its way on one got no answer (the client cannot tell whether it was applied): it answers it instead, with
    # `Connection: close` (docs/scale-out.md, "Reloading HAProxy").
    option idle-close-on-response

frontend cerebellar_norse
    bind {bind}
    option http-buffer-request
    # A market named: the header's first value not empty (an empty one would be balanced round-robin).
    acl has_market req.hdr(X-Market-ID,1) -m len 1:
    acl tick_path path /neural/process
    acl batch_path path /neural/process/batch
    acl stream_path path /neural/stream
    # A tick without the header is routed by its body's market_id.
    http-request set-header X-Market-ID %[req.body,json_query('$.market_id')] if tick_path METH_POST !has_market
    # json_query reads no \\/ escape (PHP's json_encode writes one for every /): where it read nothing, read the body
    # again with \\/ written as /.
    http-request set-header X-Market-ID %[req.body,regsub('\\\\\\\\/',/,g),json_query('$.market_id')] if tick_path METH_POST !has_market
    # A stream is routed by ?market_id= when it has no header: decoded as the replica reads it (%2F is /, + a space).
    http-request set-header X-Market-ID %[url_param(market_id),url_dec(1)] if stream_path !has_market {{ url_param(market_id) -m found }}
    # A market's state read (GET /debug/markets/<id>/state: what a client checks before resending a tick whose outcome
    # is unknown) is routed by the id in its path when it has no header, decoded as the replica reads it (%2F is /).
    http-request set-header X-Market-ID %[path,regsub(^/debug/markets/,),regsub(/state$,),url_dec] if METH_GET {{ path_reg ^/debug/markets/.+/state$ }} !has_market
    # The refusals below carry the caller's X-Request-ID where it is a valid one (1-128 of A-Z a-z 0-9 . _ : -), as the
    # replicas' answers do, else a fresh id.
    acl refused_here path /neural/process/batch /neural/stream
    http-request set-var(txn.rid) req.hdr(X-Request-ID,1) if refused_here {{ req.hdr(X-Request-ID,1) -m reg ^[A-Za-z0-9._:-]{{1,128}}$ }}
    http-request set-var(txn.rid) uuid if refused_here !{{ var(txn.rid) -m found }}
    http-request return status 400 content-type application/json lf-string '{MISSING_HEADER}' hdr X-Request-ID %[var(txn.rid)] if batch_path METH_POST !has_market
    http-request return status 400 content-type application/json lf-string '{MISSING_STREAM_MARKET}' hdr X-Request-ID %[var(txn.rid)] if stream_path !has_market
    default_backend {BACKEND}

backend {BACKEND}
    balance hdr(X-Market-ID)
    hash-type consistent sdbm avalanche
    option httpchk GET /health
    http-check expect status 200
    # A stopping replica answers /health 503 for server.drain_s while it still serves (5 s in the replica unit): keep
    # drain_s above inter x fall. No retry-on / option redispatch: a tick sent again is applied again, and one sent to
    # another replica lands where its market's state is not (docs/scale-out.md, "Restarting a replica").
    default-server check inter {check_interval_ms} fall 2 rise 1
    http-response set-header X-Served-By %[srv_name]
{servers}

listen stats
    bind {stats_bind}
    stats enable
    stats uri /stats
    stats refresh 5s
    http-request use-service prometheus-exporter if {{ path /metrics }}
"""


# -- the runtime API --------------------------------------------------------------

# Forced/inherited maintenance, forced/inherited drain, DNS maintenance. Not 0x04 (SRV_ADMF_CMAINT): HAProxy
# keeps that bit on a server declared `disabled` in the configuration after `set server … state ready` has
# put it in service (its maintenance mask SRV_ADMF_MAINT is 0x23), so it says nothing about the ring.
ADMIN_OFF = 0x01 | 0x02 | 0x08 | 0x10 | 0x20
ADMIN_DRAIN = 0x08 | 0x10
OP_RUNNING = 2


@dataclass(frozen=True)
class ServerState:
    """One server of ``show servers state``."""

    server_id: int
    name: str
    host: str
    port: int
    op_state: int
    admin_state: int
    weight: int

    @property
    def in_ring(self) -> bool:
        """Up, not in maintenance or drain, weight above 0: it holds points on the ring."""
        return self.op_state == OP_RUNNING and not self.admin_state & ADMIN_OFF and self.weight > 0

    @property
    def admin_word(self) -> str:
        """Its administrative state as ``set server … state`` takes it: ``maint``, ``drain`` or ``ready``."""
        if self.admin_state & ADMIN_OFF & ~ADMIN_DRAIN:
            return "maint"
        return "drain" if self.admin_state & ADMIN_DRAIN else "ready"


class RuntimeAPI:
    """HAProxy's runtime API on a UNIX socket (``stats socket … level admin``)."""

    def __init__(self, path: str | Path, timeout_s: float = 5.0) -> None:
        self.path = str(path)
        self.timeout_s = timeout_s

    def command(self, line: str) -> str:
        """Send one command, return HAProxy's answer (text)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(self.timeout_s)
            try:
                s.connect(self.path)
            except OSError as exc:
                raise InputError(f"cannot reach HAProxy's runtime API at {self.path}: {exc.strerror or exc}",
                                 "haproxy-socket") from None
            chunks = []
            try:
                s.sendall(line.encode() + b"\n")
                while True:
                    b = s.recv(65536)
                    if not b:
                        break
                    chunks.append(b)
            except OSError as exc:  # no answer in time, or the connection dropped
                raise InputError(f"HAProxy's runtime API at {self.path} did not answer {line.split()[0]!r}: "
                                 f"{exc.strerror or exc}", "haproxy-socket") from None
        return b"".join(chunks).decode(errors="replace")

    def servers(self, backend: str = BACKEND) -> list[ServerState]:
        """The servers of ``backend`` and their states."""
        text = self.command(f"show servers state {backend}")
        lines = [ln for ln in text.splitlines() if ln.strip()]
        header = next((ln for ln in lines if ln.startswith("#")), None)
        if header is None:
            raise InputError(f"HAProxy has no backend {backend!r} ({text.strip()[:200]})", "backend")
        cols = header.lstrip("# ").split()
        out = []
        for ln in lines:
            if ln.startswith("#") or len(ln.split()) < len(cols):
                continue
            row = dict(zip(cols, ln.split(), strict=False))
            out.append(ServerState(int(row["srv_id"]), row["srv_name"], row["srv_addr"], int(row["srv_port"]),
                                   int(row["srv_op_state"]), int(row["srv_admin_state"]), int(row["srv_uweight"])))
        return out

    def set_state(self, name: str, state: str, backend: str = BACKEND) -> None:
        """``set server <backend>/<name> state ready|maint|drain``."""
        answer = self.command(f"set server {backend}/{name} state {state}").strip()
        if answer:
            raise InputError(f"HAProxy refused to set {backend}/{name} {state}: {answer}", "haproxy-socket")

    def wait_ring(self, members: set[int], backend: str = BACKEND, timeout_s: float = 30.0,
                  settle_s: float = 0.0) -> list[ServerState]:
        """Wait until exactly ``members`` (server ids) are in the ring, and stay so for ``settle_s`` seconds; returns
        the states.

        A server put back in service (``set server … state ready``) is up at once, before its first health check:
        only a ring that stays the same over a check interval or two says that the checks pass. A ring that leaves
        ``members`` within ``settle_s`` raises at once."""
        deadline = time.monotonic() + timeout_s
        since: float | None = None
        while True:
            states = self.servers(backend)
            now = {s.server_id for s in states if s.in_ring}
            if now == members:
                since = time.monotonic() if since is None else since
                if time.monotonic() - since >= settle_s:
                    return states
            elif since is not None:
                raise InputError(f"HAProxy's ring became {sorted(now)} {time.monotonic() - since:.1f} s after it was "
                                 f"{sorted(members)}: a health check failed (does each server line's address reach "
                                 f"its replica?)", "haproxy-socket")
            if time.monotonic() > deadline:
                raise InputError(f"HAProxy's ring is {sorted(now)} after {timeout_s:g} s, expected {sorted(members)} "
                                 f"(are the new replicas healthy?)", "haproxy-socket")
            time.sleep(0.1)
