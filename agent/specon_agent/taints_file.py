"""Taints a host announces itself (``specon-agent --taints-file FILE``).

A Kubernetes node carries its reclaim notice as a taint the agent reads from its Node. A
Docker host or a local worker on a spot VM has no Node: a hook that watches the cloud's
notice (the instance metadata's spot or preemption endpoint) writes the taint into this file
instead, and the agent reports it with every heartbeat, so the manager drains the worker
(``recovery.evacuate_taints``, SPEC §6.6). One taint per line, ``key[=value]:Effect``; blank
lines and ``#`` comments are ignored. The file is looked at (a ``stat``) at each heartbeat and
read when it changed; a missing file is no taint. A line that is no taint is skipped, and
said once per change of the file.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import structlog

from specon.wire.limits import MAX_TAINT, MAX_TAINTS

log = structlog.get_logger("specon.agent")

_MAX_BYTES = 64 * 1024
_TAINT = re.compile(r"[^\s=:]+(?:=[^\s:]*)?:(?:NoSchedule|PreferNoSchedule|NoExecute)")


class TaintsFile:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._taints: tuple[str, ...] = ()
        self.skipped = 0  # lines that were no taint, in all reads

    def taints(self) -> tuple[str, ...]:
        """The file's taints as it is now."""
        try:
            st = os.stat(self.path)
        except OSError:
            self._stamp, self._taints = None, ()
            return ()
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            self._stamp = stamp
            self._taints = self._read()
        return self._taints

    def _read(self) -> tuple[str, ...]:
        try:
            with self.path.open("rb") as f:
                text = f.read(_MAX_BYTES).decode("utf-8", errors="replace")
        except OSError as exc:
            log.warning("specon.agent.taints_unreadable", path=str(self.path), error=str(exc))
            return ()
        taints: list[str] = []
        bad: list[str] = []
        for raw in text.splitlines():
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            if _TAINT.fullmatch(line) and len(line) <= MAX_TAINT and len(taints) < MAX_TAINTS:
                taints.append(line)
            else:
                bad.append(line[:80])
        if bad:
            self.skipped += len(bad)
            log.warning("specon.agent.taints_skipped", path=str(self.path), lines=bad[:5], count=len(bad))
        log.info("specon.agent.taints", path=str(self.path), taints=taints)
        return tuple(sorted(set(taints)))
