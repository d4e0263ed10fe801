"""numba's cache of compiled kernels (``NUMBA_CACHE_DIR``, ``/var/cache/cerebellar-norse/numba`` under systemd) on a
full file system: the service starts and serves, saying once that the cache cannot be written.

numba raised the failed write of a kernel's cache entry (ENOSPC) out of the kernel's first call: the start refused
every stored model as one that "cannot be served", then stopped with ``cannot start: writing failed at <state dir>:
No space left on device``, naming a state dir that had room. Skipped where a tmpfs cannot be mounted (not root).
"""

from __future__ import annotations

import contextlib
import errno
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "api"))
from live_helpers import BASE_TS, LiveServer, free_port, launch, mount_tmpfs, unmount

START_TIMEOUT_S = 300.0  # every kernel is compiled afresh (nothing can be cached): minutes on a loaded host


@pytest.fixture
def full_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on a tmpfs with no space left."""
    point = tmp_path / "cache"
    why = mount_tmpfs(point, "256k")
    if why is not None:
        pytest.skip(why)
    try:
        (point / "numba").mkdir()
        with open(point / "filler", "wb", buffering=0) as fh, contextlib.suppress(OSError):
            while True:
                fh.write(b"\xa5" * 4096)
        with pytest.raises(OSError) as full, open(point / "probe", "wb", buffering=0) as fh:
            fh.write(b"\xa5" * 4096)
        assert full.value.errno == errno.ENOSPC
        yield point / "numba"
    finally:
        unmount(point)


@pytest.mark.slow
def test_the_service_starts_and_serves_with_its_kernel_cache_on_a_full_disk(tmp_path: Path, full_dir: Path) -> None:
    port = free_port()
    log = tmp_path / "serve.log"
    srv = LiveServer(launch(tmp_path / "state", log, port, {"CEREBELLAR_NORSE_NUMBA_CACHE_BASE": str(full_dir)}), port,
                     tmp_path / "state", log)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert srv.proc.poll() is None, f"the service exited with {srv.proc.returncode}\n{srv.log()[-3000:]}"
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{srv.url}/health", timeout=1).status_code == 200:
                    break
            assert time.monotonic() < deadline, srv.log()[-3000:]
            time.sleep(0.2)
        r = httpx.post(f"{srv.url}/neural/process", json={"price": 100.0, "volume": 5.0, "timestamp": BASE_TS,
                                                           "market_id": "CACHE"}, timeout=30)
        assert r.status_code == 200, r.text
        assert srv.stop() == 0, srv.log()[-3000:]
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait()
    records = [json.loads(line) for line in srv.log().splitlines() if line.startswith("{")]
    said = [r for r in records if "compiled kernels' cache" in r["message"]]
    assert len(said) == 1 and said[0]["level"] == "WARNING", said
    assert str(full_dir) in said[0]["message"] and "errno 28 ENOSPC" in said[0]["message"], said
    assert not [r for r in records if r["level"] == "ERROR"], [r["message"] for r in records if r["level"] == "ERROR"]


def test_every_module_with_cached_kernels_installs_the_guard() -> None:
    """The guard is installed when ``cerebellar_norse.kernelcache`` is imported: a module compiling kernels with
    ``cache=True`` that does not import it could be the first to compile, unguarded."""
    package = Path(__file__).resolve().parents[2] / "cerebellar_norse"
    cached = [p for p in package.rglob("*.py") if "cache=True" in p.read_text(encoding="utf-8") and p.name != "kernelcache.py"]
    assert len(cached) >= 10, cached
    missing = [str(p.relative_to(package)) for p in cached
               if "from .. import kernelcache" not in p.read_text(encoding="utf-8")]
    assert not missing, missing


_KERNEL_MODULE = '''
import numba as nb
import numpy as np

from cerebellar_norse import kernelcache  # noqa: F401  (what each module of the package with cached kernels does)


@nb.njit(cache=True)
def twice(x):
    return x * 2.0


print("result", twice(np.float64(21.0)))
'''


def test_a_kernel_with_no_writable_cache_directory_runs_uncached_with_one_warning(tmp_path: Path) -> None:
    """``sudo -u cerebellar cerebellar-norse --validate-config`` on an install under ``/opt`` before the first start:
    NUMBA_CACHE_DIR unset, the package's ``__pycache__`` and the user's ``~/.cache`` not writable. numba raised
    ``RuntimeError: … no locator available`` at import (a traceback, exit 1); the kernel now runs, uncached.

    Every location numba tries is blocked by a regular file where a directory must go (root, who runs the tests,
    may write anywhere else)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "kmod.py").write_text(_KERNEL_MODULE)
    (src / "__pycache__").write_text("a file where numba's in-tree cache directory would go")
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    env = {"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": f"{src}:{Path(__file__).parents[2]}",
           "NUMBA_CACHE_DIR": str(blocker / "numba"), "HOME": str(blocker / "home"),
           "XDG_CACHE_HOME": str(blocker / "cache")}
    res = subprocess.run([sys.executable, "-c", "import cerebellar_norse, kmod"], capture_output=True, text=True,
                         env=env, cwd=tmp_path, timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "no locator available" not in res.stderr, res.stderr[-3000:]
    assert "result 42.0" in res.stdout, res.stdout
    assert res.stderr.count("no writable directory for the compiled kernels' cache") == 1, res.stderr[-3000:]
    assert str(blocker / "numba") in res.stderr, res.stderr[-3000:]
