"""Who can reach the service: listening beyond loopback needs a real API token."""

from __future__ import annotations

import ipaddress

from ..config import Config, with_server
from ..errors import ConfigError, ConfigProblem


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def has_token(cfg: Config) -> bool:
    """True when a real (non-blank) ``server.api_token`` is configured."""
    token = cfg.server.api_token
    return token is not None and bool(token.get_secret_value().strip())


def exposure_problems(cfg: Config) -> list[ConfigProblem]:
    """The problem of listening beyond loopback without a real token (empty list when there is none)."""
    if is_loopback(cfg.server.host) or has_token(cfg):
        return []
    return [ConfigProblem(
        "server.api_token",
        f"listening on {cfg.server.host} (not loopback) requires an API token (an empty or blank one is no token)",
        "set server.api_token (or CEREBELLAR_NORSE_SERVER__API_TOKEN), or listen on 127.0.0.1",
    )]


def check_exposure(cfg: Config) -> None:
    """Refuse to listen beyond loopback without a real API token (ConfigError naming ``server.api_token``)."""
    problems = exposure_problems(cfg)
    if problems:
        raise ConfigError(problems)


def reload_auth_refusal(running: Config, new: Config) -> str | None:
    """Why a reload to ``new`` must be refused for the sake of auth, or None when it may go ahead.

    A reload never weakens or swaps auth live: it is refused when it would leave the
    running service (listening on ``running.server.host``) off loopback without a
    token, when the new config would not be allowed to start, and when it removes or
    changes the token (adding a token where there was none is allowed). Rotating the
    token takes a restart.
    """
    live = with_server(running, {"api_token": new.server.api_token})
    for cfg in (live, new):
        problems = exposure_problems(cfg)
        if problems:
            return str(problems[0])
    if has_token(running):
        if not has_token(new):
            return "server.api_token: the new config has no token; removing the token takes a restart, never a reload"
        old_value = running.server.api_token.get_secret_value() if running.server.api_token else ""
        new_value = new.server.api_token.get_secret_value() if new.server.api_token else ""
        if old_value != new_value:
            return "server.api_token: the new config changes the token; changing it takes a restart, never a reload"
    return None
