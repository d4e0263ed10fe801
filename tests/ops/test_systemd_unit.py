"""The systemd unit passes systemd-analyze verify and rates OK (<= 3.5) on security."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "cerebellar-norse.service"
ANALYZE = shutil.which("systemd-analyze")
pytestmark = pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze not installed")


def _installed_copy(tmp_path: Path) -> Path:
    """The unit with ExecStart pointing at this checkout's console script (verify checks it exists)."""
    exe = Path(sys.executable).with_name("cerebellar-norse")
    text = UNIT.read_text().replace("/opt/cerebellar-norse/.venv/bin/cerebellar-norse", str(exe))
    out = tmp_path / "cerebellar-norse.service"
    out.write_text(text)
    return out


def test_unit_verifies(tmp_path: Path) -> None:
    r = subprocess.run([ANALYZE, "verify", str(_installed_copy(tmp_path))], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "cerebellar-norse.service" not in r.stderr, r.stderr


def test_unit_security_exposure_ok(tmp_path: Path) -> None:
    r = subprocess.run([ANALYZE, "security", "--offline=true", str(_installed_copy(tmp_path))],
                       capture_output=True, text=True, timeout=60)
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+) (\w+)", r.stdout + r.stderr)
    assert m, r.stdout + r.stderr
    assert float(m.group(1)) <= 3.5 and m.group(2) == "OK", m.group(0)


def test_unit_declares_what_operators_rely_on() -> None:
    text = UNIT.read_text()
    for line in ("Type=notify", "WatchdogSec=", "Restart=on-failure", "User=cerebellar", "StateDirectory=cerebellar-norse",
                 "LogsDirectory=cerebellar-norse", "ConfigurationDirectory=cerebellar-norse", "NoNewPrivileges=yes",
                 "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes", "DeviceAllow=/dev/nvidiactl rw",
                 "--config /etc/cerebellar-norse/production.toml", "ExecReload="):
        assert line in text, line


def test_broken_unit_fails_verify(tmp_path: Path) -> None:
    bad = tmp_path / "cerebellar-norse.service"
    bad.write_text(_installed_copy(tmp_path).read_text().replace("Type=notify", "Type=notifyy"))
    r = subprocess.run([ANALYZE, "verify", str(bad)], capture_output=True, text=True, timeout=60)
    assert "notifyy" in r.stdout + r.stderr  # verify warns about the bad line
