"""Host checks: device presence and memory against hand-made host descriptions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cerebellar_norse.config import Config, build_config, estimate_memory, fmt_bytes, load_config
from cerebellar_norse.hostcheck import HostFacts, gather_host_facts, host_problems, resolve_device, with_state_dir

REPO_ROOT = Path(__file__).resolve().parent.parent
GB = 10**9

CPU_HOST = HostFacts(ram_total_bytes=32 * GB, ram_available_bytes=30 * GB, cuda_available=False)
GPU_HOST = HostFacts(ram_total_bytes=512 * GB, ram_available_bytes=500 * GB, cuda_available=True, gpu_memory_total_bytes=80 * GB, gpu_name="NVIDIA H100")


def cfg_with(data: dict[str, Any]) -> Config:
    return build_config(data, "test", environ={})


def keys(problems: list[Any]) -> list[str]:
    return [p.key for p in problems]


def test_cuda_configured_without_cuda_is_a_device_problem() -> None:
    problems = host_problems(cfg_with({"performance": {"device": "cuda"}}), CPU_HOST)
    assert keys(problems) == ["performance.device"]
    assert "cuda" in problems[0].message
    assert "cpu" in problems[0].fix


def test_cuda_configured_with_cuda_is_fine() -> None:
    assert host_problems(cfg_with({"performance": {"device": "cuda"}}), GPU_HOST) == []


@pytest.mark.parametrize(
    ("device", "host", "resolved"),
    [
        ("auto", GPU_HOST, "cuda"),
        ("auto", CPU_HOST, "cpu"),
        ("cpu", GPU_HOST, "cpu"),
        ("cuda", GPU_HOST, "cuda"),
        ("cuda", CPU_HOST, "cuda"),  # not silently downgraded: host_problems reports it
    ],
)
def test_resolve_device(device: str, host: HostFacts, resolved: str) -> None:
    assert resolve_device(cfg_with({"performance": {"device": device}}), host) == resolved


def test_auto_on_a_cpu_host_is_not_a_problem() -> None:
    assert host_problems(cfg_with({"performance": {"device": "auto"}}), CPU_HOST) == []


def test_estimate_above_host_ram() -> None:
    cfg = cfg_with({"performance": {"memory_pool_size": "64MB", "memory_limit": "50MB"}})  # estimate > 64MB
    host = HostFacts(ram_total_bytes=60_000_000, ram_available_bytes=50_000_000, cuda_available=False)
    problems = host_problems(cfg, host)
    assert keys(problems) == ["performance.memory_limit"]
    assert "exceeds host RAM 60.00MB" in problems[0].message
    assert fmt_bytes(estimate_memory(cfg).total) in problems[0].message


def test_memory_limit_above_host_ram() -> None:
    cfg = cfg_with({"performance": {"memory_pool_size": "64MB", "memory_limit": "2GB"}})  # estimate about 64MB
    host = HostFacts(ram_total_bytes=1 * GB, ram_available_bytes=GB // 2, cuda_available=False)
    problems = host_problems(cfg, host)
    assert keys(problems) == ["performance.memory_limit"]
    assert "memory_limit 2.00GB exceeds host RAM 1.00GB" in problems[0].message


def test_unknown_ram_skips_the_ram_checks() -> None:
    host = HostFacts(ram_total_bytes=None, ram_available_bytes=None, cuda_available=False)
    assert host_problems(cfg_with({"performance": {"memory_limit": "1000GB"}}), host) == []


@pytest.mark.parametrize("device", ["cuda", "auto"])
def test_estimate_above_gpu_memory(device: str) -> None:
    cfg = cfg_with({"performance": {"device": device, "memory_pool_size": "64MB"}})  # estimate > 64MB
    host = HostFacts(64 * GB, 60 * GB, cuda_available=True, gpu_memory_total_bytes=32_000_000, gpu_name="Tiny GPU")
    problems = host_problems(cfg, host)
    assert keys(problems) == ["performance.memory_limit"]
    assert "the cuda backend plans" in problems[0].message and "GPU memory 32.00MB of Tiny GPU" in problems[0].message


def test_gpu_memory_is_not_checked_for_cpu_device() -> None:
    host = HostFacts(64 * GB, 60 * GB, cuda_available=True, gpu_memory_total_bytes=32_000_000, gpu_name="Tiny GPU")
    assert host_problems(cfg_with({"performance": {"device": "cpu"}}), host) == []


def test_production_fits_a_big_gpu_host() -> None:
    cfg = load_config(REPO_ROOT / "config" / "production.toml", environ={})
    assert host_problems(cfg, GPU_HOST) == []


def test_production_on_a_small_cpu_host_lists_every_problem() -> None:
    cfg = load_config(REPO_ROOT / "config" / "production.toml", environ={})
    host = HostFacts(ram_total_bytes=16 * GB, ram_available_bytes=15 * GB, cuda_available=False)
    problems = host_problems(cfg, host)
    assert keys(problems) == ["performance.device", "performance.memory_limit", "performance.memory_limit"]


def test_default_fits_a_small_cpu_host() -> None:
    assert host_problems(load_config(environ={}), CPU_HOST) == []


def test_gather_host_facts_reads_this_host() -> None:
    torch = pytest.importorskip("torch")
    facts = gather_host_facts()
    assert facts.ram_total_bytes is not None and facts.ram_total_bytes > 0
    assert facts.ram_available_bytes is not None and 0 < facts.ram_available_bytes <= facts.ram_total_bytes
    assert facts.cuda_available == torch.cuda.is_available()
    if facts.cuda_available:
        assert facts.gpu_memory_total_bytes and facts.gpu_memory_total_bytes > 0
    else:
        assert facts.gpu_memory_total_bytes is None


# -- the CUDA backend's memory plan ------------------------------------------------------------------


def test_production_config_plans_small_device_launches_on_an_80gb_gpu() -> None:
    from cerebellar_norse.cuda.plan import plan_for_config

    cfg = load_config(REPO_ROOT / "config" / "production.toml", environ={})
    assert host_problems(cfg, GPU_HOST) == []
    plan = plan_for_config(cfg)
    assert 1 <= plan.launch_ticks < cfg.performance.batch_size  # runs, in several launches per full batch
    assert plan.fixed + plan.streams * plan.workspace <= int(cfg.performance.memory_limit)


def test_no_room_for_one_tick_is_a_memory_limit_problem_naming_the_minimum() -> None:
    from cerebellar_norse.cuda.plan import plan_for_config

    full = plan_for_config(load_config(REPO_ROOT / "config" / "production.toml", environ={}))
    tight = str(full.fixed + full.streams * full.one_tick_workspace - 1)  # one byte short of one tick per stream
    cfg = load_config(REPO_ROOT / "config" / "production.toml", environ={"CEREBELLAR_NORSE_PERFORMANCE__MEMORY_LIMIT": tight})
    plan = plan_for_config(cfg)
    assert plan.launch_ticks == 0
    just = load_config(REPO_ROOT / "config" / "production.toml",
                       environ={"CEREBELLAR_NORSE_PERFORMANCE__MEMORY_LIMIT": str(int(tight) + 1)})
    assert plan_for_config(just).launch_ticks == 1 and host_problems(just, GPU_HOST) == []
    problems = host_problems(cfg, GPU_HOST)
    assert keys(problems) == ["performance.memory_limit"]
    assert "no room for one tick" in problems[0].message
    from cerebellar_norse.config import fmt_bytes_at_least

    assert fmt_bytes_at_least(plan.fixed + plan.streams * plan.one_tick_workspace) in problems[0].fix  # never below it
    # Configured for cuda on a host without one: both are said (the config would not run on a GPU either).
    assert keys(host_problems(cfg, CPU_HOST)) == ["performance.device", "performance.memory_limit"]
    auto = load_config(REPO_ROOT / "config" / "production.toml", environ={"CEREBELLAR_NORSE_PERFORMANCE__MEMORY_LIMIT": tight,
                                                                           "CEREBELLAR_NORSE_PERFORMANCE__DEVICE": "auto"})
    assert host_problems(auto, CPU_HOST) == []  # auto on a CPU host: the cuda plan does not apply


def test_a_plan_larger_than_the_gpu_is_a_problem() -> None:
    cfg = load_config(REPO_ROOT / "config" / "production.toml", environ={})
    small_gpu = HostFacts(ram_total_bytes=512 * GB, ram_available_bytes=500 * GB, cuda_available=True,
                          gpu_memory_total_bytes=24 * GB, gpu_name="NVIDIA L4")
    problems = [p for p in host_problems(cfg, small_gpu) if "plans" in p.message]
    assert len(problems) == 1 and "NVIDIA L4" in problems[0].message and problems[0].key == "performance.memory_limit"


def test_validate_config_prints_the_cuda_plan(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from cerebellar_norse import cli, hostcheck

    monkeypatch.setattr(hostcheck, "gather_host_facts", lambda: GPU_HOST)
    for name in [k for k in __import__("os").environ if k.startswith("CEREBELLAR_NORSE_")]:
        monkeypatch.delenv(name)
    assert cli.main(["--validate-config", "--config", str(REPO_ROOT / "config" / "production.toml")]) == 0
    out = capsys.readouterr().out
    assert "valid (device cuda" in out
    from cerebellar_norse.cuda.plan import plan_for_config

    plan = plan_for_config(load_config(REPO_ROOT / "config" / "production.toml", environ={}))
    assert f"cuda plan: {plan.summary()}" in out
    assert "pool 20.00GB + weights" in out and f"device launches of up to {plan.launch_ticks} tick(s) (batch_size 1024)" in out
    monkeypatch.setattr(hostcheck, "gather_host_facts", lambda: CPU_HOST)
    assert cli.main(["--validate-config", "--config", str(REPO_ROOT / "config" / "default.toml")]) == 0
    assert "cuda plan" not in capsys.readouterr().out


def test_journal_files_larger_than_the_state_dirs_file_system_are_a_problem_naming_the_key(
        tmp_path: Path, run_cli: Any) -> None:
    """journal_segment_size = "1000TB" passed --validate-config, and the start then failed with `cannot create journal
    file …: File too large (errno 27 EFBIG)`, naming no key."""
    small = HostFacts(ram_total_bytes=32 * GB, ram_available_bytes=30 * GB, cuda_available=False, state_fs_bytes=10 * GB)
    fits = cfg_with({"performance": {"journal_segment_size": "3GB"}})
    assert host_problems(fits, small) == []
    big = cfg_with({"performance": {"journal_segment_size": "4GB"}})
    (problem,) = host_problems(big, small)
    assert problem.key == "performance.journal_segment_size" and "exceed the whole file system" in problem.message
    assert host_problems(cfg_with({"performance": {"journal_segment_size": "4GB", "journal": False}}), small) == []
    assert host_problems(big, CPU_HOST) == []  # the file system not looked at: nothing said
    facts = with_state_dir(CPU_HOST, tmp_path / "not" / "made" / "yet")  # the nearest existing parent's file system
    assert facts.state_fs_bytes is not None and facts.state_fs_bytes > 0
    res = run_cli("--validate-config", env={"CEREBELLAR_NORSE_PERFORMANCE__JOURNAL_SEGMENT_SIZE": "1000000TB",
                                            "CEREBELLAR_NORSE_PATHS__STATE_DIR": str(tmp_path / "state")})
    assert res.returncode == 1 and "performance.journal_segment_size" in res.stderr and "Traceback" not in res.stderr
