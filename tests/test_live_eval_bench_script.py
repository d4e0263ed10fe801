"""benchmarks/live_eval_bench.py runs and reports what the scorer judged (no timing asserted)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "live_eval_bench.py"


def test_the_benchmark_scores_every_tick_whose_horizon_passed() -> None:
    """700 ticks over 8 markets (88 for four of them, 87 for the others), horizon 10 ticks: each market's last 10
    ticks wait, the other 620 are judged."""
    out = subprocess.run([sys.executable, str(SCRIPT), "--ticks", "700", "--rounds", "1", "--batch", "7"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    assert re.search(r"^round 1: \d+ ns per tick$", out, re.M), out
    assert re.search(r"batch 7, 8 markets: median \d+ ns per tick \(range \d+–\d+\); judged 620, window log loss "
                     r"\d\.\d{6}$", out, re.M), out
