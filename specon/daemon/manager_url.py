"""Where an agent may send its bearer token: the manager URL rule (pure; no I/O).

A token sent over plain HTTP can be read by anyone on the path, so an agent refuses an
``http://`` manager that is not on this host's loopback (127.0.0.0/8, ::1, ``localhost``)
unless its operator says the network is trusted (``--insecure-http``). The agent's argument
parsing and its HTTP client both apply this rule (the client as defence in depth).
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

LOOPBACK_NAMES = frozenset({"localhost", "localhost."})


class InsecureURLError(ValueError):
    """A manager URL the token must not be sent to; the message says why and what to do."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is this host's loopback. Other names are
    not: what they resolve to is not known here, and DNS may lie."""
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_manager_url(url: str, *, insecure_http: bool = False) -> str:
    """``url``'s scheme (``http`` or ``https``) if the agent may send its token there, else
    ``InsecureURLError`` saying why (a plain-HTTP URL off loopback without ``insecure_http``,
    or not a usable http(s) URL at all)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018 - raises ValueError for a port out of range or not a number
    except ValueError as exc:
        raise InsecureURLError(f"the manager URL {url!r} is not a valid URL: {exc}") from exc
    if parts.scheme not in ("http", "https") or not host:
        raise InsecureURLError(f"the manager URL must be http(s)://HOST[:PORT], got {url!r}")
    if parts.username is not None or parts.password is not None:
        raise InsecureURLError(
            "the manager URL must hold no user name or password (the token file carries the credential)"
        )
    if parts.scheme == "http" and not insecure_http and not is_loopback(host):
        raise InsecureURLError(
            f"refusing to send the bearer token in clear text to {url} (not a loopback address): "
            "serve the manager over TLS and use an https:// URL (docs/tls.md), or pass "
            "--insecure-http to allow plain HTTP on a network you trust"
        )
    return parts.scheme
