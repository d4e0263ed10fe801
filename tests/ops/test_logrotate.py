"""The shipped logrotate file and the service's own rotation of application.log never write the same file.

Runs the real ``logrotate`` (skipped where it is not installed) on the shipped file, its
directory moved to a temporary one, beside files the service's size rotation wrote.
"""

from __future__ import annotations

import gzip
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOGROTATE = shutil.which("logrotate") or next((p for p in ("/usr/sbin/logrotate", "/sbin/logrotate") if Path(p).exists()), None)


@pytest.mark.skipif(LOGROTATE is None, reason="logrotate is not installed")
def test_manual_rotations_leave_the_service_s_rotated_files_alone(tmp_path: Path) -> None:
    conf = (ROOT / "systemd" / "cerebellar-norse.logrotate").read_text()
    assert "/var/log/cerebellar-norse/application.log {" in conf
    conf = conf.replace("/var/log/cerebellar-norse/", f"{tmp_path}/").replace("    su cerebellar cerebellar\n", "")
    (tmp_path / "conf").write_text(conf)
    log = tmp_path / "application.log"
    (tmp_path / "application.log.1.gz").write_bytes(gzip.compress(b"rotated by the service\n"))
    (tmp_path / "app.log").symlink_to("application.log")
    for k in range(2):  # `logrotate -f` twice, as by hand
        log.write_text(f"line {k}\n")
        proc = subprocess.run([str(LOGROTATE), "-f", "-s", str(tmp_path / "state"), str(tmp_path / "conf")],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        if k == 0:
            time.sleep(1.1)  # the dated names hold the second
    dated = sorted(p.name for p in tmp_path.glob("application.log-*.gz"))
    assert len(dated) == 2, sorted(p.name for p in tmp_path.iterdir())
    assert [gzip.decompress((tmp_path / n).read_bytes()) for n in dated] == [b"line 0\n", b"line 1\n"]
    assert gzip.decompress((tmp_path / "application.log.1.gz").read_bytes()) == b"rotated by the service\n"
    assert log.read_text() == "" and (tmp_path / "app.log").is_symlink()
    assert not list(tmp_path.glob("*.backup")) and not list(tmp_path.glob("app.log*[0-9]*"))


@pytest.mark.skipif(LOGROTATE is None, reason="logrotate is not installed")
def test_replica_logs_are_rotated_too(tmp_path: Path) -> None:
    """cerebellar-norse@PORT writes /var/log/cerebellar-norse/PORT/application.log (its own LogsDirectory)."""
    conf = (ROOT / "systemd" / "cerebellar-norse.logrotate").read_text()
    conf = conf.replace("/var/log/cerebellar-norse/", f"{tmp_path}/").replace("    su cerebellar cerebellar\n", "")
    (tmp_path / "conf").write_text(conf)
    for port in ("8081", "8082"):
        (tmp_path / port).mkdir()
        (tmp_path / port / "application.log").write_text(f"replica {port}\n")
    proc = subprocess.run([str(LOGROTATE), "-f", "-s", str(tmp_path / "state"), str(tmp_path / "conf")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    for port in ("8081", "8082"):
        dated = list((tmp_path / port).glob("application.log-*.gz"))
        assert len(dated) == 1 and gzip.decompress(dated[0].read_bytes()) == f"replica {port}\n".encode()
