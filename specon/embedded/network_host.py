"""What the embedded cluster needs of a network host of its own (``specon.testing.net_hosts``
makes them): its address, and how to run a command there."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class Host(Protocol):
    @property
    def address(self) -> str: ...

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run in the host's network namespace; the pid stays the command's own."""
        ...
