"""benchmarks/wrk_bench.py drives both servers with wrk and reports every round (no timing asserted)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "wrk_bench.py"


@pytest.mark.tools
@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (make tools installs it)")
def test_both_servers_answer_every_tick_and_the_rounds_are_reported(tmp_path: Path) -> None:
    out = tmp_path / "wrk.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--rounds", "2", "--seconds", "1", "--connections", "4",
                           "--json", str(out)], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = re.findall(r"^round (\d): service (\d+) req/s, ([\d.]+) µs CPU/request .* non-2xx (\d+) \| empty (\d+) req/s,"
                      r".* non-2xx (\d+) \| ratio ([\d.]+)$", proc.stdout, re.M)
    assert [r[0] for r in rows] == ["1", "2"], proc.stdout
    assert all(int(r[1]) > 0 and int(r[4]) > 0 and r[3] == "0" and r[5] == "0" for r in rows), proc.stdout
    assert "exit codes after SIGTERM: service 0, empty 0" in proc.stdout
    data = json.loads(out.read_text())
    assert len(data["rounds"]) == 2
    assert data["median_ratio"] == pytest.approx(sorted(r["ratio"] for r in data["rounds"])[0] / 2
                                                 + sorted(r["ratio"] for r in data["rounds"])[1] / 2)
    for r in data["rounds"]:
        assert r["ratio"] == pytest.approx(r["service"]["req_s"] / r["empty"]["req_s"])
        assert r["service"]["requests"] > 0 and r["service"]["cpu_us"] > 0
