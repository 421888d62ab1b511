"""Command-line pieces both daemons share: the bearer token and HOST:PORT arguments."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def read_token(path: str | None) -> str:
    """The shared bearer token: ``--token-file`` (a mounted Secret), else ``$SPECON_TOKEN``."""
    if path:
        return Path(path).read_text().strip()
    return os.environ.get("SPECON_TOKEN", "").strip()


def split_listen(value: str) -> tuple[str, int]:
    """Parse ``HOST:PORT`` (``[::1]:80`` too) for argparse."""
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host.strip("[]"), int(port)
