"""The replica template unit (``cerebellar-norse@.service``) verifies as an instance and keeps the service unit's guarantees."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from cerebellar_norse.scaleout.haproxy import Replica, render_config

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "systemd" / "cerebellar-norse@.service"
SERVICE = ROOT / "systemd" / "cerebellar-norse.service"
ANALYZE = shutil.which("systemd-analyze")
needs_analyze = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze not installed")


def _instance(tmp_path: Path, port: int = 8081) -> Path:
    """An instance of the template, ExecStart pointing at this checkout's console script (verify checks it exists)."""
    exe = Path(sys.executable).with_name("cerebellar-norse")
    text = TEMPLATE.read_text().replace("/opt/cerebellar-norse/.venv/bin/cerebellar-norse", str(exe))
    (tmp_path / "cerebellar-norse@.service").write_text(text)
    out = tmp_path / f"cerebellar-norse@{port}.service"
    out.write_text(text)
    return out


@needs_analyze
def test_template_instance_verifies_and_rates_ok(tmp_path: Path) -> None:
    unit = _instance(tmp_path)
    r = subprocess.run([ANALYZE, "verify", str(unit)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "cerebellar-norse@" not in r.stderr, r.stderr
    r = subprocess.run([ANALYZE, "security", "--offline=true", str(unit)], capture_output=True, text=True, timeout=60)
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+) (\w+)", r.stdout + r.stderr)
    assert m and float(m.group(1)) <= 3.5 and m.group(2) == "OK", r.stdout + r.stderr


def test_each_instance_has_its_own_port_state_and_logs() -> None:
    text = TEMPLATE.read_text()
    for line in ("Environment=CEREBELLAR_NORSE_SERVER__PORT=%i", "StateDirectory=cerebellar-norse/%i",
                 "Environment=CEREBELLAR_NORSE_PATHS__STATE_DIR=/var/lib/cerebellar-norse/%i",
                 "LogsDirectory=cerebellar-norse/%i", "EnvironmentFile=-/etc/cerebellar-norse/replica-%i.env",
                 "CPUAffinity="):
        assert line in text, line


def test_template_keeps_every_setting_of_the_service_unit() -> None:
    """Apart from the per-instance lines, the template is the service unit (hardening, watchdog, limits)."""
    def settings(path: Path) -> set[str]:
        return {ln for ln in path.read_text().splitlines() if ln and not ln.startswith("#")}

    only_service = {ln for ln in settings(SERVICE) - settings(TEMPLATE)
                    if not ln.startswith(("Description=", "Documentation=", "StateDirectory=", "LogsDirectory=",
                                          "Environment=CEREBELLAR_NORSE_PATHS__STATE_DIR="))}
    assert not only_service, only_service


def test_each_instance_logs_to_its_own_logs_directory() -> None:
    """production.toml's [logging] file is outside an instance's writable LogsDirectory (ProtectSystem=strict)."""
    text = TEMPLATE.read_text()
    assert "ProtectSystem=strict" in text and "LogsDirectory=cerebellar-norse/%i" in text
    assert "Environment=CEREBELLAR_NORSE_LOGGING__FILE=/var/log/cerebellar-norse/%i/application.log" in text


def test_a_replica_drains_long_enough_for_haproxy_and_its_stop_fits_timeoutstopsec() -> None:
    """The replica's ``server.drain_s`` covers HAProxy's checks (inter x fall of the rendered and the shipped config)
    with a margin, and TimeoutStopSec= covers the drain, ``connection_timeout`` of production.toml and the save."""
    text = TEMPLATE.read_text()
    drain = re.search(r"^Environment=CEREBELLAR_NORSE_SERVER__DRAIN_S=([0-9.]+)$", text, re.M)
    assert drain, "the replica unit sets no server.drain_s"
    drain_s = float(drain.group(1))
    for cfg in (render_config([Replica(1, "127.0.0.1", 8081)]), (ROOT / "deploy/haproxy/cerebellar-norse.cfg").read_text()):
        m = re.search(r"default-server check inter (\d+) fall (\d+)", cfg)
        assert m, cfg
        assert drain_s >= int(m.group(1)) * int(m.group(2)) / 1000 + 1
    production = tomllib.loads((ROOT / "config" / "production.toml").read_text())["server"]
    for unit in (TEMPLATE, SERVICE):
        stop = re.search(r"^TimeoutStopSec=(\d+)$", unit.read_text(), re.M)
        assert stop, unit
        assert int(stop.group(1)) >= drain_s + production["connection_timeout"] + production["drain_s"] + 10, unit


def _writable_roots(text: str, instance: str) -> list[str]:
    """The directories a unit leaves writable under ProtectSystem=strict: its State/Cache/Logs directories and
    ReadWritePaths (the service's PrivateTmp /tmp aside)."""
    bases = {"StateDirectory": "/var/lib", "CacheDirectory": "/var/cache", "LogsDirectory": "/var/log"}
    roots = []
    for line in text.replace("%i", instance).splitlines():
        key, _, value = line.partition("=")
        if key in bases:
            roots += [f"{bases[key]}/{d}" for d in value.split()]
        elif key == "ReadWritePaths":
            roots += value.split()
    return roots


@pytest.mark.parametrize("unit", [SERVICE, TEMPLATE], ids=lambda p: p.name)
def test_every_cache_the_service_writes_lies_in_a_directory_the_unit_makes_writable(unit: Path) -> None:
    """numba's kernels, matplotlib's font cache (imported by the service) and any ~/.cache go where the unit lets
    the service write. The user's home (docs/install.md's useradd --home) is read-only to a replica, whose only
    writable state dir is /var/lib/cerebellar-norse/<port>: without MPLCONFIGDIR matplotlib warned at each start
    (`/var/lib/cerebellar-norse/.config/matplotlib is not a writable directory`, not a JSON line) and rebuilt its
    font cache in a temporary directory."""
    text = unit.read_text()
    roots = _writable_roots(text, "8081")
    home = re.search(r"useradd .*--home (\S+)", (ROOT / "docs" / "install.md").read_text())
    assert home, "docs/install.md has no useradd --home line"
    env = dict(re.findall(r"^Environment=(\w+)=(\S+)$", text.replace("%i", "8081"), re.MULTILINE))
    for var in ("NUMBA_CACHE_DIR", "MPLCONFIGDIR", "XDG_CACHE_HOME"):
        assert var in env, f"{unit.name} does not set {var}: it would default to a path under {home.group(1)}"
        path = env[var]
        assert any(path == r or path.startswith(r + "/") for r in roots), (var, path, roots)
