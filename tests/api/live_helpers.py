"""Helpers of the API tests: start the real server in a subprocess, build ticks, compare answers."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 60.0
SHUTDOWN_TIMEOUT_S = 30.0
BASE_TS = 1_640_995_200_000  # the operations guide's example tick time (ms since epoch)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _no_bootstrap() -> dict[str, str]:
    """Override that skips first-run training of a default model (tens of seconds per fresh state dir).

    The API tests serve the untrained network of the config's seed: fast, and the same
    network as ``CerebellarNetwork()``. Only set when the config knows the key.
    """
    from cerebellar_norse.config import TrainingConfig

    if "bootstrap_on_first_run" in TrainingConfig.model_fields:
        return {"CEREBELLAR_NORSE_TRAINING__BOOTSTRAP_ON_FIRST_RUN": "false"}
    return {}


NO_BOOTSTRAP = _no_bootstrap()


def tree_of(root: Path) -> dict[str, str]:
    """Every entry under ``root``: its relative path and the SHA-256 of its bytes ("dir" for a directory)."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        out[rel] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def with_active_model(state: Path, version: str) -> dict[str, str]:
    """``state`` holding the built-in network stored as model ``version``, activated, and a ``market_state.bin`` saved
    with it; returns :func:`tree_of` it (a start that must change nothing compares it afterwards, less ``.lock``)."""
    from cerebellar_norse.config import load_config
    from cerebellar_norse.neurons.topology import generate_weights
    from cerebellar_norse.training.checkpoints import ModelStore

    cfg = load_config(None, environ={})
    store = ModelStore(state)
    store.save(generate_weights(cfg), cfg, {"validation": {"loss": 0.9}}, version=version)
    store.set_active(version)
    (state / "market_state.bin").write_bytes(b"saved with the active model")  # must not be moved aside or rewritten
    return tree_of(state)


def failed_start_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one ``cerebellar-norse: …`` line of a start that stopped with exit code 1 and no traceback."""
    assert done.returncode == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("cerebellar-norse: ")]
    assert len(lines) == 1, done.stderr[-3000:]
    return lines[0]


def server_environ(state_dir: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's environment without config overrides (the kernels' cache kept), plus the state dir, no first-run
    training, and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CEREBELLAR_NORSE_") and k != "STATE_DIRECTORY"}
    # the compiled kernels' cache of this process (cerebellar_norse/__init__.py): without its base the server took
    # NUMBA_CACHE_DIR (already keyed) as one and compiled every kernel afresh into a directory of its own
    if "CEREBELLAR_NORSE_NUMBA_CACHE_BASE" in os.environ:
        env["CEREBELLAR_NORSE_NUMBA_CACHE_BASE"] = os.environ["CEREBELLAR_NORSE_NUMBA_CACHE_BASE"]
    env["CEREBELLAR_NORSE_PATHS__STATE_DIR"] = str(state_dir)
    env.update(NO_BOOTSTRAP)
    env.update(extra or {})
    return env


@dataclass
class LiveServer:
    """A ``cerebellar-norse`` serve process and how to talk to it."""

    proc: subprocess.Popen[bytes]
    port: int
    state_dir: Path
    log_path: Path
    returncode: int | None = field(default=None)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> int:
        """SIGTERM, wait for the exit, return the exit code (idempotent)."""
        if self.returncode is None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
            try:
                self.returncode = self.proc.wait(timeout=SHUTDOWN_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"server did not exit within {SHUTDOWN_TIMEOUT_S}s of SIGTERM\n{self.log()[-4000:]}") from None
        return self.returncode


def launch(state_dir: Path, log_path: Path, port: int, env: Mapping[str, str] | None = None,
           args: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """Start ``python -m cerebellar_norse.cli --port PORT [args]`` with stdout+stderr to ``log_path``."""
    state_dir.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "cerebellar_norse.cli", "--port", str(port), *args],
            cwd=REPO_ROOT, env=server_environ(state_dir, env), stdout=out, stderr=subprocess.STDOUT,
        )


def start(state_dir: Path, log_path: Path, env: Mapping[str, str] | None = None, args: Sequence[str] = ()) -> LiveServer:
    """A started server whose /health answered 200 (fails the test with the server log otherwise)."""
    port = free_port()
    srv = LiveServer(launch(state_dir, log_path, port, env, args), port, state_dir, log_path)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if srv.proc.poll() is not None:
            raise AssertionError(f"server exited with {srv.proc.returncode} during startup\n{srv.log()[-4000:]}")
        try:
            if httpx.get(f"{srv.url}/health", timeout=1.0).status_code == 200:
                return srv
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    srv.proc.kill()
    srv.proc.wait()
    raise AssertionError(f"server not healthy within {STARTUP_TIMEOUT_S}s\n{srv.log()[-4000:]}")


def start_all(root: Path, n: int, env: Mapping[str, str] | None = None) -> list[LiveServer]:
    """Start ``n`` servers at once (startup overlaps; state dirs ``root/s<j>``), each healthy before returning."""
    servers = []
    for j in range(n):
        port = free_port()
        servers.append(LiveServer(launch(root / f"s{j}", root / f"s{j}.log", port, env), port, root / f"s{j}",
                                  root / f"s{j}.log"))
    deadline = time.monotonic() + 60 * n  # startups overlap; a loaded machine slows each one down
    try:
        for srv in servers:
            wait_healthy(srv, deadline)
    except BaseException:  # one did not start: none is left running (they would slow every later test down)
        for srv in servers:
            if srv.proc.poll() is None:
                srv.proc.kill()
                srv.proc.wait()
        raise
    return servers


def wait_healthy(srv: LiveServer, deadline: float) -> None:
    """Wait until ``srv``'s /health answers 200, failing the test with its log if it exits or ``deadline``
    (``time.monotonic()``) passes first."""
    while True:
        assert srv.proc.poll() is None, srv.log()[-3000:]
        try:
            if httpx.get(f"{srv.url}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, srv.log()[-3000:]
        time.sleep(0.05)


def market(prefix: str = "M") -> str:
    """A market id no other test uses (the module's server keeps state between tests)."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def tick(market_id: str, k: int = 0, price: float = 100.0, volume: float = 1000.0) -> dict[str, Any]:
    """The k-th tick of a market: one second apart, a small deterministic price path."""
    return {"price": price + 0.25 * ((k * 7) % 5) - 0.5, "volume": volume + 10.0 * k, "timestamp": BASE_TS + 1000 * k,
            "market_id": market_id}


SIGNAL_KEYS = ("prediction", "probabilities", "confidence", "spike_count")


def signal_of(result: Mapping[str, Any]) -> dict[str, Any]:
    """The network's answer without per-request fields (ids, timing)."""
    return {k: result[k] for k in SIGNAL_KEYS}


def read_until_closed(sock: socket.socket, limit_s: float) -> tuple[bytes, bool]:
    """Everything the server sends until it closes the connection (False: it did not within ``limit_s``)."""
    sock.settimeout(limit_s)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        return data, False
    return data, True


def mount_tmpfs(point: Path, size: str, ro: bool = False) -> str | None:
    """Mount a tmpfs of ``size`` on ``point``; None when done, else why it could not be mounted."""
    point.mkdir(parents=True, exist_ok=True)
    opts = f"size={size}" + (",ro" if ro else "")
    try:
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(point)], capture_output=True, text=True,
                             timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot mount a tmpfs here: {exc}"
    return None if res.returncode == 0 else f"cannot mount a tmpfs here: {res.stderr.strip() or res.returncode}"


def unmount(point: Path) -> None:
    """Unmount what :func:`mount_tmpfs` mounted on ``point`` (lazily: a process still in it does not stop it)."""
    subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)
