"""Starting and stopping the real server: exposure check, graceful shutdown, state carried over a restart."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from live_helpers import REPO_ROOT, LiveServer, free_port, server_environ, signal_of, tick
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from cerebellar_norse import CerebellarNetwork
from cerebellar_norse.engine.persistence import STATE_FILE


def test_public_host_without_token_is_refused_before_binding(tmp_path: Path) -> None:
    cases = {  # name: (extra args, extra env); started together, they take one startup's time
        "env 0.0.0.0": ([], {"CEREBELLAR_NORSE_SERVER__HOST": "0.0.0.0"}),
        "env ::": ([], {"CEREBELLAR_NORSE_SERVER__HOST": "::"}),
        "flag 192.0.2.10": (["--host", "192.0.2.10"], {}),
    }
    procs = {}
    for name, (args, extra) in cases.items():
        env = server_environ(tmp_path / "state", extra)
        procs[name] = subprocess.Popen([sys.executable, "-m", "cerebellar_norse.cli", "--port", str(free_port()), *args],
                                       cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 1, (name, out, err)
        assert "server.api_token" in err, (name, err)
        assert "Traceback" not in out + err
        # refused before uvicorn started: nothing was bound, no state was written
        assert "Started server process" not in out + err, name
    assert not (tmp_path / "state" / STATE_FILE).exists()


def test_graceful_shutdown_saves_and_restart_continues(tmp_path: Path, start_server: Callable[..., LiveServer]) -> None:
    state_dir = tmp_path / "state"
    ticks = [tick("RESUME", k) for k in range(10)]

    def never_restarted() -> list[dict[str, Any]]:  # the same ticks through the Python API, same built-in config
        net = CerebellarNetwork()
        return [net.process(t) for t in ticks]

    pool = ThreadPoolExecutor(1)  # computed while the servers start
    expected = pool.submit(never_restarted)
    pool.shutdown(wait=False)

    first = start_server(state_dir)
    with httpx.Client(base_url=first.url, timeout=10) as c:
        before = [c.post("/neural/process", json=t).json() for t in ticks[:5]]
    with connect(f"{first.ws_url}/neural/stream", open_timeout=10) as ws:  # an open stream at shutdown
        assert first.stop() == 0, first.log()[-4000:]
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012  # "service restart"
    assert (state_dir / STATE_FILE).is_file()
    assert '"service stopped"' in first.log()

    second = start_server(state_dir)
    with httpx.Client(base_url=second.url, timeout=10) as c:
        health = c.get("/health").json()
        assert health["pool"]["markets"] == 1  # the saved market is back
        # the restored market refuses ticks older than its last one
        assert c.post("/neural/process", json=ticks[3]).status_code == 409
        after = [c.post("/neural/process", json=t).json() for t in ticks[5:]]
    assert second.stop() == 0, second.log()[-4000:]

    assert [signal_of(r) for r in before + after] == [signal_of(r) for r in expected.result(timeout=120)]


def test_a_start_whose_app_startup_fails_exits_1(tmp_path: Path) -> None:
    """The app's startup failing (here the kernels' warm-up, as a host out of memory fails it) ends the start with the
    logged `Application startup failed` and exit code 1, a check failed as every other refused start, not uvicorn's own
    code 3; nothing listens afterwards."""
    port = free_port()
    inject = ("import sys\nfrom cerebellar_norse.engine.engine import Engine\n"
              "def warm_up(self): raise MemoryError('no memory for the warm-up (injected)')\n"
              "Engine.warm_up = warm_up\nfrom cerebellar_norse import cli\ncli.run(sys.argv[1:])\n")
    proc = subprocess.run([sys.executable, "-c", inject, "--port", str(port)], cwd=REPO_ROOT,
                          env=server_environ(tmp_path / "state"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, (proc.returncode, proc.stdout[-3000:], proc.stderr[-3000:])
    assert "Application startup failed" in proc.stdout + proc.stderr
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0)
