#!/usr/bin/env python3
"""Network kernel benchmark: fused kernel vs the Norse reference, recorded in docs/benchmarks.md.

Runs ``cerebellar-norse bench --json`` and ``cerebellar-norse crossval --json`` (as
subprocesses, exactly as an operator would) with the configuration of this process
(``--config`` and ``CEREBELLAR_NORSE_*`` environment overrides), then writes the figures
into the "Network kernel" section of ``docs/benchmarks.md``. Each run replaces only its
own block, keyed by ``performance.cpu_threads``, so the two runs of the record:

    .venv/bin/python benchmarks/network_bench.py
    CEREBELLAR_NORSE_PERFORMANCE__CPU_THREADS=2 .venv/bin/python benchmarks/network_bench.py

leave both blocks side by side; the rest of the file is kept as it is.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT = REPO_ROOT / "docs" / "benchmarks.md"
SECTION = "## Network kernel"

# Targets of the network kernel (default config, CPU).
TARGET_P99_US = 10.0  # single tick (batch 1), fused, p99 per tick
TARGET_SPEEDUP = 20.0  # fused vs the Norse reference, batch 1, p50
TARGET_BATCH_256_US = 2.0  # per tick, amortised over a batch of 256 (p50 of call time / 256)

INTRO = """\
The fused numba kernel against the Norse reference network: same weights, same synthetic
ticks, same process (the ratio is taken within one run). Latency is the wall time of one
staged backend step (`step_buffered`, the call the engine makes: encoder and network; no
validation, no HTTP) divided by the ticks in the batch: p50/p99 over repeated calls, each batch one tick of each of `batch` distinct
markets. `crossval` compares every state variable and output of both backends after every
batch of a 4-market interleaved stream (float64 gates with tolerance 1e-4; float32 is
reported beside it). Produced by `benchmarks/network_bench.py`; each block below is one
run of it, replaced when the script runs again with the same `cpu_threads`.
"""


def _cli(args: list[str], config: str | None) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "cerebellar_norse.cli", *(["--config", config] if config else []), *args]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, check=False, timeout=1800)
    if proc.returncode not in (0, 1) or not proc.stdout.strip():
        raise SystemExit(f"{' '.join(cmd[1:])} failed ({proc.returncode}): {proc.stderr.strip()}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    result["_exit_code"] = proc.returncode
    return result


def _git_revision(output: Path) -> str:
    """Short HEAD revision, flagged when tracked files (other than the report itself) differ from it."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True,
                             check=True).stdout.strip()
        exclude = [f":(exclude){output.resolve().relative_to(REPO_ROOT)}"] if output.resolve().is_relative_to(REPO_ROOT) else []
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", *exclude], cwd=REPO_ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{rev} (with uncommitted changes)" if dirty else rev


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    parts = [f"Python {platform.python_version()}"]
    for pkg in ("numba", "numpy", "torch", "norse"):
        with contextlib.suppress(PackageNotFoundError):
            parts.append(f"{pkg} {version(pkg)}")
    return ", ".join(parts)


def _verdict(ok: bool) -> str:
    return "**met**" if ok else "**not met**"


def _env_overrides() -> list[str]:
    return [f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("CEREBELLAR_NORSE_") and "__" in k]


def render_block(bench: dict[str, Any], cv: dict[str, Any], threads: int, command: str, config: str | None,
                 load: float | None = None, output: Path = DEFAULT_OUTPUT) -> str:
    """The Markdown block of one run."""
    net, host = bench["network"], bench["host"]
    fused, ref = bench["fused"], bench["reference"]["batch_1"]
    f1, f256 = fused["batch_1"], fused["batch_256"]
    speedup = bench["speedup_vs_reference"]
    lines = [
        f"### cpu_threads = {threads}" + (" (default config)" if threads == 1 and not config else ""),
        "",
        f"- Command: `{command}`",
        f"- Configuration: {config or 'built-in default'}"
        + (f" with {', '.join(f'`{e}`' for e in _env_overrides())}" if _env_overrides() else "")
        + f"; network {net['mossy']} mossy, {net['granule']} granule, {net['purkinje']} Purkinje, {net['dcn']} DCN, "
          f"{net['steps_per_tick']} steps per tick, {net['precision']}; {net['spikes_per_tick']:.0f} spikes per tick (batch 1)",
        f"- Host: {host['processor']}, {host['cpus']} logical CPUs ({host['machine']}); {_versions()}"
        + (f"; 1-minute load average {load:.2f} when the run started" if load is not None else "")
        + (f"; run at niceness {os.nice(0)}" if hasattr(os, "nice") and os.nice(0) != 0 else ""),
        f"- Measured {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')} at revision {_git_revision(output)}",
    ]
    if load is not None and load > 0.5 * (host["cpus"] or 1):
        lines.append("- The host was shared with other work during this run (load average above): other processes "
                     "compete for the same cores and add to these latencies, so a quiet host should measure the same or less.")
        if threads > 1 and threads >= (host["cpus"] or 1):
            lines.append(f"- With cpu_threads = {threads} on {host['cpus']} logical CPUs a parallel batch needs every core at "
                         "once; a core taken by another process stalls the whole batch (numba's parallel loop waits for "
                         "its slowest thread), so the parallel figures suffer most from a shared host.")
    lines += [
        "",
        "| Backend | Batch | p50 µs/tick | p99 µs/tick | Timed calls |",
        "|---|---:|---:|---:|---:|",
    ]
    for key in ("batch_1", "batch_16", "batch_256"):
        f = fused[key]
        note = " (parallel kernel)" if threads > 1 and int(key.removeprefix("batch_")) >= 32 else ""
        lines.append(f"| fused{note} | {key.removeprefix('batch_')} | {f['p50_us']:.2f} | {f['p99_us']:.2f} | {f['calls']} |")
    lines.append(f"| Norse reference | 1 | {ref['p50_us']:.1f} | {ref['p99_us']:.1f} | {ref['calls']} |")
    lines += ["", "| Throughput | Ticks/s | Neuron updates/s | Synaptic events/s |", "|---|---:|---:|---:|"]
    for label in ("batch_1", "batch_256"):
        t = bench[f"throughput_{label}"]
        lines.append(f"| fused, batch {label.removeprefix('batch_')} (p50) | {t['ticks_per_s']:,.0f} | "
                     f"{t['neuron_updates_per_s']:.2e} | {t['synaptic_events_per_s']:.2e} |")
    lines += [
        "",
        "Neuron updates are (granule + Purkinje + DCN + readout cells) × steps per tick; synaptic",
        "events are the mossy→granule and mossy→DCN inputs plus the spike-driven parallel-fibre",
        "fan-out per tick (the `bench` command's definitions).",
        "",
        "| Target | Measured | Verdict |",
        "|---|---|---|",
        f"| single tick (batch 1) fused p99 ≤ {TARGET_P99_US:g} µs | {f1['p99_us']:.2f} µs | {_verdict(f1['p99_us'] <= TARGET_P99_US)} |",
        f"| fused ≥ {TARGET_SPEEDUP:g}× faster than the Norse reference (batch 1, p50) | {speedup:.0f}× | "
        f"{_verdict(speedup >= TARGET_SPEEDUP)} |",
        f"| batch of 256 ≤ {TARGET_BATCH_256_US:g} µs per tick amortised (p50; p99 {f256['p99_us']:.2f} µs) | "
        f"{f256['p50_us']:.2f} µs | {_verdict(f256['p50_us'] <= TARGET_BATCH_256_US)} |",
        "",
    ]
    lines += _crossval_lines(cv)
    return "\n".join(lines) + "\n"


def _crossval_lines(cv: dict[str, Any]) -> list[str]:
    f32 = cv.get("float32", {})
    out = [
        f"Cross-validation (`crossval --json --ticks {cv['ticks']}`, {cv['markets']} markets, tolerance {cv['tolerance']:g}): "
        + ("**pass**" if cv["passed"] else f"**FAIL**, first divergence {cv['first_divergence']}"),
        "",
        "| Precision | Granule | Purkinje | DCN | Outputs | Spike flips |",
        "|---|---:|---:|---:|---:|---:|",
    ]

    def row(label: str, diffs: dict[str, float], flips: dict[str, int]) -> str:
        d = [f"{diffs[k]:.2e}" for k in ("granule", "purkinje", "dcn", "outputs")]
        return f"| {label} | {' | '.join(d)} | {sum(flips.values())} |"

    out.append(row(f"{cv['precision']} (max abs diff, gate)", cv["max_abs_diff"], cv["spike_flips"]))
    if f32:
        out.append(row("float32 (max abs diff)", f32["max_abs_diff"], f32["spike_flips"]))
        out.append(row("float32 (before the first spike flip)", f32["max_abs_diff_before_first_spike_flip"], f32["spike_flips"]))
    return out


def _markers(threads: int) -> tuple[str, str]:
    return f"<!-- network-kernel:cpu_threads={threads}:start -->", f"<!-- network-kernel:cpu_threads={threads}:end -->"


def update_document(text: str, threads: int, block: str) -> str:
    """``text`` (the whole docs file, possibly empty) with this run's block in the Network kernel section."""
    if not text.strip():
        text = "# Benchmarks\n\nMeasured figures of cerebellar-norse; each section names its command and host.\n"
    if SECTION not in text:
        text = text.rstrip("\n") + f"\n\n{SECTION}\n\n"
    head, rest = text.split(SECTION, 1)
    nxt = re.search(r"^## ", rest, flags=re.MULTILINE)
    body, tail = (rest[:nxt.start()], rest[nxt.start():]) if nxt else (rest, "")
    found = list(re.finditer(
        r"<!-- network-kernel:cpu_threads=(\d+):start -->.*?<!-- network-kernel:cpu_threads=\1:end -->", body, flags=re.DOTALL))
    blocks = {int(m.group(1)): m.group(0) for m in found}
    notes = body[found[-1].end():].strip() if found else ""  # written by hand after the blocks: kept
    start, end = _markers(threads)
    blocks[threads] = f"{start}\n{block.rstrip()}\n{end}"
    section = f"{SECTION}\n\n{INTRO}\n" + "\n\n".join(blocks[k] for k in sorted(blocks)) + "\n"
    if notes:
        section += f"\n{notes}\n"
    return head + section + (f"\n{tail}" if tail else "")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0] if __doc__ else None)
    p.add_argument("--config", help="TOML configuration (default: built-in default)")
    p.add_argument("--ticks", type=int, default=2000, help="timed fused ticks per batch size (bench --ticks)")
    p.add_argument("--reference-ticks", type=int, default=200, help="timed reference ticks (bench --reference-ticks)")
    p.add_argument("--crossval-ticks", type=int, default=1000, help="ticks of each crossval run")
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="Markdown file to update")
    args = p.parse_args(argv)

    sys.path.insert(0, str(REPO_ROOT))
    from cerebellar_norse.config import load_checked_config

    cfg = load_checked_config(args.config)
    threads = cfg.performance.cpu_threads
    bench_args = ["bench", "--json", "--ticks", str(args.ticks), "--reference-ticks", str(args.reference_ticks)]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    if load is not None and load > 0.5 * (os.cpu_count() or 1):
        print(f"warning: load average {load:.2f} on {os.cpu_count()} CPUs: figures will be noisy", file=sys.stderr)
    bench = _cli(bench_args, args.config)
    cv = _cli(["crossval", "--json", "--ticks", str(args.crossval_ticks)], args.config)
    env = " ".join(_env_overrides())
    command = " ".join(filter(None, [env, "cerebellar-norse", f"--config {args.config}" if args.config else "", *bench_args]))
    block = render_block(bench, cv, threads, command, args.config, load, args.output)
    out: Path = args.output
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(update_document(out.read_text(encoding="utf-8") if out.exists() else "", threads, block), encoding="utf-8")
    print(block)
    print(f"written to {out}")
    return 0 if cv["_exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
