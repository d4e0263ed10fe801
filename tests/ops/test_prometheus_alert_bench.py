"""benchmarks/prometheus_alert_bench.py end to end, briefly: the service, a real Prometheus, 2 s of load.

About 20 s (service start, Prometheus start, its first scrape, 2 s of load, shutdown);
skipped where Prometheus is not installed. No figure is judged: only that Prometheus
answered every query the report is built from and that everything stopped cleanly.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "prometheus_alert_bench.py"
PROMETHEUS = shutil.which("prometheus")
HANG_GUARD_S = 180  # a hung run fails here instead of blocking the suite


@pytest.mark.skipif(PROMETHEUS is None, reason="prometheus not installed (Debian: apt-get install prometheus)")
def test_a_short_run_reports_prometheus_figures(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    r = subprocess.run([sys.executable, str(SCRIPT), "--duration", "2", "--rate", "100", "--markets", "4", "--concurrency", "2",
                        "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=HANG_GUARD_S, check=False)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    res = json.loads(out.read_text())
    assert res["prometheus"]["answered"] is True  # it scraped the service's final tick count
    assert res["exit_codes"] == {"prometheus": 0, "service": 0}
    load = res["load"]
    assert load["ok"] == load["sent"] > 0 and load["errors"] == {}
    m = res["measurement"]
    assert m["up"] == 1.0 and m["scrapes"] and m["ticks_in_5m"] and m["ticks_in_5m"] > 0
    assert m["guide_expression"] == "histogram_quantile(0.95, rate(processing_duration_seconds_bucket[5m]))"
    for q in ("0.5", "0.95", "0.99"):
        fig = m["quantiles"][q]
        for key in ("histogram_quantile_s", "exact_now_s", "exact_mean_s"):
            assert isinstance(fig[key], float) and fig[key] > 0, (q, key, fig)
        assert isinstance(fig["ratio"], float)
    assert m["above_threshold"] == (m["guide_value_s"] > 1e-5)
    alert = res["alert"]
    assert alert["name"] == "HighProcessingLatency" and alert["rule_health"] == "ok", alert  # the shipped rule loaded
    assert alert["state"] in ("inactive", "pending")  # `for: 2m`: a 2 s run cannot fire it
    assert (alert["state"] == "pending") == (alert["active_at"] is not None)
    assert "| quantile | histogram_quantile [5m]" in r.stdout and "HighProcessingLatency:" in r.stdout
