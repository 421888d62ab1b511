"""At most one writer per job: the generation a run started in, checked before each write.

Every start of a job begins a new generation: the runtime bumps ``generation.json`` in the
job's directory on the shared volume, under the job's lock, before the run exists
(``specon.runtime.volume``). A run reads the file once when it starts: its own generation.
Before each write (a progress record, a checkpoint, the done marker) it looks again: a
``stat``, and a read only when the file changed. A newer generation means another copy of
the job has started since (the manager took this one's host for lost and restored the job
elsewhere): this copy is stale, and stops at once without writing (``EXIT_FENCED``).

Light on purpose: ``specon.jobkit`` imports it in every training process, and the local
launcher (``specon.runtime.local.launcher``, run by path with no ``specon`` on its path)
loads this file by path: standard library only.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path

GENERATION_FILE = "generation.json"
EXIT_FENCED = 76  # after EX_TEMPFAIL (75): a stale copy that stopped without writing
_MAX_BYTES = 4096


# The generation a runtime started the run in, in the run's environment.
ENV_GENERATION = "SPECON_GENERATION"


def env_generation(env: Mapping[str, str]) -> int | None:
    """``$SPECON_GENERATION`` of ``env`` (None when unset or not a generation)."""
    raw = env.get(ENV_GENERATION, "")
    return int(raw) if raw.isascii() and raw.isdigit() and len(raw) < 19 else None


class Fenced(SystemExit):
    """This run is stale: a newer generation of its job has started elsewhere."""

    def __init__(self, own: int, newer: int) -> None:
        super().__init__(EXIT_FENCED)
        self.own, self.newer = own, newer


class Fence:
    """The generation file of one job (None: the job runs outside specon, never stale)."""

    def __init__(self, path: Path | None, own: int | None = None) -> None:
        """``own``: the generation the runtime started this run in (``$SPECON_GENERATION``);
        None: the file's as it reads now (a run started by an older runtime)."""
        self.path = path
        self._stamp = self._stat()
        newest = self._read()
        self.own = newest if own is None else own
        self._newest = max(newest, self.own)

    @classmethod
    def of_job(cls, checkpoint_dir: Path | None) -> Fence:
        """The fence of the job whose checkpoints are in ``checkpoint_dir`` (the volume's
        layout: ``jobs/<id>/checkpoints`` beside ``jobs/<id>/generation.json``), in the
        generation its runtime named. Read at the start a slow copy could take a newer start's
        generation for its own, and two copies would share one."""
        path = None if checkpoint_dir is None else checkpoint_dir.parent / GENERATION_FILE
        return cls(path, env_generation(os.environ))

    def stale(self) -> bool:
        """Whether a newer generation than this run's own has started."""
        stamp = self._stat()
        if stamp != self._stamp:
            self._stamp = stamp
            self._newest = max(self._newest, self._read())
        return self._newest > self.own

    def check(self) -> None:
        """``Fenced`` (a ``SystemExit``) if this run is stale, said once on stderr."""
        if self.stale():
            print(
                f"specon: generation {self._newest} of this job started elsewhere; this copy "
                f"(generation {self.own}) stops without writing",
                file=sys.stderr,
                flush=True,
            )
            raise Fenced(self.own, self._newest)

    def _stat(self) -> tuple[int, int, int] | None:
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size)

    def _read(self) -> int:
        """The file's generation; 0 when absent or unreadable (a half-written file is never
        seen: the runtime replaces it atomically)."""
        if self.path is None:
            return 0
        try:
            with open(self.path, "rb") as f:
                raw = json.loads(f.read(_MAX_BYTES))
        except (OSError, ValueError):
            return 0
        n = raw.get("generation") if isinstance(raw, dict) else None
        return n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else 0
