"""The ring of :mod:`cerebellar_norse.scaleout.ring` assigns markets exactly as a real HAProxy does.

HAProxy runs the rendered configuration in front of small HTTP servers standing in for
replicas (the assignment does not depend on what the servers answer); its
``X-Served-By`` header names the server each market went to.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from haproxy_helpers import needs_haproxy, start_haproxy

from cerebellar_norse.scaleout.haproxy import Replica
from cerebellar_norse.scaleout.ring import Ring, full_hash, routing_key, sdbm

MARKETS = [f"MKT-{k}" for k in range(600)] + ["BTC/USD", "a/b,c d", "x ,y", "p,q,r", "EUR USD", "~!@#$%^&*()", "Z" * 64]


class Ok(BaseHTTPRequestHandler):
    """Answers 200 to everything (health checks included)."""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def stand_ins() -> Iterator[list[int]]:
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), Ok) for _ in range(4)]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    yield [s.server_address[1] for s in servers]
    for s in servers:
        s.shutdown()
        s.server_close()


def test_hash_functions_match_haproxy_by_value() -> None:
    assert sdbm(b"") == 0 and sdbm(b"a") == 97 and sdbm(b"ab") == (98 + 97 * 65599) % 2**32
    assert full_hash(0) == full_hash(2**32)
    assert routing_key("a/b,c d") == "a/b" and routing_key(" x ,y") == "x" and routing_key(",x") == ""
    assert Ring({}).owner("A") is None and Ring({5: 1}).owner("A") == 5


@needs_haproxy
@pytest.mark.parametrize("servers", [{1: 1, 2: 1, 3: 1}, {1: 1, 3: 1}, {2: 1, 7: 2, 40: 1, 3: 3}])
def test_ring_matches_a_real_haproxy(tmp_path: Path, stand_ins: list[int], servers: dict[int, int]) -> None:
    replicas = [Replica(sid, "127.0.0.1", port, weight) for (sid, weight), port in zip(servers.items(), stand_ins, strict=False)]
    # Health checks a second apart (their timeout): a stand-in slow to answer on a loaded host must not
    # leave the ring, which would move its markets for reasons this test is not about.
    hap = start_haproxy(tmp_path, replicas, check_interval_ms=1000)
    try:
        hap.api.wait_ring(set(servers))
        ring = Ring(servers)
        with httpx.Client(base_url=hap.url, timeout=5) as c:
            for market in MARKETS:
                served = c.get("/health", headers={"X-Market-ID": market}).headers["X-Served-By"]
                if served != f"r{ring.owner(market)}":  # asked again only with every replica in the ring
                    hap.api.wait_ring(set(servers))
                    served = c.get("/health", headers={"X-Market-ID": market}).headers["X-Served-By"]
                assert served == f"r{ring.owner(market)}", market
            r = c.post("/neural/process/batch", json={"ticks": []})  # a batch must name its market
            assert r.status_code == 400 and r.json()["error"]["field"] == "X-Market-ID"
            r = c.get("/neural/stream")
            assert r.status_code == 400 and "market_id" in r.json()["error"]["message"]
            # an empty header names no market (HAProxy would balance it round-robin): as if it were absent
            r = c.post("/neural/process/batch", json={"ticks": []}, headers={"X-Market-ID": ""})
            assert r.status_code == 400 and r.json()["error"]["field"] == "X-Market-ID"
            r = c.get("/neural/stream", headers={"X-Market-ID": ""})
            assert r.status_code == 400 and "market_id" in r.json()["error"]["message"]
            market = MARKETS[0]
            r = c.post("/neural/process", json={"market_id": market}, headers={"X-Market-ID": ""})
            assert r.headers["X-Served-By"] == f"r{ring.owner(market)}"  # routed by the tick's market_id
    finally:
        hap.stop()


@needs_haproxy
def test_a_server_declared_disabled_joins_the_ring_once_set_ready(tmp_path: Path, stand_ins: list[int]) -> None:
    """docs/scale-out.md's way to add a replica: its server line ends in `disabled`, then `rebalance` sets it ready.

    HAProxy keeps the configuration-maintenance bit (0x04) of such a server in `show servers
    state` after `set server … state ready` although the server is in service; the ring must
    count it, or `rebalance` waits for it in vain after the routing has already switched.
    """
    replicas = [Replica(1, "127.0.0.1", stand_ins[0]), Replica(2, "127.0.0.1", stand_ins[1], enabled=False)]
    hap = start_haproxy(tmp_path, replicas, check_interval_ms=200)
    try:
        hap.api.wait_ring({1}, timeout_s=10)
        hap.api.set_state("r2", "ready")
        hap.api.wait_ring({1, 2}, timeout_s=10)
        market = next(m for m in MARKETS if Ring({1: 1, 2: 1}).owner(m) == 2)
        with httpx.Client(base_url=hap.url, timeout=5) as c:
            assert c.get("/health", headers={"X-Market-ID": market}).headers["X-Served-By"] == "r2"
        hap.api.set_state("r2", "maint")
        hap.api.wait_ring({1}, timeout_s=10)
    finally:
        hap.stop()
