"""Service lifecycle under systemd: readiness, watchdog, reload on SIGHUP.

* READY=1 is sent once the engine is warm and uvicorn listens on its socket.
* WATCHDOG=1 is sent every WATCHDOG_USEC/2 while the engine is healthy (ready, or draining at a stop, and
  accepting); a wedged event loop sends nothing, and systemd restarts the service.
* STATUS= (the line of ``systemctl status``) names the model served, whether it is
  degraded and whether the journal's wait refuses ticks; it is sent again within
  :data:`STATUS_PERIOD_S` of any of these changing.
* SIGHUP re-reads the config file. Keys that are safe to change live are applied;
  any other changed key is logged as needing a restart (and nothing of it applied);
  a file whose live keys would not fit the running values of the others (the
  consistency checks of a start, run on that mix) is refused as a whole;
  a changed ``logging.level`` while ``CEREBELLAR_NORSE_LOG`` is set, and a key the file
  sets to another value than a ``CEREBELLAR_NORSE_<SECTION>__<KEY>`` variable, are logged
  as overridden (the environment wins, as at start). The reload's outcome is logged whatever the level in force.
  Once a stop has begun (its drain included) a SIGHUP is logged and ignored.
* Market state: restored (and the tick journal replayed) before the socket opens,
  checkpointed periodically while serving, saved at shutdown. A state write that
  fails stops the service with exit code 1 (see :func:`state_write_failed`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..config import (
    LIVE_KEYS,
    Config,
    build_checked_config,
    build_config,
    consistency_problems,
    env_overrides,
    read_toml_file,
    with_server,
)
from ..engine.journal import Durability, waiting_for
from ..engine.persistence import STATE_FILE, check_writable
from ..engine.state_dir import StateDirLock
from ..errors import ConfigError, StorageError
from ..observability import systemd
from ..observability.logging import LEVEL_ENV, effective_level, env_level, log_always
from ..observability.ratelimit import ALIKE_WINDOW_S, installed_alike_limit
from ..training.checkpoints import MODELS_DIR, models_dir_problem
from .degradation import Degradation
from .deps import ServiceState, current_degradation
from .exposure import reload_auth_refusal

log = logging.getLogger("cerebellar_norse.lifecycle")

STATUS_PERIOD_S = 1.0  # the status line is checked for a change this often (s) while under systemd



def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def _plain(c: Config) -> dict[str, Any]:
    """Every key of ``c``, dotted, with its value (the token's by value)."""
    d = _flatten(c.model_dump(mode="json"))
    token = c.server.api_token
    d["server.api_token"] = token.get_secret_value() if token is not None else None
    return d


def changed_keys(old: Config, new: Config) -> list[str]:
    """Dotted keys whose values differ between two configs (secrets compared by value)."""
    a, b = _plain(old), _plain(new)
    return sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def env_overridden(data: dict[str, Any], path: str, running: Config, cli_keys: Any = ()) -> dict[str, tuple[str, Any]]:
    """The keys the file at ``path`` (read as ``data``: the reading the running config was built from, never a second
    one, which may find the file changed meanwhile) sets to another value than the one in force because a
    ``CEREBELLAR_NORSE_<SECTION>__<KEY>`` variable of the service's environment overrides it (the variable wins, at
    start as at a reload), each with its variable's name and the file's value; ``cli_keys`` (``--host``/``--port``)
    win over both and are left out. Empty when the file alone does not load."""
    _, names = env_overrides(os.environ)
    if not names:
        return {}
    variables = set(names.values())
    try:
        file_only = build_config(data, path, {k: v for k, v in os.environ.items() if k not in variables})
    except ConfigError:
        return {}
    in_file, mine, now = _flatten(data), _plain(file_only), _plain(running)
    return {key: (var, mine.get(key)) for key, var in sorted(names.items())
            if key in in_file and key not in {f"server.{k}" for k in cli_keys} and mine.get(key) != now.get(key)}


def file_values_overridden(path: str | None, running: Config, cli_keys: Any = (),
                           data: dict[str, Any] | None = None) -> dict[str, Any]:
    """The file's values of the keys an environment variable overrides (:func:`env_overridden`), as the service read
    them (at start, then at each reload): a later reload warns only of those whose value in the file changed since."""
    if path is None:
        return {}
    if data is None:  # (``data``: the file as read to build ``running``)
        try:
            data = read_toml_file(Path(path))
        except ConfigError:
            return {}
    return {key: value for key, (_, value) in env_overridden(data, path, running, cli_keys).items()}


def split_changes(running: Config, new: Config) -> tuple[list[str], list[str]]:
    """The changed keys of ``new`` against ``running``: (those a reload applies live, those needing a restart)."""
    changed = changed_keys(running, new)
    return [k for k in changed if k in LIVE_KEYS], [k for k in changed if k not in LIVE_KEYS]


def with_live_keys(running: Config, new: Config, live: list[str]) -> Config:
    """The config a reload leaves running: ``running`` with the ``live`` keys taken from ``new``, every other key
    (the restart-only ones included) kept at its running value."""
    if not live:
        return running
    update: dict[str, Any] = {}
    for section in {k.split(".", 1)[0] for k in live}:
        fields = {k.split(".", 1)[1]: getattr(getattr(new, section), k.split(".", 1)[1]) for k in live if k.startswith(section + ".")}
        update[section] = getattr(running, section).model_copy(update=fields)
    return running.model_copy(update=update)


def mixed_config_refusal(running: Config, new: Config, live: list[str], restart: list[str]) -> str | None:
    """Why a reload to ``new`` must be refused because the config it would leave running is inconsistent, or None;
    ``live`` and ``restart`` are its changed keys (:func:`split_changes`).

    A reload applies the live keys and keeps the restart-only ones at their running
    values: a file that is consistent as a whole (``queue_size = 100`` with
    ``batch_size = 64``) can still leave an inconsistent mix running (queue_size 100
    with the running batch_size 256). The consistency checks of a start
    (:func:`~cerebellar_norse.config.consistency_problems`) are run on that mix.
    """
    problems = consistency_problems(with_live_keys(running, new, live))
    if not problems:
        return None
    held = ""
    if restart:
        held = f" while {', '.join(restart)} (restart only) kept " + ("its running value" if len(restart) == 1
                                                                      else "their running values")
    return (f"applying {', '.join(live)} live{held} would leave an inconsistent config running: "
            f"{'; '.join(str(p) for p in problems)}; restart the service to apply the file as a whole")


def apply_reload(state: ServiceState, new: Config, live: list[str]) -> None:
    """Apply the ``live`` keys of ``new`` (its changed keys a reload applies, :func:`split_changes`)."""
    if not live:
        return
    state.cfg = with_live_keys(state.cfg, new, live)
    eng = state.engine
    eng.cfg = state.cfg
    eng.apply_live_settings(state.cfg.performance)
    if "performance.cpu_wakeup_latency_us" in live:
        state.wakeup.apply(state.cfg.performance.cpu_wakeup_latency_us)
    if "debug.record_requests" in live:
        eng.close_recording_if_off()  # "a file is closed when ... recording is switched off", not at the next batch
    logging.getLogger().setLevel(effective_level(state.cfg.logging))


def serving_status(state: ServiceState, note: str = "") -> str:
    """The status line of ``systemctl status`` while serving: the served model and the device, whether /health says
    "degraded" (and ``note``).

    Sent at start, after every reload and after every model swap, so that it always names the model served, and by
    :func:`announce_when_listening` whenever it changes otherwise (the journal's wait begins or ends).
    """
    line = f"serving model {state.engine.model_version} on {state.device}"
    if current_degradation(state) is not None:
        line += ", degraded (GET /health says why)"
    journal = state.engine.journal
    if journal is not None and journal.stalled is not None:
        line += (f", refusing ticks: the journal waits for {waiting_for(journal.stalled, journal.state_dir)[0]} "
                 "(GET /health says why)")
    return f"{line} ({note})" if note else line


def stopping(state: ServiceState) -> bool:
    """True once a stop has begun: a SIGTERM's drain (``server.drain_s``) runs, or the server is shutting down."""
    return state.draining or bool(getattr(state.server, "should_exit", False))


def reload_config(state: ServiceState, path: str | None) -> None:
    """Handle SIGHUP: re-read ``path``, apply what is safe, log what needs a restart.

    Every outcome is logged whatever ``logging.level`` is (:func:`log_always`): a reload
    that raises the level to WARNING, or one made while it is ERROR, still leaves its line
    in the journal. A changed ``logging.level`` while ``CEREBELLAR_NORSE_LOG`` sets the
    level is listed as ``overridden``, not ``applied``: the variable still wins.

    Once a stop has begun (a drain, ``server.drain_s``, or the shutdown after it) a reload is
    ignored, saying so: the running config stays in force until the process exits, and
    systemd is not told the service is ready and serving again while it stops.
    """
    if stopping(state):
        log_always(log, logging.WARNING, "reload requested while the service is stopping: ignored (the running config "
                                         "stays in force until it exits; start it again to use the file)")
        return
    if path is None:
        log_always(log, logging.INFO, "reload requested but the service runs on the built-in default config: "
                                      "nothing to reload")
        return
    systemd.reloading()
    try:  # the file is read once: what is checked is what is applied and what the lines below report
        data = read_toml_file(Path(path))
        new = with_server(build_checked_config(data, path), state.server_overrides)  # --host/--port win, as at start
    except ConfigError as exc:
        log_always(log, logging.ERROR, "config reload refused, keeping the running config: %s", exc)
        systemd.ready(serving_status(state, "last reload refused: config invalid"))
        return
    refusal = reload_auth_refusal(state.cfg, new)
    if refusal is not None:
        log_always(log, logging.ERROR, "config reload refused, keeping the running config: %s", refusal)
        systemd.ready(serving_status(state, "last reload refused: auth would change"))
        return
    live, restart = split_changes(state.cfg, new)
    refusal = mixed_config_refusal(state.cfg, new, live, restart)
    if refusal is not None:
        log_always(log, logging.ERROR, "config reload refused, keeping the running config: %s", refusal)
        systemd.ready(serving_status(state, "last reload refused: config inconsistent with the running one"))
        return
    apply_reload(state, new, live)
    state.need_restart = list(restart)  # (GET /debug/config): what the file holds that a restart would apply
    applied = list(live)  # less a level the environment overrides (below)
    found = env_overridden(data, path, state.cfg, state.server_overrides)
    overridden = list(found)
    # a variable set for good (a replica's port, state dir) overrides its key at every reload: only a value the file
    # changed since it was last read is news to warn of
    by_variable = {key: var for key, (var, value) in found.items()
                   if key not in state.file_overridden or state.file_overridden[key] != value}
    state.file_overridden = {key: value for key, (_, value) in found.items()}
    forced = env_level()
    if forced is not None and "logging.level" in applied:
        applied.remove("logging.level")
        overridden = sorted({*overridden, "logging.level"})
    log_always(log, logging.INFO, "config reloaded",
               fields={"applied": applied, "need_restart": restart, "overridden": overridden})
    if forced is not None and "logging.level" in overridden:
        log_always(log, logging.WARNING, "logging.level changed to %s in the config file, but %s=%s overrides it: the "
                                         "level stays %s (remove the variable from the service's environment and "
                                         "restart to use the file's level)",
                   state.cfg.logging.level, LEVEL_ENV, forced, forced)
    if by_variable:
        log_always(log, logging.WARNING, "the config file changes keys that environment variables override: "
                                         "%s; the variables' values stay in force (remove the variables from the "
                                         "service's environment and restart to use the file's values)",
                   ", ".join(f"{k} ({v})" for k, v in by_variable.items()), fields={"overridden_by": by_variable})
    if restart:
        log_always(log, logging.WARNING, "these changed keys need a restart to take effect: %s", ", ".join(restart))
    systemd.ready(serving_status(state))


async def announce_when_listening(state: ServiceState, is_listening: Callable[[], bool], timeout_s: float = 300.0) -> None:
    """Send READY=1 once the socket listens; then, under systemd, ping the watchdog while healthy and send the status
    line again whenever it changes (checked every :data:`STATUS_PERIOD_S`)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not is_listening():
        if loop.time() > deadline:
            log.error("socket not listening after %.0f s; not reporting ready", timeout_s)
            return
        await asyncio.sleep(0.01)
    sent = serving_status(state)
    systemd.ready(sent)
    if not systemd.supervised():
        return
    interval = systemd.watchdog_interval_s()
    step = STATUS_PERIOD_S if interval is None else min(interval, STATUS_PERIOD_S)
    next_ping = loop.time()
    while True:
        if interval is not None and loop.time() >= next_ping:
            # (also while a stop drains, server.drain_s: a drain longer than WatchdogSec= must not end in a kill)
            if (state.ready or state.draining) and state.engine.snapshot().accepting:
                systemd.watchdog_ping()
            next_ping = loop.time() + interval
        line = serving_status(state)
        # a reload's or a swap's own line (with its note) stays until the state changes again; a line that could not
        # be sent (no descriptor free) is tried again; once a stop has begun, its own line (STOPPING=1) stays
        if line != sent and not stopping(state) and systemd.status(line):
            sent = line
        await asyncio.sleep(step)


def ignore_sighup_while_starting() -> None:
    """Until the app installs its reload handler, a SIGHUP is logged and ignored.

    Its default action ends the process: a ``kill -HUP`` (or a reload sent by a script)
    while the service loads its model, trains its first one or restores market state
    would stop it without a word and without saving anything.
    """
    def starting(signum: int, frame: Any) -> None:
        log_always(log, logging.WARNING, "reload requested while the service is starting: ignored (send it again once "
                                         "/health answers 200)")

    signal.signal(signal.SIGHUP, starting)


def install_sighup(state: ServiceState, config_path: str | None) -> None:
    """Reload the config on SIGHUP (instead of the default: terminate)."""
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGHUP, reload_config, state, config_path)


def summary_fields(state: ServiceState, ticks_before: int, batches_before: int, interval_s: float) -> dict[str, Any] | None:
    """The fields of a ``processing summary`` line over the client ticks processed since the processing histogram
    counted ``ticks_before`` and the latency window had recorded ``batches_before`` batches; None without a tick.

    Every figure covers that one interval: ``ticks``, ``ticks_per_second`` (over
    ``interval_s``, s) and the exact median and p99 per-tick network time (ns) of its
    batches (of the last 4096 of them in an interval with more).
    """
    ticks = sum(state.metrics.processing.counts) - ticks_before
    if ticks <= 0:
        return None
    q = state.metrics.recent.quantiles((0.5, 0.99), since=batches_before)
    eng = state.engine
    return {"ticks": ticks, "ticks_per_second": round(ticks / interval_s, 1),
            "processing_time_ns": int(q[0.5] * 1e9), "processing_time_ns_p99": int(q[0.99] * 1e9),
            "queue_depth": eng.queue_depth, "markets": eng.pool.used, "model_version": eng.model_version}


async def periodic_summary(state: ServiceState, interval_s: float = 60.0) -> None:
    """Log a processing summary every ``interval_s`` (s) in which ticks were processed (INFO), with
    ``fields.processing_time_ns``; every figure of a line covers the ``interval_s`` before it
    (:func:`summary_fields`).

    The per-tick line is DEBUG (it would cost latency at INFO); this line lets
    ``jq 'select(.fields.processing_time_ns) | .fields.processing_time_ns'`` work at INFO.
    """
    m = state.metrics
    ticks, batches = sum(m.processing.counts), m.recent.added
    while True:
        await asyncio.sleep(interval_s)
        fields = summary_fields(state, ticks, batches, interval_s)
        ticks, batches = sum(m.processing.counts), m.recent.added
        if fields is not None:
            log.info("processing summary", extra={"fields": fields})


async def sweep_alike_lines() -> None:
    """Say, within a window of :class:`AlikeLinesLimit` after a flood of alike lines ends, how many were not
    written (the limit itself says it only at the next line of its loggers)."""
    while True:
        limit = installed_alike_limit()
        await asyncio.sleep(limit.window_s if limit is not None else ALIKE_WINDOW_S)
        if limit is not None:
            limit.sweep()


def check_state_dir(cfg: Config) -> StateDirLock:
    """Refuse to start on a state dir that cannot be written or that another service uses; returns its lock.

    Raises StorageError (one line, exit code 1). The lock is held for the life of the
    process (the kernel drops it when the process ends).
    """
    check_writable(Path(cfg.paths.state_dir))
    problem = models_dir_problem(Path(cfg.paths.state_dir))
    if problem is not None:  # its models unreachable: no untrained network served, no market state moved aside
        raise StorageError(problem, str(Path(cfg.paths.state_dir) / MODELS_DIR))
    return StateDirLock(Path(cfg.paths.state_dir)).acquire()


def check_free_space(state_dir: Path, segment_size: int) -> None:
    """Refuse to serve from a state dir that cannot hold its next checkpoint; warn when the journal's next file
    will not fit either.

    After recovery the state dir holds a fresh checkpoint and an open journal file: the next
    checkpoint is written beside the current one before it replaces it, so it needs the
    current one's size free, or the service would skip every checkpoint and, once its journal
    file is full, refuse every tick while looking healthy at start.

    Raises:
        StorageError: less free space than the checkpoint's size (one line, exit code 1).
    """
    checkpoint = state_dir / STATE_FILE
    try:
        need = checkpoint.stat().st_size
        usage = shutil.disk_usage(state_dir)
    except OSError:
        return  # nothing to measure (no checkpoint yet, or a file system without the figures): the writes will tell
    if usage.total <= 0:  # no figures (ramfs, tmpfs without a size, some FUSE file systems report 0 of 0): unknown
        return
    free = usage.free
    if free < need:
        raise StorageError(f"state dir {state_dir} has {free} bytes free, less than the {need} bytes its next "
                           f"checkpoint needs beside {checkpoint.name} (keep free at least three journal files and two "
                           f"checkpoints: docs/operations.md, Disk space)", str(state_dir))
    if free < need + segment_size:
        log.warning("state dir %s has %d bytes free: the next checkpoint fits, the journal's next file "
                    "(performance.journal_segment_size = %d bytes) does not; ticks will be refused (503) from when it is "
                    "needed until space is freed", state_dir, free, segment_size,
                    extra={"fields": {"free_bytes": free, "checkpoint_bytes": need, "segment_bytes": segment_size}})


def prepare_state(state: ServiceState) -> None:
    """Restore the saved market states (replaying the journal after them with ``[performance] journal``); once.

    Runs before the socket opens (from ``serve``) or in the app's lifespan. Raises
    StorageError when the state dir cannot be written or is in use by another process.
    """
    if state.state_prepared:
        return
    eng = state.engine
    lock = state.state_lock
    if state.cfg.performance.journal:
        durability = Durability(eng, on_fatal=lambda exc: state_write_failed(state, exc), lock=lock)
        durability.recover()
        state.durability = durability
        if state.jobs is not None:  # job records a full disk refused: written once a checkpoint is again
            durability.on_checkpoint = state.jobs.write_pending
        check_free_space(Path(state.cfg.paths.state_dir), durability.segment_size)
    else:
        if lock is None:
            state.state_lock = check_state_dir(state.cfg)
        eng.restore_state()
    eng.finish_restore(state.cfg.training.reset_state_on_swap)  # states saved with another model: swap it in now
    if eng.restore_problem is not None:  # /health "degraded" until the next restart, after any reason it has already
        held = current_degradation(state) or Degradation(eng.model_version)
        state.degraded = held.with_restore_problem(eng.restore_problem)
    state.state_prepared = True


def state_write_failed(state: ServiceState, exc: StorageError) -> None:
    """A journal or checkpoint write failed while serving: not ready (503 with the reason), stop, exit code 1."""
    state.ready = False
    state.not_ready_reason = f"state write failed: {exc}"
    state.exit_code = 1
    server = state.server
    if server is not None:
        server.should_exit = True


def start_checkpoints(state: ServiceState) -> asyncio.Task[None] | None:
    """The periodic checkpoint task (``[performance] checkpoint_interval_s``) when the journal is on."""
    durability: Durability | None = state.durability
    if durability is None:
        return None
    return asyncio.create_task(durability.run())


async def stop_engine(state: ServiceState, save: bool) -> None:
    """Drain the engine and save the market states; a failed save is logged (path, errno) and sets exit code 1.

    The previous state file is never replaced by a failed save (atomic rename), and with
    the journal on, the journal is kept too: the next start still restores every
    acknowledged tick.
    """
    eng = state.engine
    try:
        await eng.drain(save=save)
    except StorageError:  # logged by the journal with path and errno
        state.exit_code = 1
    except OSError as exc:
        err = StorageError.from_os_error("cannot save market state", eng.state_path(), exc)
        log.error("%s; the previous file is kept", err, extra={"fields": {"path": err.path, "errno": err.errno}})
        state.exit_code = 1
