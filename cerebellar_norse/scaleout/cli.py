"""The scale-out subcommands of ``cerebellar-norse``: ``haproxy-config``, ``rebalance``, ``rollout``."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from ..argtypes import seconds_up_to
from . import REPLICA_TIMEOUT_S, ROLLOUT_TIMEOUT_S

TOKEN_ENV = "CEREBELLAR_NORSE_SERVER__API_TOKEN"
MAX_TIMEOUT_S = 3600.0


def add_parsers(sub: Any) -> None:
    """Add the subcommands to the main parser's subparsers."""
    hc = sub.add_parser("haproxy-config", help="print the HAProxy configuration routing markets to replicas by consistent hash")
    hc.add_argument("--replicas", required=True, metavar="[ID=]HOST:PORT,…",
                    help="replicas; ids default to their position (1, 2, …); a trailing ~ declares a server in maintenance")
    hc.add_argument("--bind", default="127.0.0.1:8080", help="address HAProxy listens on (default 127.0.0.1:8080)")
    hc.add_argument("--stats-bind", default="127.0.0.1:8404", help="stats page and HAProxy metrics (default 127.0.0.1:8404)")
    hc.add_argument("--socket", default="/run/haproxy/cerebellar-norse.sock", help="runtime API socket (admin level)")
    hc.add_argument("--log", dest="log_target", default="/dev/log", help="HAProxy log target (default /dev/log)")

    rb = sub.add_parser("rebalance", help="move market states to their new replicas when replicas are added or removed")
    rb.add_argument("--old", required=True, metavar="URL,…", help="replicas now serving ([ID=]URL; ids from HAProxy otherwise)")
    rb.add_argument("--new", required=True, metavar="URL,…", help="replicas after the change")
    rb.add_argument("--token", default=None, metavar="T", help=f"bearer token of the replicas (default: ${TOKEN_ENV})")
    rb.add_argument("--dry-run", action="store_true", help="print the moves, change nothing")
    rb.add_argument("--json", action="store_true", help="print one JSON report")
    switch = rb.add_mutually_exclusive_group()
    switch.add_argument("--haproxy-socket", default=None, metavar="PATH", help="HAProxy runtime API: server ids, and the switch")
    switch.add_argument("--switch-command", default=None, metavar="CMD",
                        help="command that makes HAProxy route by the new replica list (without --haproxy-socket)")
    rb.add_argument("--backend", default=None, help="with --haproxy-socket: HAProxy backend of the replicas (default replicas)")
    _add_timeout(rb)

    ro = sub.add_parser("rollout", help="publish a stored model to every replica and activate it on all together")
    ro.add_argument("version", metavar="MODEL_VERSION", help="model version (from this config's model store, or --model-dir)")
    ro.add_argument("--replicas", required=True, metavar="URL,…", help="every replica")
    ro.add_argument("--model-dir", default=None, metavar="DIR", help="the model directory (default <state_dir>/models/VERSION)")
    ro.add_argument("--token", default=None, metavar="T", help=f"bearer token of the replicas (default: ${TOKEN_ENV})")
    ro.add_argument("--json", action="store_true", help="print one JSON report")
    _add_timeout(ro, ROLLOUT_TIMEOUT_S)


def _add_timeout(parser: argparse.ArgumentParser, default: float = REPLICA_TIMEOUT_S) -> None:
    parser.add_argument("--timeout", type=seconds_up_to(MAX_TIMEOUT_S), default=default, metavar="SECONDS",
                        help=f"seconds each call waits for a replica before the command fails naming it, > 0 and at "
                             f"most {MAX_TIMEOUT_S:g} (default {default:g})")


def misused_flag(args: argparse.Namespace) -> str | None:
    """Why a flag given to a scale-out command means nothing to it (a usage error), or None."""
    if args.command == "rebalance" and args.backend is not None and args.haproxy_socket is None:
        return "--backend needs --haproxy-socket (it names the backend in HAProxy's runtime API)"
    return None


def _token(args: argparse.Namespace) -> str | None:
    return args.token or os.environ.get(TOKEN_ENV) or None


def _haproxy_config(args: argparse.Namespace) -> int:
    from .haproxy import parse_replica, render_config

    replicas = [parse_replica(t, j + 1) for j, t in enumerate(t for t in args.replicas.split(",") if t.strip())]
    sys.stdout.write(render_config(replicas, args.bind, args.stats_bind, args.socket, args.log_target))
    return 0


def _rebalance(args: argparse.Namespace) -> int:
    from .haproxy import BACKEND
    from .rebalance import cmd_rebalance

    return cmd_rebalance(args.old, args.new, _token(args), args.dry_run, args.json, args.haproxy_socket,
                         args.backend or BACKEND, args.switch_command, args.timeout)


def commands(load: Callable[[argparse.Namespace], Any]) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Subcommand name → handler (``load`` reads the config of ``--config``)."""

    def _rollout(args: argparse.Namespace) -> int:
        from .rollout import cmd_rollout

        return cmd_rollout(load(args), args.version, args.replicas, _token(args), args.model_dir, args.json, args.timeout)

    return {"haproxy-config": _haproxy_config, "rebalance": _rebalance, "rollout": _rollout}
