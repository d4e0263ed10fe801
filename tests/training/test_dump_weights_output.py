"""--dump-weights --output writes any format into what the path names: a link's target, a FIFO; a new file gets the
umask's mode."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from cerebellar_norse.cli import main


def _config(tmp_path: Path) -> str:
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[paths]\nstate_dir = "{tmp_path / "state"}"\ndata_dir = "{tmp_path}"\n')
    return str(cfg)


def test_output_through_a_link_and_into_a_fifo(tmp_path: Path) -> None:
    cfg = _config(tmp_path)
    (tmp_path / "real").mkdir()
    link = tmp_path / "link.npz"
    link.symlink_to(tmp_path / "real" / "w.npz")
    assert main(["--config", cfg, "--dump-weights", "--format", "npz", "--output", str(link)]) == 0
    assert link.is_symlink() and (tmp_path / "real" / "w.npz").stat().st_size > 0

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    assert main(["--config", cfg, "--dump-weights", "--format", "npz", "--output", str(fifo)]) == 0
    reader.join(30)
    assert stat.S_ISFIFO(fifo.lstat().st_mode)  # not replaced by a regular file
    assert got and got[0][:2] == b"PK"


def test_a_new_output_file_gets_the_umask_mode(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        out = tmp_path / "w.npz"
        assert main(["--config", _config(tmp_path), "--dump-weights", "--format", "npz", "--output", str(out)]) == 0
        assert stat.S_IMODE(out.stat().st_mode) == 0o644
    finally:
        os.umask(old)


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_output_takes_every_format_and_stdout_stays_empty(fmt: str, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _config(tmp_path)
    assert main(["--config", cfg, "--dump-weights", "--format", fmt]) == 0
    printed = capsys.readouterr().out
    out = tmp_path / f"w.{fmt}"
    assert main(["--config", cfg, "--dump-weights", "--format", fmt, "--output", str(out)]) == 0
    captured = capsys.readouterr()
    assert captured.out == ""
    assert out.read_text() == printed and "parallel_fibre_purkinje" in printed
    assert f"to {out}" in captured.err


def test_the_untrained_network_is_named_on_stderr_with_the_state_dir_looked_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # The operations guide's `cerebellar-norse --dump-weights`, typed on a service's host without --config: the
    # built-in default's state dir is ./var of the working directory, which holds no model.
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    assert main(["--dump-weights", "--format", "json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["model_version"] == "untrained (seed 42)"  # stdout stays the dump alone
    assert f"no model to serve is stored in {tmp_path / 'var' / 'models'}" in captured.err
    assert "untrained network's weights of seed 42" in captured.err and "--config" in captured.err


def test_analyze_weights_of_the_untrained_network_says_so_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("STATE_DIRECTORY", raising=False)
    assert main(["analyze-weights", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)
    assert f"analyze-weights: no model to serve is stored in {tmp_path / 'var' / 'models'}" in captured.err
