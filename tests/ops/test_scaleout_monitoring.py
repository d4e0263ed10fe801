"""Monitoring of several replicas: Prometheus scrapes each one, the dashboard filters and aggregates by instance."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (make tools)")
def test_scrape_config_is_valid_with_the_shipped_rules(tmp_path: Path) -> None:
    text = (ROOT / "monitoring" / "prometheus.yml").read_text()
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(text.replace("/etc/prometheus/rules/cerebellar-norse-alerts.yml", str(ROOT / "monitoring" / "alerts.yml")))
    r = subprocess.run([str(PROMTOOL), "check", "config", str(cfg)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_replica_and_haproxy_are_scraped_directly() -> None:
    jobs = {j["job_name"]: j for j in yaml.safe_load((ROOT / "monitoring" / "prometheus.yml").read_text())["scrape_configs"]}
    targets = [t for sc in jobs["cerebellar-norse"]["static_configs"] for t in sc["targets"]]
    assert len(targets) >= 2 and "localhost:8080" not in targets  # replicas, not HAProxy's frontend
    assert jobs["haproxy"]["static_configs"][0]["targets"] == ["localhost:8404"]


def test_dashboard_filters_every_query_by_instance_and_shows_each_replica() -> None:
    dash = json.loads((ROOT / "monitoring" / "grafana-dashboard.json").read_text())["dashboard"]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["instance"]["multi"] and variables["instance"]["includeAll"]
    for p in dash["panels"]:
        for t in p["targets"]:
            assert 'instance=~"$instance"' in t["expr"], (p["title"], t["expr"])
    per_replica = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in dash["panels"]}
    assert "sum by (instance)" in per_replica["Ticks per replica"]
    assert 'kind="market_moving"' in per_replica["Markets per replica"]
