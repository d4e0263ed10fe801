"""README.md's Python API example runs as written (so the documentation cannot rot)."""

from __future__ import annotations

import contextlib
import io
import os
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def _section(text: str, heading: str) -> str:
    body = text.split(f"\n## {heading}\n", 1)[1]
    return body.split("\n## ", 1)[0]


def _python_blocks(section: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", section, flags=re.MULTILINE | re.DOTALL)


def test_python_api_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [k for k in os.environ if k.startswith("CEREBELLAR_NORSE_")]:
        monkeypatch.delenv(name)  # the example uses the built-in default configuration
    monkeypatch.chdir(tmp_path)
    blocks = _python_blocks(_section(README.read_text(encoding="utf-8"), "Python API"))
    assert len(blocks) == 1, "the Python API section should hold exactly one python example"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(blocks[0], "README.md:Python API", "exec"), {"__name__": "readme_example"})
    printed = out.getvalue().splitlines()
    # the comments in the example state these outputs
    assert "refused: timestamp" in printed
    assert "refused: ticks.1.price" in printed
    assert printed[-1] == "['OTHER', 'TEST']"


def test_benchmarks_section_points_to_the_record() -> None:
    section = _section(README.read_text(encoding="utf-8"), "Benchmarks")
    assert "docs/benchmarks.md" in section
    for command in ("cerebellar-norse bench", "cerebellar-norse crossval", "benchmarks/network_bench.py"):
        assert command in section


def test_construction_example_of_explicit_overrides_builds_a_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """The `load_config(path, environ={...})` example of "Construction" gives a Config the network accepts."""
    from cerebellar_norse import CerebellarNetwork, load_config
    from cerebellar_norse.errors import ConfigError

    for name in [k for k in os.environ if k.startswith("CEREBELLAR_NORSE_")]:
        monkeypatch.delenv(name)
    construction = README.read_text(encoding="utf-8").split("### Construction\n", 1)[1].split("\n### ", 1)[0]
    found = re.search(r"environ=\{\"(CEREBELLAR_NORSE_[A-Z_]+)\": \"([^\"]+)\"\}", construction)
    assert found, "the Construction section names an explicit override"
    net = CerebellarNetwork(load_config(None, environ={found.group(1): found.group(2)}))
    assert net.process({"price": 1.0, "volume": 1.0, "timestamp": 1640995200000, "market_id": "A"})["market_id"] == "A"
    # a Config whose network cannot be built is a ConfigError naming the key, not a numpy error
    with pytest.raises(ConfigError, match=r"neural\.connections_per_neuron"):
        CerebellarNetwork(load_config(None, environ={"CEREBELLAR_NORSE_NEURAL__GRANULE_SIZE": "64"}))
