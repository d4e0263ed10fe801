#!/usr/bin/env python3
"""Throughput at concurrency N with ``wrk``: ``POST /neural/process`` of the service vs the empty endpoint.

A load generator written in C, so that the client is not the limit on a small host: ``wrk``
(Debian's ``wrk`` package) with N threads of one keep-alive connection each, each sending its
own market's ticks in time order from a Lua script (a new range of timestamps every round, so
no tick is refused as older). The servers are started as ``benchmarks/http_bench.py`` starts
them: the service on its built-in default config with the untrained network of the seed (a
temporary state dir), and ``benchmarks/empty_app.py``. Rounds alternate between the two; each
reports requests per second, non-2xx answers and the server's CPU time per request (user and
system, from ``/proc/<pid>/stat``). The ratio is the service's throughput ÷ the empty
endpoint's in the same round (target: 2 at concurrency 8).

    .venv/bin/python benchmarks/wrk_bench.py [--rounds 3] [--seconds 5] [--connections 8] [--json out.json]

``--source DIR`` serves the service from another checkout (an earlier revision, to compare).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import http_bench as hb  # (the servers, started the same way)

TARGET = 2.0
TICKS_LUA = """
local counter = 0
function setup(thread)
  thread:set("id", counter)
  counter = counter + 1
end
function init(args)
  k = 0
  market = "W" .. id
  path = args[1]
  base = tonumber(args[2])
end
function request()
  k = k + 1
  local body = string.format('{"price":%.2f,"volume":%.1f,"timestamp":%d,"market_id":"%s"}',
      100.0 + 0.25 * ((k * 7) % 9) - 1.0, 1000.0 + (k % 13) * 10.0, base + k, market)
  return wrk.format("POST", path, {["Content-Type"]="application/json"}, body)
end
"""


def one_round(srv: hb.Server, path: str, script: Path, base_ms: int, seconds: float, conns: int) -> dict[str, Any]:
    """One ``wrk`` run against ``srv``: req/s, requests, non-2xx answers, server CPU µs per request."""
    u0, s0 = hb.process_cpu_s(srv.proc.pid)
    out = subprocess.run(["wrk", f"-t{conns}", f"-c{conns}", f"-d{seconds:g}s", "-s", str(script), srv.url, "--",
                          path, str(base_ms)], capture_output=True, text=True, check=True).stdout
    u1, s1 = hb.process_cpu_s(srv.proc.pid)
    rate = re.search(r"Requests/sec:\s+([\d.]+)", out)
    count = re.search(r"(\d+) requests in", out)
    if rate is None or count is None:
        raise SystemExit(f"cannot read wrk's output:\n{out}")
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    n = int(count.group(1))
    return {"req_s": float(rate.group(1)), "requests": n, "non_2xx": int(bad.group(1)) if bad else 0,
            "socket_errors": errors.group(1) if errors else "",
            "cpu_us": 1e6 * ((u1 - u0) + (s1 - s0)) / max(n, 1), "system_us": 1e6 * (s1 - s0) / max(n, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=5.0, help="length of each wrk run (s)")
    p.add_argument("--connections", type=int, default=8, help="wrk threads, one connection each")
    p.add_argument("--source", type=Path, default=None, help="serve the service from this checkout")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    if shutil.which("wrk") is None:
        print("wrk is not installed (apt-get install wrk)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="wrk-bench-"))
    script = work / "ticks.lua"
    script.write_text(TICKS_LUA)
    env = hb.service_env(work / "state")
    root = hb.REPO_ROOT
    if args.source is not None:
        hb.REPO_ROOT = args.source.resolve()  # the service's working directory: its package is imported from there
        env["PYTHONPATH"] = str(hb.REPO_ROOT)
    service = hb.start("service", ["-m", "cerebellar_norse.cli"], work, env)
    hb.REPO_ROOT = root
    empty = hb.start("empty", [str(root / "benchmarks" / "empty_app.py")], work, hb.service_env(work / "empty-state"))
    rounds: list[dict[str, Any]] = []
    base = 1_640_995_200_000
    try:
        service.wait_ready("/health")
        empty.wait_ready("/docs")
        for k in range(args.rounds + 1):  # the first round of each warms the servers up, and is not reported
            base += 10**10
            s = one_round(service, hb.PROCESS, script, base, args.seconds, args.connections)
            e = one_round(empty, hb.EMPTY, script, base, args.seconds, args.connections)
            if k == 0:
                continue
            ratio = s["req_s"] / e["req_s"]
            rounds.append({"service": s, "empty": e, "ratio": ratio})
            print(f"round {k}: service {s['req_s']:.0f} req/s, {s['cpu_us']:.1f} µs CPU/request (system "
                  f"{s['system_us']:.1f}), non-2xx {s['non_2xx']} | empty {e['req_s']:.0f} req/s, {e['cpu_us']:.1f} µs "
                  f"(system {e['system_us']:.1f}), non-2xx {e['non_2xx']} | ratio {ratio:.3f}", flush=True)
    finally:
        codes = service.stop(), empty.stop()
    ratios = [r["ratio"] for r in rounds]
    median = statistics.median(ratios)
    print(f"throughput ÷ empty at concurrency {args.connections}: median {median:.3f} (range {min(ratios):.3f}–"
          f"{max(ratios):.3f}; target {TARGET}: {'met' if median >= TARGET else 'not met'})")
    print(f"exit codes after SIGTERM: service {codes[0]}, empty {codes[1]}")
    if args.json is not None:
        args.json.write_text(json.dumps({"rounds": rounds, "median_ratio": median, "host": hb.host_info(),
                                         "connections": args.connections, "seconds": args.seconds}, indent=2))
    return 0 if codes == (0, 0) and all(r["service"]["non_2xx"] == 0 for r in rounds) else 1


if __name__ == "__main__":
    raise SystemExit(main())
