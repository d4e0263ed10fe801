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
        for key in ("histogram_quantile_s", "exact_answers_s", "exact_now_s", "exact_mean_s"):
            assert isinstance(fig[key], float) and fig[key] > 0, (q, key, fig)
        assert isinstance(fig["ratio"], float) and fig["ratio_answers"] == round(fig["histogram_quantile_s"] / fig["exact_answers_s"], 3)
    assert m["answers"] == load["ok"]  # every answer gave its processing time
    assert m["above_threshold"] == (m["guide_value_s"] > 1e-5)
    alert = res["alert"]
    assert alert["name"] == "HighProcessingLatency" and alert["rule_health"] == "ok", alert  # the shipped rule loaded
    assert alert["state"] in ("inactive", "pending")  # `for: 2m`: a 2 s run cannot fire it
    assert (alert["state"] == "pending") == (alert["active_at"] is not None)
    assert "| quantile | histogram_quantile [5m]" in r.stdout and "HighProcessingLatency:" in r.stdout


def _script_module() -> object:
    import importlib.util
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        spec = importlib.util.spec_from_file_location("prometheus_alert_bench", SCRIPT)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # its dataclasses look their module up
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(SCRIPT.parent))
    return mod


def test_exact_quantiles_are_nearest_rank() -> None:
    mod = _script_module()
    ranked = list(range(1, 101))
    assert [mod.nearest_rank(ranked, q) for q in (0.5, 0.95, 0.99, 1.0)] == [50, 95, 99, 100]  # type: ignore[attr-defined]
    assert [mod.nearest_rank([7, 9], q) for q in (0.01, 0.5, 0.51, 1.0)] == [7, 7, 9, 9]  # type: ignore[attr-defined]
    load = mod.Load(processing_ns=[3000, 1000, 2000])  # type: ignore[attr-defined]
    assert load.processing_quantiles_s() == {"0.5": 2e-6, "0.95": 3e-6, "0.99": 3e-6}
    assert mod.Load().processing_quantiles_s() == dict.fromkeys(("0.5", "0.95", "0.99"))  # type: ignore[attr-defined]


def test_set_gives_the_started_service_config_variables() -> None:
    mod = _script_module()
    env = mod.override_env(["performance.warm_step_interval_us=0", " server.max_connections = 50 "])  # type: ignore[attr-defined]
    assert env == {"CEREBELLAR_NORSE_PERFORMANCE__WARM_STEP_INTERVAL_US": "0", "CEREBELLAR_NORSE_SERVER__MAX_CONNECTIONS": "50"}


@pytest.mark.parametrize("item", ["performance.busy_poll_us", "busy_poll_us=1", ".x=1", "performance.=1"])
def test_a_malformed_set_is_refused_before_anything_starts(item: str) -> None:
    r = subprocess.run([sys.executable, str(SCRIPT), "--duration", "1", "--prometheus", sys.executable, "--set", item],
                       cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode != 0
    assert f"--set {item!r}: expected section.key=value" in r.stderr
