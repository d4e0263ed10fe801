"""The memory_limit that --validate-config says to set for one tick is enough when set as printed."""

from __future__ import annotations

import re
from pathlib import Path

from cerebellar_norse.config import load_config
from cerebellar_norse.cuda.plan import plan_for_config
from cerebellar_norse.hostcheck import HostFacts, cuda_plan_problems

GB = 10**9
H200 = HostFacts(ram_total_bytes=512 * GB, ram_available_bytes=500 * GB, cuda_available=True,
                 gpu_memory_total_bytes=150 * GB, gpu_name="NVIDIA H200")
PROD = str(Path(__file__).resolve().parents[1] / "config" / "production.toml")


def test_the_suggested_memory_limit_runs_as_printed() -> None:
    full = plan_for_config(load_config(PROD, environ={}))
    short = full.fixed + full.streams * full.one_tick_workspace - 1  # one byte short of one tick per stream
    cfg = load_config(PROD, environ={"CEREBELLAR_NORSE_PERFORMANCE__MEMORY_LIMIT": str(short)})
    (problem,) = cuda_plan_problems(cfg, H200)
    suggested = re.search(r"at least (\d+\.\d+GB)", problem.fix)
    assert suggested, problem
    fixed = load_config(PROD, environ={"CEREBELLAR_NORSE_PERFORMANCE__MEMORY_LIMIT": suggested[1]})
    assert plan_for_config(fixed).launch_ticks >= 1, (suggested[1], plan_for_config(fixed).summary())
    assert cuda_plan_problems(fixed, H200) == []


def test_sizes_to_set_are_rounded_up() -> None:
    from cerebellar_norse.config import fmt_bytes, fmt_bytes_at_least

    units = {"GB": 10**9, "MB": 10**6, "KB": 10**3}
    for n in (26_852_022_016, 10**9 + 1, 1_234_567, 999, 10**9):
        text = fmt_bytes_at_least(n)
        value = float(text[:-2]) * units[text[-2:]] if text[-2:] in units else float(text[:-1])
        assert value >= n, (n, text)
    assert fmt_bytes(26_852_022_016) == "26.85GB" and fmt_bytes_at_least(26_852_022_016) == "26.86GB"
    assert fmt_bytes_at_least(10**9) == "1.00GB"
