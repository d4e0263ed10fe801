"""Helpers of the scale-out tests: a real HAProxy process with a rendered configuration."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from cerebellar_norse.scaleout.haproxy import Replica, RuntimeAPI, render_config

HAPROXY = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
needs_haproxy = pytest.mark.skipif(HAPROXY is None, reason="haproxy is not installed (apt-get install haproxy; "
                                                           "`make tools` installs it)")


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class HAProxy:
    """A running HAProxy: its frontend URL, runtime API and process."""

    proc: subprocess.Popen[bytes]
    port: int
    stats_port: int
    api: RuntimeAPI
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_haproxy(tmp: Path, replicas: list[Replica], check_interval_ms: int = 200) -> HAProxy:
    """Render the configuration for ``replicas`` and start HAProxy in the foreground (``-db``)."""
    assert HAPROXY is not None
    port, stats = free_port(), free_port()
    sock = tmp / "haproxy.sock"
    cfg = tmp / "haproxy.cfg"
    cfg.write_text(render_config(replicas, f"127.0.0.1:{port}", f"127.0.0.1:{stats}", str(sock), "stderr format raw",
                                 check_interval_ms, maxconn=1000))
    check = subprocess.run([HAPROXY, "-c", "-f", str(cfg)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    log_path = tmp / "haproxy.log"
    with log_path.open("wb") as out:
        proc = subprocess.Popen([HAPROXY, "-db", "-f", str(cfg)], stdout=out, stderr=subprocess.STDOUT)
    api = RuntimeAPI(sock)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"haproxy exited with {proc.returncode}\n{log_path.read_text()}")
        if sock.exists():
            try:
                api.servers()
                return HAProxy(proc, port, stats, api, log_path)
            except Exception:
                pass
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"haproxy did not start\n{log_path.read_text()}")
