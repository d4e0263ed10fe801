"""HAProxy (the shipped configuration) and the replicas behind it agree on what each request is, over raw sockets.

* Where a message ends: whatever framing a client sends (``Content-Length`` with ``Transfer-Encoding``, two lengths,
  odd chunks, bare LF, a body longer than its length), a request hidden in a body never reaches a replica unless the
  client was answered for it, as a request of its own.
* Which route a path names: HAProxy selects ticks and batches by their path as sent (``path /neural/process``) and
  routes them by market; a route's words percent-encoded (``/neural/%70rocess``) are balanced to any replica, which
  answers ``404`` and applies nothing (it served them as the route, and a market's ticks landed on two replicas).
* Which market a tick names: a body's ``market_id`` written with ``\\/`` (JSON for ``/``) routes as the market.
* What HAProxy answers itself (a batch or stream naming no market): the error shape with the caller's request id.
* Which market a stream names: ``?market_id=`` decoded (``%2F``, ``+``) as the replica reads it.
* What ``Host`` is: a value that is not a host and port passes HAProxy and is refused ``400`` by the replica.
"""

from __future__ import annotations

import json
import re
import socket
import uuid
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest
from haproxy_helpers import HAProxy, needs_haproxy, start_haproxy
from live_helpers import LiveServer, read_until_closed, start_all

from cerebellar_norse.scaleout.haproxy import Replica

pytestmark = [needs_haproxy, pytest.mark.tools, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[list[LiveServer], HAProxy]]:
    tmp = tmp_path_factory.mktemp("framing")
    replicas = start_all(tmp, 2)
    hap = start_haproxy(tmp, [Replica(j + 1, "127.0.0.1", s.port) for j, s in enumerate(replicas)],
                        check_interval_ms=1000)
    try:
        hap.api.wait_ring({1, 2})
        yield replicas, hap
    finally:
        hap.stop()
        for s in replicas:
            s.stop()


def exchange(port: int, data: bytes, limit_s: float = 10.0) -> bytes:
    """Send ``data`` on one connection and read until the other side closes it (or ``limit_s`` passes)."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(data)
        return read_until_closed(s, limit_s)[0]


def statuses(answer: bytes) -> list[int]:
    return [int(code) for code in re.findall(rb"HTTP/1\.[01] (\d{3}) ", answer)]


def holders(replicas: list[LiveServer], market: str) -> list[int]:
    """The replicas (1, 2) holding state of ``market``."""
    return [j + 1 for j, s in enumerate(replicas)
            if market in {m["market_id"] for m in httpx.get(f"{s.url}/debug/markets", params={"limit": 1000},
                                                           timeout=10).json()["markets"]}]


def models_served(replicas: list[LiveServer]) -> float:
    """``GET /models`` requests the replicas counted."""
    total = 0.0
    for s in replicas:
        text = httpx.get(f"{s.url}/metrics", timeout=10).text
        total += sum(float(v) for v in re.findall(
            r'cerebellar_norse_http_requests_total\{method="GET",route="/models",status="\d+"\} (\S+)', text))
    return total


def tick_body(market: str, k: int) -> bytes:
    return json.dumps({"price": 100.0 + k, "volume": 10.0, "timestamp": 1_640_995_200_000 + 1000 * k,
                       "market_id": market}).encode()


def tick_request(path: bytes, body: bytes, host: bytes = b"x") -> bytes:
    return (b"POST " + path + b" HTTP/1.1\r\nHost: " + host + b"\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)


def test_a_route_spelled_otherwise_reaches_no_route_on_any_replica(cluster: tuple[list[LiveServer], HAProxy]) -> None:
    replicas, hap = cluster
    market = f"ENC-{uuid.uuid4().hex[:10]}"
    answer = exchange(hap.port, tick_request(b"/neural/process", tick_body(market, 0)))
    assert statuses(answer) == [200], answer[:300]
    owner = holders(replicas, market)
    assert len(owner) == 1
    k = 1
    for path in (b"/neural/%70rocess", b"/neural%2Fprocess", b"/%6Eeural/process"):
        for _ in range(4):  # balanced round-robin (no market found by HAProxy): each replica gets some
            answer = exchange(hap.port, tick_request(path, tick_body(market, k)))
            k += 1
            assert statuses(answer) == [404], (path, answer[:400])
            assert b"percent-encode only the ids in a path" in answer
    batch = json.dumps({"ticks": [json.loads(tick_body(market, k))]}).encode()
    for _ in range(4):  # a batch must name its market for HAProxy; spelled otherwise, HAProxy did not ask for it
        answer = exchange(hap.port, tick_request(b"/neural/process/%62atch", batch))
        assert statuses(answer) == [404], answer[:400]
    assert holders(replicas, market) == owner  # its state lives on its own replica only
    state = httpx.get(f"{replicas[owner[0] - 1].url}/debug/markets/{market}/state", timeout=10).json()
    assert state["last_tick"]["timestamp"] == 1_640_995_200_000  # none of the other ticks was applied


def test_a_host_that_is_not_a_host_is_refused_behind_haproxy(cluster: tuple[list[LiveServer], HAProxy]) -> None:
    replicas, hap = cluster
    market = f"HOST-{uuid.uuid4().hex[:10]}"
    for host in (b"a b", b"user@x", b"x/y"):
        answer = exchange(hap.port, tick_request(b"/neural/process", tick_body(market, 0), host=host))
        assert statuses(answer) == [400], (host, answer[:400])
        assert b"is not a host with an optional port" in answer
    assert holders(replicas, market) == []


@pytest.mark.parametrize("spelt", ["{p}\\/USD", "\\/{p}\\/\\/", "{p}\\\\\\/x"])
def test_a_tick_whose_market_id_escapes_a_slash_is_routed_by_it(cluster: tuple[list[LiveServer], HAProxy],
                                                                 spelt: str) -> None:
    """``\\/`` is JSON for ``/`` (PHP's ``json_encode`` writes it so); HAProxy's ``json_query`` read no market from
    such a body: the tick was balanced to any replica with an empty ``X-Market-ID`` and refused 422 there."""
    replicas, hap = cluster
    prefix = f"ESC-{uuid.uuid4().hex[:10]}"
    raw = spelt.format(p=prefix)
    market = json.loads(f'"{raw}"')
    assert "/" in market
    first = httpx.post(f"{hap.url}/neural/process", json=json.loads(tick_body(market, 0)),
                       headers={"X-Market-ID": market}, timeout=10)
    assert first.status_code == 200, first.text
    owner = holders(replicas, market)
    for k in range(1, 5):
        body = tick_body(market, k).replace(json.dumps(market).encode(), f'"{raw}"'.encode())
        assert f'"{raw}"'.encode() in body
        answer = exchange(hap.port, tick_request(b"/neural/process", body))
        assert statuses(answer) == [200], answer[:400]
        assert f"x-served-by: r{owner[0]}\r\n".encode() in answer.lower(), answer[:400]
    assert holders(replicas, market) == owner
    state = httpx.get(f"{replicas[owner[0] - 1].url}/debug/markets/{quote(market, safe='')}/state", timeout=10).json()
    assert state["market_id"] == market
    assert state["warmup"]["ticks_seen"] == 5  # every tick applied where its market lives


def test_haproxys_own_refusals_carry_the_callers_request_id(cluster: tuple[list[LiveServer], HAProxy]) -> None:
    """A batch without X-Market-ID and a stream naming no market are answered by HAProxy: with the error shape of the
    OpenAPI document and X-Request-ID, the caller's where it is valid, else a fresh one (it had ``request_id: null``
    and no X-Request-ID)."""
    from cerebellar_norse.api.schemas import ErrorOut

    _, hap = cluster
    for sent, kept in (("ord-7f3a", True), ("not valid!", False), (None, False)):
        headers = {} if sent is None else {"X-Request-ID": sent}
        for r in (httpx.post(f"{hap.url}/neural/process/batch", json={"ticks": []}, headers=headers, timeout=10),
                  httpx.get(f"{hap.url}/neural/stream", headers=headers, timeout=10)):
            assert r.status_code == 400 and r.headers["content-type"] == "application/json", r.text
            err = ErrorOut.model_validate(r.json()).error
            assert err.field == "X-Market-ID" and err.request_id == r.headers["x-request-id"], r.text
            assert (err.request_id == sent) is kept, r.text
            assert re.fullmatch(r"[A-Za-z0-9._:-]{1,128}", err.request_id)


@pytest.mark.parametrize(("query", "name"), [("{p}%2FUSD", "{p}/USD"), ("{p}+A%20B", "{p} A B"), ("{p}%25", "{p}%")])
def test_a_stream_named_by_an_encoded_query_is_routed_by_its_market(cluster: tuple[list[LiveServer], HAProxy],
                                                                    query: str, name: str) -> None:
    """``?market_id=`` is read decoded, by HAProxy as by the replica: HAProxy routed ``BTC%2FUSD`` by the letters sent
    and told the replica so in X-Market-ID, which refused every tick of ``BTC/USD`` 422."""
    from websockets.sync.client import connect

    replicas, hap = cluster
    prefix = f"WSQ-{uuid.uuid4().hex[:10]}"
    market = name.format(p=prefix)
    first = httpx.post(f"{hap.url}/neural/process", json=json.loads(tick_body(market, 0)), timeout=10)
    assert first.status_code == 200, first.text
    owner = holders(replicas, market)
    with connect(f"ws://127.0.0.1:{hap.port}/neural/stream?market_id={query.format(p=prefix)}", open_timeout=10) as ws:
        for k in range(1, 4):
            ws.send(tick_body(market, k).decode())
            answer = json.loads(ws.recv(timeout=10))
            assert answer.get("market_id") == market, answer
    assert holders(replicas, market) == owner
    state = httpx.get(f"{replicas[owner[0] - 1].url}/debug/markets/{quote(market, safe='')}/state", timeout=10).json()
    assert state["warmup"]["ticks_seen"] == 4


SMUGGLED = b"GET /models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


def framings(body: bytes) -> dict[str, bytes]:
    """Requests for ``/neural/process`` framed in ways a proxy and a server may read apart, each followed by
    :data:`SMUGGLED` on the same connection."""
    head = b"POST /neural/process HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"

    def chunked(size_line: bytes = b"%x", end: bytes = b"\r\n0\r\n\r\n") -> bytes:
        return (size_line % len(body)) + b"\r\n" + body + end

    return {
        "length and chunked": head + b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n"
        % len(chunked() + SMUGGLED) + chunked() + SMUGGLED,
        "chunked and a short length": head + b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n" + chunked(),
        "two lengths": head + b"Content-Length: %d\r\nContent-Length: 3\r\n\r\n" % len(body) + body,
        "two equal lengths": head + b"Content-Length: %d\r\nContent-Length: %d\r\n\r\n" % (len(body), len(body)) + body,
        "a length list": head + b"Content-Length: %d, %d\r\n\r\n" % (len(body), len(body)) + body,
        "identity, chunked": head + b"Transfer-Encoding: identity, chunked\r\n\r\n" + chunked(),
        "chunked, identity": head + b"Transfer-Encoding: chunked, identity\r\nContent-Length: %d\r\n\r\n"
        % len(body) + body,
        "space before the colon": head + b"Transfer-Encoding : chunked\r\nContent-Length: %d\r\n\r\n"
        % len(chunked()) + chunked(),
        "folded coding": head + b"Transfer-Encoding: \r\n chunked\r\nContent-Length: %d\r\n\r\n"
        % len(chunked()) + chunked(),
        "chunk size with LF": head + b"Transfer-Encoding: chunked\r\n\r\n" + chunked().replace(b"\r\n", b"\n", 1),
        "chunk size with extension": head + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(b"%x;a=b"),
        "last chunk with LF": head + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(end=b"\r\n0\n\n"),
        "trailer with LF": head + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(end=b"\r\n0\r\nX: y\n\r\n"),
        "body longer than its length": head + b"Content-Length: %d\r\n\r\n" % (len(body) - 3) + body,
        "bare LF head": head.replace(b"\r\n", b"\n") + b"Content-Length: %d\n\n" % len(body) + body,
        "chunked in HTTP/1.0": head.replace(b"HTTP/1.1", b"HTTP/1.0") + b"Transfer-Encoding: chunked\r\n"
        b"Content-Length: %d\r\n\r\n" % len(chunked() + SMUGGLED) + chunked() + SMUGGLED,
    }


def test_no_request_reaches_a_replica_that_the_client_was_not_answered_for(
        cluster: tuple[list[LiveServer], HAProxy]) -> None:
    """Differential: each framing through HAProxy, then ``GET /models`` on the same connection. The replicas
    count a ``/models`` request exactly when the client got an answer to it (HAProxy saw it as a request)."""
    replicas, hap = cluster
    market = f"FRAME-{uuid.uuid4().hex[:10]}"
    for k, (name, raw) in enumerate(framings(tick_body(market, 0)).items()):
        raw = raw.replace(b"1640995200000", b"%d" % (1_640_995_200_000 + 1000 * k))
        before = models_served(replicas)
        answer = exchange(hap.port, raw + (b"" if raw.endswith(SMUGGLED) else SMUGGLED))
        answered = answer.count(b'"active"')  # only the answer to GET /models has it
        assert models_served(replicas) - before == answered, (name, answer[:600])
