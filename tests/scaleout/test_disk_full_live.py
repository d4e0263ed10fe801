"""A replica whose disk fills up behind a real HAProxy comes back into the ring once space returns.

Replica 1's state dir is a small tmpfs. Its disk is filled and ticks are sent to it until its journal's open file is
full and the next one cannot be created: ticks are refused (503 ``capacity``), ``/health`` answers 503 and HAProxy's
checks take the replica out of the ring, so no tick of its markets reaches it any more. Once the filler is deleted,
HAProxy's checks themselves (``GET /health``) must find the space: the replica is back in the ring within a few
checks, with every acknowledged tick in its state, not only at its next periodic checkpoint (here an hour away; 60 s
by default), which was the only other thing that tried the journal's next file again.

Skipped where a tmpfs cannot be mounted (not root, no CAP_SYS_ADMIN) or haproxy is not installed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from haproxy_helpers import needs_haproxy, start_haproxy
from live_helpers import LiveServer, free_port, launch, mount_tmpfs, tick, unmount, wait_healthy

from cerebellar_norse.scaleout.haproxy import Replica

pytestmark = [needs_haproxy, pytest.mark.tools, pytest.mark.slow]

ENV = {"CEREBELLAR_NORSE_PERFORMANCE__JOURNAL_SEGMENT_SIZE": "1MB",
       "CEREBELLAR_NORSE_PERFORMANCE__CHECKPOINT_INTERVAL_S": "3600"}  # no periodic checkpoint tries the file again


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 6 MB tmpfs under tmp_path (skips the test where it cannot be mounted)."""
    point = tmp_path / "disk"
    why = mount_tmpfs(point, "6m")
    if why is not None:
        pytest.skip(why)
    yield point
    unmount(point)


def _fill(directory: Path) -> Path:
    path = directory / "filler"
    with open(path, "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\xa5" * 65536)
        except OSError:
            pass
    return path


def test_a_replica_whose_disk_filled_rejoins_the_ring_once_space_returns(tmp_path: Path, small_disk: Path) -> None:
    replicas = []
    for j, root in enumerate((small_disk / "s0", tmp_path / "s1")):
        port = free_port()
        replicas.append(LiveServer(launch(root, tmp_path / f"s{j}.log", port, ENV), port, root, tmp_path / f"s{j}.log"))
    try:
        for srv in replicas:
            wait_healthy(srv, time.monotonic() + 60)
        hap = start_haproxy(tmp_path, [Replica(j + 1, "127.0.0.1", s.port) for j, s in enumerate(replicas)],
                            check_interval_ms=300)
        try:
            hap.api.wait_ring({1, 2})
            r1 = replicas[0]
            acked = 0
            filler = _fill(small_disk)
            with httpx.Client(base_url=r1.url, timeout=15) as c:
                while True:  # until the journal's open file is full and its next one finds no space
                    assert acked < 100_000, "the journal file never filled up"
                    r = c.post("/neural/process/batch", json={"ticks": [tick("F", acked + j) for j in range(250)]})
                    if r.status_code != 200:
                        break
                    acked += 250
                assert r.status_code == 503 and r.json()["error"]["type"] == "capacity", r.text
                assert c.get("/health").status_code == 503
            hap.api.wait_ring({2})  # its checks took it out: no tick reaches it now
            filler.unlink()
            hap.api.wait_ring({1, 2}, timeout_s=15)  # ... and they find the space again
            state = httpx.get(f"{r1.url}/debug/markets/F/state", timeout=10).json()
            assert state["warmup"]["ticks_seen"] == acked  # every acknowledged tick, none of the refused ones
            r = httpx.post(f"{r1.url}/neural/process", json=tick("F", acked), timeout=10)
            assert r.status_code == 200, r.text
            assert "ticks are accepted again" in r1.log()
        finally:
            hap.stop()
    finally:
        for srv in replicas:
            srv.stop()
