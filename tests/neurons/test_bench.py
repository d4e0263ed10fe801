"""``cerebellar-norse bench --json``: the shape of the report (no timing thresholds but a sanity ratio)."""

from __future__ import annotations

import json
from typing import Any


def test_bench_json(run_cli: Any) -> None:
    proc = run_cli("bench", "--json", "--ticks", "200", "--reference-ticks", "20", timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stdout
    out = json.loads(lines[0])
    assert set(out["fused"]) == {"batch_1", "batch_16", "batch_256"}
    for key in ("batch_1", "batch_16", "batch_256"):
        figures = out["fused"][key]
        assert {"p50_us", "p99_us"} <= set(figures)
        assert 0 < figures["p50_us"] <= figures["p99_us"]
    ref = out["reference"]["batch_1"]
    assert 0 < ref["p50_us"] <= ref["p99_us"]
    assert out["speedup_vs_reference"] > 1
    assert out["speedup_vs_reference"] == ref["p50_us"] / out["fused"]["batch_1"]["p50_us"]
    for label in ("throughput_batch_1", "throughput_batch_256"):
        assert all(v > 0 for v in out[label].values())
