"""The CPU wake-up latency limit the service holds while it runs (``performance.cpu_wakeup_latency_us``).

Linux keeps one limit on how long an idle CPU may take to wake up: the lowest of the
requests held open on ``/dev/cpu_dma_latency`` (the kernel's CPU latency QoS). While a
limit is held, the idle governor picks no idle state slower to leave than it. A limit of 0
leaves only polling: an idle CPU spins in the kernel's idle loop instead of halting (on a
virtual machine, instead of handing its core back to the hypervisor), so the next request
finds it awake and the network's weights still in its caches. A request lasts while its
file is open: the kernel drops it when the file is closed or the process ends, however it
ends, so no setting outlives the service.

The price is idle power on every CPU of the host, not only the service's ones: the limit
is the host's. The device is root's alone unless the host grants it
(``systemd/60-cerebellar-norse.rules``, docs/install.md); a host that refuses is logged and
the service serves without the limit (:attr:`WakeupLatency.refusal`).
"""

from __future__ import annotations

import logging
import os
import struct
from pathlib import Path

log = logging.getLogger("cerebellar_norse.wakeup")

DEVICE = Path("/dev/cpu_dma_latency")
_VALUE = struct.Struct("=i")  # the kernel reads and writes the limit as one native 32-bit int (µs)


def _why(exc: OSError, device: Path) -> str:
    """What an operator reads when ``device`` cannot be opened or written."""
    reason = exc.strerror or type(exc).__name__
    if isinstance(exc, PermissionError):
        return (f"{device}: {reason} (the device is root's unless the host grants it: install "
                "systemd/60-cerebellar-norse.rules and allow it in the unit, docs/install.md, \"CPU wake-up latency\")")
    if isinstance(exc, FileNotFoundError):
        return f"{device}: {reason} (this kernel or container offers no CPU latency QoS device)"
    return f"{device}: {reason}"


def system_limit_us(fd: int) -> int | None:
    """The host's limit in force (µs: the lowest request of any process) read through ``fd``; None when unreadable."""
    try:
        raw = os.pread(fd, _VALUE.size, 0)
    except OSError:
        return None
    return int(_VALUE.unpack(raw)[0]) if len(raw) == _VALUE.size else None


def host_limit_us(device: Path = DEVICE) -> int | None:
    """The host's limit in force (µs), read from ``device``; None where it cannot be read (not root, no device)."""
    try:
        fd = os.open(device, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return system_limit_us(fd)
    finally:
        os.close(fd)


def _open(device: Path) -> int:
    """``device`` open to write (and to read the host's limit back where that is allowed too)."""
    try:
        return os.open(device, os.O_RDWR | os.O_CLOEXEC)
    except PermissionError:
        return os.open(device, os.O_WRONLY | os.O_CLOEXEC)


class WakeupLatency:
    """The service's request on the host's CPU wake-up latency: held, refused by the host, or not asked for.

    Attributes:
        device: the kernel's CPU latency QoS device.
        limit_us: the limit held (µs), None while none is.
        refusal: why the limit last asked for is not held (the device's error and the fix), ``""`` otherwise.
    """

    def __init__(self, device: Path = DEVICE) -> None:
        self.device = device
        self.limit_us: int | None = None
        self.refusal = ""
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """A limit is held now."""
        return self.limit_us is not None

    def apply(self, limit_us: int | None) -> None:
        """Hold ``limit_us`` (µs) from now on, in place of any limit held; None releases it.

        Never raises: a host that refuses (no device, no permission) is logged at WARNING and
        leaves no limit held, with :attr:`refusal` saying why. Changing a held limit writes
        the new value on the same open file, so the host's limit never lapses in between.
        """
        if limit_us is None:
            self.release()
            return
        if limit_us == self.limit_us:
            return
        if self._fd is None:
            try:
                self._fd = _open(self.device)
            except OSError as exc:
                self._refused(limit_us, exc)
                return
        try:
            os.write(self._fd, _VALUE.pack(limit_us))
        except OSError as exc:
            self.release()
            self._refused(limit_us, exc)
            return
        self.limit_us, self.refusal = limit_us, ""
        log.info("holding a CPU wake-up latency limit", extra={"fields": {
            "cpu_wakeup_latency_us": limit_us, "host_limit_us": system_limit_us(self._fd), "device": str(self.device)}})

    def _refused(self, limit_us: int, exc: OSError) -> None:
        self.limit_us = None
        self.refusal = _why(exc, self.device)
        log.warning("performance.cpu_wakeup_latency_us = %d not applied, serving without it: %s", limit_us, self.refusal)

    def release(self) -> None:
        """Close the request: the host's limit goes back to what other processes ask for."""
        fd, self._fd = self._fd, None
        was = self.limit_us
        self.limit_us, self.refusal = None, ""
        if fd is not None:
            os.close(fd)
            if was is not None:
                log.info("released the CPU wake-up latency limit", extra={"fields": {"cpu_wakeup_latency_us": was}})
