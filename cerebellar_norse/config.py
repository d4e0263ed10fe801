"""Configuration: pydantic models of the TOML file, loading, env overrides, checks.

Sizes written as strings ("20GB", "100MB") are parsed by pydantic's ``ByteSize``:
``GB``/``MB``/``KB`` are decimal (10^9, 10^6, 10^3 bytes); ``GiB``/``MiB``/``KiB``
are binary (2^30, 2^20, 2^10 bytes).

Loading order: built-in defaults < TOML file < environment variables
``CEREBELLAR_NORSE_<SECTION>__<KEY>`` (nested tables: ``..._NEURAL__GRANULE__V_TH``).
Unknown keys are errors in every layer.
"""

from __future__ import annotations

import copy
import errno
import math
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import replace
from datetime import tzinfo
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ByteSize,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from .errors import ConfigError, ConfigProblem
from .textmarks import wide_encoding
from .timezones import DEFAULT_ZONE, parse_zone

ENV_PREFIX = "CEREBELLAR_NORSE_"
LEVEL_NAMES = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# Keys a reload (SIGHUP) applies to the running service; every other changed key needs a restart (README.md's
# reference table says which, from this tuple). server.api_token: only added where there was none.
LIVE_KEYS = (
    "logging.level",
    "performance.max_batch_delay_us",
    "performance.queue_size",
    "performance.busy_poll_us",
    "performance.warm_step_interval_us",
    "performance.warm_window_ms",
    "performance.cpu_wakeup_latency_us",
    "server.api_token",
    "server.drain_s",
    "debug.record_requests",
    "training.auto_activate",
    "training.stall_warning_s",
    "training.reset_state_on_swap",
    "training.keep_job_records",
)

_SIZE_RE = re.compile(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*([A-Za-z]+)?\s*")
_SIZE_UNITS = sorted(ByteSize.byte_sizes, key=lambda u: (-len(u), u))  # longest first, for the schema's alternation


def _checked_size(v: Any) -> Any:
    """A size string must be a number and a known unit, nothing more (pydantic's parser alone reads "28.5.5GB" as 28
    bytes and ignores what follows "28GB")."""
    if isinstance(v, str):
        m = _SIZE_RE.fullmatch(v)
        if m is None or (m[2] is not None and m[2].lower() not in ByteSize.byte_sizes):
            raise ValueError(f"{v!r} is not a size: write a number and a unit, e.g. \"28GB\", \"512MB\" or \"1.5GiB\""
                             " (units B, KB, MB, GB, TB and KiB, MiB, GiB, TiB)")
    return v


_SIZE_PATTERN = (r"^\s*(\d+(\.\d+)?|\.\d+)\s*("
                 + "|".join("".join(f"[{c.upper()}{c.lower()}]" for c in u) for u in _SIZE_UNITS) + r")?\s*$")
Bytes = Annotated[ByteSize, BeforeValidator(_checked_size), WithJsonSchema(
    {"anyOf": [{"type": "string", "pattern": _SIZE_PATTERN}, {"type": "integer", "minimum": 0}]})]
"""A size in bytes: an integer, or a string of a number and a unit ("28GB", "512 MB", "1.5GiB"; 1 GB = 10^9 B)."""
DateOrder = Literal["auto", "day_first", "month_first"]  # training.date_order: of tick files' slash or dot dates
N_FEATURES = 3  # log return, log volume, log inter-tick gap
N_CLASSES = 3  # down, flat, up


class _Section(BaseModel):
    # strict: a TOML value of the wrong type ("512" for an integer, "no" or 0 for a boolean) is refused, never
    # converted (an integer is still a float); paths are read from strings.
    model_config = ConfigDict(extra="forbid", validate_default=True, frozen=True, strict=True)


def no_nul(path: Path | None) -> Path | None:
    """A path a system call can take: refused here, naming its key, rather than at first use."""
    if path is not None and "\x00" in str(path):
        raise ValueError("a path cannot contain a NUL character (\\u0000)")
    return path


def not_empty(value: Any) -> Any:
    """An empty string where a path goes is refused before it becomes ``Path("")``, the current directory: an
    environment override left empty (``CEREBELLAR_NORSE_PATHS__STATE_DIR=$UNSET``) made the service keep its state in
    whatever directory it was started from."""
    if isinstance(value, str) and not value.strip():
        raise ValueError("an empty or blank path, which would name the directory the service is started from: write "
                         "the path, or leave the key out for its default")
    return value


class LIFConfig(_Section):
    """LIF parameters of one population (Norse ``LIFParameters``), in physical units."""

    tau_syn_ms: float = Field(5.0, gt=0, le=1000, description="Synaptic current time constant (ms).")
    tau_mem_ms: float = Field(10.0, gt=0, le=1000, description="Membrane time constant (ms).")
    v_leak: float = Field(0.0, allow_inf_nan=False, description="Leak (resting) potential (dimensionless, threshold 1).")
    v_th: float = Field(1.0, allow_inf_nan=False, description="Spike threshold potential (dimensionless).")
    v_reset: float = Field(0.0, allow_inf_nan=False, description="Potential after a spike (dimensionless).")

    @model_validator(mode="after")
    def _reset_below_threshold(self) -> LIFConfig:
        if not self.v_reset < self.v_th:
            raise ValueError(f"v_reset ({self.v_reset}) must be below v_th ({self.v_th})")
        return self


# Time constants (tau_syn_ms, tau_mem_ms) of each population; a partial table such as
# [neural.granule] with only tau_mem_ms keeps the population's other defaults.
LIF_DEFAULTS: dict[str, tuple[float, float]] = {
    "granule": (2.0, 2.0),
    "purkinje": (2.0, 4.0),
    "dcn": (2.0, 4.0),
    "readout": (1.0, 2.0),
}


def _lif(population: str) -> Any:
    tau_syn, tau_mem = LIF_DEFAULTS[population]
    return Field(default_factory=lambda: LIFConfig(tau_syn_ms=tau_syn, tau_mem_ms=tau_mem))


class NeuralConfig(_Section):
    """Network shape, dynamics and learning rate (section ``[neural]``)."""

    mossy_size: int = Field(48, ge=N_FEATURES, le=65_536, description="Mossy fibres; a multiple of 3 (one population per tick feature).")
    granule_size: int = Field(512, ge=1, le=100_000_000, description="Granule cells.")
    granule_dendrites: int = Field(4, ge=1, le=64, description="Mossy fibres feeding each granule cell.")
    purkinje_size: int = Field(32, ge=1, le=1_000_000, description="Purkinje cells.")
    connections_per_neuron: int = Field(128, ge=1, le=1_000_000, description="Parallel-fibre inputs (granule cells) per Purkinje cell.")
    dcn_size: int = Field(12, ge=N_CLASSES, le=100_000, description="Deep-nuclei cells; a multiple of 3 (one group per class down/flat/up).")
    steps_per_tick: int = Field(4, ge=1, le=1000, description="Integration steps per market tick.")
    dt_ms: float = Field(1.0, gt=0, le=100, description="Integration step (ms).")
    seed: int = Field(42, ge=0, le=2**63 - 1, description="Seed fixing topology and initial weights.")
    horizon_ticks: int = Field(10, ge=1, le=100_000, description="Prediction horizon (ticks ahead of the same market) of the down/flat/up classes.")
    horizon_ms: int | None = Field(None, ge=1, le=10 * 365 * 86_400_000, description="When set, the horizon is this much market time (ms) instead of horizon_ticks: a tick is judged at the first tick of its market at least horizon_ms later.")
    warmup_ticks: int = Field(500, ge=0, le=10_000_000, description="Ticks a market must have seen before its results stop carrying warming_up (the state has then forgotten where it started).")
    target_sparsity: float = Field(0.05, gt=0, lt=1, description="Target fraction of granule cells spiking per step (Golgi inhibition).")
    golgi_rate: float = Field(2.0, ge=0, le=1000, description="Gain of the Golgi homeostatic inhibition (current per unit activity error per step).")
    golgi_leak: float = Field(0.05, ge=0, lt=1, description="Fraction of the Golgi inhibition that decays each step; above 0 the network forgets its starting state (0 = a pure integrator that never does).")
    mossy_gain: float = Field(1.0, gt=0, le=1000, description="Peak mossy-fibre current (per step, dimensionless).")
    feature_clip: float = Field(4.0, gt=0, le=100, description="Z-scored features are clipped to +/- this (standard deviations).")
    norm_window: int = Field(12, ge=2, le=10_000_000, description="Ticks of memory of the per-market running normaliser.")
    readout_scale: float = Field(2.0, gt=0, le=1000, description="Multiplier from readout potential to class logits.")
    precision: Literal["float32", "float64"] = Field("float32", description="Floating point type of the network state and weights.")
    learning_rate: float = Field(5e-3, gt=0, le=1, description="Adam learning rate for gradient training.")
    granule: LIFConfig = _lif("granule")
    purkinje: LIFConfig = _lif("purkinje")
    dcn: LIFConfig = _lif("dcn")
    readout: LIFConfig = _lif("readout")

    @model_validator(mode="before")
    @classmethod
    def _population_lif_defaults(cls, data: Any) -> Any:
        """Fill keys missing from a partial LIF table with that population's defaults."""
        if not isinstance(data, Mapping):
            return data
        data = dict(data)
        for name, (tau_syn, tau_mem) in LIF_DEFAULTS.items():
            table = data.get(name)
            if isinstance(table, Mapping):
                data[name] = {"tau_syn_ms": tau_syn, "tau_mem_ms": tau_mem, **table}
        return data


class PerformanceConfig(_Section):
    """Device, batching and memory (section ``[performance]``)."""

    device: Literal["cpu", "cuda", "auto"] = Field("cpu", description='"cpu", "cuda", or "auto" (CUDA when present).')
    batch_size: int = Field(256, ge=1, le=65_536, description="Most ticks stepped as one batch.")
    max_batch_delay_us: int = Field(50, ge=0, le=1_000_000, description="Longest wait to fill a batch (us).")
    queue_size: int = Field(4096, ge=1, le=10_000_000, description="Ticks waiting for the engine before callers get 503.")
    busy_poll_us: int = Field(250, ge=0, le=10_000_000, description=(
        "After a batch whose first tick came within this long of the batch before (us), keep the event loop polling "
        "its sockets instead of sleeping for this long: a client that sends its next tick as soon as it has the "
        "answer finds the CPU awake and the network's data in cache (lower latency, at the cost of one busy core "
        "while it keeps coming that quickly). Ticks further apart cost no polling; polling stops while a task waits "
        "for a CPU. 0 sleeps at once."))
    warm_step_interval_us: int = Field(1000, ge=0, le=1_000_000, description=(
        "While ticks keep coming (for warm_window_ms after each batch), step the last tick again on a state slot no "
        "market holds this often (us), so that the next tick finds the network's code and weights in the CPU's caches "
        "(on the development VM at 300 ticks/s it halved the per-tick network time at the median and cut p95 by more than half, "
        "for about 1% of a core); while busy_poll_us keeps the loop polling, also once after each batch (sequential "
        "ticks' network time 1.03-1.09x the kernel's hot loop instead of 1.2x). Nothing a client sees changes. 0: never; "
        "otherwise at least 1000 (event-loop timers have millisecond resolution). Needs a free state slot."))
    warm_window_ms: int = Field(1000, ge=1, le=3_600_000, description=(
        "How long after each batch the warm steps of warm_step_interval_us go on (ms): an idle service stops them."))
    cpu_wakeup_latency_us: int | None = Field(None, ge=0, le=1_000_000, description=(
        "While the service runs, ask the kernel to keep every idle CPU of the host able to wake within this (us; its "
        "CPU latency QoS, /dev/cpu_dma_latency): 0 keeps them polling instead of halting, so a tick arriving after an "
        "idle gap finds the CPU awake and the network's weights in its caches (on the 2-vCPU development VM the "
        "processing p50 of sequential ticks fell 16-22% and a sequential client's round trip 19-37%: "
        "docs/benchmarks.md). The limit is the whole host's: every idle CPU then burns power. "
        "Needs write access to the device (docs/install.md, \"CPU wake-up latency\"); a host that refuses is "
        "logged and the service serves without it. Not set: nothing asked."))
    max_markets: int = Field(1024, ge=1, le=10_000_000, description="Market state slots; least recently used markets are evicted beyond it.")
    cuda_streams: int = Field(1, ge=1, le=64, description="CUDA streams (device cuda).")
    cpu_threads: int = Field(1, ge=1, le=1024, description=(
        "Threads of the CPU kernel (numba). Batches of at least 32 ticks are split by market over this many "
        "threads (smaller ones run on the event loop's thread); on the 2-vCPU development host 2 threads cut a "
        "batch of 256 by 10-40% per tick, depending on what else runs (docs/benchmarks.md). Leave it at 1 where "
        "single ticks dominate and the service shares its cores."))
    memory_pool_enabled: bool = Field(True, description="Reserve the state pool at start.")
    memory_pool_size: Bytes = Field(ByteSize(64_000_000), description='Memory reserved for market states, e.g. "20GB".')
    memory_limit: Bytes = Field(ByteSize(2_000_000_000), description='Hard cap on the estimated memory, e.g. "28GB".')
    garbage_collection_threshold: float = Field(0.8, gt=0, le=1, description="Pool usage fraction above which idle markets are evicted early.")
    journal: bool = Field(True, description="Append every applied batch of ticks to a journal in the state dir before its results are returned, and replay it over the last checkpoint at start: a crash (kill -9) loses no acknowledged tick.")
    journal_fsync: bool = Field(False, description="fsync the journal after every batch, so acknowledged ticks also survive power loss (costs one disk flush per batch); without it they survive a process crash.")
    journal_segment_size: Bytes = Field(ByteSize(64_000_000), ge=1_000_000, description='Size of one journal file, reserved on disk when it is created (a full disk is found then, not mid-batch), e.g. "64MB"; a full file starts a checkpoint. The last batch_size x 301 bytes of each file are kept for the batch during which the next file cannot be created (no file descriptor or disk space: docs/operations.md, "Durability and failure modes"); where that leaves less than as much again for records, files are made larger.')
    checkpoint_interval_s: float = Field(60.0, gt=0, le=86_400, description="Seconds between checkpoints of the market states (s); each removes the journal it covers, so it bounds the replay at start.")

    @field_validator("warm_step_interval_us")
    @classmethod
    def _warm_interval_is_off_or_a_timer(cls, v: int) -> int:
        if 0 < v < 1000:
            raise ValueError("must be 0 (off) or at least 1000 us: event-loop timers have millisecond resolution")
        return v


class TrainingConfig(_Section):
    """Training jobs (section ``[training]``)."""

    gradient_checkpointing: bool = Field(False, description="Recompute activations in the backward pass to save memory.")
    epochs: int = Field(5, ge=1, le=10_000, description="Default epochs of a job.")
    sequence_length: int = Field(64, ge=1, le=100_000, description="Truncated BPTT window (ticks).")
    batch_markets: int = Field(8, ge=1, le=65_536, description="Sequences per gradient step.")
    validation_fraction: float = Field(0.15, gt=0, lt=1, description="Fraction of all markets' ticks (by time, after the training part; the cuts are common to all markets) used for early stopping and calibration.")
    test_fraction: float = Field(0.15, ge=0, lt=1, description="Last fraction of all markets' ticks (by time) held out as the test split: scored and reported, never used to choose anything.")
    early_stopping_patience: int = Field(3, ge=1, le=1000, description="Epochs without validation improvement before stopping.")
    flat_band_mode: Literal["volatility", "fixed"] = Field("volatility", description='"volatility": the flat band is flat_band_volatility_multiple x the market\'s recent volatility over the horizon; "fixed": the band is flat_band.')
    flat_band_volatility_multiple: float = Field(0.43, ge=0, le=100, description="Flat band in units of the horizon's volatility (sd of per-tick log returns x sqrt(ticks in the horizon)); 0.43 gives about a third of each class for Gaussian returns.")
    volatility_window: int = Field(100, ge=2, le=10_000_000, description="Ticks of memory of the running per-tick volatility used by the volatility flat band.")
    flat_band: float = Field(0.0005, ge=0, le=1, description="Fixed flat band (flat_band_mode fixed): |log return| over the horizon at or below this is class flat (0.0005 = 5 bp).")
    max_bad_row_fraction: float = Field(0.01, ge=0, le=1, description="A job fails when more rows than this fraction are bad.")
    data_timezone: str = Field(DEFAULT_ZONE, description='Time zone of tick files\' times written without an offset or zone (naive local times, as HistData, FirstRate Data or MetaTrader write them): "UTC", an IANA name such as "America/New_York" (daylight saving time included), or a fixed offset such as "-05:00" or "UTC+02:00". Times since the epoch and times with their own offset or zone are exact and not affected.')
    date_order: DateOrder = Field("auto", description='Order of day and month in tick files\' dates written with slashes or dots (02/03/2010): "auto" reads it from each date column (a day above 12, or successive dates days apart in one order only; dates with dots that show neither are day first) and refuses a column that cannot tell; "day_first" or "month_first" reads every such column so, and refuses one whose dates show the other order. Dates written year first (ISO 8601) are not affected.')
    adjust_splits: bool = Field(True, description="Read a one-day move of a stock's prices that matches a common split ratio (2:1, 3:2, 1:10, …) within a tight tolerance, and is over 5 % and 25 times the market's median move, between two days, with volumes, as a split: the prices before it divided by the ratio (the volumes multiplied by it where they are as traded), noted (docs/training.md). false reads every price as written (a genuine move that happens to match a ratio).")
    threads: int = Field(1, ge=1, le=1024, description="CPU threads of the training process.")
    stall_warning_s: float = Field(300.0, ge=1, le=86_400, description="A running job whose process has reported no progress and used no CPU time for this long (s) is stalled (stopped, frozen, hung on a dead mount): one WARNING, stalled_s in its status, cerebellar_norse_training_job_stalled 1; end it with DELETE /training/{job_id}.")
    auto_activate: bool = Field(True, description="Activate a trained model when it beats the active one on validation.")
    keep_job_records: int = Field(500, ge=1, le=1_000_000, description="Records of finished training jobs kept (jobs/<job_id>.json, about 5 kB each, every one read at start and held in memory for GET /training/status/<job_id>): when a job ends, and at start, the records of the oldest finished jobs beyond this many are deleted. Models are not touched.")
    reset_state_on_swap: bool = Field(False, description="Reset market states when a new model is activated.")
    online_learning: bool = Field(False, description="Climbing-fibre online adaptation while serving.")
    climbing_fibre_rate: float = Field(1e-4, ge=0, le=1, description="Step size of the climbing-fibre LTD/LTP rule.")
    bootstrap_on_first_run: bool = Field(True, description="Train a default model on generated data when the state dir has none.")
    live_evaluation: bool = Field(True, description="Score every served prediction against its label once its horizon has passed (per market and overall, against the causal base rate); exported in /metrics and /neural/metrics.")
    live_evaluation_window: int = Field(1000, ge=10, le=1_000_000, description="Judged ticks in the rolling window of live evaluation (per market and overall); each tracked market keeps about 21 bytes per window tick.")

    @field_validator("data_timezone")
    @classmethod
    def _known_zone(cls, v: str) -> str:
        parse_zone(v)
        return v.strip()

    @property
    def data_zone(self) -> tzinfo:
        """``data_timezone`` as a zone (``datetime.UTC`` for UTC)."""
        return parse_zone(self.data_timezone)

    @property
    def day_first(self) -> bool | None:
        """``date_order`` as the CSV reader takes it: True day first, False month first, None read from each column."""
        return None if self.date_order == "auto" else self.date_order == "day_first"


class ServerConfig(_Section):
    """HTTP server (section ``[server]``)."""

    host: str = Field("127.0.0.1", min_length=1, description="Listen address.")
    port: int = Field(8080, ge=1, le=65_535, description="Listen port.")
    api_token: SecretStr | None = Field(None, description="Bearer token for state-changing routes; required off loopback. Empty or blank means no token; surrounding whitespace is ignored.")
    worker_threads: int = Field(4, ge=1, le=1024, description="Threads of the pool for blocking work off the hot path (job monitoring, file I/O).")
    connection_timeout: float = Field(30.0, gt=0, le=3600, description="Seconds open connections get to finish their requests at shutdown (s).")
    drain_s: float = Field(0.0, ge=0, le=3600, description="Seconds a stop (SIGTERM) keeps serving before it stops accepting: every request is answered as usual, but GET /health answers 503 (reason: stopping) and every answer says Connection: close, so that a load balancer takes the service out and closes its kept connections first. 0: stop at once. Behind HAProxy at least its check inter x fall plus a margin (5 for the shipped checks). A second SIGTERM, or a SIGINT, ends it early. A reload applies it to the next stop (a reload during a stop is ignored).")
    keep_alive_timeout: float = Field(75.0, gt=0, le=3600, description="Idle keep-alive connection lifetime (s).")
    max_connections: int = Field(10_000, ge=1, le=1_000_000, description="Concurrent connections before new ones get 503.")
    max_body_size: Bytes = Field(ByteSize(1_000_000), ge=512, description='Largest request body (and stream message), e.g. "1MB"; at least "512B": one tick with the longest market id and numbers takes under 300 bytes of JSON (0 would refuse every body).')
    request_timeout: float = Field(10.0, gt=0, le=3600, description="Seconds a client gets to send a whole request (headers and body) once it has started one; slower requests are answered 408 and their connection closed.")
    max_clock_skew_ms: int = Field(300_000, ge=0, le=3_155_760_000_000, description="Ticks whose timestamp is more than this far ahead of the server clock (ms) are refused (409 future_timestamp).")

    @field_validator("api_token", mode="before")
    @classmethod
    def _blank_token_is_none(cls, v: Any) -> Any:
        """An empty or whitespace-only token is no token (it must never authenticate); a real one loses surrounding blanks."""
        if isinstance(v, SecretStr):
            v = v.get_secret_value()
        if isinstance(v, str):
            return v.strip() or None
        return v


class LoggingConfig(_Section):
    """Logs (section ``[logging]``)."""

    level: Annotated[Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], WithJsonSchema(
        {"type": "string", "pattern": "^(" + "|".join("".join(f"[{c}{c.lower()}]" for c in name) for name in LEVEL_NAMES)
         + ")$"})] = Field("INFO", description="Lowest level logged (any case). The environment variable CEREBELLAR_NORSE_LOG, when set to a level, wins over it (also over a reloaded value: the reload lists the key as overridden). A reload applies it at once; the reload's own `config reloaded` line is written whatever the level.")
    file: Path | None = Field(None, strict=False, description="Also write JSON lines here (e.g. /var/log/cerebellar-norse/application.log).")
    max_files: int = Field(30, ge=1, le=10_000, description="Rotated log files kept.")
    max_size: Bytes = Field(ByteSize(100_000_000), ge=1, description='Size at which the log file rotates, e.g. "100MB" (0 would never rotate it).')
    compression: Literal["gzip", "none"] = Field("gzip", description="Compression of rotated files.")

    @field_validator("level", mode="before")
    @classmethod
    def _upper(cls, v: Any) -> Any:
        return v.upper() if isinstance(v, str) else v

    _file = field_validator("file")(no_nul)
    _file_given = field_validator("file", mode="before")(not_empty)


class PathsConfig(_Section):
    """Where state and data live (section ``[paths]``)."""

    state_dir: Path = Field(
        default_factory=lambda: Path(os.environ.get("STATE_DIRECTORY", "").split(":")[0] or "./var"), strict=False,
        description="Models, market state, recordings ($STATE_DIRECTORY under systemd, else ./var).",
    )
    data_dir: Path = Field(Path("/data/training"), strict=False, description="Training CSV files.")

    _paths = field_validator("state_dir", "data_dir")(no_nul)
    _paths_given = field_validator("state_dir", "data_dir", mode="before")(not_empty)


class DebugConfig(_Section):
    """Debugging aids (section ``[debug]``)."""

    record_requests: bool = Field(False, description="Record every tick to the state dir for replay.")


class Config(_Section):
    """The whole configuration file."""

    neural: NeuralConfig = Field(default_factory=NeuralConfig)
    performance: PerformanceConfig = Field(default_factory=PerformanceConfig)
    training: TrainingConfig = Field(default_factory=TrainingConfig)
    server: ServerConfig = Field(default_factory=ServerConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    paths: PathsConfig = Field(default_factory=PathsConfig)
    debug: DebugConfig = Field(default_factory=DebugConfig)

    @property
    def dtype_bytes(self) -> int:
        """Bytes per floating point value of the network (4 or 8)."""
        return 4 if self.neural.precision == "float32" else 8


# ---------------------------------------------------------------------------
# Memory estimate
# ---------------------------------------------------------------------------


class MemoryEstimate(BaseModel):
    """Estimated memory of a configuration, in bytes."""

    model_config = ConfigDict(frozen=True)

    weights: int
    state_per_market: int
    pool: int
    total: int


def state_floats_per_market(n: NeuralConfig) -> int:
    """Floating point values of one market's network state (v and i of every cell)."""
    return 2 * (n.granule_size + n.purkinje_size + n.dcn_size + N_CLASSES) + 1


ENCODER_STATE_BYTES = 12 * 8  # float64 running normaliser, see neurons.encoder


def estimate_memory(cfg: Config) -> MemoryEstimate:
    """Memory estimate: granule_size x 4 bytes x connections_per_neuron + state + pool.

    The weights term is the operations guide's formula (an upper bound of the
    parallel-fibre weights, which number purkinje_size x connections_per_neuron);
    the other weight matrices are added exactly. The pool is ``memory_pool_size``
    when the pool is enabled, else ``max_markets`` market states.
    """
    n = cfg.neural
    b = cfg.dtype_bytes
    weights = n.granule_size * 4 * n.connections_per_neuron
    weights += n.granule_size * n.granule_dendrites * (b + 4)  # mossy -> granule
    weights += n.dcn_size * (n.mossy_size + n.purkinje_size) * b + N_CLASSES * n.dcn_size * b
    per_market = state_floats_per_market(n) * b + ENCODER_STATE_BYTES
    pool = int(cfg.performance.memory_pool_size) if cfg.performance.memory_pool_enabled else per_market * cfg.performance.max_markets
    return MemoryEstimate(weights=weights, state_per_market=per_market, pool=pool, total=weights + per_market + pool)


def pool_capacity(cfg: Config) -> int:
    """Market slots: ``max_markets``, limited to what ``memory_pool_size`` holds when the pool is enabled."""
    perf = cfg.performance
    if not perf.memory_pool_enabled:
        return perf.max_markets
    per_market = estimate_memory(cfg).state_per_market
    return max(1, min(perf.max_markets, int(perf.memory_pool_size) // per_market))


def fmt_bytes(n: int, *, at_least: bool = False) -> str:
    """Human-readable decimal size (matches the GB = 10^9 convention of the config); ``at_least`` rounds up, for a
    size to set: the printed figure is then never below ``n``."""
    for unit, factor in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if n >= factor:
            return f"{(-(-n * 100 // factor) / 100 if at_least else n / factor):.2f}{unit}"
    return f"{n}B"


def fmt_bytes_at_least(n: int) -> str:
    """:func:`fmt_bytes` rounded up (``at_least=True``)."""
    return fmt_bytes(n, at_least=True)


# ---------------------------------------------------------------------------
# Consistency checks (need no host information)
# ---------------------------------------------------------------------------


def consistency_problems(cfg: Config) -> list[ConfigProblem]:
    """Checks across keys that a schema alone cannot express."""
    n, perf = cfg.neural, cfg.performance
    out: list[ConfigProblem] = []
    if n.mossy_size % N_FEATURES:
        out.append(ConfigProblem("neural.mossy_size", f"{n.mossy_size} is not a multiple of {N_FEATURES} (one population per feature)", f"use {n.mossy_size - n.mossy_size % N_FEATURES or N_FEATURES}"))
    if n.mossy_size // N_FEATURES < 2 and n.mossy_size % N_FEATURES == 0:
        out.append(ConfigProblem("neural.mossy_size", "needs at least 2 fibres per feature for population coding", "use at least 6"))
    if n.dcn_size % N_CLASSES:
        out.append(ConfigProblem("neural.dcn_size", f"{n.dcn_size} is not a multiple of {N_CLASSES} (one group per class down/flat/up)", f"use {n.dcn_size - n.dcn_size % N_CLASSES or N_CLASSES}"))
    if n.granule_dendrites > n.mossy_size:
        out.append(ConfigProblem("neural.granule_dendrites", f"{n.granule_dendrites} dendrites but only {n.mossy_size} mossy fibres", "lower granule_dendrites or raise mossy_size"))
    if n.connections_per_neuron > n.granule_size:
        out.append(ConfigProblem("neural.connections_per_neuron", f"{n.connections_per_neuron} inputs per Purkinje cell but only {n.granule_size} granule cells", "lower connections_per_neuron or raise granule_size"))
    if n.purkinje_size > n.granule_size:
        out.append(ConfigProblem("neural.purkinje_size", f"{n.purkinje_size} Purkinje cells exceed {n.granule_size} granule cells", "lower purkinje_size"))
    if n.target_sparsity * n.granule_size < 1:
        out.append(ConfigProblem("neural.target_sparsity", f"{n.target_sparsity} of {n.granule_size} granule cells is less than one cell", "raise target_sparsity or granule_size"))
    for name in ("granule", "purkinje", "dcn", "readout"):
        lif: LIFConfig = getattr(n, name)
        for tau_key in ("tau_syn_ms", "tau_mem_ms"):
            if n.dt_ms / getattr(lif, tau_key) >= 2.0:
                out.append(ConfigProblem(f"neural.{name}.{tau_key}", f"dt_ms {n.dt_ms} is at least twice {tau_key} {getattr(lif, tau_key)}: forward Euler is unstable", f"raise {tau_key} above {n.dt_ms / 2} or lower neural.dt_ms"))
    est = estimate_memory(cfg)
    if perf.memory_pool_enabled and int(perf.memory_pool_size) < est.state_per_market:
        out.append(ConfigProblem("performance.memory_pool_size", f"{fmt_bytes(int(perf.memory_pool_size))} holds no market state of {fmt_bytes(est.state_per_market)}", f"raise it to at least {fmt_bytes(est.state_per_market)}"))
    if est.total > int(perf.memory_limit):
        out.append(ConfigProblem(
            "performance.memory_limit",
            f"memory estimate {fmt_bytes(est.total)} (weights {fmt_bytes(est.weights)} = granule_size {n.granule_size} x 4 B x connections_per_neuron {n.connections_per_neuron} + the other layers, + state {fmt_bytes(est.state_per_market)} + pool {fmt_bytes(est.pool)}) exceeds memory_limit {fmt_bytes(int(perf.memory_limit))}",
            "lower neural.granule_size, neural.connections_per_neuron or performance.memory_pool_size, or raise performance.memory_limit",
        ))
    t = cfg.training
    if t.validation_fraction + t.test_fraction >= 0.9:
        out.append(ConfigProblem("training.validation_fraction", f"validation_fraction {t.validation_fraction} + test_fraction {t.test_fraction} leave less than 10% for training", "lower training.validation_fraction or training.test_fraction"))
    if perf.batch_size > perf.queue_size:
        out.append(ConfigProblem("performance.batch_size", f"{perf.batch_size} exceeds queue_size {perf.queue_size}", "lower batch_size or raise performance.queue_size"))
    return out


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------


# The fix named for a value of the wrong type (pydantic's error type -> what to write).
_TYPE_FIXES = {
    "int_type": "write a whole number without quotes (e.g. 512)",
    "int_from_float": "write a whole number without quotes or a decimal point (e.g. 512)",
    "float_type": "write a number without quotes (e.g. 2.5)",
    "bool_type": "write true or false, without quotes",
    "string_type": "write it in quotes",
}


def _pydantic_problems(err: ValidationError, prefix: str = "") -> list[ConfigProblem]:
    out = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"])
        if prefix:
            key = f"{prefix}.{key}" if key else prefix
        etype = e["type"]
        if etype == "extra_forbidden":
            out.append(ConfigProblem(key, "unknown key", "remove it or check its spelling against `cerebellar-norse --dump-schema`"))
        elif etype == "missing":
            out.append(ConfigProblem(key, "missing", "add it"))
        else:
            got = e.get("input")
            shown = "" if isinstance(got, dict) else f" (got {got!r})"
            msg = e["msg"].removeprefix("Value error, ")
            out.append(ConfigProblem(key, f"{msg}{shown}", _TYPE_FIXES.get(etype, "see the configuration reference in README.md")))
    return out


def default_toml_text() -> str:
    """The built-in default configuration, as shipped in the package."""
    return resources.files("cerebellar_norse").joinpath("default.toml").read_text(encoding="utf-8")


def parse_toml(text: str, source: str) -> dict[str, Any]:
    """Parse TOML text; a syntax error becomes a ConfigError naming the line."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([ConfigProblem("", f"TOML syntax error: {exc}", "fix the syntax at that line")], source) from None
    except RecursionError:
        raise ConfigError([ConfigProblem("", "TOML arrays or inline tables are nested too deeply",
                                         "remove the nesting: no configuration key takes nested arrays")], source) from None


def read_toml_file(path: Path) -> dict[str, Any]:
    """Read and parse a TOML file; unreadable files are ConfigErrors."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError([ConfigProblem("", f"config file {path} does not exist", "pass an existing file to --config")], str(path)) from None
    except OSError as exc:
        why = f"{exc.strerror} (errno {exc.errno} {errno.errorcode.get(exc.errno, '?')})" if exc.errno else str(exc)
        raise ConfigError([ConfigProblem("", f"cannot read config file {path}: {why}", "check the path and its permissions "
                                         "(the service's user must be able to read it)")], str(path)) from None
    wide = wide_encoding(data)
    if wide is not None:
        wide = wide.upper()
        raise ConfigError([ConfigProblem("", f"config file {path} is {wide} text (it starts with a {wide} byte-order "
                                             "mark), not UTF-8", "save the file as UTF-8")], str(path))
    try:
        # a UTF-8 byte-order mark (Windows editors write one) is no part of the TOML: ignored, as in tick files
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise ConfigError([ConfigProblem("", f"config file {path} is not UTF-8 text: {_undecodable_place(exc)}",
                                         "save the file as UTF-8")], str(path)) from None
    return parse_toml(text, str(path))


def _undecodable_place(exc: UnicodeDecodeError) -> str:
    """Where a UTF-8 decoding failed: the first bad byte, its line (1-based) and its byte offset (0-based)."""
    data = bytes(exc.object)
    line = data.count(b"\n", 0, exc.start) + 1
    return f"byte 0x{data[exc.start]:02x} at line {line} (byte offset {exc.start})"


def _parse_env_value(raw: str) -> Any:
    """An env value is read as a TOML value when it is one (8080, true, 1.5, "x"), else as a string."""
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):
        return raw


def env_overrides(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """Collect ``CEREBELLAR_NORSE_<SECTION>__<KEY>`` variables as a nested dict.

    Returns the nested overrides and a map dotted-key -> variable name (for messages).
    Variables without ``__`` (e.g. ``CEREBELLAR_NORSE_LOG``) are not config keys.
    """
    tree: dict[str, Any] = {}
    names: dict[str, str] = {}
    for name, raw in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        parts = [p.lower() for p in name[len(ENV_PREFIX):].split("__")]
        if any(not p for p in parts):
            continue
        node = tree
        for p in parts[:-1]:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                break
            node = nxt
        else:
            node[parts[-1]] = _parse_env_value(raw)
            names[".".join(parts)] = name
    return tree, names


# Variables of the prefix that are no configuration key and that the package reads: the log level (observability.
# logging) and the base of the compiled kernels' cache (cerebellar_norse/__init__.py).
OTHER_ENV_NAMES = frozenset({"CEREBELLAR_NORSE_LOG", "CEREBELLAR_NORSE_NUMBA_CACHE_BASE"})


def unread_env_names(environ: Mapping[str, str]) -> list[str]:
    """``CEREBELLAR_NORSE_`` variables the service does not read: no ``__`` (so no configuration key), and none of
    :data:`OTHER_ENV_NAMES` (``CEREBELLAR_NORSE_LGO``, ``CEREBELLAR_NORSE_LOG_LEVEL``): a misspelt name."""
    return sorted(name for name in environ
                  if name.startswith(ENV_PREFIX) and "__" not in name and name not in OTHER_ENV_NAMES)


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def _sectionless_problems(data: Mapping[str, Any]) -> list[ConfigProblem]:
    """Top-level keys must be tables (sections); a stray key gets a clear message."""
    out = []
    for k, v in data.items():
        if k in Config.model_fields and not isinstance(v, Mapping):
            out.append(ConfigProblem(k, f"must be a table [{k}], got {type(v).__name__}", f"write it as a [{k}] section"))
    return out


# Values of an environment variable read as a switch (the file takes only true and false).
_SWITCH_WORDS = {"1": True, "yes": True, "on": True, "true": True, "0": False, "no": False, "off": False, "false": False}

# Errors of a text-typed key (str, SecretStr, Path) given a number or a bool.
_TEXT_ERROR_TYPES = frozenset({"string_type", "path_type"})


def _set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    *parents, last = key.split(".")
    for p in parents:
        tree = tree[p]
    tree[last] = value


def _malformed_env_problems(environ: Mapping[str, str]) -> list[ConfigProblem]:
    """Variables of the override scheme with an empty part (``…__PORT__``, ``…___PORT``), or with one underscore
    after a section's name (``…_SERVER_PORT``): errors, never ignored."""
    out = []
    sections = {name.upper() for name in Config.model_fields}
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX):
            continue
        rest = name[len(ENV_PREFIX):]
        if "__" in rest:
            parts = rest.split("__")
            if any(not p for p in parts):
                key = ".".join(p.lower() for p in parts if p) or name
                out.append(ConfigProblem(key, f"environment variable {name} has an empty part (a '__' at its start or end, "
                                              "or doubled)", "name it CEREBELLAR_NORSE_<SECTION>__<KEY>, e.g. "
                                                             "CEREBELLAR_NORSE_SERVER__PORT"))
            continue
        section, _, key = rest.partition("_")
        if section in sections and key:
            out.append(ConfigProblem(f"{section.lower()}.{key.lower()}", f"environment variable {name} is not an "
                                     "override: the section and the key are separated by two underscores",
                                     f"name it {ENV_PREFIX}{section}__{key}"))
    return out


def build_config(data: Mapping[str, Any], source: str = "", environ: Mapping[str, str] | None = None) -> Config:
    """Validate raw TOML data (plus env overrides) into a Config, or raise ConfigError."""
    env = os.environ if environ is None else environ
    env_tree, env_names = env_overrides(env)
    problems = _malformed_env_problems(env) + _sectionless_problems(_deep_merge(dict(data), env_tree))
    if problems:
        raise ConfigError(problems, source)
    verbatim: set[str] = set()
    while True:
        try:
            return Config.model_validate(_deep_merge(dict(data), env_tree))
        except ValidationError as exc:
            # A variable read as a TOML number or bool where the key wants text (a numeric
            # api_token, host "0") is meant verbatim: validate its raw string instead.
            retry = {
                key for key in (".".join(str(p) for p in e["loc"]) for e in exc.errors() if e["type"] in _TEXT_ERROR_TYPES)
                if key in env_names and key not in verbatim
            }
            # A switch set by a variable in the words shells and unit files use (1, yes, on, ...) is meant as one.
            switches = {
                key for key in (".".join(str(p) for p in e["loc"]) for e in exc.errors() if e["type"] == "bool_type")
                if key in env_names and key not in verbatim and env[env_names[key]].strip().lower() in _SWITCH_WORDS
            }
            if retry or switches:
                for key in retry:
                    _set_dotted(env_tree, key, env[env_names[key]])
                for key in switches:
                    _set_dotted(env_tree, key, _SWITCH_WORDS[env[env_names[key]].strip().lower()])
                verbatim |= retry | switches
                continue
            problems = [_with_env_source(p, env_names) for p in _pydantic_problems(exc)]
            raise ConfigError(problems, source) from None


def _with_env_source(problem: ConfigProblem, env_names: Mapping[str, str]) -> ConfigProblem:
    """Name the environment variable(s) a problem comes from (a key or a whole unknown section)."""
    names = [var for key, var in env_names.items() if key == problem.key or key.startswith(problem.key + ".")]
    if not problem.key or not names:
        return problem
    plural = "s" if len(names) > 1 else ""
    return replace(problem, message=f"{problem.message} [from environment variable{plural} {', '.join(names)}]")


def load_config(path: str | Path | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Load a configuration: the built-in default when ``path`` is None.

    Raises:
        ConfigError: syntax, schema or unknown-key problems (every problem listed).
    """
    if path is None:
        return build_config(parse_toml(default_toml_text(), "<built-in default>"), "<built-in default>", environ)
    p = Path(path)
    return build_config(read_toml_file(p), str(p), environ)


def load_checked_config(path: str | Path | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """Load a configuration and run the consistency checks; raise ConfigError on any problem."""
    return checked_config(load_config(path, environ), str(path) if path else "<built-in default>")


def build_checked_config(data: Mapping[str, Any], source: str, environ: Mapping[str, str] | None = None) -> Config:
    """:func:`build_config` of TOML already read (``data``, from ``source``), then the consistency checks: for a
    caller that uses the same reading of the file again (a reload), which a second read could find changed."""
    return checked_config(build_config(data, source, environ), source)


def checked_config(cfg: Config, source: str) -> Config:
    """``cfg`` when it passes the consistency checks; else ConfigError listing every problem (from ``source``)."""
    problems = consistency_problems(cfg)
    if problems:
        raise ConfigError(problems, source)
    return cfg


def listen_address(host: str) -> str:
    """``server.host`` as a socket takes it: an IPv6 address without the brackets of a URL (``[::1]`` is ``::1``)."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def with_server(cfg: Config, updates: Mapping[str, Any]) -> Config:
    """``cfg`` with the ``[server]`` keys of ``updates`` replaced (values already checked: ``--host``/``--port``, a
    reloaded token), everything else shared."""
    if not updates:
        return cfg
    return cfg.model_copy(update={"server": cfg.server.model_copy(update=dict(updates))})


def with_data_timezone(cfg: Config, zone: str | None) -> Config:
    """``cfg`` with ``training.data_timezone`` replaced by ``zone`` (already checked: ``--timezone``); ``cfg`` itself
    when ``zone`` is None."""
    if zone is None:
        return cfg
    return cfg.model_copy(update={"training": cfg.training.model_copy(update={"data_timezone": zone.strip()})})


def with_date_order(cfg: Config, order: str | None) -> Config:
    """``cfg`` with ``training.date_order`` replaced by ``order`` (``--date-order``); ``cfg`` itself when None."""
    if order is None:
        return cfg
    return cfg.model_copy(update={"training": cfg.training.model_copy(update={"date_order": order})})


def without_split_adjust(cfg: Config) -> Config:
    """``cfg`` with ``training.adjust_splits`` off (``--no-split-adjust``)."""
    return cfg.model_copy(update={"training": cfg.training.model_copy(update={"adjust_splits": False})})


def config_json_schema() -> dict[str, Any]:
    """JSON Schema of the configuration file.

    The four LIF populations share one model whose own defaults are generic; each
    population's defaults (``LIF_DEFAULTS``) are filled in by the ``[neural]`` section,
    so each gets a definition of its own carrying the defaults a config really gets.
    """
    schema = Config.model_json_schema()
    schema["title"] = "cerebellar-norse configuration"
    defs = schema.get("$defs", {})
    lif, neural = defs.get("LIFConfig"), defs.get("NeuralConfig")
    if lif is not None and neural is not None:
        for name, (tau_syn, tau_mem) in LIF_DEFAULTS.items():
            title = f"{name.capitalize()}LIFConfig"
            sub = copy.deepcopy(lif)
            sub["title"] = title
            sub["properties"]["tau_syn_ms"]["default"] = tau_syn
            sub["properties"]["tau_mem_ms"]["default"] = tau_mem
            defs[title] = sub
            neural["properties"][name] = {"$ref": f"#/$defs/{title}"}
        del defs["LIFConfig"]
    return schema


def config_to_toml_dict(cfg: Config) -> dict[str, Any]:
    """A plain dict of the config suitable for TOML/JSON (secrets masked)."""
    return cfg.model_dump(mode="json")


def is_finite_number(x: Any) -> bool:
    """True for int/float values that are finite (bools excluded)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
