"""The ``cerebellar-norse`` command.

Exit codes: 0 ok, 1 check failed, 2 usage error. Errors go to stderr, one line each;
user errors never print a traceback.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import re
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from .argtypes import int_in, non_negative, time_arg, zone_arg, zoned_time_problem
from .errors import (
    CerebellarNorseError,
    CheckpointError,
    ConfigError,
    ConfigProblem,
    InputError,
    StorageError,
    host_shortage_reason,
)
from .scaleout.cli import add_parsers as add_scaleout_parsers
from .scaleout.cli import commands as scaleout_commands
from .scaleout.cli import misused_flag as scaleout_misused_flag

if TYPE_CHECKING:
    from .config import Config

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a command whose reader went away
MAX_COST_BP = 10_000.0  # a round-trip cost of 100%: anything larger is a typo, and 1e308 would overflow the P&L
# Upper bounds of the size options: each run holds its ticks in memory (make-data about 0.2 KB per tick while
# writing; crossval and bench also step the slow reference network on them).
MAX_DATA_TICKS, MAX_DATA_MARKETS = 10_000_000, 100_000
MAX_CROSSVAL_TICKS, MAX_CROSSVAL_MARKETS = 1_000_000, 10_000
MAX_BENCH_TICKS, MAX_BENCH_REFERENCE_TICKS = 1_000_000, 100_000
MAX_BOOTSTRAP = 100_000
PLOT_TICKS = 2000  # ticks a market's raster keeps (observability.pictures.RING_TICKS, not imported: matplotlib)
# What --host/--port mean something to: the address the service listens on (serving, and the checks of it), or
# the running service that the debugging commands call when no --url is given.
ADDRESS_ACTIONS = ("serving", "--validate-only", "--validate-config", "state dump", "trace", "plot-market", "debug-bundle")


class _Parser(argparse.ArgumentParser):
    """argparse that exits 2 with a one-line message (no usage dump on stdout)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # as from Python 3.13: an argument of '-' and a digit is a value (--timezone -05:00), never an option
        self._negative_number_matcher = re.compile(r"-\.?\d")

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The full command-line interface (flags of DESIGN §4 plus subcommands)."""
    p = _Parser(prog="cerebellar-norse", description="Low-latency cerebellar spiking network service.")
    p.add_argument("--config", metavar="PATH", help="TOML configuration (default: built-in default)")
    p.add_argument("--host", help="listen address (overrides server.host): for serving, --validate-only, --validate-config, "
                                  "and the service that state dump, trace, plot-market and debug-bundle call")
    p.add_argument("--port", type=int, help="listen port (overrides server.port); used where --host is")
    actions = p.add_mutually_exclusive_group()
    actions.add_argument("--validate-only", action="store_true", help="check TOML syntax and schema, no host checks")
    actions.add_argument("--validate-config", action="store_true", help="check schema, consistency and this host (device, memory)")
    actions.add_argument("--dump-schema", action="store_true", help="print the JSON Schema of the configuration")
    actions.add_argument("--dump-weights", action="store_true", help="print per-layer weight statistics of the loaded model")
    actions.add_argument("--verify-data", metavar="DIR", help="verify SHA-256 manifests of models, market state, journal and recordings under DIR")
    actions.add_argument("--validate-model", metavar="DIR", help="verify a model directory (or a directory of models)")
    p.add_argument("--format", choices=["text", "json", "npz"], default=None,
                   help="output format of --dump-weights (default text)")
    p.add_argument("--output", metavar="PATH", help="file --dump-weights writes (any --format; default stdout)")

    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    cv = sub.add_parser("crossval", help="compare the fused kernel with the Norse reference")
    cv.add_argument("--ticks", type=int_in(1, MAX_CROSSVAL_TICKS), default=1000,
                    help=f"ticks per run, 1 to {MAX_CROSSVAL_TICKS} (default 1000)")
    cv.add_argument("--markets", type=int_in(1, MAX_CROSSVAL_MARKETS), default=4,
                    help=f"interleaved markets, 1 to {MAX_CROSSVAL_MARKETS} (default 4)")
    cv.add_argument("--precision", choices=["float32", "float64", "both"], default="both", help="precision(s) to compare (default both)")
    cv.add_argument("--seed", type=int, default=7, help="seed of the generated tick stream")
    cv.add_argument("--json", action="store_true", help="print one JSON object")

    tr = sub.add_parser("train", help="train on CSV files offline and store the model")
    tr.add_argument("files", nargs="+", help="CSV files (paths, or names relative to paths.data_dir)")
    tr.add_argument("--epochs", type=int, help="epochs (default training.epochs)")
    tr.add_argument("--activate", action="store_true", help="make the new model the active one")
    tr.add_argument("--from-scratch", action="store_true", help="start from the config's seed instead of the active model")
    _add_timezone(tr)
    _add_date_order(tr)
    _add_split_adjust(tr)
    tr.add_argument("--json", action="store_true", help="print one JSON object")

    ev = sub.add_parser("evaluate", help="score a model on CSV ticks in time order against baselines")
    ev.add_argument("files", nargs="+", help="CSV files (paths, or names relative to paths.data_dir)")
    ev.add_argument("--model", metavar="VERSION", help="stored model version (default: the active model)")
    ev.add_argument("--report", metavar="HTML", help="also write a self-contained HTML report with plots")
    ev.add_argument("--since", metavar="TIME", type=time_arg,
                    help="score only ticks at or after TIME (ms or ISO 8601, or YYYYMMDD in files of such dates, or 3/8/2011 in the "
                         "order of the files' dates; one "
                         "without an offset in the files' zone, "
                         "the first of an hour it repeats, refused in an hour it skips); earlier ones warm the network up")
    ev.add_argument("--cost-bp", type=float, default=0.0, help="round-trip cost in basis points for the P&L, charged on turnover: half of it per unit of position bought or sold, 0 to 10000 (default 0)")
    ev.add_argument("--mid-prices", action="store_true",
                    help="the files' prices are mids (of bid and ask) or index levels, with no spread to bounce "
                         "across: read no bid-ask bounce from them (--cost-bp must still charge the spread a trade "
                         "crosses)")
    ev.add_argument("--bootstrap", type=int_in(0, MAX_BOOTSTRAP), default=1000,
                    help=f"0 for no 95%% intervals; otherwise 1 to {MAX_BOOTSTRAP} (default 1000): the intervals, whose "
                         "moving-block bootstrap variance is computed exactly, are the same for any number")
    _add_timezone(ev, " and of a --since TIME without one")
    _add_date_order(ev)
    _add_split_adjust(ev)
    ev.set_defaults(after_parse=_times_in_zone(ev, "--since"))
    ev.add_argument("--json", action="store_true", help="print one JSON object")

    ix = sub.add_parser("inspect-data", help="how tick CSV files are read: columns, formats, bad and skipped rows, markets")
    ix.add_argument("files", nargs="+", help="CSV files (paths, or names relative to paths.data_dir)")
    _add_timezone(ix)
    _add_date_order(ix)
    _add_split_adjust(ix)
    ix.add_argument("--json", action="store_true", help="print one JSON object")

    md = sub.add_parser("make-data", help="write synthetic ticks with a learnable structure as CSV")
    md.add_argument("--output", dest="data_output", required=True, help="CSV file to write")
    md.add_argument("--ticks", type=int_in(1, MAX_DATA_TICKS), default=100_000, help=f"ticks, 1 to {MAX_DATA_TICKS} (default 100000)")
    md.add_argument("--markets", type=int_in(1, MAX_DATA_MARKETS), default=4, help=f"markets, 1 to {MAX_DATA_MARKETS} (default 4)")
    md.add_argument("--seed", type=int, default=0, help="seed (default 0)")

    rp = sub.add_parser("replay", help="run recorded ticks through their recorded model (or CSV ticks through the served one)")
    rp.add_argument("file", help="a recording (<state_dir>/recordings/ticks-<date>-<n>.csv: checked, replayed in the "
                                 "order applied; malformed: exit 1 naming file:line) or a tick CSV (time order)")
    rp.add_argument("--market", metavar="M", help="replay only this market's ticks")
    rp.add_argument("--detect-divergence", action="store_true",
                    help="compare each result with the probabilities recorded for it; exit 1 when a market diverges")
    rp.add_argument("--tolerance", type=non_negative, default=None, metavar="T",
                    help="with --detect-divergence: largest |difference| of a probability that is not a divergence (default 1e-9)")
    _add_timezone(rp, " (a tick CSV; a recording's times are ms)")
    _add_date_order(rp)
    rp.add_argument("--json", action="store_true", help="print one JSON result per line (with --detect-divergence: one JSON report)")

    db = sub.add_parser("debug-bundle", help="write a .tar.gz with config, versions, models and service state for support")
    db.add_argument("--output", dest="bundle_output", metavar="PATH", help="archive to write (default: <state_dir>/debug-bundle-<time>.tar.gz)")
    db.add_argument("--url", default=None, help="running service to snapshot (default: http://<server.host>:<server.port>, a wildcard host as loopback; 'none' to skip)")

    st = sub.add_parser("state", help="one market's state from the running service (dump), or compare two dumps (diff)")
    st_sub = st.add_subparsers(dest="state_command", metavar="{dump,diff}", parser_class=_Parser, required=True)
    sd = st_sub.add_parser("dump", help="print one market's state (GET /debug/markets/{id}/state) as JSON")
    sd.add_argument("--market", required=True, metavar="M", help="the market id")
    sd.add_argument("--url", default=None, help="running service (default: http://<server.host>:<server.port>)")
    sd.add_argument("--token", default=None, metavar="T", help="bearer token (default: server.api_token of the config)")
    sf = st_sub.add_parser("diff", help="compare two state dumps field by field; exit 1 when they differ")
    sf.add_argument("a", metavar="A.json", help="first dump")
    sf.add_argument("b", metavar="B.json", help="second dump")
    sf.add_argument("--tolerance", type=non_negative, default=0.0, metavar="T",
                    help="largest |difference| of two numbers that is not a difference (default 0: exact)")

    tc = sub.add_parser("trace", help="one request's timeline from the running service (GET /debug/requests/{id}) as text")
    tc.add_argument("request_id", nargs="?", metavar="REQUEST_ID", help="the request's X-Request-ID (in its answer and logs)")
    tc.add_argument("--slow", type=int, default=None, metavar="N", help="instead: the N slowest recent requests")
    tc.add_argument("--url", default=None, help="running service (default: http://<server.host>:<server.port>)")
    tc.add_argument("--token", default=None, metavar="T", help="bearer token (default: server.api_token of the config)")
    tc.add_argument("--json", action="store_true", help="print the timeline JSON instead of the drawing")

    aw = sub.add_parser("analyze-weights", help="per-layer weight histograms, saturation, dead units and drift between models")
    aw.add_argument("source", nargs="?", metavar="INPUT", help="a model directory, a weights .npz, or - for the output of "
                                                            "--dump-weights on stdin (default: the served model)")
    aw.add_argument("--model", metavar="VERSION", help="stored model version to analyse (default: the served model)")
    aw.add_argument("--compare", metavar="VERSION", help="stored model version (or model directory, .npz) to measure drift against")
    aw.add_argument("--output", dest="analyze_output", metavar="PNG", help="also write the histograms as a PNG")
    aw.add_argument("--threshold", type=non_negative, default=None, metavar="T", help="also report the fraction of weights with |w| > T")
    aw.add_argument("--json", action="store_true", help="print one JSON object")

    pm = sub.add_parser("plot-market", help="write one market's spike raster and membrane traces (GET /debug/markets/{id}/raster.png)")
    pm.add_argument("--market", required=True, metavar="M", help="the market id")
    pm.add_argument("--output", dest="plot_output", required=True, metavar="PNG", help="PNG file to write")
    pm.add_argument("--ticks", type=int_in(1, PLOT_TICKS), default=200, metavar="N",
                    help=f"most recent ticks shown, 1 to {PLOT_TICKS} (default 200)")
    pm.add_argument("--url", default=None, help="running service (default: http://<server.host>:<server.port>)")
    pm.add_argument("--token", default=None, metavar="T", help="bearer token (default: server.api_token of the config)")

    add_scaleout_parsers(sub)

    bn = sub.add_parser("bench", help="latency of the fused kernel vs the Norse reference")
    bn.add_argument("--ticks", type=int_in(10, MAX_BENCH_TICKS), default=2000,
                    help=f"timed ticks per measurement, 10 to {MAX_BENCH_TICKS} (default 2000)")
    bn.add_argument("--reference-ticks", type=int_in(10, MAX_BENCH_REFERENCE_TICKS), default=200,
                    help=f"timed ticks of the reference, 10 to {MAX_BENCH_REFERENCE_TICKS} (default 200)")
    bn.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def _add_timezone(parser: argparse.ArgumentParser, more: str = "") -> None:
    """The ``--timezone`` option of a command that reads tick files."""
    parser.add_argument("--timezone", metavar="ZONE", type=zone_arg,
                        help="zone of the files' times written without an offset or zone" + more + ": UTC, an IANA name"
                             " (America/New_York) or a fixed offset (-05:00, UTC+02:00); overrides"
                             " training.data_timezone (default UTC)")


DATE_ORDERS = {"day-first": "day_first", "month-first": "month_first"}  # --date-order's values -> training.date_order


def _add_date_order(parser: argparse.ArgumentParser) -> None:
    """The ``--date-order`` option of a command that reads tick files."""
    parser.add_argument("--date-order", choices=sorted(DATE_ORDERS),
                        help="read every date written with slashes or dots (02/03/2010) day first or month first;"
                             " overrides training.date_order (default: read from each date column, a column that"
                             " cannot tell is refused)")


def _add_split_adjust(parser: argparse.ArgumentParser) -> None:
    """The ``--no-split-adjust`` option of a command that reads tick files for training or scoring."""
    parser.add_argument("--no-split-adjust", action="store_true",
                        help="read every price as written: no one-day move that matches a stock split ratio is taken"
                             " for a split (overrides training.adjust_splits = true, the default)")


def _times_in_zone(parser: argparse.ArgumentParser, *flags: str) -> Callable[[argparse.Namespace], None]:
    """A check run once the command line is parsed: each time option of ``flags`` given without an offset must be a
    time in the zone of ``--timezone`` (a usage error of ``parser``, exit 2, otherwise). Their types check the time
    alone, in UTC: a type does not see ``--timezone``, which may come after it."""

    def check(args: argparse.Namespace) -> None:
        if args.timezone is None:  # the config's training.data_timezone is checked when the command reads it
            return
        for flag in flags:
            text = getattr(args, flag.removeprefix("--").replace("-", "_"))
            problem = None if text is None else zoned_time_problem(text, args.timezone)
            if problem is not None:
                parser.error(f"argument {flag}: {problem}")

    return check


def _err(msg: str) -> None:
    """One error line on stderr; under systemd (stderr is journald's stream) prefixed with ``<3>``, which journald takes
    as the line's priority (err) and strips, so that ``journalctl -u cerebellar-norse -p err`` shows why a start
    failed, as it shows the service's ERROR log lines."""
    from .observability.logging import SYSLOG_PRIORITY, is_journal_stream

    prefix = f"<{SYSLOG_PRIORITY['ERROR']}>" if is_journal_stream(sys.stderr) else ""
    print(f"{prefix}cerebellar-norse: {msg}", file=sys.stderr)


def _print_problems(problems: Sequence[ConfigProblem], source: str) -> None:
    for prob in problems:
        _err(f"{source}: {prob}" if source else str(prob))


def _cmd_validate(args: argparse.Namespace, host_checks: bool) -> int:
    from . import config as cfgmod

    source = args.config or "<built-in default>"
    try:
        # --host/--port are what the service would listen on: check them like the file's keys.
        cfg = cfgmod.with_server(cfgmod.load_config(args.config), _server_overrides(args))
    except ConfigError as exc:
        _print_problems(exc.problems, source)
        later = ("the checks of values against each other and the host run once these are fixed" if host_checks
                 else "--validate-config also checks values against each other and this host")
        _err(f"{source}: {len(exc.problems)} problem(s) found ({later})")
        return EXIT_FAILED
    if not host_checks:
        print(f"{source}: schema OK")
        return EXIT_OK
    from .api.exposure import exposure_problems
    from .hostcheck import gather_host_facts, host_problems, resolve_device, with_state_dir

    host = with_state_dir(gather_host_facts(), cfg.paths.state_dir)
    problems = cfgmod.consistency_problems(cfg) + exposure_problems(cfg) + host_problems(cfg, host)
    if problems:
        _print_problems(problems, source)
        _err(f"{source}: {len(problems)} problem(s) found")
        return EXIT_FAILED
    est = cfgmod.estimate_memory(cfg)
    print(f"{source}: valid (device {cfg.performance.device}, memory estimate {cfgmod.fmt_bytes(est.total)} of limit {cfgmod.fmt_bytes(int(cfg.performance.memory_limit))})")
    if resolve_device(cfg, host) == "cuda":
        from .cuda.plan import plan_for_config

        print(f"{source}: cuda plan: {plan_for_config(cfg).summary()}")
    return EXIT_OK


def _cmd_dump_schema(args: argparse.Namespace) -> int:
    from .config import config_json_schema

    print(json.dumps(config_json_schema(), indent=2))
    return EXIT_OK


def _server_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """``server`` keys given on the command line (``--host``, ``--port``): they win over the file, also on reload."""
    updates: dict[str, Any] = {}
    if args.host is not None:
        if not args.host.strip() or any(not c.isprintable() for c in args.host):
            raise ConfigError([ConfigProblem("server.host", f"--host {args.host!r} is not a listen address",
                                             "pass an address such as 127.0.0.1")])
        updates["host"] = args.host
    if args.port is not None:
        if not 1 <= args.port <= 65535:
            raise ConfigError([ConfigProblem("server.port", f"--port {args.port} is outside 1..65535", "pass a port in 1..65535")])
        updates["port"] = args.port
    return updates


def _load(args: argparse.Namespace) -> Config:
    from .config import load_checked_config, with_server

    return with_server(load_checked_config(args.config), _server_overrides(args))


def _load_for_data(args: argparse.Namespace) -> Config:
    """:func:`_load` for a command that reads tick files: ``--timezone`` overrides ``training.data_timezone``,
    ``--date-order`` ``training.date_order``, ``--no-split-adjust`` ``training.adjust_splits``."""
    from .config import with_data_timezone, with_date_order, without_split_adjust

    cfg = with_date_order(with_data_timezone(_load(args), args.timezone), DATE_ORDERS.get(args.date_order))
    return without_split_adjust(cfg) if getattr(args, "no_split_adjust", False) else cfg


def _cmd_serve(args: argparse.Namespace) -> int:
    from .config import build_checked_config, load_checked_config, read_toml_file, with_server

    # the file is read once: the service also remembers from this reading the values of the keys that environment
    # variables override (a second reading could find the file saved again meanwhile)
    data = read_toml_file(Path(args.config)) if args.config else None
    base = build_checked_config(data, args.config) if data is not None else load_checked_config(None)
    cfg = with_server(base, _server_overrides(args))
    from .api.server import serve

    return serve(cfg, args.config, _server_overrides(args), config_data=data)


def _cmd_crossval(args: argparse.Namespace) -> int:
    from .neurons.crossval import run_crossval_command

    if args.seed < 0:
        _err(f"--seed must be at least 0 (got {args.seed})")
        return EXIT_USAGE
    return run_crossval_command(_load(args), args.ticks, args.markets, args.precision, args.seed, args.json)


def _cmd_bench(args: argparse.Namespace) -> int:
    from .neurons.bench import run_bench_command

    return run_bench_command(_load(args), args.ticks, args.reference_ticks, args.json)


def _cmd_train(args: argparse.Namespace) -> int:
    from .training.commands import cmd_train

    if args.epochs is not None and args.epochs < 1:
        _err("--epochs must be at least 1")
        return EXIT_USAGE
    return cmd_train(_load_for_data(args), args.files, args.epochs, args.activate, args.json, args.from_scratch)


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from .training.commands import cmd_evaluate

    if not 0 <= args.cost_bp <= MAX_COST_BP:  # NaN fails too
        _err(f"--cost-bp must be a number from 0 to {MAX_COST_BP:g} (100% per round trip; got {args.cost_bp})")
        return EXIT_USAGE
    cost_bp = args.cost_bp + 0.0  # -0 is 0 (not "cost -0.00 bp")
    return cmd_evaluate(_load_for_data(args), args.files, args.model, args.report, cost_bp, args.bootstrap, args.json, args.since,
                        mid_prices=args.mid_prices)


def _cmd_inspect_data(args: argparse.Namespace) -> int:
    from .training.commands import cmd_inspect_data

    return cmd_inspect_data(_load_for_data(args), args.files, args.json)


def _cmd_make_data(args: argparse.Namespace) -> int:
    from .training.commands import cmd_make_data

    if args.seed < 0:
        _err(f"--seed must be at least 0 (got {args.seed})")
        return EXIT_USAGE
    return cmd_make_data(Path(args.data_output), args.ticks, args.markets, args.seed)


def _cmd_dump_weights(args: argparse.Namespace) -> int:
    from .training.commands import cmd_dump_weights

    return cmd_dump_weights(_load(args), args.format or "text", args.output)


def _cmd_verify_data(args: argparse.Namespace) -> int:
    from .training.commands import cmd_verify_data

    return cmd_verify_data(args.verify_data)


def _cmd_validate_model(args: argparse.Namespace) -> int:
    from .training.commands import cmd_validate_model

    return cmd_validate_model(args.validate_model)


def _cmd_replay(args: argparse.Namespace) -> int:
    from .training.commands import cmd_replay

    return cmd_replay(_load_for_data(args), Path(args.file), args.json, args.market, args.detect_divergence, args.tolerance)


def _cmd_debug_bundle(args: argparse.Namespace) -> int:
    from .observability.bundle import cmd_debug_bundle
    from .observability.debugtools import service_url

    cfg = _load(args)
    url = args.url if args.url is not None else service_url(cfg)  # (an IPv6 host in brackets, a wildcard as loopback)
    return cmd_debug_bundle(cfg, Path(args.bundle_output) if args.bundle_output else None, None if url == "none" else url)


def _cmd_state(args: argparse.Namespace) -> int:
    from .observability.debugtools import cmd_state_diff, cmd_state_dump

    if args.state_command == "diff":
        return cmd_state_diff(args.a, args.b, args.tolerance)
    return cmd_state_dump(_load(args), args.market, args.url, args.token)


def _cmd_trace(args: argparse.Namespace) -> int:
    from .observability.debugtools import cmd_trace

    if (args.request_id is None) == (args.slow is None):
        print("cerebellar-norse: trace: give a REQUEST_ID or --slow N (not both)", file=sys.stderr)
        return 2
    if args.slow is not None and not 1 <= args.slow <= 1024:
        print("cerebellar-norse: trace: --slow must be between 1 and 1024", file=sys.stderr)
        return 2
    return cmd_trace(_load(args), args.request_id, args.url, args.token, args.slow, args.json)


def _cmd_analyze_weights(args: argparse.Namespace) -> int:
    from .observability.pictures import cmd_analyze_weights

    return cmd_analyze_weights(_load(args), args.source, args.model, args.compare, args.analyze_output, args.json, args.threshold)


def _cmd_plot_market(args: argparse.Namespace) -> int:
    from .observability.pictures import cmd_plot_market

    return cmd_plot_market(_load(args), args.market, args.url, args.token, args.plot_output, args.ticks)


def _dispatch(args: argparse.Namespace) -> Callable[[argparse.Namespace], int]:
    if args.validate_only:
        return lambda a: _cmd_validate(a, host_checks=False)
    if args.validate_config:
        return lambda a: _cmd_validate(a, host_checks=True)
    if args.dump_schema:
        return _cmd_dump_schema
    if args.dump_weights:
        return _cmd_dump_weights
    if args.verify_data is not None:  # an empty DIR is refused in main(), never taken for "no action flag" (serve)
        return _cmd_verify_data
    if args.validate_model is not None:
        return _cmd_validate_model
    commands: dict[str, Callable[[argparse.Namespace], int]] = {
        "crossval": _cmd_crossval, "bench": _cmd_bench, "train": _cmd_train, "evaluate": _cmd_evaluate, "make-data": _cmd_make_data,
        "inspect-data": _cmd_inspect_data,
        "replay": _cmd_replay, "debug-bundle": _cmd_debug_bundle, "state": _cmd_state, "trace": _cmd_trace,
        "analyze-weights": _cmd_analyze_weights, "plot-market": _cmd_plot_market, **scaleout_commands(_load)}
    if args.command in commands:
        return commands[args.command]
    return _cmd_serve


def _action(args: argparse.Namespace) -> str:
    """What a command line does, as its user wrote it: an action flag, a command (``state dump``), or serving."""
    for flag in ("validate_only", "validate_config", "dump_schema", "dump_weights", "verify_data", "validate_model"):
        if getattr(args, flag) not in (None, False):
            return "--" + flag.replace("_", "-")
    if args.command == "state":
        return f"state {args.state_command}"
    return str(args.command or "serving")


def _misused_flag(args: argparse.Namespace) -> str | None:
    """Why a flag given means nothing to the command line's action (a usage error, rather than ignoring it)."""
    action = _action(args)
    for flag, value in (("--format", args.format), ("--output", args.output)):
        if value is not None and action != "--dump-weights":
            return f"{flag} needs --dump-weights (it is an option of the weights dump, not of {action})"
    for flag, value in (("--host", args.host), ("--port", args.port)):
        if value is not None and action not in ADDRESS_ACTIONS:
            return f"{flag} means nothing to {action} (it is for {', '.join(ADDRESS_ACTIONS)})"
    if action == "replay" and args.tolerance is not None and not args.detect_divergence:
        return "--tolerance needs --detect-divergence"
    return scaleout_misused_flag(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    misused = _misused_flag(args)
    if misused is not None:
        parser.error(misused)
    after_parse = getattr(args, "after_parse", None)  # a command's checks of options against each other
    if after_parse is not None:
        after_parse(args)
    for flag, value in (("--verify-data", args.verify_data), ("--validate-model", args.validate_model)):
        if value is not None and not value.strip():
            _err(f"{flag}: empty directory name (fix: pass the directory to check, e.g. /var/lib/cerebellar-norse/)")
            return EXIT_USAGE
    if args.config is not None and not Path(args.config).exists():
        _err(f"{args.config}: config file does not exist (fix: pass an existing file to --config)")
        return EXIT_FAILED if (args.validate_only or args.validate_config) else EXIT_USAGE
    try:
        return _dispatch(args)(args)
    except ConfigError as exc:
        _print_problems(exc.problems, exc.source or (args.config or ""))
        return EXIT_FAILED
    except CheckpointError as exc:
        _err(str(exc))
        return EXIT_FAILED
    except InputError as exc:
        _err(str(exc))
        return EXIT_FAILED
    except CerebellarNorseError as exc:
        _err(str(exc))
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (`… | head`): stop quietly, as other command-line tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so that the exit's flush cannot fail again
        return EXIT_BROKEN_PIPE
    except (OSError, MemoryError, RuntimeError) as exc:  # an output file that cannot be written (a full disk), no memory
        short = host_shortage_reason(exc)
        if short is not None:  # no descriptor, memory or process for this command: the host's, not a file's fault
            where = f"{exc.filename}: " if isinstance(exc, OSError) and exc.filename else ""
            _err(f"the host is short of file descriptors, memory or processes: {where}{short}: raise the limit "
                 "(LimitNOFILE=, MemoryMax=, TasksMax=; ulimit -n/-v/-u) or free them, and start again")
        elif not isinstance(exc, OSError):
            raise
        elif exc.filename or StorageError.is_write_failure(exc):
            _err(str(StorageError.from_os_error("cannot write", exc.filename or "output", exc)))
        else:  # no file and no full disk: a socket (a timeout), not a write
            _err(f"{type(exc).__name__}: {exc.strerror or exc}")
        return EXIT_FAILED


def run(argv: Sequence[str] | None = None) -> NoReturn:
    """Console-script entry: :func:`main` (of ``argv``), then exit with its code without the interpreter's module teardown.

    Tearing down torch's, numba's and norse's modules costs about a second of CPU on every exit
    (a service stop, each command) and does nothing this program relies on: every file it
    writes is flushed and fsynced before :func:`main` returns. What a normal exit does for
    the program still runs here, in the same order: threads are joined (and executors
    shut down), then the ``atexit`` handlers run (log handlers flush and close, temporary
    directories are removed), then stdout and stderr are flushed.
    """
    code = main(argv)
    shutdown_threads = getattr(threading, "_shutdown", None)
    if shutdown_threads is None:  # not CPython: the ordinary exit
        sys.exit(code)
    shutdown_threads()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a reader gone (EPIPE) or a closed stream: nothing to say
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
