"""The port while the service starts: bound first, answered 503 (never refused) until the app serves it."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_helpers import REPO_ROOT, free_port, launch, server_environ
from prometheus_client.parser import text_string_to_metric_families

from cerebellar_norse.api.starting import StartingResponder, bind_listener
from cerebellar_norse.engine.persistence import STATE_FILE
from cerebellar_norse.errors import StartupError, StorageError


def _request(port: int, raw: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(raw)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


def test_every_request_is_answered_503_naming_the_stage() -> None:
    sock = bind_listener("127.0.0.1", 0)
    port = sock.getsockname()[1]
    responder = StartingResponder(sock).start()
    try:
        responder.reason = "restoring market state"
        r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
        assert r.status_code == 503 and r.headers["connection"] == "close" and r.headers["x-request-id"]
        body = r.json()
        assert body["status"] == "unavailable" and body["reason"] == "starting: restoring market state"
        head = httpx.head(f"http://127.0.0.1:{port}/health", timeout=5)
        assert head.status_code == 503 and head.content == b""
        tick = {"price": 1.0, "volume": 1.0, "timestamp": 1640995200000, "market_id": "A"}
        r = httpx.post(f"http://127.0.0.1:{port}/neural/process", json=tick, timeout=5)
        assert r.status_code == 503 and r.headers["retry-after"] == "2"
        err = r.json()["error"]
        assert err["type"] == "capacity" and err["message"] == "the service is starting: restoring market state; retry later"
        assert err["request_id"] == r.headers["x-request-id"]
        big = b"x" * 300_000  # a body is read before the answer: the client gets it, not a reset connection
        raw = _request(port, b"POST /neural/process HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s" % (len(big), big))
        assert raw.startswith(b"HTTP/1.1 503 ")
        assert json.loads(raw.split(b"\r\n\r\n", 1)[1])["error"]["type"] == "capacity"
    finally:
        responder.stop()
        sock.close()


def test_a_clients_request_id_is_kept_in_the_starting_answer() -> None:
    """A client that names its request (``X-Request-ID``) finds that id in the 503 of a start, as in every other
    answer of the service; an id the service would not take (spaces, too long) is replaced by one of its own."""
    sock = bind_listener("127.0.0.1", 0)
    port = sock.getsockname()[1]
    responder = StartingResponder(sock).start()
    try:
        tick = {"price": 1.0, "volume": 1.0, "timestamp": 1640995200000, "market_id": "A"}
        r = httpx.post(f"http://127.0.0.1:{port}/neural/process", json=tick, headers={"X-Request-ID": "order-42.a"},
                       timeout=5)
        assert r.status_code == 503 and r.headers["x-request-id"] == "order-42.a"
        assert r.json()["error"]["request_id"] == "order-42.a"
        r = httpx.get(f"http://127.0.0.1:{port}/health", headers={"x-request-id": "h-1"}, timeout=5)
        assert r.status_code == 503 and r.headers["x-request-id"] == "h-1"
        raw = _request(port, b"GET /health HTTP/1.1\r\nhost: x\r\nX-Request-ID: two words\r\n\r\n")
        head = raw.split(b"\r\n\r\n", 1)[0].lower()
        assert b"x-request-id: two words" not in head and b"x-request-id: " in head
        r = httpx.get(f"http://127.0.0.1:{port}/health", headers={"X-Request-ID": "x" * 129}, timeout=5)
        assert r.headers["x-request-id"] != "x" * 129 and len(r.headers["x-request-id"]) == 32
    finally:
        responder.stop()
        sock.close()


def test_a_request_expecting_100_continue_is_answered_without_its_body() -> None:
    """A client that waits for 100 Continue before its body (curl, .NET, Java's HttpClient) gets the 503 at once; the
    responder waited for the body, which such a client sends only after its own timeout, or never."""
    sock = bind_listener("127.0.0.1", 0)
    port = sock.getsockname()[1]
    responder = StartingResponder(sock).start()
    try:
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"POST /neural/process/batch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 500000\r\nExpect: 100-continue\r\n\r\n")
            s.settimeout(5)  # under the responder's 10 s deadline for a request that never completes
            answer = s.recv(65536)
        assert answer.startswith(b"HTTP/1.1 503 ") and b"100 Continue" not in answer
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["type"] == "capacity"
    finally:
        responder.stop()
        sock.close()


def test_metrics_while_starting_say_the_process_is_up_and_not_ready() -> None:
    """A scrape during a start (a minute of first-run training, a long journal replay) is not an outage: 200 with
    cerebellar_norse_ready 0, so that Prometheus' up stays 1 and CerebellarNorseDown does not page."""
    sock = bind_listener("127.0.0.1", 0)
    port = sock.getsockname()[1]
    responder = StartingResponder(sock).start()
    try:
        r = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        samples = {s.name: s.value for f in text_string_to_metric_families(r.text) for s in f.samples}
        assert samples["cerebellar_norse_ready"] == 0.0 and samples["cerebellar_norse_uptime_seconds"] >= 0.0, samples
        head = httpx.head(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert head.status_code == 200 and head.content == b""
        assert httpx.post(f"http://127.0.0.1:{port}/metrics", timeout=5).status_code == 503
    finally:
        responder.stop()
        sock.close()


def test_after_stop_the_socket_still_listens_for_the_app() -> None:
    sock = bind_listener("127.0.0.1", 0)
    port = sock.getsockname()[1]
    responder = StartingResponder(sock).start()
    assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 503
    responder.stop()
    responder.stop()  # idempotent
    waiting = socket.create_connection(("127.0.0.1", port), timeout=5)  # queued in the backlog: no one serves it yet
    waiting.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")

    async def app_server(served: threading.Event, done: threading.Event) -> None:
        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(answer, sock=sock)
        served.set()
        while not done.is_set():
            await asyncio.sleep(0.01)
        server.close()

    served, done = threading.Event(), threading.Event()
    t = threading.Thread(target=asyncio.run, args=(app_server(served, done),))
    t.start()
    try:
        assert served.wait(10)
        raw = b""
        while chunk := waiting.recv(65536):
            raw += chunk
        assert raw.startswith(b"HTTP/1.1 200 OK") and raw.endswith(b"ok")  # the connection that waited is served
    finally:
        waiting.close()
        done.set()
        t.join(10)


def test_a_request_left_unfinished_is_answered_when_the_responder_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    import cerebellar_norse.api.starting as starting

    monkeypatch.setattr(starting, "HEAD_TIMEOUT_S", 0.5)
    sock = bind_listener("127.0.0.1", 0)
    port = sock.getsockname()[1]
    responder = StartingResponder(sock).start()
    try:
        late = socket.create_connection(("127.0.0.1", port), timeout=5)
        late.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n")  # the headers never end
        assert late.recv(65536).startswith(b"HTTP/1.1 503 ")  # answered at its deadline
        late.close()
        stuck = socket.create_connection(("127.0.0.1", port), timeout=5)
        stuck.sendall(b"GET /health HTTP/1.1\r\n")
        time.sleep(0.1)
        assert len(responder.open) == 1
        responder.stop()  # before the deadline: answered and closed now, nothing left open
        out = b""
        while chunk := stuck.recv(65536):
            out += chunk
        assert out.startswith(b"HTTP/1.1 503 ") and not responder.open
        stuck.close()
    finally:
        responder.stop()
        sock.close()


def _hand_over_under_load() -> list[bytes]:
    """Clients keep connecting while the responder hands the port over to a stand-in server; what each got."""
    sock = bind_listener("127.0.0.1", 0)
    port = sock.getsockname()[1]
    responder = StartingResponder(sock).start()
    outcomes: list[bytes] = []
    done, serving_done = threading.Event(), threading.Event()

    def client() -> None:
        while not done.is_set():
            try:
                outcomes.append(_request(port, b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")[:12])
            except OSError as exc:
                outcomes.append(repr(exc).encode())

    def next_server() -> None:
        sock.settimeout(0.2)
        while not serving_done.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            with conn:
                conn.recv(4096)
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")

    clients = [threading.Thread(target=client) for _ in range(8)]
    for t in clients:
        t.start()
    time.sleep(0.3)
    responder.stop()
    server = threading.Thread(target=next_server)
    server.start()
    time.sleep(0.3)
    done.set()
    for t in clients:
        t.join(30)
    serving_done.set()
    server.join(10)
    sock.close()
    return outcomes


def test_no_connection_is_dropped_at_the_hand_over() -> None:
    """Each client gets the responder's 503 or the next server's answer, none a reset or silence (connections
    accepted but not yet served must not be lost)."""
    for _ in range(3):
        outcomes = _hand_over_under_load()
        assert set(outcomes) <= {b"HTTP/1.1 503", b"HTTP/1.1 200"}, {o for o in outcomes if not o.startswith(b"HTTP")}
        assert b"HTTP/1.1 200" in outcomes


def test_a_port_in_use_is_refused_naming_it() -> None:
    sock = bind_listener("127.0.0.1", 0)
    port = sock.getsockname()[1]
    try:
        with pytest.raises(StartupError, match=rf"cannot listen on 127\.0\.0\.1:{port}: Address already in use"):
            bind_listener("127.0.0.1", port)
    finally:
        sock.close()


def test_the_service_answers_503_from_its_first_answer_to_ready(tmp_path: Path) -> None:
    port = free_port()
    proc = launch(tmp_path / "state", tmp_path / "server.log", port)
    seen: list[int] = []  # statuses of /health, from the first answer on (refused connections before it)
    reasons = set()
    uptimes: list[float] = []  # uptime_s of every answer: one clock from the first answer on, never going back
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and (not seen or seen[-1] != 200):
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
            except httpx.TransportError:
                assert not seen, f"refused after answering {seen[-5:]}"
                time.sleep(0.01)
                continue
            seen.append(r.status_code)
            uptimes.append(r.json()["uptime_s"])
            if r.status_code == 503:
                reasons.add(r.json()["reason"])
            time.sleep(0.01)
        assert seen[-1] == 200 and set(seen[:-1]) == {503}, seen
        assert all(reason.startswith("starting") for reason in reasons), reasons
        assert uptimes == sorted(uptimes), uptimes
        metric = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        value = float(next(line.split()[1] for line in metric.splitlines() if line.startswith("cerebellar_norse_uptime_seconds ")))
        assert value >= uptimes[-1]  # the metric counts from the same start
    finally:
        proc.terminate()
        assert proc.wait(60) == 0


def test_a_second_service_on_a_port_in_use_exits_1_before_touching_state(tmp_path: Path) -> None:
    taken = bind_listener("127.0.0.1", 0)
    port = taken.getsockname()[1]
    try:
        proc = subprocess.run([sys.executable, "-m", "cerebellar_norse.cli", "--port", str(port)], cwd=REPO_ROOT,
                              env=server_environ(tmp_path / "state", None), capture_output=True, text=True, timeout=120)
    finally:
        taken.close()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "state" / STATE_FILE).exists() and not (tmp_path / "state" / "models").exists()


def test_the_starting_body_is_one_of_the_documented_503_schemas(tmp_path: Path) -> None:
    """A spec-driven client checks the 503 of /health against the OpenAPI document, during start-up too."""
    from live_helpers import NO_BOOTSTRAP

    from cerebellar_norse.api.app import create_app
    from cerebellar_norse.api.server import build_service
    from cerebellar_norse.config import load_checked_config

    environ = {"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path / "state"), **NO_BOOTSTRAP}
    doc = create_app(build_service(load_checked_config(None, environ=environ))).openapi()
    schema = doc["paths"]["/health"]["get"]["responses"]["503"]["content"]["application/json"]["schema"]
    members = [doc["components"]["schemas"][m["$ref"].rsplit("/", 1)[1]] for m in schema["anyOf"]]
    sock = bind_listener("127.0.0.1", 0)
    responder = StartingResponder(sock).start()
    try:
        body = httpx.get(f"http://127.0.0.1:{sock.getsockname()[1]}/health", timeout=5).json()
    finally:
        responder.stop()
        sock.close()
    types = {"string": str, "number": (int, float), "integer": int, "boolean": bool, "object": dict}

    def fits(member: dict[str, Any]) -> bool:
        props = member.get("properties", {})
        return set(member.get("required", [])) <= set(body) and all(
            k in props and isinstance(v, types.get(props[k].get("type"), object)) for k, v in body.items())

    assert any(fits(m) for m in members), (body, [m.get("title") for m in members])


@pytest.mark.parametrize(("code", "said"), [(13, "cannot start: cannot use /x/journal: Permission denied (errno 13 EACCES)"),
                                            (28, "cannot start: writing failed at /x/journal: No space left on device")])
def test_a_start_up_os_error_says_writing_only_when_it_was_a_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  code: int, said: str) -> None:
    import os

    from live_helpers import NO_BOOTSTRAP

    from cerebellar_norse.api import server
    from cerebellar_norse.config import load_checked_config

    def fail(state: object) -> None:
        raise OSError(code, os.strerror(code), "/x/journal")

    monkeypatch.setattr(server, "prepare_state", fail)
    environ = {"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path / "state"),
               "CEREBELLAR_NORSE_SERVER__PORT": str(free_port()), **NO_BOOTSTRAP}
    with pytest.raises(StorageError) as exc:
        server.serve(load_checked_config(None, environ=environ))
    assert str(exc.value).startswith(said), str(exc.value)


def _ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


needs_ipv6 = pytest.mark.skipif(not _ipv6(), reason="no IPv6 loopback on this host")


@needs_ipv6
def test_an_ipv6_host_in_brackets_is_listened_on() -> None:
    """``[::1]`` (as a URL writes it) is the IPv6 loopback (it could not be bound: ``Name or service not known``), and
    the commands that call the service reach it there."""
    from cerebellar_norse.config import Config
    from cerebellar_norse.observability.debugtools import service_url

    assert service_url(Config.model_validate({"server": {"host": "[::1]", "port": 8081}})) == "http://[::1]:8081"
    sock = bind_listener("[::1]", 0)
    try:
        assert sock.family == socket.AF_INET6 and sock.getsockname()[0] == "::1"
        with socket.create_connection(("::1", sock.getsockname()[1]), timeout=5):
            pass
    finally:
        sock.close()


@needs_ipv6
def test_an_ipv6_address_in_use_is_named_in_brackets() -> None:
    sock = bind_listener("::1", 0)
    port = sock.getsockname()[1]
    try:
        with pytest.raises(StartupError, match=rf"^cannot listen on \[::1\]:{port}: Address already in use"):
            bind_listener("::1", port)
    finally:
        sock.close()


@needs_ipv6
def test_the_ipv6_wildcard_takes_ipv4_connections_too() -> None:
    sock = bind_listener("::", 0)
    try:
        assert sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 0
        with socket.create_connection(("127.0.0.1", sock.getsockname()[1]), timeout=5):
            pass
    finally:
        sock.close()


def test_a_host_that_does_not_resolve_is_refused_naming_it() -> None:
    with pytest.raises(StartupError, match=r"^cannot listen on no-such-host\.invalid:8080: .* \(server\.host is neither an "
                                           r"address nor a name"):
        bind_listener("no-such-host.invalid", 8080)


def test_a_socket_the_host_cannot_make_is_refused_naming_the_address(monkeypatch: pytest.MonkeyPatch) -> None:
    """An IPv6 address on a kernel without IPv6 (socket() fails with EAFNOSUPPORT): one line naming the address, as
    for every other failure to listen (it was a bare `OSError: …` naming neither)."""
    import errno

    def no_ipv6(family: int = socket.AF_INET, *a: object, **k: object) -> socket.socket:
        if family == socket.AF_INET6:
            raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")
        return real(family, *a, **k)  # type: ignore[arg-type]

    real = socket.socket
    monkeypatch.setattr(socket, "socket", no_ipv6)
    with pytest.raises(StartupError, match=r"^cannot listen on \[::1\]:8080: Address family not supported by protocol$"):
        bind_listener("::1", 8080)
