"""The shipped dashboard and alert rules as a real Prometheus sees them, against the real service.

One service (``python -m cerebellar_norse.cli``, untrained network, fresh state dir) and one
Prometheus scraping it every second as two replicas (the same port under two ``instance``
labels, as the dashboard's "All" shows several replicas) with ``monitoring/alerts.yml``
loaded. After a little traffic (ticks, a batch, a refused tick, an unknown path), every
dashboard query is asked of Prometheus' HTTP API with the dashboard's variables filled in as
Grafana fills them. About 20 s; skipped where Prometheus is not installed.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "api"))
from live_helpers import server_environ

from cerebellar_norse.config import load_config
from cerebellar_norse.observability.metrics import ServiceMetrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "monitoring" / "grafana-dashboard.json"
RULES = ROOT / "monitoring" / "alerts.yml"
PROMETHEUS = shutil.which("prometheus")
JOB = "cerebellar-norse"
T0 = 1_640_995_200_000  # the operations guide's example tick time (ms)
# Gauges without a sample while undefined (docs/http.md): the untrained service has served no training and judged no tick.
NO_SAMPLE_YET = {("Training loss", "A"), *(("Live signal vs base rate", r) for r in "ABCD")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} not ready in {timeout_s} s:\n{log.read_text(errors='replace')[-3000:]}")


@dataclass
class Live:
    service: str
    prometheus: str
    instances: tuple[str, str]

    def query(self, expr: str) -> list[dict[str, Any]]:
        body = httpx.get(self.prometheus + "/api/v1/query", params={"query": expr}, timeout=10.0).json()
        assert body["status"] == "success", (expr, body)
        result: list[dict[str, Any]] = body["data"]["result"]
        return result


def _start(argv: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    if PROMETHEUS is None:
        pytest.skip("prometheus not installed (Debian: apt-get install prometheus)")
    work = tmp_path_factory.mktemp("monitoring-live")
    port = _free_port()
    service = f"http://127.0.0.1:{port}"
    env = server_environ(work / "state", {"CEREBELLAR_NORSE_LOG": "WARNING"})  # untrained: no first-run training
    svc = _start([sys.executable, "-m", "cerebellar_norse.cli", "--port", str(port)], work / "service.log", env)
    procs = [svc]
    try:
        _wait(service + "/health", svc, work / "service.log", 120.0)
        instances = (f"127.0.0.1:{port}", "replica-b")
        cfg = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
               "rule_files": [str(RULES)],
               "scrape_configs": [{"job_name": JOB, "static_configs": [
                   {"targets": [instances[0]]}, {"targets": [instances[0]], "labels": {"instance": instances[1]}}]}]}
        (work / "prometheus.yml").write_text(json.dumps(cfg))  # JSON is YAML
        prom_port = _free_port()
        prom = _start([PROMETHEUS, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'tsdb'}",
                       f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"], work / "prometheus.log")
        procs.append(prom)
        lv = Live(service, f"http://127.0.0.1:{prom_port}", instances)
        _wait(lv.prometheus + "/-/ready", prom, work / "prometheus.log", 60.0)
        deadline = time.monotonic() + 30
        while len(lv.query(f'up{{job="{JOB}"}} == 1')) < 2:
            assert time.monotonic() < deadline, "Prometheus never scraped the service"
            time.sleep(0.2)
        served = 'cerebellar_norse_http_requests_total{route="/neural/process",status="200"}'
        with httpx.Client(base_url=service, timeout=10.0) as c:
            # two rounds, a scrape apart: a route's series appears with its first request, and rate() needs it twice
            for rnd, seen in enumerate((served, f"rate({served}[1m]) > 0")):
                for k in range(10 * rnd, 10 * rnd + 10):
                    for market in ("MON-A", "MON-B"):
                        tick = {"price": 100.0 + 0.1 * (k % 5), "volume": 10.0, "timestamp": T0 + 1000 * k, "market_id": market}
                        assert c.post("/neural/process", json=tick).status_code == 200
                batch = [{"price": 100.0, "volume": 1.0, "timestamp": T0 + 1000 * (5 * rnd + k), "market_id": "MON-C"}
                         for k in range(5)]
                assert c.post("/neural/process/batch", json={"ticks": batch}).status_code == 200
                assert c.post("/neural/process", json={"price": -1.0, "volume": 1.0, "timestamp": T0,
                                                       "market_id": "X"}).status_code == 422
                assert c.get("/no-such-route").status_code == 404
                deadline = time.monotonic() + 30
                while len(lv.query(seen)) < 2:
                    assert time.monotonic() < deadline, f"Prometheus never saw {seen}"
                    time.sleep(0.2)
        time.sleep(1.5)  # one more rule evaluation
        yield lv
    finally:
        for p in reversed(procs):
            _stop(p)


def _dashboard() -> dict[str, Any]:
    dash: dict[str, Any] = json.loads(DASHBOARD.read_text())["dashboard"]
    return dash


def _grafana(expr: str) -> str:
    """``expr`` with the dashboard's variables as Grafana fills them in (instance: All, i.e. its allValue)."""
    variables = {v["name"]: v for v in _dashboard()["templating"]["list"]}
    return (expr.replace("$job", variables["job"]["query"]).replace("$instance", variables["instance"]["allValue"])
            .replace("$__rate_interval", "1m").replace("$__interval", "15s"))


def test_the_instance_variable_lists_every_replica(live: Live) -> None:
    var = next(v for v in _dashboard()["templating"]["list"] if v["name"] == "instance")
    m = re.fullmatch(r"label_values\((.+), (\w+)\)", var["definition"])
    assert m is not None and var["query"]["query"] == var["definition"]
    series = live.query(_grafana(m.group(1)))
    assert sorted(s["metric"][m.group(2)] for s in series) == sorted(live.instances)


def test_every_dashboard_query_answers_and_names_each_series(live: Live) -> None:
    """Each query parses, returns data where its panel shows some, and its legend names every series apart: a label
    of ``legendFormat`` that the series lack renders empty, and replicas with the same legend cannot be told apart."""
    problems = []
    for panel in _dashboard()["panels"]:
        for target in panel["targets"]:
            where = f"{panel['title']!r} {target['refId']}"
            series = live.query(_grafana(target["expr"]))
            if not series and (panel["title"], target["refId"]) not in NO_SAMPLE_YET:
                problems.append(f"{where}: no data")
            legend = target.get("legendFormat", "")
            labels = re.findall(r"\{\{\s*(\w+)\s*\}\}", legend)
            for s in series:
                missing = [name for name in labels if name not in s["metric"]]
                if missing:
                    problems.append(f"{where}: legend {legend!r} names {missing}, absent from {s['metric']}")
            shown = [re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda g, s=s: s["metric"].get(g.group(1), ""), legend) for s in series]
            if len(set(shown)) < len(shown):
                problems.append(f"{where}: several series shown as {sorted(shown)}")
    assert problems == []


def test_every_alert_rule_evaluates_without_error(live: Live) -> None:
    groups = httpx.get(live.prometheus + "/api/v1/rules", timeout=10.0).json()["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    assert len(rules) == sum(1 for line in RULES.read_text().splitlines() if line.strip().startswith("- alert:"))
    assert [(r["name"], r["health"], r.get("lastError")) for r in rules if r["health"] != "ok" or r.get("lastError")] == []
    targets = httpx.get(live.prometheus + "/api/v1/targets", timeout=10.0).json()["data"]["activeTargets"]
    assert sorted((t["labels"]["instance"], t["health"], t["lastError"]) for t in targets) == \
        [(i, "up", "") for i in sorted(live.instances)]  # /metrics parsed: no scrape error


def test_counters_of_rare_events_are_exported_from_the_start() -> None:
    """A counter series that first appears at 1 hides that first event from rate() and increase(): the 5xx error
    kinds (the dashboard's "ticks refused while moving") and the ended training jobs (alert
    CerebellarNorseTrainingJobFailed) are exported at 0 before any happened."""
    text = ServiceMetrics().render().decode()
    for kind in ("capacity", "engine", "market_moving", "internal"):
        assert f'cerebellar_norse_errors_total{{kind="{kind}"}} 0.0' in text
    for state in ("succeeded", "failed", "cancelled"):
        assert f'cerebellar_norse_training_jobs_total{{state="{state}"}} 0.0' in text


def test_a_panel_in_seconds_shows_its_stall_count_as_a_count() -> None:
    panel = next(p for p in _dashboard()["panels"] if p["title"] == "Event loop lag")
    assert panel["fieldConfig"]["defaults"]["unit"] == "s"
    counts = [t["refId"] for t in panel["targets"] if "increase(" in t["expr"]]
    assert counts == ["B"]
    units = {o["matcher"]["options"]: {p["id"]: p["value"] for p in o["properties"]}.get("unit")
             for o in panel["fieldConfig"]["overrides"] if o["matcher"]["id"] == "byFrameRefID"}
    assert units.get("B") not in (None, "s")


def test_cuda_memory_help_says_what_the_value_counts() -> None:
    """cuda_memory_used_bytes is the driver's figure for the whole device (cuda.device.cuda_memory: total less free,
    every process), which CUDAMemoryHigh divides by the total; its HELP said "used by the service"."""
    from cerebellar_norse.api.server import _cuda_memory
    from cerebellar_norse.engine.engine import Engine
    from cerebellar_norse.observability.metrics import engine_families

    cfg = load_config(None, environ={})
    families = {f.name: f for f in engine_families(Engine(cfg, None, "test"), "cpu", _cuda_memory("cpu"))()}
    used = families["cuda_memory_used_bytes"]
    assert "every process" in used.documentation and "by the service" not in used.documentation
    assert [s.value for s in used.samples] == [0.0]


def test_every_alert_has_a_panel_showing_one_of_its_metrics() -> None:
    """An operator paged by an alert opens the dashboard: some panel plots a metric the alert's expression reads (the
    connections near server.max_connections and the failed training jobs had none)."""
    import yaml  # type: ignore[import-untyped]

    metric = re.compile(r"\b(?:cerebellar_norse_\w+|processing_duration_seconds\w*|cuda_memory_\w+|training_loss)\b")
    shown = {m for p in _dashboard()["panels"] for t in p.get("targets", []) for m in metric.findall(t["expr"])}
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    unshown = [r["alert"] for r in rules if metric.findall(r["expr"]) and not set(metric.findall(r["expr"])) & shown]
    assert unshown == []


def test_ready_help_names_every_reason_for_503() -> None:
    """cerebellar_norse_ready is 0 while the journal waits for a file descriptor or disk space too (docs/http.md);
    its HELP, what Prometheus' metadata and Grafana show, left that reason out."""
    from cerebellar_norse.observability.metrics import health_families, starting_exposition

    (ready,) = [f for f in health_families(lambda: False, lambda: False)() if f.name == "cerebellar_norse_ready"]
    for reason in ("starting", "shutting down", "a state write failed", "journal waiting for a file descriptor or disk space"):
        assert reason in ready.documentation, reason
    assert f"# HELP cerebellar_norse_ready {ready.documentation}" in starting_exposition(1.0).decode()


def _documented_metrics() -> dict[str, str]:
    """docs/http.md's metric table: each name (``…_x`` standing for ``cerebellar_norse_x``, labels dropped) and its type."""
    doc = (ROOT / "docs" / "http.md").read_text()
    section = doc[doc.index("## `GET /metrics`"):doc.index("## Debug routes")]
    out: dict[str, str] = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            cells = line.split("|")
            for name in re.findall(r"`([^`]+)`", cells[1]):
                name = re.sub(r"\{.*\}", "", name)
                out["cerebellar_norse_" + name[2:] if name.startswith("…_") else name] = cells[2].strip()
    return out


def test_metadata_of_every_scraped_metric_is_in_the_metric_table(live: Live) -> None:
    """What Prometheus stores of each metric (its type) against docs/http.md's table: the live self-evaluation
    metrics were missing from it."""
    metadata = httpx.get(live.prometheus + "/api/v1/metadata", timeout=10.0).json()["data"]
    documented = _documented_metrics()
    assert "cerebellar_norse_ready" in metadata and "processing_duration_seconds" in metadata
    assert {n: m[0]["type"] for n, m in metadata.items()} == {n: documented.get(n) for n in metadata}


def test_every_metric_the_rules_and_the_dashboard_read_is_exported(live: Live) -> None:
    """The promtool tests feed each rule series named by hand, so a rule (or a panel) reading a metric the service does
    not export passes them and stays silent against the service: every name the rules' expressions and annotation
    queries, and the dashboard's queries and variables, read is one Prometheus scraped from the live service (a
    series, or the metadata of a gauge without a sample yet)."""
    import yaml  # type: ignore[import-untyped]

    name = re.compile(r"\b(?:cerebellar_norse_\w+|processing_duration_seconds\w*|cuda_memory_\w+|training_loss|up)\b")
    texts = [text for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
             for text in (r["expr"], *r.get("annotations", {}).values())]
    dash = _dashboard()
    texts += [t["expr"] for p in dash["panels"] for t in p["targets"]]
    texts += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
    scraped = set(httpx.get(live.prometheus + "/api/v1/label/__name__/values", timeout=10.0).json()["data"])
    scraped |= set(httpx.get(live.prometheus + "/api/v1/metadata", timeout=10.0).json()["data"])
    read = {m for text in texts for m in name.findall(text)}
    assert {"cerebellar_norse_queue_peak_ticks", "training_loss", "up"} <= read
    assert sorted(read - scraped) == []


def test_every_label_value_the_rules_and_the_dashboard_select_is_exported(live: Live) -> None:
    """A selector whose metric is exported but whose label value is not (``le="1"`` where the service writes
    ``le="1.0"``, ``reason="queue-full"``, ``state="failure"``) selects nothing: its alert never fires and its panel
    stays empty, and the metric-name check above passes it. Every ``label="value"`` matcher of the rules' and the
    dashboard's queries (variables filled in as Grafana fills them) selects a series Prometheus scraped."""
    import yaml  # type: ignore[import-untyped]

    exprs = [r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    dash = _dashboard()
    exprs += [_grafana(t["expr"]) for p in dash["panels"] for t in p["targets"]]
    exprs += [_grafana(v["definition"]) for v in dash["templating"]["list"] if "definition" in v]
    selector = re.compile(r"\b([a-zA-Z_:][\w:]*)\{([^{}]*)\}")
    matcher = re.compile(r'\s*(\w+)\s*(=~|!=|!~|=)\s*"([^"]*)"\s*')
    def series(match: str) -> list[dict[str, str]]:
        body = httpx.get(live.prometheus + "/api/v1/series", params={"match[]": match}, timeout=10.0).json()
        assert body["status"] == "success", (match, body)
        found: list[dict[str, str]] = body["data"]
        return found

    checked, unselected = set(), []
    for expr in exprs:
        for name, inside in selector.findall(expr):
            for part in filter(str.strip, inside.split(",")):
                m = matcher.fullmatch(part)
                assert m is not None, (expr, part)
                label, op, value = m.groups()
                if op != "=" or label == "instance" or (name, label, value) in checked:
                    continue
                checked.add((name, label, value))
                if not series(name):
                    continue  # a gauge without a sample yet (NO_SAMPLE_YET): its name is checked by the metadata
                if not series(f'{name}{{{label}="{value}"}}'):
                    unselected.append(f'{name}{{{label}="{value}"}}')
    assert ("cerebellar_norse_event_loop_lag_seconds_bucket", "le", "1.0") in checked
    assert ("cerebellar_norse_training_jobs_total", "state", "failed") in checked
    assert unselected == []


def test_the_connections_panel_names_both_limits() -> None:
    """cerebellar_norse_http_connections_limit is server.max_connections or, where it leaves less room, the open-file
    limit's room; the "Connections" panel called it server.max_connections only, which sent an operator to raise a
    setting that changes nothing when the open-file limit is what limits."""
    panel = next(p for p in _dashboard()["panels"] if p["title"] == "Connections")
    (limit,) = [t for t in panel["targets"] if "cerebellar_norse_http_connections_limit" in t["expr"]]
    for text in (limit["legendFormat"], panel["description"]):
        assert "server.max_connections" in text and "open-file limit" in text, text
