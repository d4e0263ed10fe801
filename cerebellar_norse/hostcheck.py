"""Host checks of a configuration: is the device there, does the memory fit.

Used by ``cerebellar-norse --validate-config`` (not by ``--validate-only``).
Facts about the host are gathered once into :class:`HostFacts` so the checks are
pure functions and can be tested with any host description.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from .config import Config, estimate_memory, fmt_bytes, fmt_bytes_at_least
from .errors import ConfigProblem
from .wakeup import DEVICE as WAKEUP_DEVICE

# journal files in the state dir at a time: the open one, the next one made ahead, the one a checkpoint is about to
# delete (docs/operations.md, Disk space)
JOURNAL_FILES_KEPT = 3


@dataclass(frozen=True)
class HostFacts:
    """What the checks need to know about the host.

    Attributes:
        ram_total_bytes: physical memory (bytes), None when unknown.
        ram_available_bytes: memory available to new processes (bytes), None when unknown.
        cuda_available: a CUDA device can be used.
        gpu_memory_total_bytes: memory of CUDA device 0 (bytes), None without CUDA.
        gpu_name: name of CUDA device 0, "" without CUDA.
        state_fs_bytes: size (bytes) of the file system that holds the state dir (or would: its nearest existing
            parent), None when unknown or not looked at.
        wakeup_device: the kernel's CPU latency QoS device (:mod:`cerebellar_norse.wakeup`) to this user:
            ``"writable"``, ``"not writable"`` or ``"missing"``; ``""`` when not looked at.
    """

    ram_total_bytes: int | None
    ram_available_bytes: int | None
    cuda_available: bool
    gpu_memory_total_bytes: int | None = None
    gpu_name: str = ""
    state_fs_bytes: int | None = None
    wakeup_device: str = ""


def _meminfo() -> tuple[int | None, int | None]:
    total = avail = None
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "MemAvailable"):
                    value = int(rest.split()[0]) * 1024
                    if key == "MemTotal":
                        total = value
                    else:
                        avail = value
    except OSError:
        pass
    return total, avail


def available_ram_bytes() -> int | None:
    """Memory available to new allocations now (bytes, /proc/meminfo's MemAvailable), None when unknown."""
    return _meminfo()[1]


def _cuda_facts() -> tuple[bool, int | None, str]:
    """Ask torch for CUDA device 0; no NVIDIA driver on the host, or a broken one, reads as no CUDA."""
    if shutil.which("nvidia-smi") is None and not os.path.exists("/dev/nvidiactl"):
        return False, None, ""  # skip importing torch on hosts that cannot have CUDA
    from .cuda.device import cuda_available

    if not cuda_available():
        return False, None, ""
    try:
        import torch

        props = torch.cuda.get_device_properties(0)
        return True, int(props.total_memory), str(props.name)
    except Exception:  # a device that cannot even report its properties is not usable
        return False, None, ""


def file_system_bytes(path: Path) -> int | None:
    """Size (bytes) of the file system holding ``path``, or its nearest existing parent's; None when unknown."""
    for where in (path, *path.absolute().parents):
        try:
            st = os.statvfs(where)
        except OSError:
            continue
        return st.f_blocks * st.f_frsize
    return None


def wakeup_device_access(device: Path = WAKEUP_DEVICE) -> str:
    """Whether this user may hold a CPU wake-up latency limit on ``device``: ``"writable"``, ``"not writable"`` or
    ``"missing"`` (see :class:`HostFacts`)."""
    if not device.exists():
        return "missing"
    return "writable" if os.access(device, os.W_OK) else "not writable"


def gather_host_facts() -> HostFacts:
    """Read the facts of this host (RAM from /proc/meminfo, CUDA through torch, the CPU latency QoS device);
    ``state_fs_bytes`` is left to :func:`with_state_dir`."""
    total, avail = _meminfo()
    cuda, gpu_mem, gpu_name = _cuda_facts()
    return HostFacts(total, avail, cuda, gpu_mem, gpu_name, wakeup_device=wakeup_device_access())


def with_state_dir(host: HostFacts, state_dir: Path) -> HostFacts:
    """``host`` with the size of the file system of ``state_dir`` (:func:`file_system_bytes`)."""
    return dataclasses.replace(host, state_fs_bytes=file_system_bytes(Path(state_dir)))


def resolve_device(cfg: Config, host: HostFacts) -> str:
    """The device the service will use: ``auto`` becomes cuda when present, else cpu."""
    if cfg.performance.device == "auto":
        return "cuda" if host.cuda_available else "cpu"
    return cfg.performance.device


def cuda_plan_problems(cfg: Config, host: HostFacts) -> list[ConfigProblem]:
    """Problems of the CUDA backend's memory plan (:mod:`cerebellar_norse.cuda.plan`): no room for one tick, or more than the GPU has."""
    from .cuda.plan import plan_for_config

    plan = plan_for_config(cfg)
    out: list[ConfigProblem] = []
    if plan.state_fits_pool and plan.launch_ticks < 1:
        out.append(ConfigProblem(
            "performance.memory_limit",
            f"the cuda backend has no room for one tick: {plan.summary()}; one tick's step workspace is "
            f"{fmt_bytes(plan.one_tick_workspace)} per stream",
            f"raise memory_limit to at least {fmt_bytes_at_least(plan.fixed + plan.streams * plan.one_tick_workspace)}, "
            "or lower memory_pool_size, cuda_streams or the network size",
        ))
    if host.gpu_memory_total_bytes is not None and plan.total > host.gpu_memory_total_bytes:
        out.append(ConfigProblem(
            "performance.memory_limit",
            f"the cuda backend plans {fmt_bytes(plan.total)} ({plan.summary()}), more than the GPU memory "
            f"{fmt_bytes(host.gpu_memory_total_bytes)} of {host.gpu_name or 'device 0'}",
            f"lower memory_limit (and memory_pool_size) below {fmt_bytes(host.gpu_memory_total_bytes)}, leaving room "
            "for the driver, or lower the network size",
        ))
    return out


def host_problems(cfg: Config, host: HostFacts) -> list[ConfigProblem]:
    """Every problem of ``cfg`` on ``host``: device mismatch, memory that does not fit, a CPU wake-up latency limit the
    host would refuse."""
    out: list[ConfigProblem] = []
    device = resolve_device(cfg, host)
    if cfg.performance.device == "cuda" and not host.cuda_available:
        out.append(ConfigProblem(
            "performance.device",
            'device mismatch: "cuda" is configured but this host has no usable CUDA device',
            'set performance.device = "cpu" (or "auto"), or run on a host with a GPU (check `nvidia-smi -L`)',
        ))
    est = estimate_memory(cfg)
    if host.ram_total_bytes is not None and est.total > host.ram_total_bytes:
        out.append(ConfigProblem(
            "performance.memory_limit",
            f"memory estimate {fmt_bytes(est.total)} exceeds host RAM {fmt_bytes(host.ram_total_bytes)}",
            "lower neural.granule_size, neural.connections_per_neuron or performance.memory_pool_size",
        ))
    if host.ram_total_bytes is not None and int(cfg.performance.memory_limit) > host.ram_total_bytes:
        out.append(ConfigProblem(
            "performance.memory_limit",
            f"memory_limit {fmt_bytes(int(cfg.performance.memory_limit))} exceeds host RAM {fmt_bytes(host.ram_total_bytes)}",
            f"set it below {fmt_bytes(host.ram_total_bytes)}, leaving room for the system",
        ))
    segments = JOURNAL_FILES_KEPT * int(cfg.performance.journal_segment_size)
    if cfg.performance.journal and host.state_fs_bytes is not None and segments > host.state_fs_bytes:
        out.append(ConfigProblem(
            "performance.journal_segment_size",
            f"journal_segment_size {fmt_bytes(int(cfg.performance.journal_segment_size))}: the {JOURNAL_FILES_KEPT} "
            f"journal files the state dir holds at a time ({fmt_bytes(segments)}, each reserved on disk when it is "
            f"created) exceed the whole file system of the state dir {cfg.paths.state_dir} "
            f"({fmt_bytes(host.state_fs_bytes)}): the service could not create them (it refuses to start, or refuses "
            "ticks once its first file is full)",
            f"set it below {fmt_bytes(host.state_fs_bytes // (2 * JOURNAL_FILES_KEPT))} (the default is \"64MB\"), "
            "leaving room for market_state.bin and the models (docs/operations.md, Disk space)",
        ))
    wakeup = cfg.performance.cpu_wakeup_latency_us
    if wakeup is not None and host.wakeup_device in ("not writable", "missing"):
        missing = host.wakeup_device == "missing"
        out.append(ConfigProblem(
            "performance.cpu_wakeup_latency_us",
            f"cpu_wakeup_latency_us = {wakeup} cannot be held here: {WAKEUP_DEVICE} is "
            + ("missing (no CPU latency QoS in this kernel or container)" if missing else "not writable by this user")
            + "; the service would log a warning and serve without it",
            "remove the key on this host (in a container, pass the host's device in)" if missing else
            "grant the service's user the device (systemd/60-cerebellar-norse.rules, docs/install.md, \"CPU wake-up "
            "latency\"), or remove the key",
        ))
    if device == "cuda":
        out += cuda_plan_problems(cfg, host)
    return out
