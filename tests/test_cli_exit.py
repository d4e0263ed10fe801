"""The command's exit (``cerebellar_norse.cli.run``): main's exit code, every byte of its output, and what a normal
interpreter exit does for the program (threads joined, ``atexit`` handlers run), without the module teardown."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


def command(tmp_path: Path, code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("CEREBELLAR_NORSE_") and k not in ("STATE_DIRECTORY", "PYTHONUNBUFFERED")}
    env["CEREBELLAR_NORSE_PATHS__STATE_DIR"] = str(tmp_path / "state")
    env["CEREBELLAR_NORSE_TRAINING__BOOTSTRAP_ON_FIRST_RUN"] = "false"
    return subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)


def test_a_large_output_to_a_pipe_arrives_whole(tmp_path: Path) -> None:
    proc = command(tmp_path, "from cerebellar_norse.cli import run; run(['--dump-weights', '--format', 'json'])")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)  # less than stdout's buffer to a pipe: written by the exit's flush


@pytest.mark.parametrize("argv, code", [(["--validate-config"], 0), (["--no-such-flag"], 2),
                                        (["--validate-config", "--config", "/nonexistent/x.toml"], 1)])
def test_the_exit_code_is_mains(tmp_path: Path, argv: list[str], code: int) -> None:
    proc = command(tmp_path, f"from cerebellar_norse.cli import run; run({argv!r})")
    assert proc.returncode == code, proc.stderr


def test_threads_are_joined_and_atexit_handlers_run_in_order(tmp_path: Path) -> None:
    proc = command(tmp_path, """
import atexit, sys, threading, time
from cerebellar_norse import cli
returned = threading.Event()
main = cli.main
def main_then_set(argv=None):
    code = main(argv)
    returned.set()
    return code
cli.main = main_then_set
def late():  # still running when main has returned
    returned.wait()
    time.sleep(0.2)
    sys.stdout.write("thread done\\n")
threading.Thread(target=late).start()
atexit.register(lambda: sys.stdout.write("atexit ran\\n"))
cli.run(['--validate-config'])
""")
    assert proc.returncode == 0, proc.stderr
    assert re.search(r": valid \(.*\)\nthread done\natexit ran\n\Z", proc.stdout), proc.stdout
