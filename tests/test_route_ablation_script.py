"""benchmarks/route_ablation.py serves every variant over HTTP and reports its CPU per request (no timing asserted)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "route_ablation.py"
VARIANTS = ("full", "no-engine", "no-parse", "bare")


def test_every_variant_answers_and_is_reported() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--requests", "200", "--rounds", "1", "--concurrency", "4"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {m.group(1): m for m in re.finditer(r"^(full|no-engine|no-parse|bare)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+\[([\d., ]+)\]$",
                                               proc.stdout, re.M)}
    assert set(rows) == set(VARIANTS), proc.stdout
    assert all(int(m.group(2)) > 0 for m in rows.values()), proc.stdout  # every variant served its requests (200s only)
    parts = re.findall(r"^  (engine, checks and answer JSON|content-type check and validation|request context|uvicorn and the socket)\s",
                       proc.stdout, re.M)
    assert len(parts) == 4, proc.stdout
    batch = re.search(r"batches held ([\d.]+) ticks on average", proc.stdout)
    assert batch is not None and 1.0 <= float(batch.group(1)) <= 4.0, proc.stdout  # 4 connections: at most 4 ticks a batch


def test_an_unknown_variant_is_refused_by_name() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--serve", "no-such", "--port", "1"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode != 0
    assert "unknown variant 'no-such'" in proc.stderr and "no-engine" in proc.stderr
