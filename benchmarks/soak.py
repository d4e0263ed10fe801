"""Long run of a live service under a production-like mix, sampling what could grow (docs/operations.md, Retention).

``drive`` sends, until ``--duration`` s have passed: ``--rate`` ticks/s over ``--markets`` steady markets plus one new
market id every ``1/--churn`` s (each trades for 60 s and never comes back, so the pool fills and evicts), as single
ticks and batches of 20 over raw HTTP (4 senders) and through :class:`cerebellar_norse.client.Client` (a fifth), and
5–30 ticks on a WebSocket opened every 3 s (a third of them dropped without a close); one bad request a second
(an out-of-order tick, malformed JSON, a missing field, a negative price, a long market id, a wrong type, a line that
is not HTTP); ``/metrics`` every 2 s, ``/health``, ``/neural/metrics`` and two debug routes every 20 s; a training job
every ``--job-every`` s on ``--job-file`` (1 epoch; cancelled, activated ``always`` and ``auto`` in turn) and a SIGHUP
every ``--hup-every`` s toggling ``logging.level`` between INFO and WARNING in ``--config``. Every 30 s one row goes to
``--out``: the service's resident memory, threads and descriptors, its child processes and theirs, the state dir's
size by part, the log's size, the pool and queue gauges, the processing and HTTP p50/p99 of those 30 s (bucket
edges), the client's own p50/p99 and counts. Each sender owns its markets, so no tick is sent out of order by accident.

``fit`` prints per column its first, last, lowest and highest value and its least-squares slope per hour (over the
samples after ``--skip`` s, and over their second half).

    .venv/bin/python benchmarks/soak.py drive --url http://127.0.0.1:8080 --pid-file run/pid --state-dir var \\
        --log-file run/app.log --config run/default.toml --token T --out soak.csv --duration 3600
    .venv/bin/python benchmarks/soak.py fit soak.csv --skip 600
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import json
import math
import os
import random
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from cerebellar_norse.client import Client

SENDERS = 6  # 4 raw HTTP, 1 Client, 1 WebSocket; sender i owns the markets whose number is i modulo SENDERS
SAMPLE_S = 30.0
FIELDS = ["t_s", "rss_bytes", "threads", "fds", "children", "children_rss_bytes", "journal_bytes", "models_bytes",
          "jobs_bytes", "state_file_bytes", "state_dir_bytes", "models", "job_records", "log_bytes", "pool_markets",
          "pool_evictions", "queue_depth", "queue_peak", "processing_p50_us", "processing_p99_us", "http_p50_ms",
          "http_p99_ms", "client_p50_ms", "client_p99_ms", "ticks_total", "errors_total", "series", "stream_connections",
          "http_connections", "client_ok", "client_errors", "websockets", "unexpected_answers", "markets_created"]


class Load:
    """The ticks' side: markets, their last tick, and what the senders saw."""

    def __init__(self, url: str, rate: float, markets: int, churn: float) -> None:
        self.url, self.rate, self.churn = url, rate, churn
        self.host, port = url.split("//", 1)[1].rsplit(":", 1)
        self.port = int(port)
        self.rnd = random.Random(13)
        self.last: dict[str, list[float]] = {}  # market -> [timestamp ms, price]
        self.steady = [f"S{i:04d}" for i in range(markets)]
        self.live: list[tuple[str, float]] = []  # churning markets and when they appeared
        self.created = 0
        self.latencies: list[float] = []
        self.counts = {"ok": 0, "errors": 0, "websockets": 0, "unexpected": 0}
        self.lock = threading.Lock()

    def tick(self, market: str) -> dict[str, Any]:
        last = self.last.setdefault(market, [1_700_000_000_000 + self.rnd.randrange(1000), 100 + 50 * self.rnd.random()])
        last[0] += 1 + self.rnd.randrange(2000)
        last[1] *= 1 + self.rnd.gauss(0, 0.001)
        return {"price": round(last[1], 6), "volume": float(self.rnd.randrange(1, 5000)), "timestamp": int(last[0]),
                "market_id": market}

    def market(self, sender: int) -> str:
        now = time.time()
        while self.live and self.live[0][1] < now - 60:
            self.live.pop(0)
        mine = [m for m, _ in self.live if int(m[1:]) % SENDERS == sender]
        if mine and self.rnd.random() < 0.25:
            return self.rnd.choice(mine)
        return self.rnd.choice(self.steady[sender::SENDERS])

    def answered(self, n: int, seconds: float) -> None:
        with self.lock:
            self.latencies.extend([seconds] * n)
            self.counts["ok"] += n

    def window(self) -> tuple[float, float]:
        """Client p50 and p99 (ms) since the last call."""
        with self.lock:
            lat, self.latencies = sorted(self.latencies), []
        if not lat:
            return math.nan, math.nan
        return tuple(lat[min(len(lat) - 1, int(q * len(lat)))] * 1000 for q in (0.5, 0.99))  # type: ignore[return-value]

    async def churn_loop(self) -> None:
        while True:
            await asyncio.sleep(1 / self.churn)
            self.created += 1
            self.live.append((f"C{self.created:06d}", time.time()))

    async def http_sender(self, client: httpx.AsyncClient, sender: int, rate: float) -> None:
        while True:
            if self.rnd.random() < 0.5:
                ticks = [self.tick(self.market(sender))]
                path, body = "/neural/process", ticks[0]
            else:
                ticks = [self.tick(self.market(sender)) for _ in range(20)]
                path, body = "/neural/process/batch", {"ticks": ticks}
            t = time.perf_counter()
            try:
                r = await client.post(self.url + path, json=body)
                if r.status_code == 200:
                    self.answered(len(ticks), time.perf_counter() - t)
                else:
                    self.counts["errors"] += 1
            except httpx.HTTPError:
                self.counts["errors"] += 1
            await asyncio.sleep(len(ticks) / rate)

    def client_sender(self, rate: float) -> None:
        with Client(self.url, timeout_s=10) as c:
            while True:
                ticks = [self.tick(self.market(4)) for _ in range(1 if self.rnd.random() < 0.5 else 10)]
                t = time.perf_counter()
                try:
                    c.process(ticks[0]) if len(ticks) == 1 else c.process_batch(ticks)
                    self.answered(len(ticks), time.perf_counter() - t)
                except Exception:
                    self.counts["errors"] += 1
                time.sleep(len(ticks) / rate)

    async def websockets_loop(self) -> None:
        import websockets

        n = 0
        while True:
            await asyncio.sleep(3)
            n += 1
            try:
                ws = await websockets.connect(f"ws://{self.host}:{self.port}/neural/stream")
                self.counts["websockets"] += 1
                for _ in range(self.rnd.randrange(5, 30)):
                    t = time.perf_counter()
                    await ws.send(json.dumps(self.tick(self.market(5))))
                    if "error" in json.loads(await ws.recv()):
                        self.counts["errors"] += 1
                    else:
                        self.answered(1, time.perf_counter() - t)
                if n % 3 == 0:
                    ws.transport.abort()  # dropped: no close frame
                else:
                    await ws.close()
            except (OSError, websockets.WebSocketException):
                self.counts["errors"] += 1

    async def bad_requests(self, client: httpx.AsyncClient) -> None:
        while True:
            await asyncio.sleep(1)
            kind = self.rnd.randrange(7)
            market = self.rnd.choice(self.steady)
            old = {"price": 100.0, "volume": 1.0, "timestamp": int(self.last.get(market, [2e12])[0]) - 10_000_000,
                   "market_id": market}
            try:
                if kind == 6:  # not HTTP at all
                    reader, writer = await asyncio.open_connection(self.host, self.port)
                    writer.write(b"GARBAGE\r\n\r\n")
                    await asyncio.wait_for(reader.read(1000), 5)
                    writer.close()
                    continue
                url = self.url + ("/neural/process/batch" if kind == 1 else "/neural/process")
                if kind == 2:
                    r = await client.post(url, content=b'{"price": 1.0, "volu', headers={"content-type": "application/json"})
                else:
                    body: Any = [old, {"ticks": [old]}, None, {"price": 1.0}, {**old, "price": -1.0},
                                 {**old, "market_id": "Z" * 300}][kind]
                    r = await client.post(url, json=body)
                if not 400 <= r.status_code < 500:
                    self.counts["unexpected"] += 1
            except (TimeoutError, OSError, httpx.HTTPError):
                pass

    async def run(self, duration_s: float) -> None:
        limits = httpx.Limits(max_connections=8, max_keepalive_connections=8)
        async with httpx.AsyncClient(limits=limits, timeout=10) as client:
            threading.Thread(target=self.client_sender, args=(self.rate * 0.2,), daemon=True).start()
            tasks = [asyncio.create_task(self.http_sender(client, i, self.rate * 0.2)) for i in range(4)]
            tasks += [asyncio.create_task(c) for c in (self.churn_loop(), self.websockets_loop(), self.bad_requests(client))]
            await asyncio.sleep(duration_s)
            for task in tasks:
                task.cancel()


class Ops:
    """The operator's side: scrapes, training jobs, reloads, samples."""

    def __init__(self, args: argparse.Namespace, load: Load) -> None:
        self.a, self.load = args, load
        self.http = httpx.Client(base_url=args.url, timeout=30, headers={"Authorization": f"Bearer {args.token}"})
        self.metrics = ""
        self.previous: dict[str, list[tuple[float, float]]] = {}

    def pid(self) -> int:
        return int(Path(self.a.pid_file).read_text().strip())

    def every(self, seconds: float, what: Any) -> None:
        def loop() -> None:
            while True:
                time.sleep(seconds)
                try:
                    what()
                except (httpx.HTTPError, OSError, ValueError) as exc:
                    print(f"{time.strftime('%H:%M:%S')} {what.__name__}: {exc!r}", flush=True)
        threading.Thread(target=loop, daemon=True).start()

    def scrape(self) -> None:
        self.metrics = self.http.get("/metrics").text

    def look(self) -> None:
        for path in ("/health", "/neural/metrics", "/debug/requests?limit=5", "/debug/markets?limit=5"):
            self.http.get(path)

    def job(self) -> None:
        mode = ["cancel", "always", "auto"][int(time.time() // self.a.job_every) % 3]
        body: dict[str, Any] = {"files": [self.a.job_file], "epochs": 1}
        if mode != "cancel":
            body["activate"] = mode
        r = self.http.post("/training", json=body)
        job_id = r.json().get("job_id")
        print(f"{time.strftime('%H:%M:%S')} job {mode}: {r.status_code} {job_id}", flush=True)
        if job_id and mode == "cancel":
            time.sleep(8)
            self.http.delete(f"/training/{job_id}")

    def hup(self) -> None:
        text = Path(self.a.config).read_text()
        level = "WARNING" if 'level = "INFO"' in text else "INFO"
        Path(self.a.config).write_text(re.sub(r'level = "[A-Z]+"', f'level = "{level}"', text))
        os.kill(self.pid(), signal.SIGHUP)

    def value(self, name: str) -> float:
        found = [float(line.rsplit(" ", 1)[1]) for line in self.metrics.splitlines()
                 if line.startswith((name + " ", name + "{"))]
        return sum(found) if found else math.nan

    def quantiles(self, name: str) -> tuple[float, float]:
        """p50, p99 (bucket edges) of a histogram over the observations since the last call."""
        buckets = sorted((math.inf if m[1] == "+Inf" else float(m[1]), float(m[2])) for m in
                         re.finditer(rf'^{name}_bucket{{.*?le="([^"]+)".*?}} (\S+)$', self.metrics, re.M))
        before = self.previous.get(name, [])
        self.previous[name] = buckets
        if len(before) == len(buckets):
            buckets = [(le, n - m) for (le, n), (_, m) in zip(buckets, before, strict=True)]
        total = buckets[-1][1] if buckets else 0
        return tuple(next((le for le, n in buckets if total and n >= q * total), math.nan) for q in (0.5, 0.99))  # type: ignore[return-value]

    def sample(self, t_s: float) -> list[Any]:
        pid = self.pid()
        status = Path(f"/proc/{pid}/status").read_text()

        def rss(text: str) -> int:
            return int(re.search(r"VmRSS:\s+(\d+)", text)[1]) * 1024  # type: ignore[index]

        kids = [int(p) for p in subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True,
                                               text=True, check=False).stdout.split()]
        kids_rss = 0
        for kid in kids:
            with contextlib.suppress(OSError, TypeError):  # ended meanwhile, or a zombie (no VmRSS)
                kids_rss += rss(Path(f"/proc/{kid}/status").read_text())
        state = Path(self.a.state_dir)

        def size(p: Path) -> int:
            return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) if p.is_dir() else 0

        log = Path(self.a.log_file)
        p50, p99 = self.quantiles("processing_duration_seconds")
        h50, h99 = self.quantiles("cerebellar_norse_http_request_duration_seconds")
        c50, c99 = self.load.window()
        return [round(t_s, 1), rss(status), int(re.search(r"Threads:\s+(\d+)", status)[1]),  # type: ignore[index]
                len(os.listdir(f"/proc/{pid}/fd")), len(kids), kids_rss, size(state / "journal"), size(state / "models"),
                size(state / "jobs"), (state / "market_state.bin").stat().st_size, size(state),
                len([p for p in (state / "models").iterdir() if p.is_dir()]), len(list((state / "jobs").glob("*.json"))),
                sum(p.stat().st_size for p in log.parent.glob(log.name + "*")), self.value("cerebellar_norse_pool_markets"),
                self.value("cerebellar_norse_pool_evictions_total"), self.value("cerebellar_norse_queue_depth_ticks"),
                self.value("cerebellar_norse_queue_peak_ticks"), p50 * 1e6, p99 * 1e6, h50 * 1e3, h99 * 1e3, c50, c99,
                self.value("cerebellar_norse_ticks_total"), self.value("cerebellar_norse_errors_total"),
                sum(1 for line in self.metrics.splitlines() if line and not line.startswith("#")),
                self.value("cerebellar_norse_stream_connections"), self.value("cerebellar_norse_http_connections"),
                self.load.counts["ok"], self.load.counts["errors"], self.load.counts["websockets"],
                self.load.counts["unexpected"], self.load.created]


def drive(args: argparse.Namespace) -> None:
    load = Load(args.url, args.rate, args.markets, args.churn)
    ops = Ops(args, load)
    ops.scrape()
    for seconds, what in ((2, ops.scrape), (20, ops.look), (args.job_every, ops.job), (args.hup_every, ops.hup)):
        ops.every(seconds, what)
    t0 = time.time()

    def sampler() -> None:
        with open(args.out, "w", newline="") as fh:
            out = csv.writer(fh)
            out.writerow(FIELDS)
            while True:
                try:
                    out.writerow(ops.sample(time.time() - t0))
                    fh.flush()
                except (OSError, ValueError, TypeError) as exc:
                    print(f"sample: {exc!r}", flush=True)
                time.sleep(SAMPLE_S)

    threading.Thread(target=sampler, daemon=True).start()
    asyncio.run(load.run(args.duration))


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    points = [(x, y) for x, y in points if not math.isnan(y)]
    if len(points) < 3:
        return math.nan
    mx, my = (sum(p[i] for p in points) / len(points) for i in (0, 1))
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx * 3600 if sxx else math.nan


def fit(args: argparse.Namespace) -> None:
    with open(args.csv, newline="") as fh:
        rows = list(csv.DictReader(fh))

    def num(v: str) -> float:
        try:
            return float(v)
        except ValueError:
            return math.nan

    t = [num(r["t_s"]) for r in rows]
    print(f"{len(rows)} samples over {t[-1] / 60:.1f} min; slopes over t >= {args.skip:g} s")
    print(f"{'quantity':22} {'first':>11} {'last':>11} {'min':>11} {'max':>11} {'slope/h':>11} {'2nd half/h':>11}")
    for col in rows[0]:
        if col == "t_s":
            continue
        ys = [num(r[col]) for r in rows]
        seen = [y for y in ys if not math.isnan(y)]
        if not seen:
            continue
        after = [(x, y) for x, y in zip(t, ys, strict=True) if x >= args.skip]
        half = [(x, y) for x, y in after if after and x >= (after[0][0] + after[-1][0]) / 2]
        print(f"{col:22} {seen[0]:11.4g} {seen[-1]:11.4g} {min(seen):11.4g} {max(seen):11.4g} "
              f"{slope_per_hour(after):11.4g} {slope_per_hour(half):11.4g}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    d = sub.add_parser("drive", help="drive a running service and sample it")
    d.add_argument("--url", required=True)
    d.add_argument("--pid-file", required=True, help="file holding the service's pid")
    d.add_argument("--state-dir", required=True)
    d.add_argument("--log-file", required=True, help="the service's [logging] file (rotated files counted too)")
    d.add_argument("--config", required=True, help="the service's --config file (its logging.level is toggled)")
    d.add_argument("--token", required=True, help="server.api_token")
    d.add_argument("--out", required=True, help="CSV of samples")
    d.add_argument("--duration", type=float, default=3600.0, help="seconds")
    d.add_argument("--rate", type=float, default=200.0, help="ticks/s")
    d.add_argument("--markets", type=int, default=300, help="steady markets")
    d.add_argument("--churn", type=float, default=1.0, help="new market ids per second")
    d.add_argument("--job-file", default="short.csv", help="training file, relative to paths.data_dir")
    d.add_argument("--job-every", type=float, default=600.0, help="seconds between training jobs")
    d.add_argument("--hup-every", type=float, default=300.0, help="seconds between SIGHUPs")
    f = sub.add_parser("fit", help="first, last and slope per hour of each sampled quantity")
    f.add_argument("csv")
    f.add_argument("--skip", type=float, default=0.0, help="fit only samples after this many seconds")
    args = ap.parse_args()
    drive(args) if args.command == "drive" else fit(args)


if __name__ == "__main__":
    main()
