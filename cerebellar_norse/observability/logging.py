"""Structured JSON logs: one object per line on stdout (journald), optionally a rotated file.

When stdout is journald's stream (systemd sets ``JOURNAL_STREAM``), each line starts with its
syslog priority (``<3>`` for ERROR), which journald takes as the entry's priority and strips:
``journalctl -p err`` shows the service's errors, and ``-o cat`` still prints the JSON.

Each line: ``{"ts", "level", "logger", "message", "request_id", "fields": {...}}``;
``fields`` carries structured values (e.g. ``processing_time_ns``, ``market_id``), so
``jq -r 'select(.fields.processing_time_ns) | .fields.processing_time_ns'`` works.
Pass them with ``log.info("...", extra={"fields": {...}})``.

The level comes from ``[logging] level``, overridden by ``CEREBELLAR_NORSE_LOG``.
With ``[logging] file`` set, lines also go to that file, rotated at ``max_size`` with
``max_files`` kept, gzip-compressed when ``compression = "gzip"``.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import logging.handlers
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from ..config import LoggingConfig, unread_env_names
from ..errors import ConfigError, ConfigProblem
from .context import request_id_var
from .ratelimit import install_alike_limit

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class JsonFormatter(logging.Formatter):
    """Formats records as one JSON object per line."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        rid = getattr(record, "request_id", None) or request_id_var.get()
        if rid:
            out["request_id"] = rid
        fields = getattr(record, "fields", None)
        if fields:
            out["fields"] = fields
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


# syslog priority of each level: journald reads a leading "<N>" as the line's priority (and strips it), so
# `journalctl -p err` finds the service's errors.
SYSLOG_PRIORITY = {"DEBUG": 7, "INFO": 6, "WARNING": 4, "ERROR": 3, "CRITICAL": 2}


class JournalFormatter(JsonFormatter):
    """:class:`JsonFormatter` with the record's syslog priority as a ``<N>`` prefix, for a stream read by journald."""

    def format(self, record: logging.LogRecord) -> str:
        return f"<{SYSLOG_PRIORITY.get(record.levelname, 6)}>" + super().format(record)


def is_journal_stream(stream: Any, environ: dict[str, str] | None = None) -> bool:
    """True when ``stream`` is the journald stream systemd connected (``JOURNAL_STREAM`` = its ``device:inode``)."""
    value = (environ if environ is not None else os.environ).get("JOURNAL_STREAM", "")
    try:
        st = os.fstat(stream.fileno())
    except (AttributeError, OSError, ValueError):
        return False
    return value == f"{st.st_dev}:{st.st_ino}"


def _gzip_rotator(source: str, dest: str) -> None:
    with open(source, "rb") as src, gzip.open(dest, "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.remove(source)


LEVEL_ENV = "CEREBELLAR_NORSE_LOG"


def env_level(environ: dict[str, str] | None = None) -> str | None:
    """The level ``CEREBELLAR_NORSE_LOG`` sets (upper case) when it names a valid one, else None (the config's rules)."""
    env = (environ if environ is not None else os.environ).get(LEVEL_ENV, "").upper()
    return env if env in LEVELS else None


def effective_level(cfg: LoggingConfig, environ: dict[str, str] | None = None) -> str:
    """The level to use: ``CEREBELLAR_NORSE_LOG`` when set to a valid level, else the config's."""
    return env_level(environ) or cfg.level


def log_always(logger: logging.Logger, level: int, msg: str, *args: Any, fields: dict[str, Any] | None = None) -> None:
    """Log a line whatever the level in force (with its own level as priority): the outcome of an operator's action
    (a config reload) must show in the journal even when ``logging.level`` filters its level out."""
    if logger.isEnabledFor(level):
        logger.log(level, msg, *args, extra={"fields": fields} if fields else None)
        return
    record = logger.makeRecord(logger.name, level, "(log_always)", 0, msg, args, None,
                               extra={"fields": fields} if fields else None)
    logger.handle(record)  # handle() skips the level check that log() makes; handlers and filters still apply


class _SaysFailuresOnce(logging.Handler):
    """A handler whose failing writes (a full disk, a reader gone) are said once on stderr, and their end once,
    instead of logging's traceback at every line."""

    failing = False  # the last write failed and that was said
    _failed_now = False  # the write of the record being emitted failed
    what = "the log"
    meanwhile = ""
    again = "the log is written again"

    def emit(self, record: logging.LogRecord) -> None:
        super().emit(record)  # (the concrete handler's emit, next in the MRO)
        if self.failing and not self._failed_now:
            self.failing = False
            with contextlib.suppress(Exception):
                sys.stderr.write(f"cerebellar-norse: {self.again}\n")
        self._failed_now = False

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 (logging's name)
        if not isinstance(sys.exc_info()[1], OSError):  # a log call's own bug (bad % arguments): logging's report
            super().handleError(record)
            return
        self._failed_now = True
        if self.failing:
            return
        self.failing = True
        exc = sys.exc_info()[1]
        why = f"{exc.strerror} (errno {exc.errno})" if isinstance(exc, OSError) and exc.strerror else repr(exc)
        with contextlib.suppress(Exception):
            sys.stderr.write(f"cerebellar-norse: cannot write {self.what}: {why}; {self.meanwhile}\n")


class LogFileHandler(_SaysFailuresOnce, logging.handlers.RotatingFileHandler):
    """The rotating log file; a failing write (a full or read-only disk) is said once on stderr, not as
    logging's traceback at every line (stdout, journald under systemd, keeps every line)."""

    meanwhile = "log lines go to stdout only until it can be written again"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.what = f"the log file {self.baseFilename}"
        self.again = f"{self.what} is written again"


class ConsoleHandler(_SaysFailuresOnce, logging.StreamHandler):
    """The log lines on stdout (journald's stream under systemd). When they cannot be written (``/dev/full``, a
    reader that went away) the service serves on: that is said once on stderr, the lines are dropped meanwhile, and
    the end of it is said too (not logging's traceback on stderr at every line)."""

    what = "log lines to stdout"
    meanwhile = "they are dropped (the service serves on) until stdout can be written again"
    again = "log lines go to stdout again"


def file_handler(cfg: LoggingConfig) -> logging.Handler | None:
    """The rotating file handler of ``[logging] file`` (None when no file is configured)."""
    if cfg.file is None:
        return None
    path = Path(cfg.file)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        h = LogFileHandler(path, maxBytes=int(cfg.max_size), backupCount=cfg.max_files, encoding="utf-8")
    except OSError as exc:  # a directory, no permission, a read-only disk: one line at start, not a traceback
        raise ConfigError([ConfigProblem("logging.file", f"cannot write the log file {path}: {exc.strerror or exc}",
                                         "point it at a writable file, or leave it unset (stdout only)")]) from None
    if path.name == "application.log":
        # The operations guide reads both application.log and app.log: keep the second as an alias.
        alias = path.with_name("app.log")
        if not alias.exists() and not alias.is_symlink():
            with contextlib.suppress(OSError):
                alias.symlink_to(path.name)
    if cfg.compression == "gzip":
        h.namer = lambda name: name + ".gz"
        h.rotator = _gzip_rotator
    return h


def setup_logging(cfg: LoggingConfig, stream: Any = None) -> None:
    """Install the JSON handlers on the root logger (idempotent)."""
    root = logging.getLogger()
    for h in list(root.handlers):  # including handlers a library's basicConfig left behind
        root.removeHandler(h)
    out = stream or sys.stdout
    console = ConsoleHandler(out)
    console.setFormatter(JournalFormatter() if is_journal_stream(out) else JsonFormatter())
    handlers: list[logging.Handler] = [console]
    fh = file_handler(cfg)
    if fh is not None:
        fh.setFormatter(JsonFormatter())
        handlers.append(fh)
    for h in handlers:
        h._cerebellar_norse = True  # type: ignore[attr-defined]
        root.addHandler(h)
    root.setLevel(effective_level(cfg))
    for noisy in ("numba", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    install_alike_limit()  # lines any client causes per connection: at most a few alike ones per window
    raw = os.environ.get(LEVEL_ENV, "")
    if raw.strip() and env_level() is None:  # a typo in the unit's Environment= would otherwise pass without a word
        log_always(logging.getLogger("cerebellar_norse.logging"), logging.WARNING,
                   "%s=%r is not a log level (%s): ignored, the level is %s from [logging] level", LEVEL_ENV, raw,
                   ", ".join(LEVELS), cfg.level)
    for name in unread_env_names(os.environ):  # a misspelt variable would otherwise change nothing without a word
        log_always(logging.getLogger("cerebellar_norse.logging"), logging.WARNING,
                   "environment variable %s is not one the service reads: ignored (a configuration key's variable is "
                   "CEREBELLAR_NORSE_<SECTION>__<KEY>, with two underscores; the log level's is %s)", name, LEVEL_ENV)
