"""``cerebellar-norse debug-bundle``: one archive with what a support request needs.

The archive (``.tar.gz``, written atomically) holds:

* ``config.json`` – the effective configuration (the API token masked) and the
  consistency and host problems found for it;
* ``versions.json`` – package, Python, torch, norse, numba, numpy versions, host facts;
* ``models.json`` – stored models, the active one, and the result of verifying each
  manifest and the market state file (``--verify-data``);
* ``service/health.json``, ``service/metrics.txt``, ``service/neural_metrics.json`` –
  fetched from a running service when ``--url`` answers (skipped otherwise);
* ``logs/application.log`` – the last lines of ``[logging] file`` when configured.
"""

from __future__ import annotations

import io
import json
import platform
import tarfile
import time
from collections import deque
from importlib import metadata
from pathlib import Path
from typing import Any

from .. import __version__
from ..config import Config, consistency_problems
from ..storage import atomic_write_bytes

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

    data = cfg.model_dump(mode="json")
    if data["server"].get("api_token") is not None:
        data["server"]["api_token"] = "***"
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


def _service_files(url: str, timeout_s: float) -> dict[str, bytes]:
    import httpx

    files: dict[str, bytes] = {}
    for path, name in (("/health", "service/health.json"), ("/metrics", "service/metrics.txt"),
                       ("/neural/metrics", "service/neural_metrics.json")):
        try:
            r = httpx.get(url.rstrip("/") + path, timeout=timeout_s)
            files[name] = r.content
        except httpx.HTTPError as exc:
            files[name + ".error"] = f"{type(exc).__name__}: {exc}\n".encode()
    return files


def _log_tail(cfg: Config) -> bytes | None:
    if cfg.logging.file is None or not Path(cfg.logging.file).is_file():
        return None
    with open(cfg.logging.file, "rb") as fh:
        return b"".join(deque(fh, maxlen=LOG_TAIL_LINES))


def build_bundle(cfg: Config, url: str | None, timeout_s: float = 2.0) -> bytes:
    """The archive's bytes (``.tar.gz``)."""
    files: dict[str, bytes] = {
        "config.json": json.dumps(_config_section(cfg), indent=2).encode(),
        "versions.json": json.dumps(_versions(), indent=2).encode(),
        "models.json": json.dumps(_models_section(cfg), indent=2).encode(),
    }
    if url:
        files.update(_service_files(url, timeout_s))
    tail = _log_tail(cfg)
    if tail is not None:
        files["logs/application.log"] = tail
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


def cmd_debug_bundle(cfg: Config, output: Path | None, url: str | None) -> int:
    """Write the bundle (default ``<state_dir>/debug-bundle-<UTC time>.tar.gz``) and print its path."""
    path = output or Path(cfg.paths.state_dir) / time.strftime("debug-bundle-%Y%m%dT%H%M%SZ.tar.gz", time.gmtime())
    atomic_write_bytes(path, build_bundle(cfg, url))
    print(path)
    return 0
