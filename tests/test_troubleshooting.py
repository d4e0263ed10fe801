"""docs/troubleshooting.md names only commands, routes, metrics and alerts that exist.

Every ``cerebellar-norse …`` command line parses with the real argument parser, every
``curl`` path is a route of the app, every metric name is in a scrape of the in-process
app's ``/metrics``, every ``grep`` of that scrape finds something, and every alert name is
a rule of ``monitoring/alerts.yml``.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml
from fastapi.testclient import TestClient

from cerebellar_norse.api.app import create_app
from cerebellar_norse.api.routes import training as training_routes
from cerebellar_norse.api.server import build_service
from cerebellar_norse.cli import build_parser, main
from cerebellar_norse.config import load_checked_config

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "troubleshooting.md"
TEXT = DOC.read_text(encoding="utf-8")


def _shell_lines(text: str = TEXT) -> list[str]:
    """Lines of the fenced code blocks (a line ending in ``\\`` joined with the next) and the inline code spans of a
    doc (by default docs/troubleshooting.md)."""
    lines: list[str] = []
    in_block, held = False, ""
    for line in text.splitlines():
        if line.strip().startswith("```"):
            in_block, held = not in_block, ""
            continue
        if in_block:
            if line.rstrip().endswith("\\"):
                held += line.rstrip()[:-1] + " "
                continue
            lines.append((held + line).strip())
            held = ""
        else:
            lines.extend(re.findall(r"`([^`]+)`", line))
    return lines


def _cli_commands(text: str = TEXT) -> list[str]:
    """Each shell command segment that runs ``cerebellar-norse`` (its arguments, redirections cut)."""
    found: list[str] = []
    for line in _shell_lines(text):
        for seg in re.split(r"\|\||&&|\||;", line):
            seg = re.sub(r"^(sudo(\s+-u\s+\S+)?\s+)", "", seg.strip())
            seg = re.split(r"\s\d?>", seg)[0]
            words = seg.split()
            if words and (words[0] == "cerebellar-norse" or words[0].endswith("/bin/cerebellar-norse")):
                found.append(seg)
    return found


def _curl_requests(text: str = TEXT) -> list[tuple[str, str]]:
    """(method, path) of every curl line against the service."""
    found: list[tuple[str, str]] = []
    for line in _shell_lines(text):
        if not line.startswith("curl") and " curl " not in line:
            continue
        for m in re.finditer(r"localhost:8080(/[^\s'\"|)]*)", line):
            method = re.search(r"-X\s+(\w+)", line)
            found.append((method.group(1) if method else "GET", unquote(urlsplit(m.group(1)).path)))
    return found


def _metric_greps(text: str = TEXT) -> list[str]:
    """The patterns of ``curl … /metrics | grep [-E] PATTERN`` lines."""
    found: list[str] = []
    for line in _shell_lines(text):
        m = re.search(r"localhost:8080/metrics\s*\|\s*grep\s+(.*)$", line)
        if m:
            args = shlex.split(m.group(1), comments=True)
            found.append(next(a for a in args if not a.startswith("-")))
    return found


METRIC_NAME = re.compile(r"\b(cerebellar_norse_[a-z0-9_]*[a-z0-9]|processing_duration_seconds\w*|cuda_memory_\w+|training_loss)\b")
ALERT_NAME = re.compile(r"`([A-Z][A-Za-z0-9]*[a-z][A-Za-z0-9]*)`")
NOT_ALERTS = {"StartLimitBurst", "WatchdogSec", "OutOfMemory"}  # systemd keys; a log message of the native build


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, str]]:
    """The in-process app (no lifespan: no warm-up, fast) and a scrape of its /metrics after one request."""
    state_dir = tmp_path_factory.mktemp("state")
    # no first-run training (tens of seconds): serve the untrained network of the seed
    environ = {"CEREBELLAR_NORSE_PATHS__STATE_DIR": str(state_dir), "CEREBELLAR_NORSE_TRAINING__BOOTSTRAP_ON_FIRST_RUN": "false"}
    state = build_service(load_checked_config(None, environ=environ))
    # the routers of make_app (the served app) without its lifespan
    with TestClient(create_app(state, extra_routers=[training_routes.router])) as client:
        client.get("/health")  # a request, so that the per-route HTTP series have samples
        yield client, client.get("/metrics").text


def test_every_cli_command_parses() -> None:
    commands = _cli_commands()
    for needed in ("--dump-weights", "--validate-config", " evaluate ", "--verify-data", "--validate-model",
                   " state dump ", " state diff ", "analyze-weights", " debug-bundle", " replay ", " bench", "--validate-only", "--dump-schema"):
        assert any(needed in c + " " for c in commands), needed
    parser = build_parser()
    for cmd in commands:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                parser.parse_args(shlex.split(cmd)[1:])
            except SystemExit as exc:
                pytest.fail(f"{cmd!r} does not parse (exit {exc.code}): {err.getvalue().strip()}")


def test_validate_only_output_as_documented(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", str(ROOT / "config" / "production.toml"), "--validate-only"]) == 0
    assert capsys.readouterr().out.strip().endswith("production.toml: schema OK")
    assert "production.toml: schema OK" in TEXT


def test_every_curl_path_is_a_route(served: tuple[TestClient, str]) -> None:
    client, _ = served
    paths = client.app.openapi()["paths"]  # type: ignore[attr-defined]
    routes = [(re.compile("^" + re.sub(r"\\{[^}]+\\}", ".+", re.escape(template)) + "$"), {m.upper() for m in ops})
              for template, ops in paths.items()]
    requests = _curl_requests()
    for needed in ("/health", "/metrics", "/training/status/latest", "/neural/metrics", "/debug/backtrace",
                   "/debug/config", "/neural/process"):
        assert ("POST" if needed == "/neural/process" else "GET", needed) in requests, needed
    for method, path in requests:
        matching = [rx for rx, methods in routes if rx.match(path) and method in methods]
        assert matching, f"curl {method} {path}: no such route"


def test_every_metric_name_is_scraped(served: tuple[TestClient, str]) -> None:
    _, scrape = served
    names = set(METRIC_NAME.findall(TEXT))
    assert {"processing_duration_seconds", "cerebellar_norse_processing_latency_seconds", "training_loss",
            "cuda_memory_used_bytes", "cuda_memory_total_bytes"} <= names
    exported = set(re.findall(r"^(?:# (?:HELP|TYPE) )?([a-zA-Z_:][a-zA-Z0-9_:]*)", scrape, re.MULTILINE))
    for name in sorted(names):
        assert name in exported or name.removesuffix("_total") in exported, f"{name} is not in /metrics"


def test_every_metrics_grep_finds_something(served: tuple[TestClient, str]) -> None:
    _, scrape = served
    patterns = _metric_greps()
    assert "latency" in patterns
    for pattern in patterns:
        assert any(re.search(pattern, line) for line in scrape.splitlines()), f"grep {pattern!r} finds nothing"
    latency_samples = {line.split("{")[0].split(" ")[0] for line in scrape.splitlines()
                       if "latency" in line and not line.startswith("#")}
    summary = "cerebellar_norse_processing_latency_seconds"
    assert latency_samples == {summary, f"{summary}_sum", f"{summary}_count"}  # what the doc says grep latency finds


def test_every_alert_name_is_a_rule() -> None:
    rules = yaml.safe_load((ROOT / "monitoring" / "alerts.yml").read_text(encoding="utf-8"))
    alerts = {r["alert"]: r["expr"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    named = set(ALERT_NAME.findall(TEXT)) - NOT_ALERTS
    assert {"HighProcessingLatency", "CUDAMemoryHigh", "NeuralConvergenceFailure"} <= named
    assert named <= set(alerts), named - set(alerts)
    assert "deriv(training_loss[10m]) > 0" in alerts["NeuralConvergenceFailure"]
    assert "rate(training_loss" not in alerts["NeuralConvergenceFailure"]


def test_log_fields_named_exist() -> None:
    from cerebellar_norse.observability import logging as cn_logging

    source = Path(cn_logging.__file__).read_text(encoding="utf-8")
    for key in ("ts", "level", "logger", "message", "request_id", "fields", "exception"):
        assert f'"{key}"' in source, key
    lifecycle = (ROOT / "cerebellar_norse" / "api" / "lifecycle.py").read_text(encoding="utf-8")
    for key in ("processing_time_ns", "processing_time_ns_p99", "ticks_per_second", "queue_depth", "markets", "model_version"):
        assert f'"{key}"' in lifecycle, key
    assert '"processing summary"' in lifecycle


# -- the other docs an operator copies commands from ------------------------------------------------------------

OTHER_DOCS = ["README.md", "docs/operations.md", "docs/install.md", "docs/http.md", "docs/training.md"]
NOT_COMMANDS = {"cerebellar-norse recording states v1"}  # the first line of a recording's .states file
UNLISTED_ROUTES = {"/openapi.json", "/docs", "/redoc"}  # served beside the API, not operations of its document


def _doc(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


@pytest.mark.parametrize("name", OTHER_DOCS)
def test_every_cli_command_of_the_other_docs_parses(name: str) -> None:
    """Every command line of the doc parses with the real parser: its flags, subcommands and values exist. A
    synopsis (``[--flag N]``, ``<placeholder>``, ``…``) is not a command line, and a command named in prose
    without the arguments it needs (``cerebellar-norse train``) need only name a real command."""
    parser = build_parser()
    commands = [c for c in _cli_commands(_doc(name)) if c not in NOT_COMMANDS]
    assert commands
    for cmd in commands:
        args = shlex.split(cmd, comments=True)[1:]
        if re.search(r"\[-|<|…|\{", cmd):
            continue
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                parser.parse_args(args)
            except SystemExit as exc:
                if "the following arguments are required" not in err.getvalue():
                    pytest.fail(f"{name}: {cmd!r} does not parse (exit {exc.code}): {err.getvalue().strip()}")


@pytest.mark.parametrize("name", OTHER_DOCS)
def test_every_curl_path_of_the_other_docs_is_a_route(name: str, served: tuple[TestClient, str]) -> None:
    client, _ = served
    paths = client.app.openapi()["paths"]  # type: ignore[attr-defined]
    routes = [(re.compile("^" + re.sub(r"\\{[^}]+\\}", ".+", re.escape(template)) + "$"), {m.upper() for m in ops})
              for template, ops in paths.items()]
    for method, path in _curl_requests(_doc(name)):
        if path in UNLISTED_ROUTES:
            continue
        assert any(rx.match(path) and method in methods for rx, methods in routes), f"{name}: curl {method} {path}: no such route"


@pytest.mark.parametrize("name", OTHER_DOCS)
def test_every_metric_named_in_the_other_docs_is_scraped(name: str, served: tuple[TestClient, str]) -> None:
    """Every metric name is in /metrics (a counter also by the name OpenMetrics gives it, without ``_total``; a name
    cut at ``_`` is a prefix in a regular expression), and every ``grep`` of /metrics finds a sample line (of a metric
    with no sample before its first event, such as ``training_loss``, at least its name)."""
    _, scrape = served
    exported = set(re.findall(r"^(?:# (?:HELP|TYPE) )?([a-zA-Z_:][a-zA-Z0-9_:]*)", scrape, re.MULTILINE))
    text = _doc(name)
    for metric in sorted(set(METRIC_NAME.findall(text))):
        known = {metric, metric.removesuffix("_total"), metric + "_total", metric.rstrip("_")}
        assert known & exported or any(e.startswith(metric) for e in exported if metric.endswith("_")), \
            f"{name}: {metric} is not in /metrics"
    lines = scrape.splitlines() + [f"{n} 0" for n in exported]
    for pattern in _metric_greps(text):
        assert any(re.search(pattern, line) for line in lines), f"{name}: grep {pattern!r} finds nothing"


@pytest.mark.parametrize("name", OTHER_DOCS)
def test_every_alert_named_in_the_other_docs_is_a_rule(name: str) -> None:
    rules = yaml.safe_load((ROOT / "monitoring" / "alerts.yml").read_text(encoding="utf-8"))
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r}
    named = {n for n in ALERT_NAME.findall(_doc(name))
             if n.startswith(("CerebellarNorse", "LiveSignal", "HighProcessing", "CUDAMemory", "NeuralConvergence"))}
    assert named <= alerts, f"{name}: {sorted(named - alerts)} are not rules of monitoring/alerts.yml"


def test_the_install_puts_the_command_the_docs_run_on_the_path(tmp_path: Path) -> None:
    """The docs run ``cerebellar-norse …`` by its name (``sudo -u cerebellar cerebellar-norse … debug-bundle`` at
    3 a.m.), but the install put it only in /opt/cerebellar-norse/.venv/bin: every such line was "command not found".
    docs/install.md links the unit's ExecStart into /usr/local/bin (on every login's and sudo's PATH), and the
    console script runs through such a link."""
    import os
    import subprocess
    import sys

    exec_start = re.search(r"^ExecStart=(\S+)", (ROOT / "systemd" / "cerebellar-norse.service").read_text(encoding="utf-8"),
                           re.MULTILINE)
    assert exec_start
    links = [shlex.split(line)[-2:] for line in _shell_lines(_doc("docs/install.md"))
             if re.match(r"(sudo\s+)?ln\s+-sf?\s", line)]
    assert [exec_start.group(1), "/usr/local/bin/cerebellar-norse"] in links, links
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "cerebellar-norse").symlink_to(Path(sys.executable).with_name("cerebellar-norse"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CEREBELLAR_NORSE_")}
    r = subprocess.run(["cerebellar-norse", "--validate-only"], env={**env, "PATH": f"{bin_dir}:/usr/bin:/bin"},
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "<built-in default>: schema OK", r.stderr
