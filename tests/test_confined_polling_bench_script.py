"""benchmarks/confined_polling_bench.py confines a service and a busy process to one CPU and reports each phase (no
timing asserted)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "confined_polling_bench.py"
ROW = r"^{} +(\d+\.\d\d) +(\d+\.\d\d) +(\d+\.\d\d) +(\d+\.\d) +(\d+\.\d\d) +(\d+\.\d\d){}$"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs: one for the service, one for the client")
def test_each_phase_reports_the_services_time_cpu_and_polling() -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), "--ticks", "200", "--rounds", "1"],
                         capture_output=True, text=True, timeout=300, check=True).stdout
    alone = re.search(ROW.format("alone", " +-"), out, re.M)
    beside = re.search(ROW.format("beside", r" +(\d+\.\d\d)"), out, re.M)
    assert alone and beside, out
    for row in (alone, beside):
        p50, p95 = float(row[1]), float(row[2])
        assert 0 < p50 <= p95
        assert 0.0 <= float(row[6]) <= 1.05  # polling's share of the phase's wall time


def test_one_cpu_for_both_is_refused() -> None:
    cpu = min(os.sched_getaffinity(0))
    done = subprocess.run([sys.executable, str(SCRIPT), "--service-cpu", str(cpu), "--client-cpu", str(cpu)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "need two different usable CPUs" in done.stderr


@pytest.mark.parametrize("flag", ["--ticks", "--rounds"])
def test_no_ticks_or_no_rounds_is_a_usage_error(flag: str) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), flag, "0"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "--ticks and --rounds must be at least 1" in done.stderr
