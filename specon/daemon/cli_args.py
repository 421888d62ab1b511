"""Command-line pieces both daemons share: bearer tokens, HOST:PORT and address arguments,
optional extras."""

from __future__ import annotations

import argparse
import importlib.util
import ipaddress
import os
import sys
from pathlib import Path
from typing import TypeVar

import structlog

from specon.daemon.settings import AgentSettings, ManagerSettings, SettingsError

S = TypeVar("S", AgentSettings, ManagerSettings)

# Placeholders that docs and old manifests used: never accepted as a credential.
PLACEHOLDER_TOKENS = frozenset({"change-me", "changeme", "placeholder", "specon-token", "replace-me"})
MIN_TOKEN_BYTES = 32


def missing_extra(module: str, extra: str, what: str) -> str | None:
    """Why ``what`` cannot run when the client library ``module`` (the ``specon[extra]``
    install) is absent, else None: a plain ``pip install specon`` runs the local runtime only."""
    if importlib.util.find_spec(module) is not None:
        return None
    return f"{what} needs the {module} client library: pip install 'specon[{extra}]'"


class WeakTokenError(ValueError):
    """A token that must not guard anything (a placeholder, too short); says why."""


def check_token_strength(token: str, *, what: str = "token") -> str:
    """``token`` if it is fit to guard the manager, else ``WeakTokenError`` saying why."""
    if token.strip().lower() in PLACEHOLDER_TOKENS or token.upper().startswith("REPLACE"):
        raise WeakTokenError(f"the {what} is the documented placeholder: generate one (make deploy does)")
    size = len(token.encode("utf-8", "replace"))
    if size < MIN_TOKEN_BYTES:
        raise WeakTokenError(
            f"the {what} is {size} bytes; at least {MIN_TOKEN_BYTES} are required (`openssl rand -hex 32`)"
        )
    return token


def read_token(path: str | None) -> str:
    """The bearer token: ``--token-file`` (a mounted Secret), else ``$SPECON_TOKEN``."""
    if path:
        return Path(path).read_text().strip()
    return os.environ.get("SPECON_TOKEN", "").strip()


def load_settings(cls: type[S], prog: str) -> S | None:
    """``cls.from_env()`` for daemon ``prog``: None (after saying why on stderr) when a value
    is bad; unknown ``SPECON_*`` variables are logged, not fatal."""
    try:
        settings = cls.from_env()
    except SettingsError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return None
    for var in cls.unknown_variables():
        structlog.get_logger().warning(f"specon.{prog.removeprefix('specon-')}.unknown_setting", variable=var)
    return settings


def split_listen(value: str) -> tuple[str, int]:
    """Parse ``HOST:PORT`` (``[::1]:80`` too) for argparse."""
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)


def ip_address(value: str) -> str:
    """Parse an IPv4 or IPv6 address (no name, no port) for argparse."""
    try:
        return str(ipaddress.ip_address(value.strip("[]")))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an IP address, got {value!r}") from None


def add_managed_pod_options(group: argparse._ArgumentGroup) -> None:
    """Which pods are specon's and which of their volumes is the shared one (Kubernetes): the
    agents' and the manager's (its pod broker checks the agents' pods by them) must agree."""
    from specon.runtime.kubernetes.pods import DEFAULT_CLAIM, DEFAULT_SELECTOR  # noqa: PLC0415

    group.add_argument(
        "--selector",
        default=DEFAULT_SELECTOR,
        help=f"label selector of managed pods, equality-based (default {DEFAULT_SELECTOR}; the same on "
        "the agents and the manager)",
    )
    group.add_argument(
        "--claim", default=DEFAULT_CLAIM, help=f"PVC name of the shared volume (default {DEFAULT_CLAIM})"
    )
    group.add_argument(
        "--host-path", help="or: a hostPath directory that is the shared volume's root (single-node setups)"
    )
    group.add_argument("--include-owned", action="store_true", help="also save pods owned by a controller")
