"""``cerebellar-norse debug-bundle``: one archive with what a support request needs.

The archive (``.tar.gz``, written atomically) holds:

* ``config.json`` – the effective configuration (the API token masked) and the
  consistency and host problems found for it;
* ``versions.json`` – package, Python, torch, norse, numba, numpy versions, host facts;
* ``models.json`` – stored models, the active one, and the result of verifying each
  manifest and the market state file (``--verify-data``);
* ``models/active_evaluation.json`` – the stored evaluation (validation and test scores,
  edge) of the active model;
* from the running service at ``--url`` (``--url none`` leaves it out):
  ``service/health.json``, ``service/metrics.txt``, ``service/neural_metrics.json``, and
  with the config's token ``service/config.json`` (its effective config, redacted),
  ``service/backtrace.json`` and ``.txt`` (every thread's stack),
  ``service/markets.json`` (the busiest markets) and ``service/markets/NN-<id>.json``
  (the state of each of them);
* ``logs/application.log`` – the last lines of ``[logging] file`` when configured;
* ``summary.json`` – every part with ``ok``, ``failed: why`` or ``skipped: why``.

A part fails when the service cannot be reached (the parts after it are then skipped)
or answers with an unexpected status (401: the config's token is not the service's);
the archive is still written, the failures are named on stderr and the exit code is 1.
No file holds a secret: the config's token is redacted where it belongs and, should it
appear anywhere else (a log line), replaced by ``***`` in every file.
"""

from __future__ import annotations

import contextlib
import io
import json
import platform
import re
import sys
import tarfile
import time
from collections import deque
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from .. import __version__
from ..config import Config, consistency_problems
from ..httpcalls import bearer, call_failure, request_errors
from ..storage import atomic_write_bytes
from .debugtools import REDACTED, config_token, format_stacks, market_state_path, redacted_config
from .timelines import ascii_timeline

LOG_TAIL_LINES = 2000


def _versions() -> dict[str, Any]:
    out: dict[str, Any] = {"cerebellar_norse": __version__, "python": platform.python_version(),
                           "platform": platform.platform(), "machine": platform.machine()}
    for dist in ("torch", "norse", "numba", "numpy", "fastapi", "uvicorn", "pydantic"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _config_section(cfg: Config) -> dict[str, Any]:
    from ..hostcheck import gather_host_facts, host_problems

    data = redacted_config(cfg)
    host = gather_host_facts()
    return {"config": data,
            "problems": [str(p) for p in consistency_problems(cfg) + host_problems(cfg, host)],
            "host": {"ram_total_bytes": host.ram_total_bytes, "ram_available_bytes": host.ram_available_bytes,
                     "cuda_available": host.cuda_available, "gpu_memory_total_bytes": host.gpu_memory_total_bytes,
                     "gpu_name": host.gpu_name}}


def _models_section(cfg: Config) -> dict[str, Any]:
    from ..training.checkpoints import ModelStore, verify_tree

    store = ModelStore(Path(cfg.paths.state_dir))
    ok, problems = verify_tree(Path(cfg.paths.state_dir)) if Path(cfg.paths.state_dir).exists() else ([], [])
    return {"state_dir": str(cfg.paths.state_dir), "versions": store.versions(), "active": store.active_version(),
            "verified": ok, "problems": problems}


BUSIEST_MARKETS = 5  # state dumps of this many markets (most ticks seen) go into the bundle
SLOW_REQUESTS = 20  # timelines of this many of the slowest recent requests go into the bundle
_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")


@dataclass
class Parts:
    """The bundle's files and, per part, what happened: ``ok``, ``failed: why`` or ``skipped: why``."""

    files: dict[str, bytes] = field(default_factory=dict)
    status: dict[str, str] = field(default_factory=dict)

    @property
    def failed(self) -> dict[str, str]:
        """Failed parts and why."""
        return {k: v[len("failed: "):] for k, v in self.status.items() if v.startswith("failed: ")}


def _service_parts(url: str, token: str | None, timeout_s: float, parts: Parts) -> None:
    """Snapshot the running service; a part fails when the service gives no (acceptable) answer.

    After a part finds the service unreachable, the remaining parts are skipped rather
    than each waiting for its own timeout.
    """
    import httpx

    base = url.rstrip("/")
    auth = bearer(token)
    unreachable: str | None = None

    def get(name: str, path: str, guarded: bool = False, ok: tuple[int, ...] = (200,)) -> bytes | None:
        nonlocal unreachable
        if unreachable is not None:
            parts.status[name] = f"skipped: {unreachable}"
            return None
        try:
            r = httpx.get(base + path, headers=auth if guarded else {}, timeout=timeout_s)
        except request_errors() as exc:  # no answer, no URL, a token no header carries
            unreachable = f"service at {url} unreachable"
            why = call_failure(url, exc, whose_token="the config's server.api_token", advice=False)
            parts.status[name] = f"failed: {why}"
            return None
        if r.status_code not in ok:
            why = f"GET {path} answered {r.status_code}"
            if r.status_code == 401:
                why += " (the config's server.api_token is not the service's token)"
            parts.status[name] = f"failed: {why}"
            parts.files[name + ".error"] = r.content
            return None
        parts.files[name] = r.content
        parts.status[name] = "ok"
        return r.content

    get("service/health.json", "/health", ok=(200, 503))  # a service that is not ready says why: worth having
    get("service/metrics.txt", "/metrics")
    get("service/neural_metrics.json", "/neural/metrics")
    get("service/config.json", "/debug/config", guarded=True)
    stacks = get("service/backtrace.json", "/debug/backtrace", guarded=True)
    if stacks is not None:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            parts.files["service/backtrace.txt"] = format_stacks(json.loads(stacks)["threads"]).encode()
    slow = get("service/slow_requests.json", f"/debug/requests?slow=true&limit={SLOW_REQUESTS}", guarded=True)
    if slow is not None:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            parts.files["service/slow_requests.txt"] = "\n\n".join(
                ascii_timeline(tl) for tl in json.loads(slow)["requests"]).encode()
    listing = get("service/markets.json", f"/debug/markets?limit={BUSIEST_MARKETS}", guarded=True)
    if listing is None:
        return
    try:
        markets = [m["market_id"] for m in json.loads(listing)["markets"]]
    except (ValueError, KeyError, TypeError):
        parts.status["service/markets.json"] = "failed: not a market listing"
        return
    for rank, market in enumerate(markets, start=1):
        get(f"service/markets/{rank:02d}-{_SAFE_NAME.sub('_', market)[:48]}.json", market_state_path(market), guarded=True)


def _log_tail(cfg: Config) -> bytes | None:
    if cfg.logging.file is None or not Path(cfg.logging.file).is_file():
        return None
    with open(cfg.logging.file, "rb") as fh:
        return b"".join(deque(fh, maxlen=LOG_TAIL_LINES))


def _active_model_evaluation(cfg: Config) -> dict[str, Any] | None:
    """The stored evaluation (validation and test scores, edge) of the active model, if there is one."""
    from ..training.checkpoints import ModelStore

    store = ModelStore(Path(cfg.paths.state_dir))
    active = store.active_version()
    if active is None or active not in store.versions():
        return None
    try:
        metrics = store.load(active).metrics
    except Exception as exc:  # a corrupt model: say so in the bundle
        return {"model_version": active, "error": f"{type(exc).__name__}: {exc}"}
    keep = {k: v for k, v in metrics.items() if k != "history"}
    return {"model_version": active, **keep}


def _scrub(files: dict[str, bytes], secrets: list[str]) -> int:
    """Replace every secret in every file by ``***``; returns how many files held one."""
    hits = 0
    for name, data in files.items():
        new = data
        for secret in secrets:
            for form in {secret.encode(), json.dumps(secret)[1:-1].encode()}:
                new = new.replace(form, REDACTED.encode())
        if new != data:
            files[name] = new
            hits += 1
    return hits


def collect(cfg: Config, url: str | None, timeout_s: float = 2.0) -> Parts:
    """Every part of the bundle, with what happened to each."""
    parts = Parts()
    for name, make in (("config.json", lambda: _config_section(cfg)), ("versions.json", _versions),
                       ("models.json", lambda: _models_section(cfg)), ("models/active_evaluation.json",
                                                                        lambda: _active_model_evaluation(cfg))):
        try:
            value = make()
        except Exception as exc:  # one broken part must not cost the others
            parts.status[name] = f"failed: {type(exc).__name__}: {exc}"
            continue
        if value is None:
            parts.status[name] = "skipped: no active model"
            continue
        parts.files[name] = json.dumps(value, indent=2, default=str).encode()
        parts.status[name] = "ok"
    if url:
        _service_parts(url, config_token(cfg), timeout_s, parts)
    else:
        parts.status["service"] = "skipped: --url none"
    tail = _log_tail(cfg)
    if tail is not None:
        parts.files["logs/application.log"] = tail
        parts.status["logs/application.log"] = "ok"
    else:
        parts.status["logs/application.log"] = "skipped: no logging.file"
    token = config_token(cfg)
    scrubbed = _scrub(parts.files, [token] if token else [])
    parts.files["summary.json"] = json.dumps({"created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "url": url,
                                              "parts": parts.status, "failed": sorted(parts.failed),
                                              "secrets_scrubbed_from_files": scrubbed}, indent=2).encode()
    return parts


def archive(files: dict[str, bytes]) -> bytes:
    """The files as a ``.tar.gz`` under ``cerebellar-norse-debug/``."""
    buf = io.BytesIO()
    now = int(time.time())
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in sorted(files.items()):
            info = tarfile.TarInfo(f"cerebellar-norse-debug/{name}")
            info.size = len(data)
            info.mtime = now
            info.mode = 0o640
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def build_bundle(cfg: Config, url: str | None, timeout_s: float = 2.0) -> bytes:
    """The archive's bytes (``.tar.gz``)."""
    return archive(collect(cfg, url, timeout_s).files)


def cmd_debug_bundle(cfg: Config, output: Path | None, url: str | None) -> int:
    """Write the bundle (default ``<state_dir>/debug-bundle-<UTC time>.tar.gz``) and print its path.

    The archive is written whatever failed; each failed part is named on stderr, and the
    exit code is 1 when any part failed (the service could not be reached, refused the
    token, …), 0 when every part is in.
    """
    path = output or Path(cfg.paths.state_dir) / time.strftime("debug-bundle-%Y%m%dT%H%M%SZ.tar.gz", time.gmtime())
    parts = collect(cfg, url)
    atomic_write_bytes(path, archive(parts.files))
    print(path)
    failed = parts.failed
    for name, why in failed.items():
        print(f"cerebellar-norse: debug-bundle: {name}: {why}", file=sys.stderr)
    if failed:
        print(f"cerebellar-norse: debug-bundle: {len(failed)} part(s) failed; {path} holds the rest "
              "(--url none leaves the service out)", file=sys.stderr)
        return 1
    return 0
