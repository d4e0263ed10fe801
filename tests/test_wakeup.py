"""The CPU wake-up latency limit (``performance.cpu_wakeup_latency_us``): held, changed, released, refused."""

from __future__ import annotations

import errno
import logging
import os
import struct
from pathlib import Path

import pytest

from cerebellar_norse.config import LIVE_KEYS, load_config
from cerebellar_norse.errors import ConfigError
from cerebellar_norse.hostcheck import HostFacts, host_problems, wakeup_device_access
from cerebellar_norse.wakeup import DEVICE, WakeupLatency, _why, host_limit_us


def _limits(path: Path) -> list[int]:
    """The limits written to a stand-in device, in order."""
    raw = path.read_bytes()
    return [v for (v,) in struct.iter_unpack("=i", raw)]


def _open_fds_to(path: Path) -> int:
    fd_dir = Path("/proc/self/fd")
    return sum(1 for fd in fd_dir.iterdir() if os.path.realpath(fd_dir / fd.name) == str(path.resolve()))


def test_a_limit_is_written_as_the_kernel_reads_it_and_changed_on_the_same_open_file(tmp_path: Path) -> None:
    dev = tmp_path / "cpu_dma_latency"
    dev.write_bytes(b"")
    w = WakeupLatency(dev)
    w.apply(0)
    assert w.held and w.limit_us == 0 and w.refusal == ""
    assert _limits(dev) == [0]
    w.apply(0)  # the same limit: nothing written
    w.apply(25)  # a new limit goes on the open request (a reopen would write over the first value)
    assert _limits(dev) == [0, 25] and w.limit_us == 25
    assert _open_fds_to(dev) == 1
    w.apply(None)
    assert not w.held and w.limit_us is None
    assert _open_fds_to(dev) == 0


def test_release_without_a_limit_and_twice_is_harmless(tmp_path: Path) -> None:
    w = WakeupLatency(tmp_path / "never-opened")
    w.release()
    w.apply(None)
    assert not w.held and w.refusal == ""


def test_a_host_without_the_device_is_logged_and_nothing_is_held(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dev = tmp_path / "missing" / "cpu_dma_latency"
    w = WakeupLatency(dev)
    with caplog.at_level(logging.WARNING, logger="cerebellar_norse.wakeup"):
        w.apply(0)
    assert not w.held
    assert str(dev) in w.refusal and "no CPU latency QoS device" in w.refusal
    msgs = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(msgs) == 1 and "performance.cpu_wakeup_latency_us = 0 not applied" in msgs[0] and str(dev) in msgs[0]


def test_a_refused_open_keeps_a_limit_held_before_it_released_and_says_why(tmp_path: Path) -> None:
    """A device that cannot be written (here a directory) is refused; a later good device is held again."""
    w = WakeupLatency(tmp_path)
    w.apply(10)
    assert not w.held and str(tmp_path) in w.refusal
    dev = tmp_path / "dev"
    dev.write_bytes(b"")
    w.device = dev
    w.apply(10)
    assert w.held and w.refusal == "" and _limits(dev) == [10]
    w.release()


def test_a_permission_refusal_names_the_fix() -> None:
    why = _why(PermissionError(errno.EACCES, "Permission denied"), DEVICE)
    assert str(DEVICE) in why and "Permission denied" in why
    assert "60-cerebellar-norse.rules" in why and "docs/install.md" in why


def test_the_key_is_optional_bounded_and_applied_by_a_reload() -> None:
    assert load_config(environ={}).performance.cpu_wakeup_latency_us is None
    cfg = load_config(environ={"CEREBELLAR_NORSE_PERFORMANCE__CPU_WAKEUP_LATENCY_US": "0"})
    assert cfg.performance.cpu_wakeup_latency_us == 0
    for bad in ("-1", "1000001", "fast"):
        with pytest.raises(ConfigError) as exc:
            load_config(environ={"CEREBELLAR_NORSE_PERFORMANCE__CPU_WAKEUP_LATENCY_US": bad})
        assert [p.key for p in exc.value.problems] == ["performance.cpu_wakeup_latency_us"]
    assert "performance.cpu_wakeup_latency_us" in LIVE_KEYS


@pytest.mark.parametrize(("access", "limit", "problem"), [
    ("writable", 0, False), ("not writable", 0, True), ("missing", 5, True), ("not writable", None, False),
    ("", 0, False)])
def test_validate_config_reports_a_limit_the_host_would_refuse(access: str, limit: int | None, problem: bool) -> None:
    env = {} if limit is None else {"CEREBELLAR_NORSE_PERFORMANCE__CPU_WAKEUP_LATENCY_US": str(limit)}
    cfg = load_config(environ=env)
    host = HostFacts(ram_total_bytes=None, ram_available_bytes=None, cuda_available=False, wakeup_device=access)
    found = [p for p in host_problems(cfg, host) if p.key == "performance.cpu_wakeup_latency_us"]
    assert len(found) == int(problem)
    if problem:
        assert access in found[0].message and "would log a warning and serve without it" in found[0].message
        assert ("60-cerebellar-norse.rules" in found[0].fix) == (access == "not writable")


def test_device_access_is_read_from_the_file_system(tmp_path: Path) -> None:
    assert wakeup_device_access(tmp_path / "nothing") == "missing"
    dev = tmp_path / "dev"
    dev.write_bytes(b"")
    assert wakeup_device_access(dev) == "writable"


@pytest.mark.skipif(not (DEVICE.exists() and os.access(DEVICE, os.R_OK | os.W_OK)),
                    reason="the kernel's CPU latency QoS device is not readable and writable here")
def test_the_kernel_holds_the_limit_while_it_is_held_and_drops_it_after() -> None:
    before = host_limit_us()
    assert before is not None
    if before <= 200:
        pytest.skip(f"another process holds a lower limit ({before} us)")
    w = WakeupLatency()
    w.apply(200)
    try:
        assert w.held and host_limit_us() == 200
        w.apply(150)
        assert host_limit_us() == 150
    finally:
        w.release()
    assert host_limit_us() == before
