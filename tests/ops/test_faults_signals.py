"""Signals against a real service process: a forced quit (SIGINT while a SIGTERM drains open requests).

uvicorn skips the app's shutdown on a forced quit and leaves it to the cancellation of
the lifespan at the loop's end; each cancelled request and the lifespan were logged as an
ERROR traceback. The service cuts the running requests off itself, says so in one
WARNING, saves the market state in order and exits 0, with every acknowledged tick.
"""

from __future__ import annotations

import signal
import socket
import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "api"))
from live_helpers import BASE_TS, start


@pytest.mark.slow
def test_sigint_while_a_sigterm_drains_cuts_requests_off_with_one_line_and_saves(tmp_path: Path) -> None:
    srv = start(tmp_path / "state", tmp_path / "serve.log")
    try:
        with httpx.Client(base_url=srv.url, timeout=10) as c:
            for k in range(20):
                r = c.post("/neural/process", json={"price": 100.0 + k % 3, "volume": 5.0,
                                                    "timestamp": BASE_TS + 1000 * k, "market_id": "SIG"})
                assert r.status_code == 200, r.text
        # a request whose body never completes: the graceful shutdown waits for it (server.connection_timeout)
        hanging = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
        hanging.sendall(b"POST /neural/process/batch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Content-Length: 100000\r\n\r\n{")
        time.sleep(0.3)
        srv.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while "Waiting for connections to close" not in srv.log():
            assert time.monotonic() < deadline and srv.proc.poll() is None, srv.log()[-3000:]
            time.sleep(0.05)
        srv.proc.send_signal(signal.SIGINT)
        assert srv.stop() == 0, srv.log()[-3000:]
        hanging.close()
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait()
    log = srv.log()
    assert "Traceback" not in log and '"ERROR"' not in log, log[-4000:]
    assert [line for line in log.splitlines() if "forced quit" in line and '"WARNING"' in line], log[-3000:]
    assert len([line for line in log.splitlines() if "forced quit" in line]) == 1
    tail = log[log.index("forced quit"):]
    assert '"saved market state"' in tail and '"ticks": 20' in tail, tail[-2000:]
