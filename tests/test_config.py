"""Configuration: loading, byte sizes, environment overrides, memory estimate, consistency rules."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cerebellar_norse.config import (
    Config,
    build_config,
    config_json_schema,
    consistency_problems,
    default_toml_text,
    env_overrides,
    estimate_memory,
    fmt_bytes,
    load_checked_config,
    load_config,
)
from cerebellar_norse.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parent.parent

PRODUCTION = REPO_ROOT / "config" / "production.toml"


def cfg_with(data: dict[str, Any], environ: dict[str, str] | None = None) -> Config:
    """A config of the given TOML tables on top of the defaults, without the caller's environment."""
    return build_config(data, "test", environ={} if environ is None else environ)


def problem_keys(exc: ConfigError) -> list[str]:
    return [p.key for p in exc.problems]


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------


def test_builtin_default_loads_with_documented_values() -> None:
    cfg = load_config(environ={})
    assert cfg.performance.device == "cpu"
    assert (cfg.server.host, cfg.server.port) == ("127.0.0.1", 8080)
    assert int(cfg.performance.memory_pool_size) == 64 * 10**6
    assert int(cfg.performance.memory_limit) == 2 * 10**9
    assert int(cfg.logging.max_size) == 100 * 10**6
    assert cfg.paths.state_dir == Path("./var")
    assert cfg.server.api_token is None


def test_builtin_default_equals_model_defaults() -> None:
    """A key left out of a TOML file gets the same value as in the built-in default."""
    assert load_config(environ={}) == Config()


def test_builtin_default_has_no_consistency_problems() -> None:
    cfg = load_config(environ={})
    assert consistency_problems(cfg) == []
    assert load_checked_config(environ={}) == cfg


def test_config_default_toml_is_the_package_default() -> None:
    repo_copy = (REPO_ROOT / "config" / "default.toml").read_text(encoding="utf-8")
    package_copy = (REPO_ROOT / "cerebellar_norse" / "default.toml").read_text(encoding="utf-8")
    assert repo_copy == package_copy
    assert default_toml_text() == package_copy
    assert load_config(REPO_ROOT / "config" / "default.toml", environ={}) == load_config(environ={})


def test_production_config_loads_with_operations_guide_values() -> None:
    cfg = load_config(PRODUCTION, environ={})
    assert cfg.performance.device == "cuda"
    assert cfg.performance.batch_size == 1024
    assert cfg.performance.cuda_streams == 4
    assert cfg.performance.memory_pool_enabled is True
    assert int(cfg.performance.memory_pool_size) == 20 * 10**9
    assert int(cfg.performance.memory_limit) == 28 * 10**9
    assert cfg.performance.garbage_collection_threshold == 0.8
    assert cfg.neural.granule_size == 4_000_000
    assert cfg.neural.learning_rate == 0.0001
    assert cfg.training.gradient_checkpointing is True
    assert cfg.training.bootstrap_on_first_run is False  # never a model trained on generated data in production
    assert (cfg.server.worker_threads, cfg.server.connection_timeout, cfg.server.keep_alive_timeout) == (16, 30, 75)
    assert cfg.server.max_connections == 10_000
    assert (cfg.logging.max_files, int(cfg.logging.max_size), cfg.logging.compression) == (30, 100 * 10**6, "gzip")
    assert cfg.logging.file == Path("/var/log/cerebellar-norse/application.log")
    assert cfg.paths.state_dir == Path("/var/lib/cerebellar-norse")
    assert cfg.paths.data_dir == Path("/data/training")


def test_production_config_is_consistent() -> None:
    """Host checks aside (device, RAM), the production file is a valid network."""
    assert consistency_problems(load_config(PRODUCTION, environ={})) == []


def test_missing_file_is_a_config_error_naming_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_config(missing, environ={})
    assert str(missing) in str(info.value)


def test_toml_syntax_error_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[neural]\ngranule_size = 10\nseed = = 3\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert "line 3" in str(info.value)


@pytest.mark.parametrize("code", [errno.EACCES, errno.EIO])
def test_a_config_file_that_cannot_be_read_is_named_with_the_reason_in_words(
        tmp_path: Path, unreadable: Callable[[Path, int], None], code: int) -> None:
    """The line was `cannot read config file x.toml: [Errno 13] Permission denied: 'x.toml'`: Python's repr of the
    error, the path twice."""
    path = tmp_path / "x.toml"
    path.write_text("[server]\nport = 1\n", encoding="utf-8")
    unreadable(path, code)
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert info.value.problems[0].message == (f"cannot read config file {path}: {os.strerror(code)} "
                                              f"(errno {code} {errno.errorcode[code]})")


def test_toml_nested_too_deeply_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.toml"
    path.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    assert "nested too deeply" in str(info.value) and str(path) in str(info.value)
    deep = "[" * 5000 + "]" * 5000  # an environment value that is not TOML is taken as text, as any other
    assert str(load_config(None, environ={"CEREBELLAR_NORSE_PATHS__DATA_DIR": deep}).paths.data_dir) == deep


@pytest.mark.parametrize(("section", "key"), [("paths", "state_dir"), ("paths", "data_dir"), ("logging", "file")])
def test_a_path_with_a_nul_character_names_the_key(section: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        cfg_with({section: {key: "/tmp/a\x00b"}})
    assert problem_keys(info.value) == [f"{section}.{key}"]
    assert "NUL" in info.value.problems[0].message


@pytest.mark.parametrize(("section", "key"), [("paths", "state_dir"), ("paths", "data_dir"), ("logging", "file")])
@pytest.mark.parametrize("value", ["", "  "])
def test_an_empty_path_names_the_key_rather_than_meaning_the_current_directory(section: str, key: str,
                                                                               value: str) -> None:
    """``CEREBELLAR_NORSE_PATHS__STATE_DIR=$UNSET`` (or ``state_dir = ""``) was ``Path("")``: the service kept its
    market state, journal and models in whatever directory it was started from, and --validate-config said valid."""
    with pytest.raises(ConfigError) as info:
        cfg_with({section: {key: value}})
    assert problem_keys(info.value) == [f"{section}.{key}"]
    assert "an empty or blank path" in info.value.problems[0].message
    env = f"CEREBELLAR_NORSE_{section.upper()}__{key.upper()}"
    with pytest.raises(ConfigError) as info:
        load_config(None, environ={env: value})
    assert problem_keys(info.value) == [f"{section}.{key}"] and env in str(info.value)
    assert str(load_config(None, environ={env: "."}).model_dump()[section][key]) == "."  # said on purpose: taken


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as info:
        cfg_with({"server": {"port": 0, "colour": "red"}, "performance": {"device": "tpu"}})
    assert sorted(problem_keys(info.value)) == ["performance.device", "server.colour", "server.port"]


WRONG_TYPES = {  # a TOML value of the wrong type is refused, never converted: (section, key, value, fix)
    "integer in quotes": ("performance", "batch_size", "512", "write a whole number without quotes (e.g. 512)"),
    "integer as a float": ("server", "port", 8080.0, "write a whole number without quotes (e.g. 512)"),
    "boolean in quotes": ("performance", "memory_pool_enabled", "yes", "write true or false, without quotes"),
    "'false' in quotes": ("debug", "record_requests", "false", "write true or false, without quotes"),
    "boolean as a number": ("performance", "memory_pool_enabled", 0, "write true or false, without quotes"),
    "number in quotes": ("neural", "readout_scale", "2.5", "write a number without quotes (e.g. 2.5)"),
    "text as a number": ("server", "host", 127, "write it in quotes"),
}


@pytest.mark.parametrize("kind", sorted(WRONG_TYPES))
def test_a_value_of_the_wrong_type_is_refused_with_what_to_write(kind: str) -> None:
    section, key, value, fix = WRONG_TYPES[kind]
    with pytest.raises(ConfigError) as info:
        cfg_with({section: {key: value}})
    (problem,) = info.value.problems
    assert problem.key == f"{section}.{key}" and f"(got {value!r})" in problem.message and problem.fix == fix


@pytest.mark.parametrize(("raw", "value"), [("1", True), ("yes", True), ("ON", True), ("true", True), ("0", False),
                                            ("no", False), ("off", False), ("False", False)])
def test_a_switch_from_the_environment_takes_the_usual_words(raw: str, value: bool) -> None:
    cfg = cfg_with({}, {"CEREBELLAR_NORSE_DEBUG__RECORD_REQUESTS": raw})
    assert cfg.debug.record_requests is value
    with pytest.raises(ConfigError) as info:  # the file takes true and false only
        cfg_with({"debug": {"record_requests": raw}})
    assert problem_keys(info.value) == ["debug.record_requests"]


def test_an_integer_is_a_float_and_paths_are_text() -> None:
    cfg = cfg_with({"neural": {"readout_scale": 3}, "paths": {"data_dir": "/tmp/d", "state_dir": "/tmp/s"},
                    "logging": {"file": "/tmp/a.log"}})
    assert cfg.neural.readout_scale == 3.0 and cfg.paths.data_dir == Path("/tmp/d") and cfg.logging.file == Path("/tmp/a.log")


def test_top_level_key_that_should_be_a_table() -> None:
    with pytest.raises(ConfigError) as info:
        cfg_with({"server": 8080})
    assert problem_keys(info.value) == ["server"]
    assert "table" in info.value.problems[0].message


def test_lif_reset_must_be_below_threshold() -> None:
    with pytest.raises(ConfigError) as info:
        cfg_with({"neural": {"dcn": {"v_reset": 1.0, "v_th": 1.0}}})
    assert problem_keys(info.value) == ["neural.dcn"]


@pytest.mark.parametrize("population", ["granule", "purkinje", "dcn", "readout"])
@pytest.mark.parametrize(("key", "value"), [("v_leak", float("inf")), ("v_leak", float("nan")), ("v_th", float("inf")),
                                            ("v_reset", float("-inf"))])
def test_lif_potentials_must_be_finite(population: str, key: str, value: float) -> None:
    """An infinite readout leak passed every check and the service answered null probabilities with confidence 1.0."""
    with pytest.raises(ConfigError) as info:
        cfg_with({"neural": {population: {key: value}}})
    assert problem_keys(info.value) == [f"neural.{population}.{key}"]
    assert "finite" in info.value.problems[0].message
    with pytest.raises(ConfigError) as info:
        cfg_with({}, environ={f"CEREBELLAR_NORSE_NEURAL__{population.upper()}__{key.upper()}": str(value)})
    assert problem_keys(info.value) == [f"neural.{population}.{key}"]


@pytest.mark.parametrize("interval", [1, 250, 999])
def test_warm_step_interval_below_a_millisecond_is_refused(interval: int) -> None:
    with pytest.raises(ConfigError) as info:
        cfg_with({"performance": {"warm_step_interval_us": interval}})
    assert problem_keys(info.value) == ["performance.warm_step_interval_us"]
    assert "at least 1000" in info.value.problems[0].message


@pytest.mark.parametrize("interval", [0, 1000, 250_000])
def test_warm_step_interval_is_off_or_a_timer(interval: int) -> None:
    assert cfg_with({"performance": {"warm_step_interval_us": interval}}).performance.warm_step_interval_us == interval


def test_partial_lif_table_keeps_population_defaults() -> None:
    """[neural.purkinje] with one key keeps the Purkinje defaults of the others (not generic LIF ones)."""
    cfg = cfg_with({"neural": {"purkinje": {"tau_syn_ms": 1.5}}})
    assert (cfg.neural.purkinje.tau_syn_ms, cfg.neural.purkinje.tau_mem_ms) == (1.5, 4.0)
    assert cfg.neural.granule == Config().neural.granule


def test_logging_level_is_case_insensitive() -> None:
    assert cfg_with({"logging": {"level": "debug"}}).logging.level == "DEBUG"


def test_json_schema_lists_every_section_and_forbids_unknown_keys() -> None:
    schema = config_json_schema()
    assert set(schema["properties"]) == {"neural", "performance", "training", "server", "logging", "paths", "debug"}
    assert schema["additionalProperties"] is False
    assert all(d["additionalProperties"] is False for d in schema["$defs"].values())


# ---------------------------------------------------------------------------
# Byte sizes: GB/MB decimal, GiB/MiB binary
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("20GB", 20 * 10**9),
        ("20GiB", 20 * 2**30),
        ("28GB", 28 * 10**9),
        ("100MB", 100 * 10**6),
        ("100MiB", 100 * 2**20),
        ("1KB", 1000),
        ("1KiB", 1024),
        ("2.5GB", 2_500_000_000),
        (12345, 12345),
    ],
)
def test_byte_size_parsing(text: str | int, expected: int) -> None:
    cfg = cfg_with({"performance": {"memory_pool_size": text, "memory_limit": "1000GB"}})
    assert int(cfg.performance.memory_pool_size) == expected


def test_bad_byte_size_names_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        cfg_with({"performance": {"memory_limit": "20 parsecs"}})
    assert problem_keys(info.value) == ["performance.memory_limit"]
    assert "20 parsecs" in info.value.problems[0].message


@pytest.mark.parametrize("text", ["28.5.5GB", "28GB xyz", "2XB", "-1GB", "", "GB", "1e3MB"])
def test_a_size_with_anything_but_a_number_and_a_unit_is_refused(text: str) -> None:
    """pydantic's parser alone reads "28.5.5GB" as 28 bytes and ignores what follows "28GB"."""
    for section, key in (("performance", "memory_limit"), ("logging", "max_size"), ("server", "max_body_size")):
        with pytest.raises(ConfigError) as info:
            cfg_with({section: {key: text}})
        assert problem_keys(info.value) == [f"{section}.{key}"]
        assert f"{text!r} is not a size: write a number and a unit" in info.value.problems[0].message


def test_the_json_schema_accepts_the_sizes_and_levels_the_loader_accepts() -> None:
    import re

    schema = config_json_schema()["$defs"]
    size = re.compile(next(a["pattern"] for a in schema["PerformanceConfig"]["properties"]["memory_limit"]["anyOf"]
                           if a.get("type") == "string"))
    for ok in ("28GB", "28 gb", " 1.5GiB ", "512", ".5MB", "28g", "100mib"):
        assert size.search(ok), ok
        cfg_with({"performance": {"memory_limit": ok}})
    for bad in ("28.5.5GB", "28GB xyz", "2XB", "-1GB", ""):
        assert not size.search(bad), bad
    level = re.compile(schema["LoggingConfig"]["properties"]["level"]["pattern"])
    for ok in ("DEBUG", "debug", "Warning"):
        assert level.search(ok) and cfg_with({"logging": {"level": ok}}).logging.level == ok.upper()
    assert not level.search("verbose")


# ---------------------------------------------------------------------------
# Environment overrides CEREBELLAR_NORSE_<SECTION>__<KEY>
# ---------------------------------------------------------------------------


def test_env_override_of_a_key_is_typed() -> None:
    cfg = load_config(environ={"CEREBELLAR_NORSE_SERVER__PORT": "9090", "CEREBELLAR_NORSE_DEBUG__RECORD_REQUESTS": "true"})
    assert cfg.server.port == 9090
    assert cfg.debug.record_requests is True


def test_env_override_beats_the_file(write_toml: Any) -> None:
    path = write_toml("[server]\nport = 7000\nhost = \"0.0.0.0\"\n")
    cfg = load_config(path, environ={"CEREBELLAR_NORSE_SERVER__PORT": "9000"})
    assert (cfg.server.host, cfg.server.port) == ("0.0.0.0", 9000)


def test_env_override_of_paths_and_sizes() -> None:
    cfg = load_config(environ={
        "CEREBELLAR_NORSE_PATHS__STATE_DIR": "/srv/cerebellar",
        "CEREBELLAR_NORSE_PERFORMANCE__MEMORY_LIMIT": "3GiB",
        "CEREBELLAR_NORSE_PERFORMANCE__DEVICE": "auto",
    })
    assert cfg.paths.state_dir == Path("/srv/cerebellar")
    assert int(cfg.performance.memory_limit) == 3 * 2**30
    assert cfg.performance.device == "auto"


def test_nested_env_override_of_a_lif_table() -> None:
    cfg = load_config(environ={"CEREBELLAR_NORSE_NEURAL__GRANULE__TAU_MEM_MS": "3.5"})
    assert cfg.neural.granule.tau_mem_ms == 3.5
    assert cfg.neural.granule.tau_syn_ms == 2.0  # the granule default, not the generic LIF default
    assert cfg.neural.purkinje == Config().neural.purkinje


def test_env_text_values_are_kept_verbatim() -> None:
    """Values that look like TOML numbers stay text where the key is text (token, host, path)."""
    cfg = load_config(environ={
        "CEREBELLAR_NORSE_SERVER__API_TOKEN": "123456",
        "CEREBELLAR_NORSE_PATHS__DATA_DIR": "2024",
        "CEREBELLAR_NORSE_SERVER__HOST": "0.0.0.0",
    })
    assert cfg.server.api_token is not None
    assert cfg.server.api_token.get_secret_value() == "123456"
    assert cfg.paths.data_dir == Path("2024")
    assert cfg.server.host == "0.0.0.0"


def test_env_override_of_unknown_key_is_an_error_naming_key_and_variable() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(environ={"CEREBELLAR_NORSE_SERVER__PROT": "9090"})
    (problem,) = info.value.problems
    assert problem.key == "server.prot"
    assert "unknown key" in problem.message
    assert "environment variable CEREBELLAR_NORSE_SERVER__PROT" in problem.message


def test_env_override_of_unknown_section_names_the_variable() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(environ={"CEREBELLAR_NORSE_SERVERS__PORT": "9090"})
    (problem,) = info.value.problems
    assert problem.key == "servers"
    assert "CEREBELLAR_NORSE_SERVERS__PORT" in problem.message


def test_env_override_with_a_bad_value_names_key_and_variable() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(environ={"CEREBELLAR_NORSE_SERVER__PORT": "notaport"})
    (problem,) = info.value.problems
    assert problem.key == "server.port"
    assert "CEREBELLAR_NORSE_SERVER__PORT" in problem.message


def test_env_variables_without_double_underscore_are_not_config() -> None:
    environ = {"CEREBELLAR_NORSE_LOG": "debug", "CEREBELLAR_NORSE_PORT": "1", "SERVER__PORT": "1", "OTHER_SERVER__PORT": "1"}
    assert env_overrides(environ) == ({}, {})
    assert load_config(environ=environ) == load_config(environ={})


@pytest.mark.parametrize("name", ["CEREBELLAR_NORSE_SERVER__PORT__", "CEREBELLAR_NORSE_SERVER____PORT",
                                  "CEREBELLAR_NORSE___SERVER__PORT"])
def test_env_variable_with_an_empty_part_is_an_error_naming_it(name: str) -> None:
    """``CEREBELLAR_NORSE_SERVER__PORT__=9090`` was silently ignored: the service started on another port."""
    with pytest.raises(ConfigError) as info:
        load_config(environ={name: "9090"})
    assert any(name in p.message for p in info.value.problems), info.value.problems


@pytest.mark.parametrize(("name", "fix"), [("CEREBELLAR_NORSE_SERVER_PORT", "CEREBELLAR_NORSE_SERVER__PORT"),
                                         ("CEREBELLAR_NORSE_PATHS_STATE_DIR", "CEREBELLAR_NORSE_PATHS__STATE_DIR"),
                                         ("CEREBELLAR_NORSE_LOGGING_LEVEL", "CEREBELLAR_NORSE_LOGGING__LEVEL")])
def test_a_section_and_key_joined_by_one_underscore_is_an_error_naming_the_fix(name: str, fix: str) -> None:
    """The likeliest typo of an override: read as no override at all, the service would run on the file's value."""
    with pytest.raises(ConfigError) as info:
        load_config(environ={name: "9090"})
    (problem,) = info.value.problems
    assert name in problem.message and problem.fix == f"name it {fix}"
    assert load_config(environ={"CEREBELLAR_NORSE_LOG": "debug", "CEREBELLAR_NORSE_NUMBA_CACHE_BASE": "/x"}) == load_config(environ={})


def test_env_overrides_builds_a_nested_tree() -> None:
    tree, names = env_overrides({
        "CEREBELLAR_NORSE_NEURAL__GRANULE__V_TH": "1.5",
        "CEREBELLAR_NORSE_SERVER__PORT": "8081",
        "CEREBELLAR_NORSE_PATHS__STATE_DIR": "/srv/x",
    })
    assert tree == {"neural": {"granule": {"v_th": 1.5}}, "server": {"port": 8081}, "paths": {"state_dir": "/srv/x"}}
    assert names["neural.granule.v_th"] == "CEREBELLAR_NORSE_NEURAL__GRANULE__V_TH"


def test_os_environ_is_used_when_no_environ_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CEREBELLAR_NORSE_SERVER__PORT", "9191")
    assert load_config().server.port == 9191


def test_state_dir_defaults_to_systemd_state_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STATE_DIRECTORY", "/var/lib/cerebellar-norse:/var/lib/other")
    assert load_config(environ={}).paths.state_dir == Path("/var/lib/cerebellar-norse")


# ---------------------------------------------------------------------------
# Memory estimate
# ---------------------------------------------------------------------------


def test_memory_estimate_of_the_default_config() -> None:
    cfg = load_config(environ={})
    n = cfg.neural
    est = estimate_memory(cfg)
    pf_weights = n.granule_size * 4 * n.connections_per_neuron  # the operations guide's formula
    mossy_weights = n.granule_size * n.granule_dendrites * (4 + 4)  # float32 weight + int32 index
    dcn_weights = n.dcn_size * (n.mossy_size + n.purkinje_size) * 4 + 3 * n.dcn_size * 4
    assert est.weights == pf_weights + mossy_weights + dcn_weights
    state_floats = 2 * (n.granule_size + n.purkinje_size + n.dcn_size + 3) + 1
    assert est.state_per_market == state_floats * 4 + 12 * 8
    assert est.pool == int(cfg.performance.memory_pool_size)
    assert est.total == est.weights + est.state_per_market + est.pool


def test_memory_estimate_weights_scale_with_granule_size_times_connections() -> None:
    base = cfg_with({"neural": {"granule_size": 10_000, "connections_per_neuron": 100}})
    more = cfg_with({"neural": {"granule_size": 10_000, "connections_per_neuron": 101}})
    assert estimate_memory(more).weights - estimate_memory(base).weights == 10_000 * 4


def test_memory_estimate_of_production_is_the_guides_numbers() -> None:
    est = estimate_memory(load_config(PRODUCTION, environ={}))
    assert est.weights >= 4_000_000 * 4 * 250  # 4 GB of parallel-fibre weights
    assert est.pool == 20 * 10**9
    assert est.total < 28 * 10**9


def test_memory_estimate_without_pool_counts_market_slots() -> None:
    cfg = cfg_with({"performance": {"memory_pool_enabled": False, "max_markets": 10}})
    est = estimate_memory(cfg)
    assert est.pool == 10 * est.state_per_market


def test_memory_estimate_float64_doubles_state() -> None:
    f32 = estimate_memory(cfg_with({"neural": {"precision": "float32"}}))
    f64 = estimate_memory(cfg_with({"neural": {"precision": "float64"}}))
    assert f64.state_per_market - 96 == 2 * (f32.state_per_market - 96)


@pytest.mark.parametrize(("n", "text"), [(999, "999B"), (1000, "1.00KB"), (64_569_708, "64.57MB"), (28 * 10**9, "28.00GB")])
def test_fmt_bytes_is_decimal(n: int, text: str) -> None:
    assert fmt_bytes(n) == text


# ---------------------------------------------------------------------------
# Consistency rules (one case per rule in consistency_problems)
# ---------------------------------------------------------------------------

CONSISTENCY_CASES = [
    pytest.param({"neural": {"mossy_size": 50}}, {"neural.mossy_size"}, "multiple of 3", id="mossy-not-multiple-of-3"),
    pytest.param({"neural": {"mossy_size": 3, "granule_dendrites": 2}}, {"neural.mossy_size"}, "at least 2 fibres", id="mossy-one-per-feature"),
    pytest.param({"neural": {"dcn_size": 13}}, {"neural.dcn_size"}, "multiple of 3", id="dcn-not-multiple-of-3"),
    pytest.param({"neural": {"mossy_size": 6, "granule_dendrites": 7}}, {"neural.granule_dendrites"}, "only 6 mossy", id="dendrites-above-mossy"),
    pytest.param({"neural": {"granule_size": 1024, "connections_per_neuron": 2000}}, {"neural.connections_per_neuron"}, "only 1024 granule", id="connections-above-granule"),
    pytest.param({"neural": {"granule_size": 1024, "purkinje_size": 2000}}, {"neural.purkinje_size"}, "exceed 1024 granule", id="purkinje-above-granule"),
    pytest.param({"neural": {"granule_size": 1024, "target_sparsity": 0.0005}}, {"neural.target_sparsity"}, "less than one cell", id="sparsity-below-one-cell"),
    pytest.param({"neural": {"readout": {"tau_mem_ms": 0.5}}}, {"neural.readout.tau_mem_ms"}, "unstable", id="euler-readout-tau-mem"),
    pytest.param(
        {"neural": {"dt_ms": 4.0}},  # taus of 2.0 or less are unstable (ratio >= 2); tau_mem 4.0 (ratio 1) fine
        {"neural.granule.tau_syn_ms", "neural.granule.tau_mem_ms", "neural.purkinje.tau_syn_ms", "neural.dcn.tau_syn_ms",
         "neural.readout.tau_syn_ms", "neural.readout.tau_mem_ms"},
        "forward Euler is unstable",
        id="euler-dt-at-twice-tau",
    ),
    pytest.param({"performance": {"memory_pool_size": "1KB"}}, {"performance.memory_pool_size"}, "holds no market state", id="pool-below-one-state"),
    pytest.param({"performance": {"batch_size": 5000, "queue_size": 4096}}, {"performance.batch_size"}, "queue_size 4096", id="batch-above-queue"),
    pytest.param(
        {"neural": {"granule_size": 1_000_000, "connections_per_neuron": 1000}},
        {"performance.memory_limit"},
        "exceeds memory_limit 2.00GB",
        id="estimate-above-memory-limit",
    ),
]


@pytest.mark.parametrize(("data", "keys", "fragment"), CONSISTENCY_CASES)
def test_consistency_rule(data: dict[str, Any], keys: set[str], fragment: str) -> None:
    cfg = cfg_with(data)
    problems = consistency_problems(cfg)
    assert {p.key for p in problems} == keys
    assert all(fragment in p.message for p in problems), problems
    assert all(p.fix for p in problems)


def test_euler_rule_boundary_is_twice_tau() -> None:
    just_stable = cfg_with({"neural": {"dt_ms": 1.9}})  # the smallest default tau is 1.0 ms (readout tau_syn)
    assert not [p for p in consistency_problems(just_stable) if "Euler" in p.message]


def test_memory_limit_message_gives_the_numbers() -> None:
    cfg = cfg_with({"neural": {"granule_size": 1_000_000, "connections_per_neuron": 1000}})
    est = estimate_memory(cfg)
    (problem,) = consistency_problems(cfg)
    for text in (fmt_bytes(est.total), fmt_bytes(est.weights), "granule_size 1000000", "connections_per_neuron 1000", "2.00GB"):
        assert text in problem.message


def test_load_checked_config_raises_on_a_consistency_problem(write_toml: Any) -> None:
    path = write_toml("[neural]\nmossy_size = 50\n")
    load_config(path, environ={})  # the schema is fine
    with pytest.raises(ConfigError) as info:
        load_checked_config(path, environ={})
    assert problem_keys(info.value) == ["neural.mossy_size"]
    assert info.value.source == str(path)


def test_json_schema_defaults_are_the_defaults_a_config_gets() -> None:
    """Every default in --dump-schema is the value an empty file gives (the LIF populations' own ones included)."""
    schema = config_json_schema()
    defs = schema["$defs"]

    def node(ref_or_schema: dict[str, Any]) -> dict[str, Any]:
        ref = ref_or_schema.get("$ref")
        return defs[ref.rsplit("/", 1)[-1]] if ref else ref_or_schema

    checked = []

    def walk(sub: dict[str, Any], values: dict[str, Any], prefix: str) -> None:
        for key, prop in node(sub)["properties"].items():
            value = values[key]
            if isinstance(value, dict):
                walk(prop, value, f"{prefix}{key}.")
            elif "default" in prop:
                assert prop["default"] == value, f"{prefix}{key}: schema default {prop['default']!r}, effective {value!r}"
                checked.append(f"{prefix}{key}")

    walk(schema, Config().model_dump(mode="json"), "")
    assert {"neural.granule.tau_mem_ms", "neural.purkinje.tau_mem_ms", "neural.readout.tau_syn_ms"} <= set(checked)


def test_a_log_size_of_zero_is_refused_naming_the_key(tmp_path: Path) -> None:
    """logging.max_size = 0 would never rotate the log file (RotatingFileHandler's maxBytes 0): refused, named."""
    path = tmp_path / "c.toml"
    path.write_text('[logging]\nmax_size = "0MB"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "logging.max_size" in str(info.value), info.value
    path.write_text('[logging]\nmax_size = "1KB"\n')
    assert int(load_config(path).logging.max_size) == 1000


# (section, key, sizes refused, the lowest size accepted, in bytes)
SIZE_BOUNDS = [
    pytest.param("server", "max_body_size", ["0B", 0, "511B", "0.5KB"], 512, id="max_body_size"),  # one tick's JSON
    pytest.param("performance", "journal_segment_size", ["0B", "999999B"], 1_000_000, id="journal_segment_size"),
    pytest.param("logging", "max_size", ["0B", 0], 1, id="log_max_size"),  # 0 never rotates
]


@pytest.mark.parametrize(("section", "key", "refused", "lowest"), SIZE_BOUNDS)
def test_a_size_that_cannot_work_is_refused_naming_the_key(section: str, key: str, refused: list[str | int],
                                                           lowest: int) -> None:
    """server.max_body_size = "0B" validated, and the service then refused every request body and stream message."""
    for size in refused:
        with pytest.raises(ConfigError) as info:
            cfg_with({section: {key: size}})
        assert problem_keys(info.value) == [f"{section}.{key}"], size
        with pytest.raises(ConfigError) as info:
            cfg_with({}, environ={f"CEREBELLAR_NORSE_{section.upper()}__{key.upper()}": str(size)})
        assert problem_keys(info.value) == [f"{section}.{key}"], size
    assert int(getattr(getattr(cfg_with({section: {key: lowest}}), section), key)) == lowest


def test_a_config_file_that_is_not_utf8_says_so_and_where(tmp_path: Path) -> None:
    """A Latin-1 file read as "'utf-8' codec can't decode byte … (fix: check the path and its permissions)"."""
    path = tmp_path / "c.toml"
    path.write_bytes(b'[server]\nport = 8080\n# caf\xe9\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    (problem,) = info.value.problems
    assert problem.message == f"config file {path} is not UTF-8 text: byte 0xe9 at line 3 (byte offset 26)"
    assert problem.fix == "save the file as UTF-8"


def test_a_config_file_with_a_utf8_byte_order_mark_is_read(tmp_path: Path) -> None:
    """A file saved by a Windows editor starts with EF BB BF; it was refused as "TOML syntax error: Invalid statement
    (at line 1, column 1)", a line with nothing wrong to see."""
    path = tmp_path / "c.toml"
    path.write_bytes(b"\xef\xbb\xbf[server]\nport = 8181\n")
    assert load_config(path, environ={}).server.port == 8181


@pytest.mark.parametrize(("encoding", "name"), [("utf-16", "UTF-16"), ("utf-16-be", "UTF-16"), ("utf-32", "UTF-32")])
def test_a_config_file_in_utf16_or_utf32_says_so(tmp_path: Path, encoding: str, name: str) -> None:
    path = tmp_path / "c.toml"
    path.write_bytes(("\ufeff" if encoding == "utf-16-be" else "").encode(encoding) + "[server]\nport = 8181\n".encode(encoding))
    with pytest.raises(ConfigError) as info:
        load_config(path, environ={})
    (problem,) = info.value.problems
    assert problem.message == f"config file {path} is {name} text (it starts with a {name} byte-order mark), not UTF-8"
    assert problem.fix == "save the file as UTF-8"
