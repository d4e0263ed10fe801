#!/usr/bin/env python3
"""The operators' Prometheus measurement of tick latency, reproduced end to end.

One run starts (unless ``--url`` names a running service):

* the service as operators run it, ``python -m cerebellar_norse.cli --port P`` on the
  built-in default config, on a free loopback port, with its own temporary state dir
  (first-run training of the default model is skipped: the untrained network of the
  seed is served, as in the API tests; ``--bootstrap`` trains it first);
* a real Prometheus (``prometheus`` on PATH; Debian: ``apt-get install prometheus``)
  with a temporary config that scrapes the service every second and loads the shipped
  alert rules ``monitoring/alerts.yml`` (evaluated every second);

then drives a bounded steady load (default 300 ticks/s over 20 markets from 4
keep-alive connections, each market's ticks in time order, for 180 s; ``--quick``:
40 s) and asks Prometheus' HTTP API for:

* the operations guide's expression
  ``histogram_quantile(0.95, rate(processing_duration_seconds_bucket[5m]))``, and the
  same for 0.5 and 0.99 (seconds);
* the state of the shipped ``HighProcessingLatency`` alert (inactive / pending /
  firing; ``for: 2m``, so a run shorter than that can show it pending at most), with
  the times it changed during the run;
* the exact quantiles of the ``processing_time_ns`` of every answer the load received
  (what the histogram counted, tick by tick: a started service serves no other ticks,
  and runs up to 5 minutes fall inside the expression's window), and the ratio
  histogram_quantile ÷ those: the bucket edges bound it to 0.83–1.2 from 1 µs to 1 ms
  (see ``cerebellar_norse.observability.metrics``). With ``--url``, the window also
  holds whatever else the service served in the 5 minutes;
* the service's own exact quantiles ``cerebellar_norse_processing_latency_seconds{quantile}``
  (per tick, over its last 4096 batches): the value at the end and its mean over the
  run (the gauge's samples scraped every second). A quantile of the last 4096 batches,
  averaged over time, is not the quantile of the run: where the load's tail came in
  bursts, it differs from both of the above by more than the bucket edges allow.

All child processes are stopped on exit, Ctrl-C and SIGTERM included.

    .venv/bin/python benchmarks/prometheus_alert_bench.py [--quick] [--duration S] [--set SECTION.KEY=VALUE] [--url URL] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import datetime as dt
import json
import math
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

import httpx
from http_bench import PROCESSING, override_env, read_answer, service_env  # benchmarks/ is first on sys.path

REPO_ROOT = Path(__file__).resolve().parent.parent
RULES = REPO_ROOT / "monitoring" / "alerts.yml"
ALERT = "HighProcessingLatency"
THRESHOLD_S = 1e-5  # the guide's alert threshold, 10 µs
QUANTILES = ("0.5", "0.95", "0.99")  # as the service labels its gauge (repr of the float)
GUIDE_EXPR = "histogram_quantile({q}, rate(processing_duration_seconds_bucket[5m]))"
EXACT_GAUGE = 'cerebellar_norse_processing_latency_seconds{{quantile="{q}"}}'
BASE_TS = 1_640_995_200_000  # the operations guide's example tick time (ms since epoch)
QUICK_S = 40.0
FULL_S = 180.0


# -- child processes ------------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when this script dies, however it dies (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


@dataclass
class Child:
    """A started child process with its log file."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")[-n:]

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout_s``; the exit code (idempotent)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


@dataclass
class Children:
    """Every child started by this run, stopped in reverse order on exit."""

    started: list[Child] = field(default_factory=list)
    codes: dict[str, int] = field(default_factory=dict)

    def start(self, name: str, argv: list[str], log: Path, env: dict[str, str] | None = None) -> Child:
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True,  # Ctrl-C reaches this script only; it stops them in order
                                    preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
        child = Child(name, proc, log)
        self.started.append(child)
        return child

    def stop_all(self) -> None:
        while self.started:
            child = self.started.pop()
            self.codes[child.name] = child.stop()


def wait_http(child: Child | None, url: str, timeout_s: float) -> None:
    """Until ``url`` answers 200 (SystemExit with the child's log when it exits or the time is up)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if child is not None and child.proc.poll() is not None:
            raise SystemExit(f"{child.name} exited with {child.proc.returncode}:\n{child.tail()}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        time.sleep(0.1)
    raise SystemExit(f"{url} not ready within {timeout_s:.0f} s" + (f":\n{child.tail()}" if child else ""))


def start_service(children: Children, work: Path, bootstrap: bool, overrides: dict[str, str] | None = None) -> str:
    """The service on the default config (plus ``overrides``, config variables) and a free loopback port; its base URL once /health is 200."""
    port = free_port()
    env = service_env(work / "state", bootstrap, overrides)
    child = children.start("service", [sys.executable, "-m", "cerebellar_norse.cli", "--port", str(port)], work / "service.log", env)
    url = f"http://127.0.0.1:{port}"
    wait_http(child, url + "/health", 600.0 if bootstrap else 120.0)
    return url


def prometheus_config(target_url: str, scrape_s: float, rules: Path) -> str:
    """A Prometheus config scraping ``target_url``/metrics every ``scrape_s`` and evaluating ``rules`` as often."""
    parts = urlsplit(target_url)
    cfg = {
        "global": {"scrape_interval": f"{scrape_s:g}s", "scrape_timeout": f"{scrape_s:g}s", "evaluation_interval": f"{scrape_s:g}s"},
        "rule_files": [str(rules)],
        "scrape_configs": [{"job_name": "cerebellar-norse", "scheme": parts.scheme or "http", "metrics_path": "/metrics",
                            "static_configs": [{"targets": [parts.netloc]}]}],
    }
    return json.dumps(cfg, indent=2)  # JSON is YAML


def start_prometheus(children: Children, work: Path, binary: str, target_url: str, scrape_s: float) -> str:
    """Prometheus with a temporary config and data dir; its base URL once /-/ready is 200."""
    port = free_port()
    cfg = work / "prometheus.yml"
    cfg.write_text(prometheus_config(target_url, scrape_s, RULES))
    child = children.start("prometheus", [binary, f"--config.file={cfg}", f"--storage.tsdb.path={work / 'tsdb'}",
                                          f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                           work / "prometheus.log")
    url = f"http://127.0.0.1:{port}"
    wait_http(child, url + "/-/ready", 60.0)
    return url


def prometheus_version(binary: str) -> str:
    r = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=30, check=False)
    found = re.search(r"version (\S+)", r.stdout or r.stderr)
    return found.group(1) if found else "unknown"


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (and SIGHUP) raise KeyboardInterrupt, so the cleanup of Ctrl-C runs for them too."""
    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# -- Prometheus queries -----------------------------------------------------------------------------------


class Prom:
    """A small client of Prometheus' HTTP API (``/api/v1``)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = httpx.Client(base_url=url, timeout=10.0)

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The instant vector of ``expr`` now (SystemExit when Prometheus refuses it)."""
        r = self.http.get("/api/v1/query", params={"query": expr})
        body = r.json()
        if r.status_code != 200 or body.get("status") != "success":
            raise SystemExit(f"Prometheus refused {expr!r}: {body.get('error', r.text)}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def scalar(self, expr: str) -> float | None:
        """The single value of ``expr`` (None for an empty result; NaN kept as NaN)."""
        res = self.query(expr)
        return float(res[0]["value"][1]) if res else None

    def alert_rule(self, name: str) -> dict[str, Any] | None:
        """The rule ``name`` as /api/v1/rules reports it (state, health, lastError, alerts)."""
        r = self.http.get("/api/v1/rules", params={"type": "alert"})
        for group in r.json()["data"]["groups"]:
            for rule in group["rules"]:
                if rule.get("name") == name:
                    found: dict[str, Any] = rule
                    return found
        return None

    def close(self) -> None:
        self.http.close()


# -- load ----------------------------------------------------------------------------------------------------


@dataclass
class Load:
    """What the load generator did."""

    sent: int = 0
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    latencies_us: list[float] = field(default_factory=list)
    processing_ns: list[int] = field(default_factory=list)  # each answer's processing_time_ns
    elapsed_s: float = 0.0

    def processing_quantiles_s(self) -> dict[str, float | None]:
        """The exact quantiles (nearest rank) of the answers' processing times, s, keyed as :data:`QUANTILES`."""
        ns = sorted(self.processing_ns)
        return {q: nearest_rank(ns, float(q)) / 1e9 if ns else None for q in QUANTILES}

    def summary(self, target: float, markets: int, concurrency: int, duration_s: float) -> dict[str, Any]:
        lat = sorted(self.latencies_us)

        def pct(q: float) -> float | None:
            return round(nearest_rank(lat, q), 1) if lat else None

        return {"target_ticks_per_s": target, "markets": markets, "concurrency": concurrency, "duration_s": duration_s,
                "sent": self.sent, "ok": self.ok, "errors": self.errors,
                "achieved_ticks_per_s": round(self.ok / self.elapsed_s, 1) if self.elapsed_s else None,
                "client_p50_us": pct(0.5), "client_p99_us": pct(0.99)}


def nearest_rank(ordered: list[Any], q: float) -> Any:
    """The ``q`` quantile (0 < q ≤ 1) of a sorted, non-empty list: its ⌈q·n⌉-th value."""
    return ordered[max(1, min(len(ordered), math.ceil(q * len(ordered)))) - 1]


async def _roundtrip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: bytes) -> tuple[int, bytes]:
    """Send one request; read its answer (Content-Length bodies); the status code and body."""
    writer.write(raw)
    return await read_answer(reader)


async def drive(url: str, rate: float, markets: int, concurrency: int, duration_s: float, on_tick: Any = None) -> Load:
    """``rate`` ticks/s over ``markets`` markets for ``duration_s``, from ``concurrency`` keep-alive connections.

    Worker w owns the markets m ≡ w (mod concurrency) and sends them in turn, each
    market's ticks one second apart in time order, on a fixed schedule (rate/concurrency
    per worker; a late worker sends at once, it does not burst to catch up beyond its
    schedule). Market ids are new for every run, so a running service never refuses
    them as out of order.
    """
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    run = uuid.uuid4().hex[:8]
    load = Load()
    t0 = time.monotonic()
    end = t0 + duration_s
    per_worker = rate / concurrency

    async def worker(w: int) -> None:
        owned = [f"PAB-{run}-{m:02d}" for m in range(markets) if m % concurrency == w]
        if not owned:
            return
        counts = dict.fromkeys(owned, 0)
        reader, writer = await asyncio.open_connection(host, port)
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            i = 0
            while True:
                due = t0 + (i + w / concurrency) / per_worker
                if due >= end:
                    return
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                market = owned[i % len(owned)]
                k = counts[market]
                counts[market] = k + 1
                body = json.dumps({"price": round(100.0 + 0.25 * ((k * 7) % 9) - 1.0, 2), "volume": 1000.0 + (k % 13) * 10.0,
                                   "timestamp": BASE_TS + 1000 * k, "market_id": market}, separators=(",", ":")).encode()
                raw = (b"POST /neural/process HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                       % (parts.netloc.encode(), len(body))) + body
                sent = time.perf_counter_ns()
                status, answer = await _roundtrip(reader, writer, raw)
                load.sent += 1
                if status == 200:
                    load.ok += 1
                    load.latencies_us.append((time.perf_counter_ns() - sent) / 1e3)
                    if (took := PROCESSING.search(answer)) is not None:
                        load.processing_ns.append(int(took.group(1)))
                else:
                    load.errors[str(status)] = load.errors.get(str(status), 0) + 1
                i += 1
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def watch() -> None:
        while time.monotonic() < end:
            if on_tick is not None:
                await asyncio.get_running_loop().run_in_executor(None, on_tick, time.monotonic() - t0)
            await asyncio.sleep(2.0)

    watcher = asyncio.create_task(watch())
    try:
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
    finally:
        load.elapsed_s = time.monotonic() - t0
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    return load


# -- measurement -------------------------------------------------------------------------------------------


def service_count(url: str) -> float:
    """``processing_duration_seconds_count`` as the service exposes it now."""
    text = httpx.get(url + "/metrics", timeout=10.0).text
    return next((float(line.split()[1]) for line in text.splitlines() if line.startswith("processing_duration_seconds_count")), 0.0)


def wait_scraped(prom: Prom, count: float, timeout_s: float) -> bool:
    """Until Prometheus holds a scrape with at least ``count`` ticks (then one more evaluation interval)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        v = prom.scalar("processing_duration_seconds_count")
        if v is not None and v >= count:
            return True
        time.sleep(0.2)
    return False


def _num(x: float | None) -> float | None:
    return None if x is None or math.isnan(x) else x


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def measure(prom: Prom, window_s: int, answers: dict[str, float | None]) -> dict[str, Any]:
    """The figures of the run from Prometheus (seconds; None where Prometheus has no value).

    ``answers``: the exact quantiles of the processing times the load's answers gave (s).
    """
    out: dict[str, Any] = {"quantiles": {}}
    for q in QUANTILES:
        hq = _num(prom.scalar(GUIDE_EXPR.format(q=q)))
        gauge = EXACT_GAUGE.format(q=q)
        now = _num(prom.scalar(gauge))
        mean = _num(prom.scalar(f"avg_over_time(({gauge} >= 0)[{window_s}s:1s])"))  # NaN samples (no batch yet) left out
        out["quantiles"][q] = {"histogram_quantile_s": hq, "exact_answers_s": answers.get(q),
                               "ratio_answers": _ratio(hq, answers.get(q)),
                               "exact_now_s": now, "exact_mean_s": mean, "ratio": _ratio(hq, mean), "ratio_now": _ratio(hq, now)}
    out["guide_expression"] = GUIDE_EXPR.format(q="0.95")
    out["guide_value_s"] = out["quantiles"]["0.95"]["histogram_quantile_s"]
    out["threshold_s"] = THRESHOLD_S
    out["above_threshold"] = out["guide_value_s"] is not None and out["guide_value_s"] > THRESHOLD_S
    out["exact_window_s"] = window_s
    out["ticks_in_5m"] = _num(prom.scalar("increase(processing_duration_seconds_count[5m])"))
    out["scrapes"] = _num(prom.scalar('count_over_time(up{job="cerebellar-norse"}[5m])'))
    out["up"] = _num(prom.scalar('up{job="cerebellar-norse"}'))
    return out


def alert_state(prom: Prom) -> tuple[str, dict[str, Any]]:
    """(state, rule) of the shipped latency alert: inactive, pending or firing ('missing' when the rule is not loaded)."""
    rule = prom.alert_rule(ALERT)
    if rule is None:
        return "missing", {}
    return str(rule.get("state", "inactive")), rule


# -- report ----------------------------------------------------------------------------------------------------


def host_info() -> dict[str, Any]:
    model, hypervisor = "unknown", False
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "unknown":
                model = line.split(":", 1)[1].strip()
            if line.startswith("flags") and " hypervisor" in line:
                hypervisor = True
    return {"cpu": model, "logical_cpus": os.cpu_count(), "virtual_machine": hypervisor,
            "load_avg_1m_at_start": round(os.getloadavg()[0], 2), "kernel": platform.release(), "python": platform.python_version()}


def _us(x: float | None) -> str:
    return "—" if x is None else f"{x * 1e6:.2f} µs"


def table(res: dict[str, Any]) -> str:
    m, ld, al = res["measurement"], res["load"], res["alert"]
    errors = sum(ld["errors"].values())
    lines = [
        f"service {res['service']['url']} (model {res['service'].get('model_version')}), Prometheus {res['prometheus']['version']}, "
        f"scrape and rule evaluation every {res['prometheus']['scrape_interval_s']:g} s",
        f"load: {ld['target_ticks_per_s']:g} ticks/s target, {ld['achieved_ticks_per_s']} achieved, {ld['markets']} markets, "
        f"concurrency {ld['concurrency']}, {ld['duration_s']:g} s; {ld['ok']} ok, {errors} errors; "
        f"client round trip p50 {ld['client_p50_us']} µs, p99 {ld['client_p99_us']} µs",
        "",
        f"| quantile | histogram_quantile [5m] | exact, the run's {m['answers']} answers | ratio (hq ÷ exact) "
        f"| service's gauge, mean over {m['exact_window_s']} s | gauge at the end |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for q, v in m["quantiles"].items():
        lines.append(f"| {q} | {_us(v['histogram_quantile_s'])} | {_us(v['exact_answers_s'])} | {v['ratio_answers']} "
                     f"| {_us(v['exact_mean_s'])} | {_us(v['exact_now_s'])} |")
    lines += ["", f"{m['guide_expression']} = {_us(m['guide_value_s'])} "
              f"({'above' if m['above_threshold'] else 'not above'} the 10 µs threshold)",
              f"{ALERT}: {al['state']} at the end" + (f" (active since {al['active_at']})" if al.get("active_at") else "")
              + "; during the run: " + (", ".join(f"{c['state']} at {c['t_s']:.0f} s" for c in al["changes"]) or "no change")]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="The operators' Prometheus latency measurement and alert, reproduced")
    ap.add_argument("--duration", type=float, default=None, help=f"seconds of load (default {FULL_S:g}; --quick: {QUICK_S:g})")
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_S:g} s of load")
    ap.add_argument("--rate", type=float, default=300.0, help="ticks per second, all markets together (default 300)")
    ap.add_argument("--markets", type=int, default=20, help="markets (default 20)")
    ap.add_argument("--concurrency", type=int, default=4, help="keep-alive connections (default 4)")
    ap.add_argument("--scrape-interval", type=float, default=1.0, help="Prometheus scrape and rule evaluation interval, s (default 1)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="a config key of the started service, e.g. performance.warm_step_interval_us=0 (repeatable)")
    ap.add_argument("--url", help="measure this running service (e.g. http://127.0.0.1:8080) instead of starting one")
    ap.add_argument("--bootstrap", action="store_true", help="let the started service train its default model first (minutes)")
    ap.add_argument("--prometheus", default=shutil.which("prometheus"), help="Prometheus binary (default: prometheus on PATH)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON ('-': JSON to stdout, the table to stderr)")
    args = ap.parse_args(argv)
    duration = args.duration if args.duration is not None else (QUICK_S if args.quick else FULL_S)
    if args.prometheus is None:
        print("prometheus not found on PATH (Debian: apt-get install prometheus), or give --prometheus PATH", file=sys.stderr)
        return 2
    if duration <= 0 or args.rate <= 0 or args.markets < 1 or args.concurrency < 1 or args.scrape_interval <= 0:
        print("--duration, --rate, --scrape-interval must be > 0; --markets, --concurrency ≥ 1", file=sys.stderr)
        return 2

    overrides = override_env(args.set)
    command = shlex.join([".venv/bin/python", "benchmarks/prometheus_alert_bench.py", *(argv if argv is not None else sys.argv[1:])])
    res: dict[str, Any] = {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), "command": command, "host": host_info(), "settings": args.set}
    children = Children()
    changes: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="prometheus-alert-bench-") as tmp, sigterm_as_interrupt():
        work = Path(tmp)
        try:
            url = args.url.rstrip("/") if args.url else start_service(children, work, args.bootstrap, overrides)
            if args.url:
                wait_http(None, url + "/health", 30.0)
            res["service"] = {"url": url, "started_here": not args.url,
                              "model_version": httpx.get(url + "/health", timeout=10.0).json().get("model_version")}
            prom_url = start_prometheus(children, work, args.prometheus, url, args.scrape_interval)
            p = Prom(prom_url)
            res["prometheus"] = {"version": prometheus_version(args.prometheus), "scrape_interval_s": args.scrape_interval,
                                 "rules": str(RULES.relative_to(REPO_ROOT))}
            deadline = time.monotonic() + 30
            while p.scalar('up{job="cerebellar-norse"}') != 1.0:  # the first scrape
                if time.monotonic() > deadline:
                    raise SystemExit(f"Prometheus never scraped {url}/metrics:\n{children.started[-1].tail()}")
                time.sleep(0.2)
            watcher = Prom(prom_url)  # its own connection: polled from a worker thread during the load
            last = ["inactive"]

            def poll(t_s: float) -> None:
                state, _ = alert_state(watcher)
                if state != last[0]:
                    changes.append({"t_s": round(t_s, 1), "state": state})
                    last[0] = state

            print(f"load: {args.rate:g} ticks/s, {args.markets} markets, {duration:g} s ...", file=sys.stderr)
            load = asyncio.run(drive(url, args.rate, args.markets, args.concurrency, duration, poll))
            res["load"] = load.summary(args.rate, args.markets, args.concurrency, duration)
            watcher.close()
            res["prometheus"]["answered"] = wait_scraped(p, service_count(url), 30.0)
            time.sleep(args.scrape_interval * 1.5)  # one more rule evaluation on the last scrape
            res["measurement"] = measure(p, max(2, min(300, math.ceil(load.elapsed_s))), load.processing_quantiles_s())
            res["measurement"]["answers"] = len(load.processing_ns)
            state, rule = alert_state(p)
            active = next((a for a in rule.get("alerts", [])), None)
            res["alert"] = {"name": ALERT, "state": state, "for": rule.get("duration"), "rule_health": rule.get("health"),
                            "rule_error": rule.get("lastError") or None, "active_at": active.get("activeAt") if active else None,
                            "value": active.get("value") if active else None, "changes": changes}
            p.close()
        except KeyboardInterrupt:
            print("interrupted: stopping the service and Prometheus", file=sys.stderr)
            return 130
        finally:
            children.stop_all()
        res["exit_codes"] = children.codes
    text = table(res)
    if args.json == "-":
        print(text, file=sys.stderr)
        print(json.dumps(res, indent=2))
    else:
        if args.json:
            Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
        print(text)
    failed = sum(res["load"]["errors"].values()) or not res["prometheus"]["answered"]
    bad_exit = any(code != 0 for code in res["exit_codes"].values())  # both stop cleanly on SIGTERM
    return 1 if failed or bad_exit else 0


if __name__ == "__main__":
    raise SystemExit(main())
