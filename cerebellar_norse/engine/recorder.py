"""Recording of served ticks (``[debug] record_requests``) for replay.

Accepted ticks are appended, in the order they were applied, to
``<state_dir>/recordings/ticks-<UTC date>.csv`` in the training CSV format
(``timestamp,market_id,price,volume``), so a recording can be replayed
(``cerebellar-norse replay FILE``) or trained on. Lines are flushed after each batch
and fsynced when the recorder closes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from ..ticks import Tick

HEADER = "timestamp,market_id,price,volume\n"


class TickRecorder:
    """Appends ticks to a daily CSV file under ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._day = ""
        self._fh: TextIO | None = None
        self.ticks = 0

    def _file(self) -> TextIO:
        day = time.strftime("%Y%m%d", time.gmtime())
        if self._fh is None or day != self._day:
            self.close()
            self.directory.mkdir(parents=True, exist_ok=True)
            path = self.directory / f"ticks-{day}.csv"
            new = not path.exists() or path.stat().st_size == 0
            self._fh = open(path, "a", encoding="utf-8")  # noqa: SIM115 (kept open across batches)
            if new:
                self._fh.write(HEADER)
            self._day = day
        return self._fh

    def write(self, ticks: Sequence[Tick]) -> None:
        """Append a batch of applied ticks and flush."""
        fh = self._file()
        fh.write("".join(f"{t.timestamp},{t.market_id},{t.price!r},{t.volume!r}\n" for t in ticks))
        fh.flush()
        self.ticks += len(ticks)

    def close(self) -> None:
        """fsync and close the current file."""
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
            self._fh = None
