"""The replica template unit (``cerebellar-norse@.service``) verifies as an instance and keeps the service unit's guarantees."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
