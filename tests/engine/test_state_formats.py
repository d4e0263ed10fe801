"""Format markers of the state dir's files, for upgrades and their rollback.

``market_state.bin`` (its payload's ``format`` entry) and every journal file (its header's
``format``) say which format wrote them. A file without a marker was written before the
markers existed (format 1) and recovers as before. A file of a newer format than this
version reads was written by a newer version of the service (an upgrade rolled back
after it ran): the start stops naming the file, and leaves it byte for byte as it is,
so that the newer version, started again, still finds every acknowledged tick. Before
the markers, such a file would have been read as if it were of this version's format
(a checkpoint) or moved aside as damaged with the ticks it holds (a journal file).
"""

from __future__ import annotations

import io
import json
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from engine_helpers import run
from test_journal import assert_same_pool, start
from test_state_dir_identity import crashed_with_journal, sd

from cerebellar_norse.config import Config
from cerebellar_norse.engine.journal import Durability
from cerebellar_norse.engine.persistence import STATE_FILE, STATE_FORMAT
from cerebellar_norse.engine.segments import FORMAT, HEADER_SIZE, JOURNAL_DIR, MAGIC, REC, list_segments
from cerebellar_norse.errors import NewerFormatError
from cerebellar_norse.storage import read_checksummed, write_checksummed

pytestmark = pytest.mark.asyncio


def set_checkpoint_format(state_dir: Path, value: int | None) -> None:
    """Rewrite ``market_state.bin`` with its ``format`` entry set to ``value`` (None: without one, as the versions
    before the marker wrote it), checksummed again."""
    path = state_dir / STATE_FILE
    with np.load(io.BytesIO(read_checksummed(path)), allow_pickle=False) as z:
        data = {k: z[k] for k in z.files if k != "format"}
    if value is not None:
        data["format"] = np.array(value, dtype=np.int64)
    buf = io.BytesIO()
    np.savez(buf, **data)  # type: ignore[arg-type]
    write_checksummed(path, buf.getvalue())


def set_journal_format(state_dir: Path, value: int | None) -> Path:
    """Rewrite the header of the (only) journal file with its ``format`` set to ``value`` (None: without one); returns
    the file."""
    (_, path), = list_segments(state_dir / JOURNAL_DIR)
    raw = bytearray(path.read_bytes())
    n = REC.unpack_from(raw, len(MAGIC))[0]
    meta = json.loads(raw[len(MAGIC) + REC.size:len(MAGIC) + REC.size + n])
    meta.pop("format", None)
    if value is not None:
        meta["format"] = value
    m = json.dumps(meta, sort_keys=True).encode()
    raw[:HEADER_SIZE] = (MAGIC + REC.pack(len(m), zlib.crc32(m)) + m).ljust(HEADER_SIZE, b"\0")
    path.write_bytes(bytes(raw))
    return path


def snapshot(state_dir: Path) -> dict[str, bytes]:
    """Every file under the state dir (but the lock's pid file) by relative path, with its bytes."""
    return {str(p.relative_to(state_dir)): p.read_bytes() for p in sorted(state_dir.rglob("*"))
            if p.is_file() and p.name != ".lock"}


async def test_a_state_dir_whose_files_carry_no_format_recovers_as_before(journaled: tuple[Config, list[Durability]]) -> None:
    """Files written before the markers (none in the checkpoint or the journal headers) are format 1."""
    cfg, opened = journaled
    twin = await crashed_with_journal(cfg, opened, "AB", 4)
    assert STATE_FORMAT == 1 and FORMAT == 1  # what this version writes (raised with a change of format)
    set_checkpoint_format(sd(cfg), None)
    set_journal_format(sd(cfg), None)
    e, _ = start(cfg, opened)
    assert_same_pool(e, twin)
    assert not list(sd(cfg).rglob("*.corrupt-*")) and not list(sd(cfg).rglob("*.foreign-*"))


Rewrite = Callable[[Path, int | None], object]


@pytest.mark.parametrize("which", ["checkpoint", "journal"])
async def test_a_file_of_a_newer_format_stops_the_start_and_is_left_as_it_is(
        journaled: tuple[Config, list[Durability]], capsys: pytest.CaptureFixture[str], which: str) -> None:
    """A rollback onto a state dir that a newer version wrote: refused, naming the file, nothing moved or rewritten;
    once the file is of a format this version reads again, every acknowledged tick is there."""
    cfg, opened = journaled
    twin = await crashed_with_journal(cfg, opened, "AB", 4)
    rewrite: Rewrite = set_checkpoint_format if which == "checkpoint" else set_journal_format
    rewrite(sd(cfg), 2)
    path = sd(cfg) / STATE_FILE if which == "checkpoint" else list_segments(sd(cfg) / JOURNAL_DIR)[0][1]
    before = snapshot(sd(cfg))
    with pytest.raises(NewerFormatError) as err:
        start(cfg, opened)
    what = "market state" if which == "checkpoint" else "journal"
    assert str(err.value).startswith(f"{path}: written by a newer version of cerebellar-norse ({what} format 2; this "
                                     "version reads format 1 and older)")
    assert "start the version that wrote it" in str(err.value)
    assert snapshot(sd(cfg)) == before  # not moved aside, not rewritten (the state-id is not even created anew)

    code, _, err_out = run(capsys, "--verify-data", sd(cfg))  # the check an operator runs before a start says the same
    assert code == 1
    assert f"{path}: written by a newer version of cerebellar-norse ({what} format 2;" in err_out
    assert snapshot(sd(cfg)) == before

    rewrite(sd(cfg), 1)  # as the newer version would read it: nothing was lost meanwhile
    e, _ = start(cfg, opened)
    assert_same_pool(e, twin)
