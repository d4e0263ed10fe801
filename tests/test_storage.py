"""Atomic, checksummed files (cerebellar_norse.storage)."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cerebellar_norse.errors import CheckpointError
from cerebellar_norse.storage import (
    HEADER_LEN,
    MAGIC,
    NotARegularFileError,
    atomic_write_bytes,
    dump_checksummed_json,
    load_checksummed_json,
    read_checksummed,
    read_file,
    read_refused,
    read_state_file,
    sha256_bytes,
    sha256_file,
    write_checksummed,
)


def test_sha256_helpers(tmp_path: Path) -> None:
    data = os.urandom(3 << 20)  # more than one read chunk
    path = tmp_path / "blob"
    path.write_bytes(data)
    assert sha256_bytes(data) == hashlib.sha256(data).hexdigest() == sha256_file(path)


def test_atomic_write_creates_parents_and_replaces_whole(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "file.bin"
    atomic_write_bytes(path, b"first version, rather long" * 100)
    os.link(path, tmp_path / "old")
    atomic_write_bytes(path, b"second")
    assert path.read_bytes() == b"second"
    assert (tmp_path / "old").read_bytes() == b"first version, rather long" * 100  # old inode untouched
    assert os.listdir(path.parent) == ["file.bin"]


def test_atomic_write_failure_keeps_the_old_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "file.bin"
    atomic_write_bytes(path, b"old")

    def fail(*_args: object) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError, match="Input/output"):
        atomic_write_bytes(path, b"new")
    monkeypatch.undo()
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["file.bin"]  # the temporary file was removed


@pytest.mark.parametrize(("code", "kind"), [(errno.ENOSPC, OSError), (errno.EACCES, PermissionError)])
def test_a_failed_atomic_write_names_the_target_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int,
                                                      kind: type[OSError]) -> None:
    path = tmp_path / "file.bin"

    def fail(*_args: object) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(kind) as caught:
        atomic_write_bytes(path, b"new")
    assert (caught.value.errno, caught.value.filename, caught.value.filename2) == (code, str(path), None)
    assert str(caught.value) == f"[Errno {code}] {os.strerror(code)}: '{path}'"  # no "-> None"


@pytest.mark.parametrize("payload", [b"", b"x", os.urandom(100_000)])
def test_checksummed_round_trip(tmp_path: Path, payload: bytes) -> None:
    path = tmp_path / "state.bin"
    digest = write_checksummed(path, payload)
    assert digest == sha256_bytes(payload)
    raw = path.read_bytes()
    assert raw == MAGIC + digest.encode() + b"\n" + payload and len(raw) == HEADER_LEN + len(payload)
    assert read_checksummed(path) == payload


@pytest.mark.parametrize(("damage", "message"), [
    ("flip_payload", "checksum mismatch"),
    ("flip_digest", "checksum mismatch"),
    ("truncate_payload", "checksum mismatch"),
    ("append", "checksum mismatch"),
    ("truncate_header", "bad header"),
    ("empty", "bad header"),
    ("magic", "bad header"),
])
def test_corruption_is_detected_naming_the_file(tmp_path: Path, damage: str, message: str) -> None:
    path = tmp_path / "state.bin"
    write_checksummed(path, b"0123456789" * 50)
    raw = bytearray(path.read_bytes())
    if damage == "flip_payload":
        raw[HEADER_LEN + 17] ^= 0x01
    elif damage == "flip_digest":
        raw[len(MAGIC)] = ord("0") if raw[len(MAGIC)] != ord("0") else ord("1")
    elif damage == "truncate_payload":
        del raw[-1:]
    elif damage == "append":
        raw += b"\0"
    elif damage == "truncate_header":
        del raw[HEADER_LEN - 10:]
    elif damage == "empty":
        raw = bytearray()
    else:
        raw[0:1] = b"X"
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=message) as exc:
        read_checksummed(path)
    assert exc.value.path == str(path)
    assert str(path) in str(exc.value)


def test_unreadable_file_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "missing.bin"
    with pytest.raises(CheckpointError, match="cannot read") as exc:
        read_checksummed(missing)
    assert exc.value.path == str(missing)
    with pytest.raises(CheckpointError, match="cannot read"):
        read_checksummed(tmp_path)  # a directory


def test_a_write_that_finds_no_descriptor_for_the_directory_leaves_the_previous_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No descriptor to open the directory for its flush (EMFILE): the error is raised before the rename, so the
    previous file is still the one in place (it was raised after it: the caller was told the write failed while the
    new file was already there, and a refused model swap could not be undone)."""
    target = tmp_path / "state.bin"
    atomic_write_bytes(target, b"old")
    real_open = os.open

    def no_descriptor(p: object, flags: int, *a: object, **k: object) -> int:
        if Path(str(p)) == tmp_path:
            raise OSError(errno.EMFILE, "Too many open files", str(p))
        return real_open(p, flags, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", no_descriptor)
    with pytest.raises(OSError, match="Too many open files") as failed:
        atomic_write_bytes(target, b"new")
    monkeypatch.undo()
    assert failed.value.errno == errno.EMFILE and failed.value.filename == str(target)
    assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["state.bin"]


def within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()`` in a thread: its result or exception, or a failed test when it has not returned within ``seconds``
    (a read that waits for a FIFO's writer, or reads ``/dev/zero`` without end)."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(call())
        except BaseException as exc:  # handed back to the test
            out.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert out, f"still reading after {seconds} s"
    return out[0]


@pytest.mark.parametrize("kind", ["fifo", "/dev/zero", "/dev/null"])
def test_a_state_file_that_is_a_fifo_or_a_device_is_refused_at_once_as_no_file(tmp_path: Path, kind: str) -> None:
    """A FIFO as market_state.bin (or state-id, ACTIVE, a manifest) made --verify-data and the service's start wait
    for a writer for ever; a link to /dev/zero made them read until memory ran out."""
    path = tmp_path / "market_state.bin"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(kind)
    exc = within(5, lambda: read_file(path))
    assert isinstance(exc, NotARegularFileError) and exc.filename == str(path)
    assert not read_refused(exc)  # what is at the path is no file: damaged, moved aside, never "fix and restart"
    assert within(5, lambda: read_state_file(path, "the market state")) is None
    err = within(5, lambda: read_checksummed(path))
    assert isinstance(err, CheckpointError) and "not a regular file" in str(err) and str(path) in str(err)


def test_read_file_reads_a_regular_file_whole(tmp_path: Path) -> None:
    data = os.urandom(3 << 20)
    (tmp_path / "f").write_bytes(data)
    (tmp_path / "link").symlink_to(tmp_path / "f")
    assert read_file(tmp_path / "f") == read_file(tmp_path / "link") == data


CHECKSUMMED_RECORD: dict[str, Any] = {
    "job_id": "j1", "state": "succeeded", "epoch": 3, "loss": 0.6931471805599453, "loss_history": [1.1, float("nan")],
    "error": None, "activated": True, "warnings": ["é, \"quoted\"\n"], "validation": {"accuracy": 0.5, "n": 10},
    "created": "2026-11-25T10:00:00Z", "empty": {},
}


def test_checksummed_json_reads_back_what_was_written_and_stays_plain_json() -> None:
    data = dump_checksummed_json(CHECKSUMMED_RECORD)
    plain = json.loads(data)  # what `jq` reads: the fields, and the checksum as one more member
    assert list(plain)[-1] == "sha256" and len(plain["sha256"]) == 64
    back, checked = load_checksummed_json(data, "rec.json")
    assert checked and json.dumps(back) == json.dumps(CHECKSUMMED_RECORD)
    assert load_checksummed_json(dump_checksummed_json({}), "e.json") == ({}, True)
    legacy = json.dumps({"job_id": "old", "state": "failed"}).encode()  # written before records had a checksum
    assert load_checksummed_json(legacy, "old.json") == ({"job_id": "old", "state": "failed"}, False)
    with pytest.raises(ValueError, match="sha256"):
        dump_checksummed_json({"sha256": "x"})


def test_no_bit_flipped_in_a_checksummed_json_file_changes_what_is_read() -> None:
    """Each of the file's bits flipped in turn: the read is refused naming the file, or (a flip in the checksum
    member's name, which leaves a file without a checksum) gives the same fields."""
    data = dump_checksummed_json(CHECKSUMMED_RECORD)
    want = json.dumps(CHECKSUMMED_RECORD)
    refused = 0
    for i in range(len(data)):
        for bit in range(8):
            bad = bytearray(data)
            bad[i] ^= 1 << bit
            try:
                back, _ = load_checksummed_json(bytes(bad), "rec.json")
            except CheckpointError as exc:
                assert exc.path == "rec.json"
                refused += 1
                continue
            assert json.dumps({k: v for k, v in back.items() if k in CHECKSUMMED_RECORD}) == want, (i, bit)
    assert refused >= 8 * len(data) - 8 * len('"sha256"')


@pytest.mark.parametrize(("data", "message"), [
    (b"\xff{}", "not a JSON file"), (b'{"a": ', "not a JSON file"), (b"[1]", "a JSON object was expected, not list"),
    (b'{"a": 1, "sha256": 5}', "checksum mismatch"), (b'{"a": 1, "sha256": "00"}', "checksum mismatch"),
])
def test_a_damaged_checksummed_json_file_is_refused_saying_what_is_wrong(data: bytes, message: str) -> None:
    with pytest.raises(CheckpointError, match=message) as err:
        load_checksummed_json(data, "jobs/x.json")
    assert str(err.value).startswith("jobs/x.json: ")
