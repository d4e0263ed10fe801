"""Fixtures of the API tests: the real server in a subprocess on a free loopback port.

``live`` is one server per test module (module-scoped, startup takes about two seconds);
``start_server`` starts more (a restart, a refused start) inside one test. Every server
is stopped with SIGTERM and must exit 0 (graceful shutdown).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import httpx
import pytest
from live_helpers import LiveServer, start


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """One real server for the whole test module; SIGTERM at the end must exit 0."""
    root = tmp_path_factory.mktemp("live")
    srv = start(root / "state", root / "server.log")
    try:
        yield srv
    finally:
        rc = srv.stop()
    assert rc == 0, f"server exited with {rc} after SIGTERM\n{srv.log()[-4000:]}"


@pytest.fixture(scope="module")
def client(live: LiveServer) -> Iterator[httpx.Client]:
    """A keep-alive HTTP client of the module's server."""
    with httpx.Client(base_url=live.url, timeout=10.0) as c:
        yield c


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., LiveServer]]:
    """Start extra servers in a test: ``start_server(state_dir, env={...}, args=[...])``; all are stopped at the end."""
    started: list[LiveServer] = []

    def _start(state_dir: Path, env: Mapping[str, str] | None = None, args: Sequence[str] = ()) -> LiveServer:
        srv = start(state_dir, tmp_path / f"server-{len(started)}.log", env, args)
        started.append(srv)
        return srv

    yield _start
    for srv in started:
        srv.stop()
