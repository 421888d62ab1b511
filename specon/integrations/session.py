"""The job contract (SPEC §6) for a training loop a framework drives, not the script.

``specon.jobkit.Job`` owns the loop (``for step in job.steps()``); a framework (Lightning,
the Hugging Face Trainer, Keras) owns its own, and calls back at step boundaries. A
``Session`` is what those callbacks share: the same progress records, checkpoint files,
``done.json`` marker and exit codes as ``jobkit``, driven by calls instead of a generator:

* ``newest()`` before training: the newest complete checkpoint to resume from;
* ``begin(step, total)`` when training starts: the ``started`` record, which also declares
  the job's total steps (``"steps"``) where the framework knows them;
* ``log(step, loss)`` for samples; at each step boundary ``completed = step`` and, when
  ``stop_requested`` or ``due()``, ``stop(save)`` (checkpoint, ``checkpointed``, exit 75) or
  ``checkpoint(save)``;
* ``finish(save)`` when the framework's loop ends: final checkpoint, ``done.json``, ``finished``.

``save`` returns the payload (the framework's own checkpoint files, packed by
``specon.integrations.archive``); it is called only when a checkpoint is written.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, NoReturn

from specon import checkpoint, jobkit

Save = Callable[[], bytes]

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def warn(message: str) -> None:
    """A line on stderr (the job's log): the integrations run in the job, with no logger set up."""
    with contextlib.suppress(OSError):
        print(f"specon.integrations: {message}", file=sys.stderr, flush=True)


def env_checkpoint_dir() -> Path | None:
    """``$SPECON_CHECKPOINT_DIR``, or None when the job runs outside specon."""
    value = os.environ.get(jobkit.ENV_CHECKPOINT_DIR, "").strip()
    return Path(value) if value else None


def newest(directory: Path | None = None) -> tuple[int, bytes] | None:
    """``(step, payload)`` of the newest complete checkpoint in ``directory`` (default
    ``$SPECON_CHECKPOINT_DIR``), or None. Corrupt or torn ones are skipped (said on stderr)
    in favour of the previous complete one, as ``jobkit`` does."""
    directory = directory if directory is not None else env_checkpoint_dir()
    if directory is None:
        return None
    for item in checkpoint.iter_complete(directory):
        if isinstance(item, checkpoint.CheckpointError):
            warn(f"skipping checkpoint: {item}")
            continue
        try:
            return item.step, checkpoint.read_payload(item)
        except (FileNotFoundError, checkpoint.CheckpointError):  # pruned or changed since
            continue
    return None


def for_callback(
    session: Session | None,
    log_every: int | None,
    checkpoint_every: int | None,
    checkpoint_interval: float | None,
    keep: int,
    /,
) -> Session:
    """What a framework callback's constructor shares: check ``log_every`` and return
    ``session``, or a new one with the periodic-checkpoint settings."""
    if log_every is not None and log_every < 1:
        raise ValueError(f"log_every must be >= 1 or None, got {log_every}")
    return session or Session(
        checkpoint_every=checkpoint_every, checkpoint_interval=checkpoint_interval, keep=keep
    )


class Session:
    """One run of a framework-driven job under the contract (module docstring).

    ``checkpoint_every`` steps or ``checkpoint_interval`` seconds bound what a SIGKILL loses
    (jobkit's defaults); ``keep`` complete checkpoints are kept. Paths default to the
    runtime's ``$SPECON_CHECKPOINT_DIR`` and ``$SPECON_PROGRESS_FILE``.
    """

    def __init__(
        self,
        *,
        checkpoint_every: int | None = jobkit.DEFAULT_CHECKPOINT_EVERY,
        checkpoint_interval: float | None = jobkit.DEFAULT_CHECKPOINT_INTERVAL,
        keep: int = 2,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        progress: str | os.PathLike[str] | None = None,
        job_id: str | None = None,
    ) -> None:
        jobkit.check_schedule(checkpoint_every, checkpoint_interval, keep)
        self.checkpoint_every = checkpoint_every
        self.checkpoint_interval = checkpoint_interval
        self.keep = keep
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir is not None else env_checkpoint_dir()
        self._progress_path = progress
        self.progress: jobkit.ProgressLog | None = None  # opened by ``begin``
        self.job_id = job_id if job_id is not None else os.environ.get(jobkit.ENV_JOB_ID, "")
        self.completed = 0  # optimizer steps done, counting those restored from the checkpoint
        self.total: int | None = None
        self.outcome: Literal["finished", "checkpointed"] | None = None
        self._stop_request = jobkit.StopRequest()
        self._last_saved: int | None = None
        self._last_time = time.monotonic()
        self._retry_at = 0.0
        self._failing = False
        self._previous: dict[int, Any] = {}

    # -- signals -------------------------------------------------------------------------
    @property
    def stop_requested(self) -> bool:
        """SIGTERM or SIGINT arrived: checkpoint and exit at the next step boundary."""
        return self._stop_request.requested

    def request_stop(self, signum: int = signal.SIGTERM) -> None:
        """What the signal handler does; also callable directly (a test, another thread)."""
        self._stop_request.request(signum)

    def install_signals(self) -> None:
        """Handle SIGTERM/SIGINT (again: a framework may have put its own handler over ours).

        The first call remembers the handlers it replaced, for ``restore_signals``."""
        for sig in _STOP_SIGNALS:
            try:
                previous = signal.signal(sig, self._stop_request.handle)
            except ValueError:  # not the main thread
                warn(f"cannot handle {signal.Signals(sig).name} outside the main thread")
                continue
            self._previous.setdefault(sig, previous)

    def restore_signals(self) -> None:
        for sig, handler in self._previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()

    # -- the run ---------------------------------------------------------------------------
    def begin(self, step: int, total: int | None) -> None:
        """Training starts at ``step`` (the framework's restored step; 0 when fresh) of
        ``total`` (None: the framework cannot tell). Writes the ``started`` record."""
        if self.progress is None:
            self.progress = jobkit.ProgressLog(self._progress_path)
        self.completed = step
        self.total = total
        self._last_saved = step if step > 0 else None
        self._last_time = time.monotonic()
        fields: dict[str, Any] = {"step": step, "resumed": step > 0, "job": self.job_id}
        if total is not None:
            fields["steps"] = total
        self._event("started", **fields)

    def log(self, step: int, loss: float, **metrics: float) -> None:
        """A training sample: ``{"step", "loss", "ts", **metrics}``."""
        if self.progress is not None:
            self.progress.log(step, loss, **metrics)

    def due(self) -> bool:
        """A periodic checkpoint is due at this boundary."""
        last = self._last_saved if self._last_saved is not None else 0
        now = time.monotonic()
        if self.completed == last or now < self._retry_at:
            return False
        if self.checkpoint_every is not None and self.completed - last >= self.checkpoint_every:
            return True
        return self.checkpoint_interval is not None and now - self._last_time >= self.checkpoint_interval

    def checkpoint(self, save: Save, event: str | None = "checkpoint") -> bool:
        """Checkpoint the completed steps now (a no-op outside specon or when nothing new).

        False when the disk is full: nothing is recorded, the previous complete checkpoint
        stays the newest and the next periodic attempt waits ``jobkit.RETRY_AFTER_FULL`` s."""
        if self.checkpoint_dir is None:
            return True
        if self._last_saved != self.completed:
            try:
                checkpoint.write(self.checkpoint_dir, self.completed, save(), keep=self.keep)
            except OSError as exc:
                if exc.errno not in _DISK_FULL:
                    raise
                if not self._failing:
                    warn(f"checkpoint at step {self.completed} not written (retried when due): {exc}")
                self._failing = True
                self._retry_at = time.monotonic() + jobkit.RETRY_AFTER_FULL
                return False
            self._failing = False
            self._last_saved = self.completed
        self._last_time = time.monotonic()
        if event is not None:
            self._event(event, step=self.completed)
        return True

    def stop(self, save: Save) -> NoReturn:
        """Checkpoint, record ``checkpointed`` and exit ``jobkit.EXIT_CHECKPOINTED`` (75).

        On a full disk: ``checkpoint_failed`` and exit 1 (restarted from the newest
        complete checkpoint), as ``jobkit`` does."""
        saved = self.checkpoint(save, event=None)
        self._event("checkpointed" if saved else "checkpoint_failed", step=self.completed)
        self.outcome = "checkpointed" if saved else None
        self.close()
        self.restore_signals()  # on the way out a signal acts as it would have without us
        raise SystemExit(jobkit.EXIT_CHECKPOINTED if saved else 1)

    def finish(self, save: Save | None) -> None:
        """The framework's loop ended: a final checkpoint (when ``save`` is given) so a
        restart is a no-op, ``done.json`` and ``finished``. A full disk is waited out for
        ``jobkit.FINISH_PATIENCE`` s, as ``jobkit`` does."""
        deadline = time.monotonic() + jobkit.FINISH_PATIENCE
        while not (save is None or self.checkpoint(save, event=None)) or not self._write_done():
            if time.monotonic() > deadline or self.stop_requested:
                raise OSError(errno.ENOSPC, "the disk stayed full: cannot record that the job finished")
            time.sleep(1.0)
        total = self.total if self.total is not None else self.completed
        self._event("finished", step=self.completed, steps=total)
        self.outcome = "finished"

    def close(self) -> None:
        if self.progress is not None:
            self.progress.close()
            self.progress = None

    # -- helpers -------------------------------------------------------------------------
    def _event(self, name: str, **fields: Any) -> None:
        if self.progress is None:
            self.progress = jobkit.ProgressLog(self._progress_path)
        self.progress.event(name, **fields)

    def _write_done(self) -> bool:
        if self.checkpoint_dir is None:
            return True
        total = self.total if self.total is not None else self.completed
        marker = {"job": self.job_id, "steps": total, "finished": time.time()}
        try:
            self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            checkpoint.atomic_write(jobkit.done_marker(self.checkpoint_dir), json.dumps(marker).encode())
        except OSError as exc:
            if exc.errno not in _DISK_FULL:
                raise
            return False
        return True
