"""Alert rules load and their promtool unit tests pass; every alert has a firing and a quiet test."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "monitoring" / "alerts.yml"
TESTS = ROOT / "monitoring" / "tests" / "alerts_test.yml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (make tools installs it)")


@needs_promtool
def test_rules_check() -> None:
    r = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
def test_rules_unit_tests_pass() -> None:
    r = subprocess.run([PROMTOOL, "test", "rules", str(TESTS)], capture_output=True, text=True, timeout=120, cwd=TESTS.parent)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
def test_rule_tests_can_fail(tmp_path: Path) -> None:
    broken = tmp_path / "alerts.yml"
    broken.write_text(RULES.read_text().replace("> 0.00001", "> 0.001"))
    t = tmp_path / "t.yml"
    t.write_text(TESTS.read_text().replace("../alerts.yml", str(broken)))
    r = subprocess.run([PROMTOOL, "test", "rules", str(t)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode != 0


def test_every_alert_has_firing_and_quiet_cases() -> None:
    alerts = [r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    for name in ("HighProcessingLatency", "CUDAMemoryHigh", "NeuralConvergenceFailure"):
        assert name in alerts
    cases = yaml.safe_load(TESTS.read_text())["tests"]
    for name in alerts:
        results = [a for c in cases for a in c.get("alert_rule_test", []) if a["alertname"] == name]
        assert any(a["exp_alerts"] for a in results), f"{name} has no firing test"
        assert any(not a["exp_alerts"] for a in results), f"{name} has no quiet test"


def test_convergence_alert_does_not_rate_a_gauge() -> None:
    rules = {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    expr = rules["NeuralConvergenceFailure"]["expr"]
    assert "rate(training_loss" not in expr.replace("deriv(", "")
    assert "deriv(training_loss" in expr


def test_dashboard_queries_use_exported_metrics() -> None:
    import json

    dash = json.loads((ROOT / "monitoring" / "grafana-dashboard.json").read_text())["dashboard"]
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    titles = {p["title"] for p in dash["panels"]}
    assert {"Processing Latency", "CUDA Memory Usage", "Training loss", "Spike counts", "State pool"} <= titles
    for metric in ("processing_duration_seconds_bucket", "cuda_memory_used_bytes", "training_loss",
                   "cerebellar_norse_spikes_total", "cerebellar_norse_pool_usage_ratio", "cerebellar_norse_http_requests_total"):
        assert metric in exprs


def test_dashboard_rate_windows_hold_samples_at_any_scrape_interval() -> None:
    """rate() and increase() need two samples in their window: a fixed [1m] is empty at Prometheus' default 1 minute
    scrape interval (the panels went blank). Each window is Grafana's $__rate_interval (four scrape intervals) or at
    least 4 minutes."""
    import json
    import re

    dash = json.loads((ROOT / "monitoring" / "grafana-dashboard.json").read_text())["dashboard"]
    seconds = {"s": 1, "m": 60, "h": 3600}
    short = [(p["title"], t["refId"], w) for p in dash["panels"] for t in p["targets"]
             for w in re.findall(r"\[([^\]]+)\]", t["expr"])
             if w != "$__rate_interval" and not (re.fullmatch(r"\d+[smh]", w) and int(w[:-1]) * seconds[w[-1]] >= 240)]
    assert short == []
