"""A replica stopped behind a real HAProxy while ticks stream through it loses no request (``server.drain_s``).

Two replicas with ``server.drain_s`` behind HAProxy (health checks every 300 ms, ``fall 2``); client threads send
ticks of their markets through HAProxy on kept connections; replica 1 gets a SIGTERM. HAProxy takes it out of
its ring while it still accepts and answers (its ``/health`` says it is stopping), its markets go to replica 2,
and it stops once HAProxy sends it nothing: every request is answered 200, none is closed without an answer.

Without the drain the stop closes the listening socket and the kept connections at once: HAProxy then finds the
replica refusing connections before its checks take it out (the check below fails), and a request it sends on a
kept connection at that moment is never answered (measured: a lost request in about half of the stops under
~400 ticks/s; docs/operations.md, "Stopping a replica behind HAProxy").
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from haproxy_helpers import needs_haproxy, start_haproxy
from live_helpers import start_all, tick

from cerebellar_norse.scaleout.haproxy import Replica

pytestmark = [needs_haproxy, pytest.mark.tools, pytest.mark.slow]

ENV = {"CEREBELLAR_NORSE_SERVER__DRAIN_S": "2"}  # HAProxy's inter x fall (0.6 s) and a margin for a loaded machine


def test_a_replica_stopped_under_a_stream_of_ticks_loses_no_request(tmp_path: Path) -> None:
    replicas = start_all(tmp_path, 2, ENV)
    hap = start_haproxy(tmp_path, [Replica(j + 1, "127.0.0.1", s.port) for j, s in enumerate(replicas)],
                        check_interval_ms=300)
    outcomes: Counter[str] = Counter()
    lost: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def feed(t: int) -> None:
        markets = [f"D{t}M{k}" for k in range(12)]  # a dozen markets a thread: both replicas get some
        sent = dict.fromkeys(markets, 0)
        with httpx.Client(base_url=hap.url, timeout=15) as http:
            while not stop.is_set():
                for m in markets:
                    try:
                        r = http.post("/neural/process", json=tick(m, sent[m]), headers={"X-Market-ID": m})
                        outcome = str(r.status_code)
                    except httpx.TransportError as exc:  # HAProxy closed the connection without an answer
                        outcome = "lost"
                        with lock:
                            lost.append(f"{m}: {exc!r}")
                    sent[m] += 1
                    with lock:
                        outcomes[outcome] += 1

    threads = [threading.Thread(target=feed, args=(t,)) for t in range(3)]
    try:
        hap.api.wait_ring({1, 2})
        for th in threads:
            th.start()
        time.sleep(1.0)
        r1 = replicas[0]
        r1.proc.send_signal(signal.SIGTERM)
        hap.api.wait_ring({2})  # HAProxy's checks take it out ...
        health = httpx.get(f"{r1.url}/health", timeout=5)  # ... while it still accepts and answers
        assert health.status_code == 503 and health.json()["reason"].startswith("stopping: draining")
        assert r1.proc.wait(timeout=60) == 0, r1.log()[-3000:]
        assert "drain over (2 s): stopping" in r1.log()
        before = sum(outcomes.values())
        time.sleep(0.5)
        assert sum(outcomes.values()) > before  # the stream went on at replica 2
    finally:
        stop.set()
        for th in threads:
            if th.is_alive():
                th.join()
        hap.stop()
        for s in replicas:
            s.stop()
    assert not lost, lost
    assert set(outcomes) == {"200"}, outcomes
