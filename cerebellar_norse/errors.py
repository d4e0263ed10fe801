"""The one exception tree of cerebellar-norse.

Every error the service raises on purpose derives from :class:`CerebellarNorseError`
and falls into one of four families, which map onto how callers react:

* :class:`ConfigError` – the configuration (TOML, environment, CLI) is wrong; fix it
  and restart. Carries every problem found, each with its TOML key and a fix.
* :class:`InputError` – one request, tick, CSV row or checkpoint is bad; the caller
  gets a 4xx naming the field and no state changes.
* :class:`CapacityError` – the service is full right now (queue, pool, a journal file
  waiting for a file descriptor); retry later.
* :class:`EngineFatalError` – the engine or device cannot go on (device lost,
  backend failed to start); the service reports itself not ready.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .client import TickAnswer


def quoted(text: str, limit: int) -> str:
    """``text`` as an error message quotes it (its ``repr``): its first ``limit`` characters and its length when it is
    longer, so that a value of a million characters is not echoed back whole."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}… ({len(text)} characters)"


class CerebellarNorseError(Exception):
    """Base of every error raised on purpose by cerebellar-norse.

    Attributes:
        request_id: the ``X-Request-ID`` of the HTTP request that failed (the service's logs and
            ``GET /debug/requests/{request_id}`` find it), or ``""`` when the error is not about one request.
        error_type: raised by :mod:`cerebellar_norse.client` for an error answer of the service: its
            ``error.type`` (``validation``, ``out_of_order``, ``future_timestamp``, ``capacity``, ``market_moving``,
            ``engine``, ``internal``, …: docs/http.md, "Errors"); ``""`` otherwise (no answer, or an answer that is
            not the service's error, such as a proxy's page).
        http_status: the HTTP status of that answer (``429`` of a proxy's rate limit, ``503``, ``409``, …), or ``0``
            when no answer came.
    """

    request_id: str = ""
    error_type: str = ""
    http_status: int = 0


@dataclass(frozen=True)
class ConfigProblem:
    """One problem in a configuration.

    Attributes:
        key: dotted TOML key, e.g. ``performance.device`` (``""`` for the whole file).
        message: what is wrong, with the offending value or numbers.
        fix: what to do about it.
    """

    key: str
    message: str
    fix: str = ""

    def __str__(self) -> str:
        text = f"{self.key}: {self.message}" if self.key else self.message  # (a whole-file problem: the path says where)
        if self.fix:
            text += f" (fix: {self.fix})"
        return text


class ConfigError(CerebellarNorseError):
    """The configuration is invalid; ``problems`` lists every problem found."""

    def __init__(self, problems: list[ConfigProblem], source: str = "") -> None:
        self.problems = list(problems)
        self.source = source
        prefix = f"{source}: " if source else ""
        super().__init__(prefix + "; ".join(str(p) for p in self.problems))


class InputError(CerebellarNorseError):
    """Bad input from a caller (a tick, a request body, a CSV row, a checkpoint).

    Attributes:
        field: the offending field (dotted path, e.g. ``ticks.3.price``) or ``""``.
    """

    status_code = 422

    def __init__(self, message: str, field: str = "") -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}" if field else message)


class RepeatedKeyError(InputError):
    """A JSON object of a request body names one key twice (``{"price": 1, "price": 2}``): which value was meant is
    unknown, so the body is refused (422 validation) rather than read with the last value. ``field``: where."""

    def __init__(self, field: str) -> None:
        key = field.rsplit(".", 1)[-1]
        super().__init__(f"key {key!r} appears more than once in its object: send each key once", field)


class TickOrderError(InputError):
    """A tick is older than the last tick applied to its market."""

    status_code = 409


class NotFoundError(InputError):
    """The request names something that does not exist (HTTP 404, ``not_found``)."""

    status_code = 404


class ConflictError(InputError):
    """The request conflicts with the service's state, which is left unchanged (HTTP 409, ``conflict``)."""

    status_code = 409


class DataError(InputError):
    """A training data file is unusable (report lists file:line problems)."""

    def __init__(self, message: str, report: list[str] | None = None) -> None:
        self.report = list(report or [])
        super().__init__(message)


class CheckpointError(InputError):
    """A model checkpoint or state file is corrupt, incomplete or of the wrong shape.

    Attributes:
        path: the file that is corrupt (or the directory when no file is named).
        reason: what is wrong with it (the message without the path).
    """

    def __init__(self, message: str, path: str = "") -> None:
        self.path = path
        self.reason = message
        super().__init__(f"{path}: {message}" if path else message)


class CapacityError(CerebellarNorseError):
    """The service cannot take more work right now (queue full, pool exhausted).

    Attributes:
        retry_after_s: suggested wait before retrying, in seconds.
    """

    def __init__(self, message: str, retry_after_s: float = 0.01) -> None:
        self.retry_after_s = retry_after_s
        super().__init__(message)


HOST_SHORTAGE_RETRY_S = 5.0  # Retry-After of a request the host had no thread, process or memory for (s)


class DeviceMemoryError(CapacityError):
    """The GPU had no memory for an allocation the CUDA backend's budget allowed (another process holds it, or the
    driver's own overhead grew): the device's to free, not the model's or the config's budget. A host shortage
    (:func:`host_shortage_reason`): building the engine of a stored model stops the start instead of refusing the
    model (:class:`EngineHostError`)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retry_after_s=HOST_SHORTAGE_RETRY_S)


class MarketMovingError(CapacityError):
    """A market's state is moving between replicas (scale-out handover): its ticks are refused for now.

    Answered 503 with ``Retry-After``; by then the load balancer routes the market to
    the replica that holds its state.

    Attributes:
        market_id: the market that is moving.
    """

    def __init__(self, market_id: str, message: str, retry_after_s: float = 1.0) -> None:
        self.market_id = market_id
        super().__init__(message, retry_after_s)


class JournalWaitError(CapacityError):
    """The journal's next file cannot be created for now (too many open files, EMFILE/ENFILE; a full disk or quota,
    ENOSPC/EDQUOT): ticks and the other changes of state it must record are refused before they change anything,
    answered 503 with ``Retry-After``; each refused call tries again to create the file (for want of space, at most
    every 0.25 s), and serving goes on once it can."""


class StartupError(CerebellarNorseError):
    """The service cannot start serving (its port cannot be bound); start-up exits 1 with this one line."""


class EngineFatalError(CerebellarNorseError):
    """The engine or its device cannot continue (backend failed, device lost)."""


class DeviceUnavailableError(EngineFatalError):
    """The configured device (e.g. ``cuda``) is not present on this host."""


class StorageError(EngineFatalError):
    """A file of the state dir cannot be written or locked (read-only or full disk, permissions, in use).

    The service does not go on without durable state: at start-up it exits 1 with this
    one line; while serving, it stops (exit code 1) after saving what it can.

    Attributes:
        path: the file or directory concerned.
        errno: the operating system's error number (e.g. 28 ENOSPC, 30 EROFS), or None.
        reported: logged already where it happened (the journal's failure, which every later tick is refused
            with): the answers refusing ticks with it do not log it again.
    """

    def __init__(self, message: str, path: str = "", errno: int | None = None) -> None:
        self.path = path
        self.errno = errno
        self.reported = False
        super().__init__(message)

    @staticmethod
    def is_write_failure(exc: OSError) -> bool:
        """The error numbers of a write that failed for lack of room or a read-only disk (ENOSPC, EDQUOT, EROFS,
        EFBIG), as opposed to a file that cannot be read or used at all."""
        import errno as errno_names

        return exc.errno in (errno_names.ENOSPC, errno_names.EDQUOT, errno_names.EROFS, errno_names.EFBIG)

    @staticmethod
    def os_reason(exc: OSError) -> str:
        """``"<strerror> (errno N ENAME)"`` of an OSError."""
        import errno as errno_names

        code = exc.errno
        name = errno_names.errorcode.get(code, "") if code is not None else ""
        reason = exc.strerror or str(exc) or type(exc).__name__
        detail = f" (errno {code} {name})".replace(" )", ")") if code is not None else ""
        return f"{reason}{detail}"

    @classmethod
    def from_os_error(cls, what: str, path: object, exc: OSError) -> StorageError:
        """``"<what> <path>: <strerror> (errno N ENAME)"`` from an OSError raised while writing ``path``."""
        return cls(f"{what} {path}: {cls.os_reason(exc)}", str(path), exc.errno)


HOST_SHORTAGE_ERRNOS = (errno.EAGAIN, errno.ENOMEM, errno.EMFILE, errno.ENFILE)
"""Error numbers that say the host is short of something for now (a thread or process, memory, a file descriptor),
nothing about the files or the model concerned."""


# how torch's CPU allocator words a failed allocation (a plain RuntimeError: "[enforce fail at alloc_cpu.cpp:N] ...
# DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes. Error code 12 (Cannot allocate memory)")
_TORCH_CPU_ALLOCATOR = "DefaultCPUAllocator: "
_TORCH_CPU_NO_MEMORY = ("can't allocate memory", "not enough memory")


def _torch_gpu_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is torch's ``OutOfMemoryError`` (``torch.cuda.OutOfMemoryError`` is the same class). torch is
    not imported for this: an error of torch's can only come once it was."""
    torch = sys.modules.get("torch")
    oom = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    return isinstance(oom, type) and isinstance(exc, oom)


def _torch_cpu_allocation_failure(exc: BaseException) -> str | None:
    """The words of torch's CPU allocator when ``exc`` is its failed allocation (``DefaultCPUAllocator: can't allocate
    memory: you tried to allocate N bytes``), else None."""
    if not isinstance(exc, RuntimeError):
        return None
    text = str(exc)
    at = text.find(_TORCH_CPU_ALLOCATOR)
    if at < 0 or not any(w in text[at:] for w in _TORCH_CPU_NO_MEMORY):
        return None
    return text[at:].split(". ", 1)[0].strip().rstrip(".")


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` says memory ran out: ``MemoryError`` (host memory), torch's CPU allocator failing (a
    ``RuntimeError``), or torch's ``OutOfMemoryError`` (GPU memory; a ``RuntimeError`` too, not a ``MemoryError``)."""
    return isinstance(exc, MemoryError) or _torch_gpu_out_of_memory(exc) or _torch_cpu_allocation_failure(exc) is not None


def host_shortage_reason(exc: BaseException) -> str | None:
    """What the host was short of when ``exc`` was raised (``MemoryError``, torch's ``OutOfMemoryError`` of GPU
    memory or the CUDA backend's :class:`DeviceMemoryError` made of it, torch's CPU allocator's failure,
    ``RuntimeError("can't start new thread")``, an OSError EAGAIN, ENOMEM, EMFILE or ENFILE), as ``"out of memory
    (MemoryError)"``, ``"out of GPU memory (OutOfMemoryError: ...)"`` or ``"<strerror> (errno N ENAME)"``;
    None for any other error (one that may say something about the input)."""
    if isinstance(exc, MemoryError):
        return f"out of memory (MemoryError{': ' + str(exc) if str(exc) else ''})"
    if isinstance(exc, DeviceMemoryError):
        return f"out of GPU memory ({exc})"
    if _torch_gpu_out_of_memory(exc):
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""  # (torch adds lines of allocator advice)
        return f"out of GPU memory ({type(exc).__name__}{': ' + first if first else ''})"
    cpu = _torch_cpu_allocation_failure(exc)
    if cpu is not None:
        return f"out of memory ({cpu})"
    if isinstance(exc, RuntimeError) and str(exc) == "can't start new thread":
        return "cannot start a thread (can't start new thread)"
    if isinstance(exc, OSError) and exc.errno in HOST_SHORTAGE_ERRNOS:
        return StorageError.os_reason(exc)
    return None


class EngineHostError(StorageError):
    """The engine of a stored model could not be built at start for a host reason (no memory, no file descriptor, no
    thread: :func:`host_shortage_reason`), not for anything in the model: the start stops with this one line and
    moves nothing aside, as for a model file it cannot read (:class:`ModelUnreadableError`), instead of serving
    another model (or the untrained network) and moving aside the market states saved with this one.

    Attributes:
        version: the model whose engine could not be built.
        reason: what the host was short of.
    """

    def __init__(self, version: str, path: str, reason: str, errno: int | None = None) -> None:
        self.version = version
        self.reason = reason
        super().__init__(f"cannot build the engine of model {version} ({path}): {reason}: the host is short of memory, "
                         "GPU memory, file descriptors or threads, nothing is wrong with the model; the service does not start "
                         "(nothing is moved aside): free memory or raise the service's limits (MemoryMax=, LimitNOFILE=, TasksMax=; "
                         "ulimit -v/-n/-u) and start again", path, errno)


# -- the families' members raised by one part each (state files, handover, jobs, data, models, client, debug) --


class ModelUnreadableError(CheckpointError):
    """A stored model's file is there but reading it failed for a reason that says nothing about its bytes: the service
    may not read it (permissions, EACCES or EPERM: a restore from backup without ``chown``, a mode changed by hand), an
    I/O error (EIO), no file descriptor (EMFILE, ENFILE) or memory (ENOMEM): not known damage. The start refuses it in
    one line (:meth:`storage_error`) before anything is touched, instead of serving another model (or the untrained
    network) and moving aside the market states saved with this one; ``--verify-data`` says the same. Elsewhere (an
    activation, a job) it is a model that cannot be loaded, as a corrupt one is.

    Attributes:
        errno: the operating system's error number.
    """

    def __init__(self, path: str, exc: OSError) -> None:
        self.errno = exc.errno
        self._storage = StorageError.from_os_error("cannot read model file", path, exc)
        super().__init__(f"cannot read: {StorageError.os_reason(exc)}", path)

    def storage_error(self) -> StorageError:
        """The error a start refuses it with (one line: the file, the errno, what to do)."""
        if self.errno in (errno.EACCES, errno.EPERM):
            remedy = "make it readable by the service's user (e.g. chown) and start again"
        elif self.errno == errno.EIO:
            remedy = "check the disk (journalctl -k) and start again; a file the disk can no longer read: restore it"
        else:
            remedy = "free file descriptors or memory (LimitNOFILE=, other processes) and start again"
        return StorageError(f"{self._storage}: the service does not start on a model it cannot read (nothing is moved "
                            f"aside): {remedy}", self._storage.path, self.errno)


class NewerFormatError(StorageError):
    """A state dir file written by a newer version of the service, in a format this version does not read.

    The start stops with this one line and leaves the file as it is: moved aside, what it holds would be lost to the
    version that wrote it (an upgrade rolled back). Start that version again, or move the file away on purpose.

    Attributes:
        found: the file's format number.
        supported: the newest format this version reads.
    """

    def __init__(self, path: str, what: str, found: int, supported: int, remedy: str) -> None:
        self.found = found
        self.supported = supported
        super().__init__(f"{path}: written by a newer version of cerebellar-norse ({what} format {found}; this version "
                         f"reads format {supported} and older): the service does not start on it and leaves it as it "
                         f"is: start the version that wrote it (or a later one), or {remedy}", path)


class ForeignStateDirError(CheckpointError):
    """A readable state file written by another state dir (its ``state_id`` is not this dir's): moved aside as foreign.

    ``saved`` and ``expected`` are the two identities (``expected`` None: this state dir
    was written before identities, so any file that has one came from elsewhere).
    """

    def __init__(self, reason: str, path: str, saved: str, expected: str | None) -> None:
        super().__init__(reason, path)
        self.saved = saved
        self.expected = expected


class ForeignStateError(CheckpointError):
    """A readable state file saved for another network or model (fingerprint mismatch); ``saved`` is its fingerprint."""

    def __init__(self, reason: str, path: str, saved: dict[str, Any]) -> None:
        super().__init__(reason, path)
        self.saved = saved

    def other_model(self, fingerprint: dict[str, Any]) -> str | None:
        """The model version the file was saved with, when only that differs from ``fingerprint`` (the same
        network), else None."""
        from .engine.persistence import network_of

        version = self.saved.get("model_version")
        same = network_of(self.saved) == network_of(fingerprint)
        return version if same and isinstance(version, str) and version else None


class StateMismatchError(CheckpointError):
    """An exported market state belongs to another network or model version than the one served here (HTTP 409)."""

    status_code = 409


class StaleStateError(ConflictError):
    """An exported market state is older (its last tick earlier) than the state the market holds here (HTTP 409)."""


class NotMovingError(ConflictError):
    """A move step that needs the market frozen here (release) found it serving (HTTP 409)."""


class JobConflictError(ConflictError):
    """A job is already queued or running (HTTP 409)."""


class JobNotFoundError(NotFoundError):
    """No job with that id (HTTP 404)."""


class ModelNotFoundError(NotFoundError):
    """No stored model of that version (HTTP 404)."""


class RequestNotFoundError(NotFoundError):
    """No timeline kept for that request id (HTTP 404)."""


class DataFileNotFoundError(NotFoundError):
    """A well-formed data file name that names no file in the data dir (HTTP 404)."""


class ModelConflictError(ConflictError):
    """Another model of the same version is stored already (HTTP 409)."""


class OutcomeUnknownError(EngineFatalError):
    """A request was sent but its answer never came (read timeout, connection dropped): its ticks may have been applied.

    The service applies a tick of a timestamp equal to its market's last one again, so
    resending such a tick can apply it twice; check the market first (its last tick
    time: ``GET /debug/markets/{market_id}/state``).

    Attributes:
        market_id: the market of the request.
    """

    def __init__(self, market_id: str, message: str) -> None:
        self.market_id = market_id
        super().__init__(message)


class BatchPartError(CerebellarNorseError):
    """One part of a split batch failed after others were applied.

    Attributes:
        cause: the error of the failed part.
        applied: markets whose part was applied.
        failed: the market whose part failed.
        results: one entry per tick of the caller's list: the result of a tick of an applied part, None for
            the others (those ticks were not applied, or, for the failed part, see ``cause``).
    """

    def __init__(self, cause: CerebellarNorseError, applied: list[str], failed: str,
                 results: Sequence[TickAnswer | None] | None = None) -> None:
        self.cause = cause
        self.applied = applied
        self.failed = failed
        self.results = list(results) if results is not None else []
        super().__init__(f"batch part of market {failed!r} failed ({cause}); parts applied before it: {applied}")


class ServiceCallError(CerebellarNorseError):
    """A debug call to the running service failed; the message says why (never the token)."""
