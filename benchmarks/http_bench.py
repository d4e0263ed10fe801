#!/usr/bin/env python3
"""HTTP benchmark: ``POST /neural/process`` of the real service vs an empty endpoint on the same stack.

One run starts two server processes on loopback ports and measures both in the same
run, interleaved, so the ratio is taken under the same conditions:

* the service, exactly as operators run it: ``python -m cerebellar_norse.cli --port P``
  on the built-in default config (state dir: a fresh temporary directory, so on first run
  the service trains its default model before it serves, as on a new machine; with
  ``--untrained`` that step is skipped and the untrained network of the seed is served);
* ``benchmarks/empty_app.py``: uvicorn with the service's settings (uvloop + httptools)
  serving one empty ``POST /empty`` that validates the same ``TickIn`` body.

Measurements:

1. sequential, one keep-alive connection, a minimal blocking HTTP/1.1 client on a raw
   socket (pre-built requests, so the client adds as little as possible): p50/p99
   latency and throughput, in alternating blocks of the two endpoints;
2. concurrency 1, 8 and 64 with ``httpx.AsyncClient`` (one client, one keep-alive
   connection per worker): throughput and p50/p99 latency, bounded in requests and
   seconds per level; then the same load from a minimal asyncio client on raw sockets,
   because httpx needs more CPU per request than the servers do and, on a small host,
   its figures are the client's limit rather than the server's.

Every worker sends its own market's ticks in time order, so no request is refused
(any non-200 is counted and reported). Targets: ``/neural/process`` p50 ÷ empty p50
≤ 1.25 (sequential) and ``/neural/process`` sequential p99 ≤ 2 ms.

    .venv/bin/python benchmarks/http_bench.py [--set SECTION.KEY=VALUE] [--json results.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import gc
import json
import os
import platform
import re
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
import uvloop

REPO_ROOT = Path(__file__).resolve().parent.parent
TARGET_RATIO = 1.25
TARGET_P99_MS = 2.0
BASE_TS = 1_640_995_200_000
PROCESS, EMPTY = "/neural/process", "/empty"
WARM_ROUNDS = 3  # requests per worker before a raw-client measurement
PROCESSING = re.compile(rb'"processing_time_ns":(\d+)')  # a tick answer's processing time (ns)


# -- servers --------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, path: str, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.name} exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(self.url + path, timeout=1.0).status_code == 200:
                    return
            time.sleep(0.1)
        raise SystemExit(f"{self.name} not ready within {timeout}s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait()


def service_env(state_dir: Path, bootstrap: bool = False, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a benchmarked service: this one without config overrides, the state dir, log level WARNING,
    no first-run training unless ``bootstrap``, then ``extra`` (config variables)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CEREBELLAR_NORSE_") and k != "STATE_DIRECTORY"}
    env["CEREBELLAR_NORSE_PATHS__STATE_DIR"] = str(state_dir)
    env["CEREBELLAR_NORSE_LOG"] = "WARNING"
    if not bootstrap:
        env["CEREBELLAR_NORSE_TRAINING__BOOTSTRAP_ON_FIRST_RUN"] = "false"
    env.update(extra or {})
    return env


def override_env(settings: list[str]) -> dict[str, str]:
    """``section.key=value`` settings as the service's ``CEREBELLAR_NORSE_SECTION__KEY`` variables."""
    env = {}
    for item in settings:
        key, sep, value = item.partition("=")
        section, dot, name = key.strip().partition(".")
        if not (sep and dot and section and name):
            raise SystemExit(f"--set {item!r}: expected section.key=value, e.g. performance.busy_poll_us=20000")
        env[f"CEREBELLAR_NORSE_{section.upper()}__{name.upper()}"] = value.strip()
    return env


def start(name: str, argv: list[str], workdir: Path, env: dict[str, str]) -> Server:
    port = free_port()
    log = workdir / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, *argv, "--port", str(port)], cwd=REPO_ROOT, env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    return Server(name, proc, port, log)


# -- ticks ------------------------------------------------------------------------------------------


class Ticks:
    """Request bodies: each market's ticks in time order (one second apart)."""

    def __init__(self) -> None:
        self.n: dict[str, int] = {}

    def body(self, market: str) -> bytes:
        k = self.n.get(market, 0)
        self.n[market] = k + 1
        tick = {"price": round(100.0 + 0.25 * ((k * 7) % 9) - 1.0, 2), "volume": 1000.0 + (k % 13) * 10.0,
                "timestamp": BASE_TS + 1000 * k, "market_id": market}
        return json.dumps(tick, separators=(",", ":")).encode()


# -- statistics -------------------------------------------------------------------------------------


def pct(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, max(0, round(q / 100 * (len(sorted_values) - 1))))
    return sorted_values[i]


@dataclass
class Stats:
    latencies_us: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    errors: int = 0

    def summary(self) -> dict[str, Any]:
        s = sorted(self.latencies_us)
        return {"requests": len(s), "errors": self.errors, "throughput_rps": round(len(s) / self.elapsed_s, 1) if self.elapsed_s else None,
                "p50_us": round(pct(s, 50), 1), "p90_us": round(pct(s, 90), 1), "p99_us": round(pct(s, 99), 1),
                "max_us": round(s[-1], 1) if s else None}


# -- 1. sequential, raw keep-alive connection ------------------------------------------------------------------


def content_length(head: bytes) -> int:
    """The Content-Length of a response head (status line and headers, without the blank line); 0 when absent."""
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return length


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One response from an asyncio stream (Content-Length bodies only): status code and body."""
    head = await reader.readuntil(b"\r\n\r\n")
    body = await reader.readexactly(content_length(head[:-4]))
    return int(head[9:12]), body


class RawConnection:
    """A minimal HTTP/1.1 keep-alive client (Content-Length responses only)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""

    def request(self, path: str, body: bytes) -> bytes:
        return (b"POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                % (path.encode(), self.port, len(body))) + body

    def roundtrip(self, raw: bytes) -> tuple[int, bytes]:
        sock, buf = self.sock, self.buf
        sock.sendall(raw)
        while (end := buf.find(b"\r\n\r\n")) < 0:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("server closed the connection")
            buf += chunk
        head = buf[:end]
        status = int(head[9:12])
        length = content_length(head)
        rest = buf[end + 4:]
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("server closed the connection")
            rest += chunk
        self.buf = rest[length:]
        return status, rest[:length]

    def close(self) -> None:
        self.sock.close()


def sequential(servers: dict[str, Server], ticks: Ticks, blocks: int, block: int, warmup: int, max_s: float) -> dict[str, Any]:
    conns = {path: RawConnection(srv.port) for path, srv in servers.items()}
    stats = {path: Stats() for path in servers}
    net_ns: list[int] = []
    try:
        for path, conn in conns.items():  # warm-up: connections, caches, the first ticks of the markets
            for _ in range(warmup):
                conn.roundtrip(conn.request(path, ticks.body(f"seq{path}")))
        deadline = time.monotonic() + max_s
        gc.disable()
        try:
            for _ in range(blocks):
                for path, conn in conns.items():  # alternating blocks: both endpoints see the same host conditions
                    reqs = [conn.request(path, ticks.body(f"seq{path}")) for _ in range(block)]
                    lat, st = [], stats[path]
                    t_block = time.perf_counter()
                    for raw in reqs:
                        t0 = time.perf_counter_ns()
                        status, body = conn.roundtrip(raw)
                        lat.append((time.perf_counter_ns() - t0) / 1e3)
                        if status != 200:
                            st.errors += 1
                        elif path == PROCESS and len(net_ns) < 20000:
                            net_ns.append(int(json.loads(body)["processing_time_ns"]))
                    st.elapsed_s += time.perf_counter() - t_block
                    st.latencies_us.extend(lat)
                if time.monotonic() > deadline:
                    break
        finally:
            gc.enable()
    finally:
        for conn in conns.values():
            conn.close()
    out = {path: st.summary() for path, st in stats.items()}
    net_ns.sort()
    out["network_time_ns"] = {"p50": pct([float(x) for x in net_ns], 50), "p99": pct([float(x) for x in net_ns], 99)}
    return out


# -- 2. concurrency ---------------------------------------------------------------------------------------------


async def run_workers(conc: int, total: int, max_s: float, send: Any, st: Stats) -> None:
    """``conc`` workers, each sending its market's ticks one at a time, until ``total`` requests or ``max_s``."""
    issued = 0
    deadline = time.perf_counter() + max_s

    async def worker(w: int) -> None:
        nonlocal issued
        while issued < total and time.perf_counter() < deadline:
            issued += 1
            t0 = time.perf_counter_ns()
            status = await send(w)
            st.latencies_us.append((time.perf_counter_ns() - t0) / 1e3)
            if status != 200:
                st.errors += 1

    t_start = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(conc)))
    st.elapsed_s = time.perf_counter() - t_start


async def httpx_concurrent(url: str, path: str, conc: int, total: int, max_s: float, ticks: Ticks) -> dict[str, Any]:
    """httpx.AsyncClient, one client (one keep-alive connection) per worker.

    One client per worker rather than one shared pool of ``conc`` connections: httpx's
    shared pool itself becomes the bottleneck at concurrency 64 (measured: ~2x fewer requests/s).
    """
    headers = {"Content-Type": "application/json"}
    clients = [httpx.AsyncClient(base_url=url, limits=httpx.Limits(max_connections=1), timeout=30.0) for _ in range(conc)]
    markets = [f"h{conc}w{w}{path}" for w in range(conc)]
    try:
        for _ in range(3):  # warm-up: open every connection
            await asyncio.gather(*(c.post(path, content=ticks.body(m), headers=headers) for c, m in zip(clients, markets, strict=True)))

        async def send(w: int) -> int:
            r = await clients[w].post(path, content=ticks.body(markets[w]), headers=headers)
            return r.status_code

        st = Stats()
        await run_workers(conc, total, max_s, send, st)
    finally:
        for c in clients:
            await c.aclose()
    return st.summary()


async def raw_concurrent(port: int, path: str, conc: int, total: int, max_s: float, ticks: Ticks) -> dict[str, Any]:
    """The same load from a minimal asyncio client (raw HTTP/1.1 on asyncio streams): what the servers sustain."""
    conns = [await asyncio.open_connection("127.0.0.1", port) for _ in range(conc)]
    markets = [f"r{conc}w{w}{path}" for w in range(conc)]
    head = b"POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\nContent-Length: " % (path.encode(), port)

    async def send(w: int) -> int:
        reader, writer = conns[w]
        body = ticks.body(markets[w])
        writer.write(head + b"%d\r\n\r\n" % len(body) + body)
        status, _ = await read_answer(reader)
        return status

    try:
        for _ in range(WARM_ROUNDS):
            await asyncio.gather(*(send(w) for w in range(conc)))
        st = Stats()
        await run_workers(conc, total, max_s, send, st)
    finally:
        for _, writer in conns:
            writer.close()
    return st.summary()


def process_cpu_s(pid: int) -> tuple[float, float]:
    """CPU time (user, system; s) a process has used so far, from ``/proc/<pid>/stat``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def run_async(coro: Any) -> Any:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


# -- host, report ----------------------------------------------------------------------------------------------


def host_info() -> dict[str, Any]:
    model = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    versions = {}
    for pkg in ("fastapi", "starlette", "uvicorn", "uvloop", "httptools", "pydantic", "httpx"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[pkg] = metadata.version(pkg)
    return {"cpu": model, "logical_cpus": os.cpu_count(), "usable_cpus": len(os.sched_getaffinity(0)),
            "load_avg_1m_at_start": round(os.getloadavg()[0], 2), "kernel": platform.release(),
            "python": platform.python_version(), "packages": versions}


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def _concurrency_table(title: str, per_level: dict[Any, Any], ratios: dict[Any, Any], client: str) -> list[str]:
    """Markdown lines of one concurrency table and its throughput ratios (with server CPU per request where measured)."""
    cpu = all("server_cpu_us_per_request" in s for per in per_level.values() for s in per.values())
    head = ("| endpoint | concurrency | requests | errors | req/s | p50 µs | p99 µs |"
            + (" server CPU µs/request | of it in the kernel (system) |" if cpu else ""))
    lines = [title, "", head, "|---|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if cpu else "")]
    for c, per in per_level.items():
        for name in (PROCESS, EMPTY):
            s = per[name]
            lines.append(f"| `{name}` | {c} | {s['requests']} | {s['errors']} | {s['throughput_rps']} | {s['p50_us']} | {s['p99_us']} |"
                         + (f" {s['server_cpu_us_per_request']} | {s.get('server_system_cpu_us_per_request', '')} |" if cpu else ""))
    lines += ["", f"Throughput ratio `/neural/process` ÷ empty ({client}): " + ", ".join(f"c={c}: {ratios[c]}" for c in per_level)]
    if cpu:
        lines += ["", "Server CPU per request, empty ÷ `/neural/process` (requests per CPU-second the service serves, relative "
                  "to the empty endpoint; what throughput becomes once the server, not the client, is the limit): "
                  + ", ".join(f"c={c}: {per[EMPTY]['server_cpu_us_per_request'] / per[PROCESS]['server_cpu_us_per_request']:.3f}"
                              for c, per in per_level.items())]
    return lines


def markdown(res: dict[str, Any]) -> str:
    seq, h = res["sequential"], res["host"]
    p, e = seq[PROCESS], seq[EMPTY]
    lines = [
        f"Run {res['date']} — `{res['command']}`",
        "",
        f"Host: {h['cpu']}, {h['usable_cpus']} usable of {h['logical_cpus']} logical CPUs, load average {h['load_avg_1m_at_start']} "
        f"at start; Linux {h['kernel']}, Python {h['python']}, "
        + ", ".join(f"{k} {v}" for k, v in h["packages"].items()) + ".",
        "",
        f"Service model: `{res['model_version']}`.",
        "",
        "Sequential, one keep-alive connection (raw-socket client), alternating blocks:",
        "",
        "| endpoint | requests | p50 µs | p90 µs | p99 µs | max µs | req/s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in ((PROCESS, p), (EMPTY, e)):
        lines.append(f"| `{name}` | {s['requests']} | {s['p50_us']} | {s['p90_us']} | {s['p99_us']} | {s['max_us']} | {s['throughput_rps']} |")
    r = res["ratios"]
    lines += [
        "",
        f"- `/neural/process` p50 ÷ empty p50 = **{r['p50_ratio']}** (target ≤ {TARGET_RATIO}: **{verdict(r['p50_ratio'] <= TARGET_RATIO)}**)",
        f"- `/neural/process` sequential p99 = **{p['p99_us'] / 1000:.3f} ms** (target ≤ {TARGET_P99_MS} ms: "
        f"**{verdict(p['p99_us'] / 1000 <= TARGET_P99_MS)}**)",
        f"- network time inside the service (`processing_time_ns` of the answers): p50 {seq['network_time_ns']['p50'] / 1000:.1f} µs, "
        f"p99 {seq['network_time_ns']['p99'] / 1000:.1f} µs",
        "",
    ]
    lines += _concurrency_table("Concurrency (`httpx.AsyncClient`, one connection per worker; latency as seen by the client):",
                                res["concurrency"], r["throughput_ratio"], "httpx")
    lines.append("")
    lines += _concurrency_table("Same load from the minimal asyncio client (raw sockets, one connection per worker):",
                                res["concurrency_raw"], r["throughput_ratio_raw"], "raw")
    lines += ["", f"Service ticks processed in the run: {res['service_ticks_total']:.0f}; exit codes after SIGTERM: "
              + ", ".join(f"{k} {v}" for k, v in res["exit_codes"].items()) + "."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="/neural/process vs an empty endpoint on the same server stack")
    ap.add_argument("--blocks", type=int, default=10, help="alternating sequential blocks per endpoint (default 10)")
    ap.add_argument("--block", type=int, default=1000, help="requests per sequential block (default 1000)")
    ap.add_argument("--warmup", type=int, default=1000, help="sequential warm-up requests per endpoint (default 1000)")
    ap.add_argument("--concurrency", default="1,8,64", help="concurrency levels (default 1,8,64)")
    ap.add_argument("--requests", type=int, default=5000, help="requests per endpoint and concurrency level (default 5000)")
    ap.add_argument("--max-seconds", type=float, default=20.0, help="time cap per measurement (default 20)")
    ap.add_argument("--untrained", action="store_true",
                    help="skip the first-run training of the default model (serve the seed's untrained network)")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="a config key of the started service, e.g. performance.cpu_wakeup_latency_us=0 (repeatable)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)
    levels = [int(x) for x in args.concurrency.split(",")]

    command = shlex.join([".venv/bin/python", "benchmarks/http_bench.py", *(argv if argv is not None else sys.argv[1:])])
    res: dict[str, Any] = {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"), "command": command, "host": host_info()}
    with tempfile.TemporaryDirectory(prefix="http-bench-") as tmp:
        work = Path(tmp)
        env = service_env(work / "state", bootstrap=not args.untrained, extra=override_env(args.set))
        service = start("service", ["-m", "cerebellar_norse.cli"], work, env)
        empty = start("empty", [str(REPO_ROOT / "benchmarks" / "empty_app.py")], work, env)
        try:
            service.wait_ready("/health")
            empty.wait_ready("/openapi.json")
            res["model_version"] = httpx.get(f"{service.url}/health", timeout=5).json().get("model_version")
            servers = {PROCESS: service, EMPTY: empty}
            ticks = Ticks()
            print("sequential ...", file=sys.stderr)
            res["sequential"] = sequential(servers, ticks, args.blocks, args.block, args.warmup, args.max_seconds * 2)
            res["concurrency"] = {}
            res["concurrency_raw"] = {}
            for c in levels:
                print(f"concurrency {c} ...", file=sys.stderr)
                per: dict[str, Any] = {}
                raw: dict[str, Any] = {}
                for path, srv in servers.items():
                    per[path] = run_async(httpx_concurrent(srv.url, path, c, args.requests, args.max_seconds, ticks))
                    user0, sys0 = process_cpu_s(srv.proc.pid)
                    raw[path] = run_async(raw_concurrent(srv.port, path, c, args.requests, args.max_seconds, ticks))
                    served = raw[path]["requests"] + WARM_ROUNDS * c
                    user1, sys1 = process_cpu_s(srv.proc.pid)
                    raw[path]["server_cpu_us_per_request"] = round(1e6 * (user1 - user0 + sys1 - sys0) / served, 1)
                    raw[path]["server_system_cpu_us_per_request"] = round(1e6 * (sys1 - sys0) / served, 1)
                res["concurrency"][c] = per
                res["concurrency_raw"][c] = raw
            metrics = httpx.get(f"{service.url}/metrics", timeout=5).text
        finally:
            codes = {s.name: s.stop() for s in (service, empty)}
        res["exit_codes"] = codes
    res["service_ticks_total"] = next((float(line.split()[1]) for line in metrics.splitlines()
                                       if line.startswith("cerebellar_norse_ticks_total ")), None)
    seq = res["sequential"]
    res["ratios"] = {
        "p50_ratio": round(seq[PROCESS]["p50_us"] / seq[EMPTY]["p50_us"], 3),
        "p99_ratio": round(seq[PROCESS]["p99_us"] / seq[EMPTY]["p99_us"], 3),
        "throughput_ratio": {c: round(per[PROCESS]["throughput_rps"] / per[EMPTY]["throughput_rps"], 3)
                             for c, per in res["concurrency"].items()},
        "throughput_ratio_raw": {c: round(per[PROCESS]["throughput_rps"] / per[EMPTY]["throughput_rps"], 3)
                                 for c, per in res["concurrency_raw"].items()},
    }
    res["targets"] = {"p50_ratio_max": TARGET_RATIO, "p50_ratio_met": res["ratios"]["p50_ratio"] <= TARGET_RATIO,
                      "p99_ms_max": TARGET_P99_MS, "p99_met": seq[PROCESS]["p99_us"] / 1000 <= TARGET_P99_MS}
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2) + "\n")
    print(markdown(res))
    errors = sum(s["errors"] for s in seq.values() if isinstance(s, dict) and "errors" in s)
    errors += sum(s["errors"] for key in ("concurrency", "concurrency_raw") for per in res[key].values() for s in per.values())
    return 1 if errors or any(code not in (0, None) for code in codes.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
