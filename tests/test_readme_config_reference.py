"""README.md documents every configuration key: the generated reference cannot drift."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from cerebellar_norse.config import LIVE_KEYS, Config

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPT = REPO_ROOT / "scripts" / "config_reference.py"
README = REPO_ROOT / "README.md"




@pytest.fixture(scope="module")
def readme() -> str:
    return README.read_text(encoding="utf-8")


def _leaf_keys(tree: dict[str, Any], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for k, v in tree.items():
        key = f"{prefix}{k}"
        out |= _leaf_keys(v, key + ".") if isinstance(v, dict) else {key}
    return out


def test_script_lists_every_key_of_the_models(script: ModuleType) -> None:
    printed = [row.key for row in script.reference_rows()]
    assert len(printed) == len(set(printed))
    assert set(printed) == _leaf_keys(Config().model_dump())
    for nested in ("neural.granule.tau_mem_ms", "neural.purkinje.v_th", "neural.dcn.tau_syn_ms", "neural.readout.v_reset"):
        assert nested in printed


def test_every_key_is_in_the_readme(script: ModuleType, readme: str) -> None:
    missing = [row.key for row in script.reference_rows() if f"`{row.key}`" not in readme]
    assert not missing, f"README.md lacks {missing}: run `.venv/bin/python scripts/config_reference.py --write`"


def test_readme_table_is_the_generated_one(script: ModuleType, readme: str) -> None:
    assert script.generated_block() in readme, "README.md's configuration table is stale: run `.venv/bin/python scripts/config_reference.py --write`"


def test_defaults_in_the_table_are_the_real_defaults(script: ModuleType) -> None:
    rows = {row.key: row for row in script.reference_rows()}
    assert rows["server.port"].default == "8080"
    assert rows["performance.memory_limit"].default == '"2GB"'
    assert rows["neural.granule.tau_syn_ms"].default == "2.0"  # the granule population's, not the generic LIF default
    assert rows["neural.readout.tau_mem_ms"].default == "2.0"
    assert rows["paths.state_dir"].default == '"./var"'
    assert rows["performance.device"].type == '"cpu" / "cuda" / "auto"'


def test_script_prints_the_table_as_a_command() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT)], cwd=REPO_ROOT, capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "| Key | Type | Default | Reload | Meaning |"
    assert all(re.match(r"^\| `[a-z_.]+` \| ", line) for line in lines[2:])


def test_readme_starts_with_the_quick_start(readme: str) -> None:
    headings = re.findall(r"^## (.+)$", readme, flags=re.MULTILINE)
    assert headings[0] == "Quick start"
    for section in ("Installation notes", "Configuration reference", "CLI reference", "Python API", "Benchmarks"):
        assert section in headings
    quick = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "make run" in quick and "make test" in quick


def test_readme_documents_every_cli_flag_and_command(readme: str) -> None:
    from cerebellar_norse.cli import build_parser

    parser = build_parser()
    flags = {opt for action in parser._actions for opt in action.option_strings if opt.startswith("--")}
    commands: set[str] = set()
    for action in parser._actions:
        choices = getattr(action, "choices", None)
        if isinstance(choices, dict):
            commands |= set(choices)
            for sub in choices.values():
                flags |= {opt for a in sub._actions for opt in a.option_strings if opt.startswith("--")}
    cli_section = readme.split("## CLI reference", 1)[1]
    missing = sorted(x for x in flags | commands if x not in cli_section)
    assert not missing, f"README.md's CLI reference lacks {missing}"


def test_the_table_says_what_a_reload_does_with_every_key(readme: str) -> None:
    """Operators read the table to know whether ``systemctl reload`` applies a key: it said so for two keys only
    (server.drain_s and logging.level), nothing for the other nine a reload applies nor for the ones needing a restart."""
    table = readme.split("<!-- config-reference:start", 1)[1].split("<!-- config-reference:end", 1)[0].splitlines()[1:]
    columns = [c.strip() for c in table[0].strip("|").split("|")]
    assert "Reload" in columns, table[0]
    cells = {}
    for line in table:
        m = re.match(r"^\| `([a-z_.]+)` \| ", line)
        if m:
            cells[m[1]] = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))][columns.index("Reload")]
    assert set(cells) == _leaf_keys(Config().model_dump())
    for key, cell in cells.items():
        if key == "server.api_token":
            assert cell.startswith("adding one applies at once") and "restart" in cell
        elif key in LIVE_KEYS:
            assert cell.startswith("applies at once"), (key, cell)
        else:
            assert cell == "restart", (key, cell)
