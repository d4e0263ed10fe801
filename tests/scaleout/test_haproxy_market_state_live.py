"""``GET /debug/markets/{id}/state`` through HAProxy reaches the replica holding the market.

It is what a client checks before resending a tick whose outcome is unknown (``OutcomeUnknownError``: its last tick
time). Sent as documented, without ``X-Market-ID``, HAProxy balanced it round robin: another replica answered 404
("holds no state"), as if the tick had never been applied. The rendered configuration routes it by the id in its
path, decoded as the replica reads it.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path

import httpx
import pytest
from haproxy_helpers import needs_haproxy, start_haproxy
from live_helpers import start_all, tick

from cerebellar_norse.scaleout.haproxy import Replica

pytestmark = [needs_haproxy, pytest.mark.tools, pytest.mark.slow]


def test_a_markets_state_read_through_haproxy_is_routed_to_its_replica(tmp_path: Path) -> None:
    replicas = start_all(tmp_path, 2)
    hap = start_haproxy(tmp_path, [Replica(j + 1, "127.0.0.1", s.port) for j, s in enumerate(replicas)],
                        check_interval_ms=1000)
    try:
        hap.api.wait_ring({1, 2})
        markets = [*(f"Q{k:02d}" for k in range(16)), "BTC/USD", "A+B"]
        with httpx.Client(base_url=hap.url, timeout=30) as http:
            for m in markets:
                for k in range(3):
                    r = http.post("/neural/process", json=tick(m, k), headers={"X-Market-ID": m})
                    assert r.status_code == 200, r.text
            served = set()
            for m in markets:
                r = http.get(f"/debug/markets/{urllib.parse.quote(m, safe='')}/state")  # no X-Market-ID, as documented
                assert r.status_code == 200, (m, r.text)
                body = r.json()
                assert body["market_id"] == m and body["last_tick"]["timestamp"] == tick(m, 2)["timestamp"]
                served.add(r.headers["X-Served-By"])
        assert served == {"r1", "r2"}  # the markets are spread over both replicas: the routing was tested
    finally:
        hap.stop()
        for s in replicas:
            s.stop()
