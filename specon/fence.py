"""At most one writer per job: the generation a run started in, checked before each write.

Every start of a job begins a new generation: the runtime bumps ``generation.json`` in the
job's directory on the shared volume, under the job's lock, before the run exists
(``specon.runtime.volume``). A run reads the file once when it starts: its own generation.
Before each write (a progress record, a checkpoint, the done marker) it looks again: a
``stat``, and a read only when the file changed. A newer generation means another copy of
the job has started since (the manager took this one's host for lost and restored the job
elsewhere): this copy is stale, and stops at once without writing (``EXIT_FENCED``).

A run with ``$SPECON_RUN_LOCK=1`` also holds the job's ``run.lock`` (``flock``, released by
the kernel when the process ends, however it ends) for its life: the admission webhook sets it
on every pod a Kubernetes Job makes. Every run takes that lock before it reads its checkpoint,
so a copy started while the previous one still saves (a Job's replacement for an evicted pod,
made by its controller at once) waits for it and resumes from the checkpoint the previous copy
wrote as it stopped: the two never train at once. It waits ``$SPECON_AWAIT_PREVIOUS`` seconds
(``DEFAULT_AWAIT_S`` without), then stops without writing (``EXIT_FENCED``). Only a run with
either variable keeps the lock; the others let it go at once (CRIU does not dump a process
that holds one).

Light on purpose: ``specon.jobkit`` imports it in every training process, and the local
launcher (``specon.runtime.local.launcher``, run by path with no ``specon`` on its path)
loads this file by path: standard library only.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
import weakref
from collections.abc import Mapping
from pathlib import Path

GENERATION_FILE = "generation.json"
RUN_LOCK_FILE = "run.lock"
# Seconds a copy waits for the previous copy of its job to end (set on a controller's
# replacement pod by the admission webhook; unset: it does not wait).
ENV_AWAIT_PREVIOUS = "SPECON_AWAIT_PREVIOUS"
# "1": hold the run lock (the webhook sets it on every pod a Job makes, so a later copy can
# wait for this one). Off by default: CRIU does not dump a process that holds a file lock.
ENV_RUN_LOCK = "SPECON_RUN_LOCK"
_LOCK_POLL_S = 0.1
# How long a copy waits for the lock without ``$SPECON_AWAIT_PREVIOUS`` (its previous copy
# holds it: a Job's replacement the webhook did not answer for).
DEFAULT_AWAIT_S = 300.0
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
        if checkpoint_dir is None:
            return cls(None, env_generation(os.environ))
        wait = await_previous(os.environ)
        hold = wait is not None or os.environ.get(ENV_RUN_LOCK) == "1"
        # Every run waits while another copy holds the lock (a replacement the webhook missed
        # too); only a run asked to keeps it (CRIU dumps no process that holds one).
        lock = take_run_lock(checkpoint_dir.parent / RUN_LOCK_FILE, DEFAULT_AWAIT_S if wait is None else wait)
        fence = cls(checkpoint_dir.parent / GENERATION_FILE, env_generation(os.environ))
        if lock is not None and not hold:
            os.close(lock)
        elif lock is not None:  # held while this fence lives (the run's), released with it
            weakref.finalize(fence, os.close, lock)
        return fence

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


def await_previous(env: Mapping[str, str]) -> float | None:
    """``$SPECON_AWAIT_PREVIOUS`` of ``env``: seconds to wait for the previous copy (None: unset
    or not a number of seconds)."""
    try:
        seconds = float(env.get(ENV_AWAIT_PREVIOUS, ""))
    except ValueError:
        return None
    return seconds if 0 <= seconds < 86_400 else None


def take_run_lock(path: Path, wait: float) -> int | None:
    """Take the job's run lock: its open descriptor, held until closed. While another copy
    holds it, wait up to ``wait`` seconds, then stop without writing (``EXIT_FENCED``). None
    where no lock can be taken (a read-only directory, a file system without locks: said on
    stderr; the generation alone fences then)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        print(
            f"specon: no run lock ({exc}); copies of this job are not kept apart", file=sys.stderr, flush=True
        )
        return None
    deadline = time.monotonic() + wait
    told = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            pass
        except OSError as exc:  # a file system without locks
            os.close(fd)
            print(
                f"specon: no run lock ({exc}); copies of this job are not kept apart",
                file=sys.stderr,
                flush=True,
            )
            return None
        if time.monotonic() >= deadline:
            os.close(fd)
            print(
                f"specon: the previous copy of this job still runs after {wait:g} s; this copy stops "
                "without writing",
                file=sys.stderr,
                flush=True,
            )
            raise SystemExit(EXIT_FENCED)
        if not told:
            print("specon: waiting for the previous copy of this job to stop", file=sys.stderr, flush=True)
            told = True
        time.sleep(_LOCK_POLL_S)


def _no_lock(exc: OSError) -> None:
    print(f"specon: no run lock ({exc}); copies of this job are not kept apart", file=sys.stderr, flush=True)
