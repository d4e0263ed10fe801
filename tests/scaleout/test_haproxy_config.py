"""The shipped HAProxy configuration is what ``haproxy-config`` renders, and HAProxy accepts it."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from haproxy_helpers import HAPROXY, needs_haproxy

from cerebellar_norse.cli import main
from cerebellar_norse.errors import ConfigError
from cerebellar_norse.scaleout.haproxy import Replica, parse_replica, render_config

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "deploy" / "haproxy" / "cerebellar-norse.cfg"


def test_shipped_config_is_the_rendered_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["haproxy-config", "--replicas", "127.0.0.1:8081,127.0.0.1:8082,127.0.0.1:8083"]) == 0
    assert capsys.readouterr().out == SHIPPED.read_text()


@needs_haproxy
def test_haproxy_accepts_the_shipped_config() -> None:
    assert HAPROXY is not None
    r = subprocess.run([HAPROXY, "-c", "-f", str(SHIPPED)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr


def test_replica_syntax_and_bad_lists() -> None:
    assert parse_replica("7=10.0.0.5:8081~", 1) == Replica(7, "10.0.0.5", 8081, enabled=False)
    assert parse_replica("http://h:9000", 3) == Replica(3, "h", 9000)
    for bad in ("h", "x=h:1", "0=h:1"):
        with pytest.raises(Exception, match="replica"):
            parse_replica(bad, 1)
    with pytest.raises(ConfigError, match="duplicate server ids"):
        render_config([Replica(1, "a", 1), Replica(1, "b", 2)])
    assert "server r2 b:2 id 2 weight 1 disabled" in render_config([Replica(1, "a", 1), Replica(2, "b", 2, enabled=False)])
