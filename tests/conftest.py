"""Shared fixtures: the repository root, a clean environment, the CLI as a subprocess."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

CliRunner = Callable[..., subprocess.CompletedProcess[str]]


def clean_environ(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """``os.environ`` without config overrides (``CEREBELLAR_NORSE_*``) or ``STATE_DIRECTORY``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CEREBELLAR_NORSE_") and k != "STATE_DIRECTORY"}
    env.update(extra or {})
    return env


@pytest.fixture
def run_cli() -> CliRunner:
    """Run the real ``cerebellar-norse`` command (``python -m cerebellar_norse.cli``) from the repo root.

    ``run_cli("--validate-only", "--config", path, env={"CEREBELLAR_NORSE_SERVER__PORT": "1"})``
    returns the CompletedProcess with text stdout/stderr. The environment is cleaned of
    config overrides first, then ``env`` is added.
    """

    def run(*args: str | os.PathLike[str], env: Mapping[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "cerebellar_norse.cli", *map(str, args)],
            cwd=REPO_ROOT,
            env=clean_environ(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    return run


@pytest.fixture
def write_toml(tmp_path: Path) -> Callable[[str], Path]:
    """Write TOML text to a fresh file under tmp_path and return its path."""
    counter = iter(range(1_000_000))

    def write(text: str) -> Path:
        path = tmp_path / f"config-{next(counter)}.toml"
        path.write_text(text, encoding="utf-8")
        return path

    return write


@pytest.fixture(autouse=True)
def _no_state_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    """``paths.state_dir`` defaults to $STATE_DIRECTORY; keep tests independent of the caller's shell."""
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)


def load_script(path: Path) -> ModuleType:
    """Import a repository script (``scripts/``, ``benchmarks/``) as a module, by path."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def script(request: pytest.FixtureRequest) -> ModuleType:
    """The script named by the test module's ``SCRIPT`` path, imported once per module."""
    return load_script(request.module.SCRIPT)


@pytest.fixture
def unreadable(monkeypatch: pytest.MonkeyPatch) -> Callable[[Path, int], None]:
    """``unreadable(path, code)``: every ``Path.read_bytes`` of ``path`` fails with OSError ``code`` (EACCES, EIO, …)
    for the rest of the test; other paths read as ever. (The tests run as root, whom chmod does not stop.)"""
    real = Path.read_bytes

    def make(path: Path, code: int) -> None:
        def failing(p: Path) -> bytes:
            if p == path:
                raise OSError(code, os.strerror(code), str(p))
            return real(p)

        monkeypatch.setattr(Path, "read_bytes", failing)

    return make


@pytest.fixture
def cpus_free(monkeypatch: pytest.MonkeyPatch) -> None:
    """No task waits for a CPU, whatever else runs on the host meanwhile (busy polling stops when one does)."""
    from cerebellar_norse.engine import engine as engine_module

    monkeypatch.setattr(engine_module, "cpu_wanted", lambda: False)
