"""A reload of HAProxy (master-worker, as Debian's unit runs it: ``systemctl reload haproxy`` is SIGUSR2) loses no
tick sent on a kept-alive connection.

At a reload the old worker stops; by default it closes its clients' idle keep-alive connections at once, so a request
a client had just written on one got no answer (the Python client raises ``OutcomeUnknownError``: it cannot tell
whether the tick was applied). With ``option idle-close-on-response`` (rendered by ``haproxy-config``) the old worker
answers that request, with ``Connection: close``, before it closes. The test holds a connection idle across a reload,
then sends a tick on it: it must be answered 200, and applied once.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from haproxy_helpers import HAPROXY, free_port, needs_haproxy
from live_helpers import start_all, tick

from cerebellar_norse.scaleout.haproxy import Replica, RuntimeAPI, ServerState, render_config

pytestmark = [needs_haproxy, pytest.mark.tools, pytest.mark.slow]


def exchange(conn: socket.socket, body: dict[str, object]) -> tuple[bytes, bytes]:
    """Send one tick on ``conn``; return the answer's head and body (b"", b"" when the connection closed first)."""
    data = json.dumps(body).encode()
    conn.sendall(b"POST /neural/process HTTP/1.1\r\nHost: h\r\nContent-Type: application/json\r\nX-Market-ID: "
                 + str(body["market_id"]).encode() + b"\r\nContent-Length: " + str(len(data)).encode() + b"\r\n\r\n"
                 + data)
    got = b""
    while b"\r\n\r\n" not in got:
        try:
            chunk = conn.recv(65536)
        except ConnectionResetError:
            return b"", b""
        if not chunk:
            return b"", b""
        got += chunk
    head, _, rest = got.partition(b"\r\n\r\n")
    m = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
    assert m is not None, head
    while len(rest) < int(m.group(1)):
        chunk = conn.recv(65536)
        assert chunk, "the connection closed inside an answer"
        rest += chunk
    return head, rest


def test_a_tick_sent_on_a_kept_connection_across_a_reload_is_answered(tmp_path: Path) -> None:
    assert HAPROXY is not None
    (srv,) = start_all(tmp_path, 1)
    port, stats = free_port(), free_port()
    sock_path = tmp_path / "haproxy.sock"
    cfg = tmp_path / "haproxy.cfg"
    cfg.write_text(render_config([Replica(1, "127.0.0.1", srv.port)], f"127.0.0.1:{port}", f"127.0.0.1:{stats}",
                                 str(sock_path), "stderr format raw", 1000, maxconn=1000))
    log = (tmp_path / "haproxy.log").open("wb")
    master = subprocess.Popen([HAPROXY, "-W", "-db", "-f", str(cfg)], stdout=log, stderr=subprocess.STDOUT)
    api = RuntimeAPI(sock_path)
    try:
        deadline = time.monotonic() + 30
        while not (sock_path.exists() and any(s.in_ring for s in _servers(api))):
            assert master.poll() is None and time.monotonic() < deadline, (tmp_path / "haproxy.log").read_text()
            time.sleep(0.1)
        worker = _pid(api)
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            head, _ = exchange(conn, tick("RELOAD", 0))
            assert head.startswith(b"HTTP/1.1 200"), head
            master.send_signal(signal.SIGUSR2)  # systemctl reload haproxy
            while _pid(api) in (worker, None):  # the new worker answers the runtime API: the old one stops
                assert time.monotonic() < deadline + 30, (tmp_path / "haproxy.log").read_text()
                time.sleep(0.1)
            time.sleep(1.0)  # the old worker's soft stop has begun: without the option it closed the connection here
            head, body = exchange(conn, tick("RELOAD", 1))
        assert head.startswith(b"HTTP/1.1 200"), f"no answer to a tick sent on a kept connection after a reload: {head!r}"
        assert b"connection: close" in head.lower()
        assert json.loads(body)["market_id"] == "RELOAD"
        held = httpx.get(f"{srv.url}/debug/markets", timeout=30).json()["markets"]
        assert [(m["market_id"], m["ticks_seen"]) for m in held] == [("RELOAD", 2)]  # applied once
    finally:
        master.terminate()
        master.wait(timeout=30)
        log.close()
        srv.stop()


def _servers(api: RuntimeAPI) -> list[ServerState]:
    try:
        return api.servers()
    except Exception:  # not listening yet
        return []


def _pid(api: RuntimeAPI) -> int | None:
    try:
        m = re.search(r"(?m)^Pid: (\d+)", api.command("show info"))
    except Exception:  # between workers
        return None
    return int(m.group(1)) if m else None
