"""systemd integration without extra dependencies: sd_notify over the NOTIFY_SOCKET datagram socket.

* ``READY=1`` once the model is loaded and the socket is listening;
* ``WATCHDOG=1`` every ``WATCHDOG_USEC / 2`` while the engine is healthy (a hung or
  failed engine stops the pings, and systemd restarts the service);
* ``STOPPING=1`` when shutdown begins, ``RELOADING=1`` around a config reload;
* ``STATUS=…`` human-readable state for ``systemctl status``.

Without ``NOTIFY_SOCKET`` (not under systemd) every call is a no-op.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping


def supervised(environ: Mapping[str, str] | None = None) -> bool:
    """True when a notify socket is set (the process runs under systemd with ``Type=notify``)."""
    return bool((os.environ if environ is None else environ).get("NOTIFY_SOCKET", ""))


def notify(message: str, environ: Mapping[str, str] | None = None) -> bool:
    """Send one sd_notify message; True when sent (False when not under systemd or on error)."""
    env = os.environ if environ is None else environ
    addr = env.get("NOTIFY_SOCKET", "")
    if not addr:
        return False
    if addr.startswith("@"):
        addr = "\0" + addr[1:]  # abstract namespace socket
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(addr)
            sock.sendall(message.encode("utf-8"))
        return True
    except OSError:
        return False


def watchdog_interval_s(environ: Mapping[str, str] | None = None) -> float | None:
    """Seconds between watchdog pings (half of WATCHDOG_USEC), or None when no watchdog is set for us."""
    env = os.environ if environ is None else environ
    usec = env.get("WATCHDOG_USEC")
    pid = env.get("WATCHDOG_PID")
    if not usec:
        return None
    if pid and pid.isdigit() and int(pid) != os.getpid():
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 2e6 if value > 0 else None


def ready(status: str = "") -> bool:
    """Tell systemd the service is ready."""
    return notify("READY=1" + (f"\nSTATUS={status}" if status else ""))


def status(text: str) -> bool:
    """Set the status line of ``systemctl status`` (nothing else changes)."""
    return notify(f"STATUS={text}")


def stopping(status: str = "") -> bool:
    """Tell systemd the service is stopping."""
    return notify("STOPPING=1" + (f"\nSTATUS={status}" if status else ""))


def reloading() -> bool:
    """Tell systemd a reload started (send ready() when it ends)."""
    return notify(f"RELOADING=1\nMONOTONIC_USEC={time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000}")


def watchdog_ping() -> bool:
    """Tell systemd the service is alive."""
    return notify("WATCHDOG=1")
