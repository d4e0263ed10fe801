"""benchmarks/idle_window_bench.py serves tick requests in process and reports each scenario (no timing asserted)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "idle_window_bench.py"


def test_every_scenario_reports_the_answers_processing_time() -> None:
    """Each gap's requests are answered through the service's protocol with a tick's answer (the script stops with an
    error on any other answer), and the engine back to back is the reference of the ratios (1.00 on its own row)."""
    out = subprocess.run([sys.executable, str(SCRIPT), "--requests", "200", "--gap-us", "20"],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    for name in ("none", "spin 20 µs", "sleep 20 µs"):
        assert re.search(rf"^{name} +\d+\.\d\d +\d+\.\d\d +\d+\.\d\d$", out, re.M), out
    assert re.search(r"^engine back to back +\d+\.\d\d +\d+\.\d\d +1\.00$", out, re.M), out
