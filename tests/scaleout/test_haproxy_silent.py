"""A HAProxy runtime socket that accepts but never answers is named as such, not 'cannot write output'."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from cerebellar_norse import cli
from cerebellar_norse.errors import InputError
from cerebellar_norse.scaleout.haproxy import RuntimeAPI


def test_a_silent_runtime_socket_is_an_input_error(tmp_path: Path) -> None:
    path = tmp_path / "hap.sock"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    srv.listen(1)
    try:
        with pytest.raises(InputError, match="did not answer 'show': timed out"):
            RuntimeAPI(path, timeout_s=0.2).command("show servers state be")
    finally:
        srv.close()


def test_a_read_side_oserror_is_not_called_a_write(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    def boom(args: object) -> int:
        raise TimeoutError("timed out")

    monkeypatch.setattr(cli, "_dispatch", lambda args: boom)
    assert cli.main(["inspect-data", "x.csv"]) == cli.EXIT_FAILED
    err = capsys.readouterr().err
    assert "cannot write" not in err and "timed out" in err, err
