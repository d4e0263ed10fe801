"""Fault injection at start: the engine of the model to serve cannot be built for a host reason.

A real service process whose address space is limited (``RLIMIT_AS``, as ``prlimit --as``, ``ulimit -v`` or
``LimitAS=`` set it) below what its market-state pool needs meets a real ``MemoryError`` while building the engine of
the active model. That is the host's to fix, not the model's: the start stops (exit 1) with one line naming the model,
the cause and what to do, and nothing in the state dir is moved aside or rewritten (serving another model, or the
untrained network, would move aside the market state saved with this one).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "api"))
from live_helpers import REPO_ROOT, failed_start_line, free_port, server_environ, tree_of, with_active_model

VERSION = "20240101T000000Z-aaaaaa"
POOL_MARKETS = 240_000  # about 1.1 GB of market states (4,572 B each with the built-in network)
MARGIN = 256 << 20  # address space left above what the process maps once its modules are imported (bytes)

# The service's entry, with RLIMIT_AS set once the modules are imported (their mappings alone take about 1 GB): the
# engine build that follows is the first large allocation.
LIMITED_ENTRY = f"""
import resource, sys
import cerebellar_norse.api.server
from cerebellar_norse.cli import run
size = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (size + {MARGIN}, resource.RLIM_INFINITY))
sys.argv = ["cerebellar-norse", *sys.argv[1:]]
sys.exit(run())
"""


def ram_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs /proc (Linux)")
@pytest.mark.skipif(ram_bytes() < 6 << 30, reason="the pool of this test (about 1.1 GB, limit 4 GB) needs 6 GB of RAM")
def test_no_memory_for_the_engine_of_the_active_model_stops_the_start_and_moves_nothing_aside(tmp_path: Path) -> None:
    state = tmp_path / "state"
    before = with_active_model(state, VERSION)
    env = server_environ(state, {"CEREBELLAR_NORSE_PERFORMANCE__MAX_MARKETS": str(POOL_MARKETS),
                                 "CEREBELLAR_NORSE_PERFORMANCE__MEMORY_POOL_SIZE": "2GB",
                                 "CEREBELLAR_NORSE_PERFORMANCE__MEMORY_LIMIT": "4GB"})
    done = subprocess.run([sys.executable, "-c", LIMITED_ENTRY, "--port", str(free_port())], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    line = failed_start_line(done)
    assert line.startswith(f"cerebellar-norse: cannot build the engine of model {VERSION} "
                           f"({state / 'models' / VERSION}): out of memory (MemoryError"), line
    assert "nothing is moved aside" in line and "MemoryMax=" in line, line
    after = tree_of(state)
    after.pop(".lock", None)  # the state dir's lock, taken before the model is loaded
    assert after == before


@pytest.mark.parametrize(("fault", "said"), [
    (OSError(24, "Too many open files"), "Too many open files (errno 24 EMFILE)"),
    (OSError(24, "Too many open files", "/usr/lib/python3/site-packages/numpy/entry_points.txt"),
     "/usr/lib/python3/site-packages/numpy/entry_points.txt: Too many open files (errno 24 EMFILE)"),
    (MemoryError("Unable to allocate 4.17 GiB"), "out of memory (MemoryError: Unable to allocate 4.17 GiB)"),
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.17 GiB.\nIf reserved but unallocated memory is "
                            "large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
     "out of GPU memory (OutOfMemoryError: CUDA out of memory. Tried to allocate 4.17 GiB.)"),
], ids=["EMFILE without a file (the event loop's socketpair)", "EMFILE reading a module's file", "MemoryError",
        "torch.OutOfMemoryError"])
def test_a_start_the_host_has_no_descriptor_or_memory_for_is_one_line_naming_the_cause(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fault: BaseException, said: str) -> None:
    """Outside the model's engine (the event loop's self-pipe, a module's file read at import): under a low ``ulimit -n``
    the start said ``OSError: Too many open files`` (or ``cannot write <a file it only read>``), and a MemoryError was a
    traceback. One line now names the cause and what to do."""
    from cerebellar_norse import cli

    def failing(args: object) -> int:
        raise fault

    monkeypatch.setattr(cli, "_dispatch", lambda args: failing)
    assert cli.main([]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"cerebellar-norse: the host is short of file descriptors, memory or processes: {said}: raise the "
                   "limit (LimitNOFILE=, MemoryMax=, TasksMax=; ulimit -n/-v/-u) or free them, and start again"], err
