"""Market state and journal files that are intact but cannot be read, or links to nowhere: never silently dropped."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from engine_helpers import ConfigFactory

from cerebellar_norse.engine.engine import Engine
from cerebellar_norse.engine.persistence import STATE_FILE
from cerebellar_norse.errors import StorageError


@pytest.mark.parametrize("target", ["/nonexistent-mount/market_state.bin", STATE_FILE], ids=["dangling", "loop"])
def test_a_state_file_link_to_nowhere_is_moved_aside_and_logged(engine_config: ConfigFactory, tmp_path: Path,
                                                                target: str) -> None:
    eng = Engine(engine_config(state_dir=tmp_path / "state", max_markets=8))
    path = eng.state_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, path)
    assert eng.restore_state() == 0
    assert not path.is_symlink()
    moved = list(path.parent.glob(f"{STATE_FILE}.corrupt-*"))
    assert len(moved) == 1 and os.readlink(moved[0]) == target


# permissions (a restore without chown), and errors that say nothing of the bytes: an I/O error, no descriptor or
# memory (these moved the file aside, and with it every acknowledged tick, on a single failed read at start)
UNREADABLE = [errno.EACCES, errno.EIO, errno.EMFILE, errno.ENOMEM]


@pytest.mark.parametrize("code", UNREADABLE, ids=[errno.errorcode[c] for c in UNREADABLE])
def test_an_unreadable_state_file_stops_the_start_and_is_kept(engine_config: ConfigFactory, tmp_path: Path,
                                                              unreadable: Callable[[Path, int], None], code: int) -> None:
    eng = Engine(engine_config(state_dir=tmp_path / "state", max_markets=8))
    path = eng.state_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"intact, but not ours to read")

    unreadable(path, code)
    with pytest.raises(StorageError, match=rf"cannot read the market state .*errno {code} {errno.errorcode[code]}"):
        eng.restore_state()
    assert path.exists() and not list(path.parent.glob(f"{STATE_FILE}.corrupt-*"))


@pytest.mark.parametrize("code", UNREADABLE, ids=[errno.errorcode[c] for c in UNREADABLE])
def test_an_unreadable_journal_file_stops_the_start_and_is_kept(engine_config: ConfigFactory, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    from cerebellar_norse.engine import journal

    cfg = engine_config(state_dir=tmp_path / "state", max_markets=8)
    d = journal.Durability(Engine(cfg))
    seg = d.dir / "00000000000000000000.journal"
    seg.parent.mkdir(parents=True, exist_ok=True)
    seg.write_bytes(b"\0" * 4096)

    def denied(path: Path, *a: object, **k: object) -> object:
        raise OSError(code, os.strerror(code), str(path))

    monkeypatch.setattr(journal, "SegmentReader", denied)
    try:
        with pytest.raises(StorageError, match=rf"cannot read journal file .*errno {code} {errno.errorcode[code]}"):
            d.recover()
    finally:
        d.closed = True
        d._unlock()
    assert seg.exists() and not list(seg.parent.glob("*.corrupt-*"))  # every acknowledged tick is still there


@pytest.mark.parametrize("code", UNREADABLE, ids=[errno.errorcode[c] for c in UNREADABLE])
def test_verify_data_says_of_an_unreadable_state_file_what_the_start_does(tmp_path: Path, unreadable: Callable[[Path, int], None],
                                                                          capsys: pytest.CaptureFixture[str],
                                                                          code: int) -> None:
    """--verify-data said `market_state.bin: cannot read: Permission denied`, as of a damaged file, where the start
    stops on it and moves nothing aside (the file may hold every acknowledged tick): the fix is the owner, not a
    restore."""
    from cerebellar_norse.training.commands import cmd_verify_data

    path = tmp_path / STATE_FILE
    path.write_bytes(b"intact, but not ours to read")
    unreadable(path, code)
    assert cmd_verify_data(str(tmp_path)) == 1
    err = capsys.readouterr().err
    assert f"cannot read the market state {path}: {os.strerror(code)} (errno {code} {errno.errorcode[code]}): the " \
           "service does not start on it (nothing is moved aside)" in err
