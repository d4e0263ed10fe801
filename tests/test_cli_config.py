"""The real ``cerebellar-norse`` command on broken and valid configurations (subprocesses)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from cerebellar_norse.config import build_config, estimate_memory, fmt_bytes, load_config

CliRunner = Callable[..., subprocess.CompletedProcess[str]]  # see conftest.run_cli

SECTIONS = ["neural", "performance", "training", "server", "logging", "paths", "debug"]


def assert_clean_failure(proc: subprocess.CompletedProcess[str], code: int = 1) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert "Traceback" not in proc.stdout
    assert proc.stderr.strip(), "a failure must say why on stderr"


def names_key(stderr: str, key: str) -> bool:
    """Each problem line reads ``cerebellar-norse: <source>: <dotted key>: <message>``."""
    return any(f": {key}: " in line for line in stderr.splitlines())


# (id, TOML text, dotted key the message must name, further text the message must contain)
SCHEMA_CASES = [
    ("wrong-type", '[neural]\ngranule_size = "many"\n', "neural.granule_size", "many"),
    *[
        (f"unknown-key-{section}", f"[{section}]\nbogus_key = 1\n", f"{section}.bogus_key", "unknown key")
        for section in [*SECTIONS, "neural.granule"]
    ],
    ("unknown-section", "[neurall]\ngranule_size = 1024\n", "neurall", "unknown key"),
    ("port-0", "[server]\nport = 0\n", "server.port", "greater than or equal to 1"),
    ("port-70000", "[server]\nport = 70000\n", "server.port", "65535"),
    ("negative-drain", "[server]\ndrain_s = -1\n", "server.drain_s", "greater than or equal to 0 (got -1)"),
    ("drain-in-quotes", '[server]\ndrain_s = "5s"\n', "server.drain_s", "write a number without quotes"),
    ("negative-batch-size", "[performance]\nbatch_size = -1\n", "performance.batch_size", "-1"),
    ("sparsity-1.5", "[neural]\ntarget_sparsity = 1.5\n", "neural.target_sparsity", "1.5"),
    ("learning-rate-0", "[neural]\nlearning_rate = 0\n", "neural.learning_rate", "greater than 0"),
    ("device-tpu", '[performance]\ndevice = "tpu"\n', "performance.device", "tpu"),
    ("level-loud", '[logging]\nlevel = "LOUD"\n', "logging.level", "LOUD"),
    ("compression-zip", '[logging]\ncompression = "zip"\n', "logging.compression", "zip"),
    ("bad-byte-size", '[performance]\nmemory_pool_size = "20 parsecs"\n', "performance.memory_pool_size", "20 parsecs"),
    ("section-not-a-table", "neural = 5\n[server]\nport = 8080\n", "neural", "must be a table"),
    ("lif-reset-above-threshold", "[neural.purkinje]\nv_reset = 1.5\n", "neural.purkinje", "v_reset"),
    ("batch-size-in-quotes", '[performance]\nbatch_size = "512"\n', "performance.batch_size", "without quotes"),
    ("switch-in-quotes", '[debug]\nrecord_requests = "off"\n', "debug.record_requests", "write true or false"),
]


@pytest.mark.parametrize(("toml_text", "key", "fragment"), [pytest.param(*c[1:], id=c[0]) for c in SCHEMA_CASES])
def test_validate_only_rejects_schema_problem(run_cli: CliRunner, write_toml: Callable[[str], Path], toml_text: str, key: str, fragment: str) -> None:
    path = write_toml(toml_text)
    proc = run_cli("--validate-only", "--config", path)
    assert_clean_failure(proc)
    assert names_key(proc.stderr, key), proc.stderr
    problem_lines = [line for line in proc.stderr.splitlines() if f": {key}: " in line]
    assert any(fragment in line for line in problem_lines), proc.stderr
    assert str(path) in proc.stderr
    assert "schema OK" not in proc.stdout
    assert proc.stderr.splitlines()[-1].startswith(f"cerebellar-norse: {path}: 1 problem(s) found"), proc.stderr


def test_toml_syntax_error_names_the_line(run_cli: CliRunner, write_toml: Callable[[str], Path]) -> None:
    path = write_toml("[neural]\ngranule_size = 1024\nseed = = 3\n")
    proc = run_cli("--validate-only", "--config", path)
    assert_clean_failure(proc)
    assert "TOML syntax error" in proc.stderr
    assert "line 3" in proc.stderr
    assert f"{path}: TOML syntax error" in proc.stderr  # the file's path says where; no placeholder key before it


def _memory_case() -> tuple[str, str, list[str]]:
    data = {"neural": {"granule_size": 1_000_000, "connections_per_neuron": 1000}}
    est = estimate_memory(build_config(data, environ={}))
    text = "[neural]\ngranule_size = 1000000\nconnections_per_neuron = 1000\n"
    numbers = [fmt_bytes(est.total), fmt_bytes(est.weights), "granule_size 1000000", "connections_per_neuron 1000", "memory_limit 2.00GB"]
    return text, "performance.memory_limit", numbers


# (id, TOML text, dotted key, texts the message must contain): valid schema, inconsistent network
CONSISTENCY_CASES = [
    ("mossy-not-multiple-of-3", "[neural]\nmossy_size = 50\n", "neural.mossy_size", ["multiple of 3", "use 48"]),
    ("connections-above-granule", "[neural]\ngranule_size = 100\nconnections_per_neuron = 200\n", "neural.connections_per_neuron", ["200", "100 granule"]),
    ("memory-above-limit", *_memory_case()),
    ("euler-unstable", "[neural]\ndt_ms = 1.0\n[neural.granule]\ntau_mem_ms = 0.4\n", "neural.granule.tau_mem_ms", ["dt_ms 1.0", "unstable"]),
]


@pytest.mark.parametrize(("toml_text", "key", "fragments"), [pytest.param(*c[1:], id=c[0]) for c in CONSISTENCY_CASES])
def test_validate_config_rejects_consistency_problem(run_cli: CliRunner, write_toml: Callable[[str], Path], toml_text: str, key: str, fragments: list[str]) -> None:
    proc = run_cli("--validate-config", "--config", write_toml(toml_text))
    assert_clean_failure(proc)
    lines = [line for line in proc.stderr.splitlines() if f": {key}: " in line]
    assert lines, proc.stderr
    for fragment in fragments:
        assert any(fragment in line for line in lines), (fragment, proc.stderr)
    assert "problem(s) found" in proc.stderr


def test_validate_only_does_not_run_consistency_checks(run_cli: CliRunner, write_toml: Callable[[str], Path]) -> None:
    proc = run_cli("--validate-only", "--config", write_toml("[neural]\nmossy_size = 50\n"))
    assert proc.returncode == 0, proc.stderr
    assert "schema OK" in proc.stdout


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.skipif(_cuda_available(), reason="this host has CUDA: production's device is valid here")
def test_production_fails_host_checks_on_a_cpu_host(run_cli: CliRunner) -> None:
    proc = run_cli("--validate-config", "--config", "config/production.toml")
    assert_clean_failure(proc)
    assert names_key(proc.stderr, "performance.device")
    assert "nvidia-smi" in proc.stderr  # the fix says how to check for a GPU


def test_production_passes_schema_check(run_cli: CliRunner) -> None:
    proc = run_cli("--validate-only", "--config", "config/production.toml")
    assert proc.returncode == 0, proc.stderr
    assert "config/production.toml: schema OK" in proc.stdout
    assert proc.stderr == ""


def test_builtin_default_passes_every_check(run_cli: CliRunner) -> None:
    proc = run_cli("--validate-config")
    assert proc.returncode == 0, proc.stderr
    cfg = load_config(environ={})
    assert "<built-in default>: valid" in proc.stdout
    assert f"memory estimate {fmt_bytes(estimate_memory(cfg).total)} of limit 2.00GB" in proc.stdout


def test_dump_schema_prints_json_schema_of_every_section(run_cli: CliRunner) -> None:
    proc = run_cli("--dump-schema")
    assert proc.returncode == 0, proc.stderr
    schema = json.loads(proc.stdout)
    assert set(SECTIONS) <= set(schema["properties"])
    assert schema["additionalProperties"] is False
    assert "granule_size" in schema["$defs"]["NeuralConfig"]["properties"]


def test_unknown_flag_is_a_usage_error(run_cli: CliRunner) -> None:
    proc = run_cli("--no-such-flag")
    assert_clean_failure(proc, code=2)
    assert "--no-such-flag" in proc.stderr
    assert proc.stdout == ""


def test_exclusive_actions_are_a_usage_error(run_cli: CliRunner) -> None:
    proc = run_cli("--validate-only", "--dump-schema")
    assert_clean_failure(proc, code=2)
    assert "not allowed with" in proc.stderr


@pytest.mark.parametrize("flag", ["--validate-only", "--validate-config"])
def test_missing_config_file_names_the_path(run_cli: CliRunner, tmp_path: Path, flag: str) -> None:
    missing = tmp_path / "absent" / "production.toml"
    proc = run_cli(flag, "--config", missing)
    assert_clean_failure(proc)
    assert str(missing) in proc.stderr
    assert "does not exist" in proc.stderr


def test_env_override_with_a_bad_value_fails_naming_the_key(run_cli: CliRunner) -> None:
    proc = run_cli("--validate-only", env={"CEREBELLAR_NORSE_SERVER__PORT": "notaport"})
    assert_clean_failure(proc)
    assert names_key(proc.stderr, "server.port")
    assert "CEREBELLAR_NORSE_SERVER__PORT" in proc.stderr


def test_env_override_applies_over_the_file(run_cli: CliRunner, write_toml: Callable[[str], Path]) -> None:
    """The file is consistent; the variable makes it inconsistent, so the variable was applied."""
    path = write_toml("[neural]\nmossy_size = 48\n")
    proc = run_cli("--validate-config", "--config", path, env={"CEREBELLAR_NORSE_NEURAL__MOSSY_SIZE": "50"})
    assert_clean_failure(proc)
    assert names_key(proc.stderr, "neural.mossy_size")


def test_valid_env_override_passes(run_cli: CliRunner) -> None:
    proc = run_cli("--validate-only", env={"CEREBELLAR_NORSE_SERVER__PORT": "9000", "CEREBELLAR_NORSE_LOG": "anything"})
    assert proc.returncode == 0, proc.stderr


def test_serve_rejects_an_out_of_range_port_before_starting(run_cli: CliRunner) -> None:
    proc = run_cli("--port", "70000", timeout=30)
    assert_clean_failure(proc)
    assert names_key(proc.stderr, "server.port")


@pytest.mark.parametrize("flag", ["--validate-only", "--validate-config"])
def test_validate_checks_an_out_of_range_port_flag(run_cli: CliRunner, flag: str) -> None:
    proc = run_cli(flag, "--port", "70000")
    assert_clean_failure(proc)
    assert names_key(proc.stderr, "server.port")


def test_validate_config_checks_the_host_flag_like_serving_does(run_cli: CliRunner) -> None:
    proc = run_cli("--validate-config", "--host", "0.0.0.0")
    assert_clean_failure(proc)
    assert names_key(proc.stderr, "server.api_token")
    proc = run_cli("--validate-config", "--host", "0.0.0.0", env={"CEREBELLAR_NORSE_SERVER__API_TOKEN": "s3cret"})
    assert proc.returncode == 0, proc.stderr
