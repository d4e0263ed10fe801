"""benchmarks/hot_route_cpu.py runs the real app end to end and reports a CPU time for each scenario (no timing asserted)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "hot_route_cpu.py"


def test_reports_each_scenario_for_every_round() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--requests", "64", "--rounds", "2", "--concurrency", "4"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {m.group(1): m for m in re.finditer(r"^(route|context|engine)\s+([\d.]+)\s+\[([\d.]+), ([\d.]+)\]$", proc.stdout, re.M)}
    assert set(rows) == {"route", "context", "engine"}, proc.stdout
    assert all(float(m.group(k)) > 0 for m in rows.values() for k in (2, 3, 4))
