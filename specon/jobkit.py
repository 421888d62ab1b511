"""The job contract (SPEC §6) for training scripts: progress log, checkpoint on SIGTERM, resume.

Usable from any training loop; PyTorch is optional and imported only by the ``torch_*``
helpers. A migratable job looks like this::

    from specon import jobkit

    with jobkit.Job(steps=2000, save=lambda: jobkit.torch_payload(model, opt),
                    restore=lambda b: jobkit.torch_restore(b, model, opt)) as job:
        for step in job.steps():          # resumes after the newest complete checkpoint
            loss = train_one_batch()
            job.log(step, loss)           # one JSON line, flushed

Environment (set by the runtime that starts the job; all optional): ``SPECON_PROGRESS_FILE``,
the file progress records are appended to (JSON lines, append mode: a restored job continues
it; unset: records are dropped); ``SPECON_CHECKPOINT_DIR``, the directory of its checkpoints
(``specon.checkpoint``) and ``done.json`` marker (unset: no checkpoint, no resume; its parent
holds the job's ``generation.json``, ``specon.fence``); ``SPECON_JOB_ID``, the job's id.

Progress records, one JSON object per line, each written with a single ``write`` to a file
opened with ``O_APPEND`` so a tailer only ever sees whole lines:

* ``{"step": N, "loss": X, "ts": T, ...extra metrics}`` - a training sample (``ts`` is epoch
  seconds). Non-finite values are written as ``NaN``/``Infinity`` (Python's JSON dialect) so
  the reader can count them.
* ``{"event": "started", "step": S, "resumed": bool, "job": ID, "ts": T}`` - the process
  started (or resumed after checkpoint step ``S``).
* ``{"event": "checkpoint", "step": N, "ts": T}`` - a periodic checkpoint was written.
* ``{"event": "checkpointed", "step": N, "ts": T}`` - the last record of a job stopped by
  SIGTERM/SIGINT: its checkpoint at step ``N`` is complete; exit code ``EXIT_CHECKPOINTED``.
* ``{"event": "finished", "step": N, "steps": N, "ts": T}`` - all configured steps are done;
  exit code 0 and ``done.json`` written.
* ``{"event": "checkpoint_failed", "step": N, "ts": T}`` - stopped by SIGTERM, but the disk
  was full: no checkpoint at ``N``; exit code 1 (restarted from the newest complete one).

A full disk (ENOSPC, EDQUOT) is transient: refused records are written, in order, once there
is room (up to ``PENDING_LIMIT`` bytes); a refused periodic checkpoint is retried after
``RETRY_AFTER_FULL`` s, the final one and ``done.json`` for ``FINISH_PATIENCE`` s. Event
records carry no metric, so a reader looking for ``loss`` skips them; a fenced run's name
its ``generation`` (``specon.fence``), so a reader can tell which copy wrote each.

Exit codes: 0 = finished (``done.json`` exists); ``EXIT_CHECKPOINTED`` (75, EX_TEMPFAIL) =
stopped on request after a complete checkpoint; ``EXIT_FENCED`` (76) = a newer copy started
elsewhere and this one stopped without writing (``specon.fence``); anything else = failed (a
restart resumes from its newest complete checkpoint). The signal handlers live only inside
``with Job(...)``: a SIGTERM before or after it kills the process with the default action,
so a runtime asks ``read_done(checkpoint_dir)`` first (a job killed after it finished is
finished). Guarantee: however often a job is stopped and restarted, it trains each step of
``1..steps`` and finishes with exactly ``steps``; steps after its last checkpoint are redone
only when it was killed without warning; periodic checkpoints bound that loss.
"""

from __future__ import annotations

import contextlib
import errno
import io
import itertools
import json
import os
import random
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any, Literal

from specon import checkpoint
from specon.fence import EXIT_FENCED as EXIT_FENCED  # noqa: PLC0414 (re-exported)
from specon.fence import Fence

if TYPE_CHECKING:
    import torch

ENV_PROGRESS_FILE = "SPECON_PROGRESS_FILE"
ENV_CHECKPOINT_DIR = "SPECON_CHECKPOINT_DIR"
ENV_JOB_ID = "SPECON_JOB_ID"

EXIT_CHECKPOINTED = 75
DONE_MARKER = "done.json"

DEFAULT_CHECKPOINT_EVERY = 200
DEFAULT_CHECKPOINT_INTERVAL = 60.0

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# A full disk or quota: transient, worth retrying, never a reason to die mid-training.
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
PENDING_LIMIT = 1 << 20  # bytes of progress records kept while the disk is full
# At the end, the final checkpoint and done marker are retried this long on a full disk.
FINISH_PATIENCE = 600.0
# After a checkpoint a full disk refused, the next periodic attempt waits this long (each
# attempt serialises the whole model state).
RETRY_AFTER_FULL = 5.0


def _warn(message: str) -> None:
    # stderr is often a file on the same volume: a full disk must not turn a warning into a crash.
    with contextlib.suppress(OSError):
        print(f"specon.jobkit: {message}", file=sys.stderr, flush=True)


def _env_path(name: str) -> Path | None:
    value = os.environ.get(name, "").strip()
    return Path(value) if value else None


class ProgressLog:
    """Appends progress records (JSON lines) to a file; a no-op sink when there is none.

    ``path`` defaults to ``$SPECON_PROGRESS_FILE``.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path: Path | None = Path(path) if path is not None else _env_path(ENV_PROGRESS_FILE)
        self._fd: int | None = None
        # Records a full disk refused, oldest first, kept (in order) for the next write.
        self._pending = b""
        self.dropped = 0  # records given up on (the backlog outgrew PENDING_LIMIT)
        self.fence: Fence | None = None  # set by ``Job``: a stale copy writes nothing
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, record: dict[str, Any]) -> None:
        """Append one record as a single line, written with one ``write`` call.

        A write the disk refuses (full, over quota) is kept and retried, in order, before
        the next record: training goes on through a transient full disk and the log stays
        complete. A backlog over ``PENDING_LIMIT`` bytes is dropped (and counted)."""
        if self._fd is None:
            return
        self.check_fence()
        data = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        if len(self._pending) + len(data) > PENDING_LIMIT:
            self.dropped += self._pending.count(b"\n")
            _warn(f"progress log: dropped {self.dropped} records a full disk refused")
            self._pending = b""
        self._pending += data
        self.flush()

    def flush(self) -> bool:
        """Write what is pending; False if the disk still refuses some of it.

        All or nothing: a full disk may take part of a write (a short write) and then refuse
        the rest; the part is cut off again, so the file never ends in half a line that a
        later run (a restart, a move) would append to."""
        if not self._pending or self._fd is None:
            return True
        data, done = self._pending, 0
        while data:
            try:
                written = os.write(self._fd, data)
            except OSError as exc:
                if exc.errno not in _DISK_FULL:
                    raise
                if done:  # only this process appends: the file ends with our ``done`` bytes
                    os.ftruncate(self._fd, os.fstat(self._fd).st_size - done)  # needs no space
                return False
            data, done = data[written:], done + written
        self._pending = b""
        return True

    def check_fence(self) -> None:
        """``Fenced`` if a newer copy of the job started: nothing pending is written then."""
        if self.fence is not None and self.fence.stale():
            self._pending = b""
            self.fence.check()

    def log(self, step: int, loss: float, **metrics: float) -> None:
        """A training sample: ``{"step", "loss", "ts", **metrics}``."""
        self.write({"step": step, "loss": float(loss), "ts": time.time(), **_floats(metrics)})

    def event(self, name: str, **fields: Any) -> None:
        own = {} if self.fence is None or not self.fence.own else {"generation": self.fence.own}
        self.write({"event": name, **fields, **own, "ts": time.time()})

    def close(self) -> None:
        if self._fd is not None:
            if not self.flush():
                lost = self._pending.count(b"\n")
                _warn(f"progress log: {lost} records lost to a full disk at exit")
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> ProgressLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _floats(metrics: dict[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()}


def done_marker(checkpoint_dir: Path) -> Path:
    """Where a finished job leaves its ``done.json`` marker."""
    return checkpoint_dir / DONE_MARKER


def read_done(checkpoint_dir: Path) -> dict[str, Any] | None:
    """The finished job's marker (``{"job", "steps", "finished"}``), or None if not finished."""
    try:
        data = json.loads(done_marker(checkpoint_dir).read_bytes())
    except (FileNotFoundError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def check_schedule(checkpoint_every: int | None, checkpoint_interval: float | None, keep: int) -> None:
    """Raise ValueError unless the periodic-checkpoint settings are valid (``Job``'s, also
    used by ``specon.integrations.session.Session``)."""
    if checkpoint_every is not None and checkpoint_every < 1:
        raise ValueError(f"checkpoint_every must be >= 1 or None, got {checkpoint_every}")
    if checkpoint_interval is not None and checkpoint_interval <= 0:
        raise ValueError(f"checkpoint_interval must be > 0 or None, got {checkpoint_interval}")
    if keep < 1:
        raise ValueError(f"keep must be >= 1, got {keep}")


class StopRequest:
    """SIGTERM/SIGINT as a request to checkpoint and exit at the next step boundary
    (``Job``'s, also used by ``specon.integrations.session.Session``). ``handle`` is the
    signal handler; a second SIGINT raises KeyboardInterrupt: a second Ctrl-C means "now"."""

    def __init__(self) -> None:
        self.signum: int | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def request(self, signum: int = signal.SIGTERM) -> None:
        self.signum = signum

    def handle(self, signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGINT and self.requested:
            raise KeyboardInterrupt
        self.request(signum)


class Job:
    """A training job that honours the contract: see the module docstring.

    ``save()`` returns the payload to checkpoint; ``restore(payload)`` loads it back
    (optional when the script calls ``resume()`` itself and restores the payload).
    ``steps`` is the configured number of training steps; steps are numbered ``1..steps``.
    ``progress`` (a path or a ``ProgressLog``, default ``$SPECON_PROGRESS_FILE``) is closed
    when the ``with`` block ends. ``keep`` complete checkpoints are kept.
    """

    def __init__(
        self,
        *,
        steps: int,
        save: Callable[[], bytes] | None = None,
        restore: Callable[[bytes], object] | None = None,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        progress: ProgressLog | str | os.PathLike[str] | None = None,
        job_id: str | None = None,
        checkpoint_every: int | None = DEFAULT_CHECKPOINT_EVERY,
        checkpoint_interval: float | None = DEFAULT_CHECKPOINT_INTERVAL,
        keep: int = 2,
        exit_on_stop: bool = True,
    ) -> None:
        if steps < 0:
            raise ValueError(f"steps must be >= 0, got {steps}")
        check_schedule(checkpoint_every, checkpoint_interval, keep)
        self.total = steps
        self._save = save
        self._restore = restore
        self.checkpoint_dir = (
            Path(checkpoint_dir) if checkpoint_dir is not None else _env_path(ENV_CHECKPOINT_DIR)
        )
        self.progress = progress if isinstance(progress, ProgressLog) else ProgressLog(progress)
        self.progress.fence = Fence.of_job(self.checkpoint_dir)  # its generation: read once, now
        self.job_id = job_id if job_id is not None else os.environ.get(ENV_JOB_ID, "")
        self.checkpoint_every = checkpoint_every
        self.checkpoint_interval = checkpoint_interval
        self.keep = keep
        self.exit_on_stop = exit_on_stop
        self.completed = 0  # steps done so far, counting those restored from the checkpoint
        self.outcome: Literal["finished", "checkpointed"] | None = None  # once the loop ends
        self._stop_request = StopRequest()
        self._checkpoint_failing = False
        self._retry_at = 0.0  # after a full disk: no periodic checkpoint attempt before this
        self._resumed: tuple[int, bytes | None] | None = None
        self._last_checkpoint_step: int | None = None
        self._last_checkpoint_time = time.monotonic()
        self._previous_handlers: dict[int, Any] = {}
        self._entered = False

    # -- signals -------------------------------------------------------------------------
    @property
    def should_stop(self) -> bool:
        """True once SIGTERM or SIGINT arrived: checkpoint and exit at the next step boundary."""
        return self._stop_request.requested

    def request_stop(self, signum: int = signal.SIGTERM) -> None:
        """What the signal handler does; also callable directly (e.g. from a test)."""
        self._stop_request.request(signum)

    def __enter__(self) -> Job:
        for sig in _STOP_SIGNALS:
            try:
                self._previous_handlers[sig] = signal.signal(sig, self._stop_request.handle)
            except ValueError:  # not the main thread: the caller must use request_stop()
                _warn(f"cannot install a handler for {signal.Signals(sig).name} outside the main thread")
        self._entered = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for sig, handler in self._previous_handlers.items():
            signal.signal(sig, handler)
        self._previous_handlers.clear()
        self.progress.close()
        self._entered = False

    # -- resume --------------------------------------------------------------------------
    def resume(self) -> tuple[int, bytes | None]:
        """The newest complete checkpoint's ``(step, payload)``, or ``(0, None)``.

        Corrupt or torn checkpoints are skipped (reported on stderr) in favour of the
        previous complete one. Calls ``restore(payload)`` when one was given. Idempotent.
        """
        if self._resumed is not None:
            return self._resumed
        found: tuple[int, bytes | None] = (0, None)
        if self.checkpoint_dir is not None:
            for item in checkpoint.iter_complete(self.checkpoint_dir):
                if isinstance(item, checkpoint.CheckpointError):
                    _warn(f"skipping checkpoint: {item}")
                    continue
                try:
                    found = (item.step, checkpoint.read_payload(item))
                except (FileNotFoundError, checkpoint.CheckpointError):  # pruned or changed since
                    continue
                break
        step, payload = found
        if step > self.total:
            raise ValueError(f"checkpoint is at step {step}, beyond the configured {self.total} steps")
        if payload is not None and self._restore is not None:
            self._restore(payload)
        self._resumed = found
        self.completed = step
        self._last_checkpoint_step = step if payload is not None else None
        self._last_checkpoint_time = time.monotonic()
        self.progress.event("started", step=step, resumed=payload is not None, job=self.job_id)
        return found

    # -- the loop ------------------------------------------------------------------------
    def steps(self) -> Iterator[int]:
        """Yield the step numbers still to train, ``completed+1 .. steps``.

        Between steps it writes periodic checkpoints and honours a stop request: checkpoint,
        record ``checkpointed`` and exit with ``EXIT_CHECKPOINTED`` (or, with
        ``exit_on_stop=False``, end the iteration with ``outcome == "checkpointed"``). After
        the last step it checkpoints, records ``finished`` and writes ``done.json``.
        """
        if not self._entered:
            raise RuntimeError("use `with Job(...) as job:` so the stop signals are handled")
        if self._resumed is None:
            _step, payload = self.resume()
            if payload is not None and self._restore is None:
                raise RuntimeError("a checkpoint exists: pass restore= or call resume() and restore it")
        while self.completed < self.total:  # finishing beats stopping: no restart for nothing
            if self.should_stop:
                self._stop()
                return
            if self._checkpoint_due():
                self.checkpoint("checkpoint")
            yield self.completed + 1
            self.completed += 1
        self._finish()

    def log(self, step: int, loss: float, **metrics: float) -> None:
        """Append a training sample to the progress log."""
        self.progress.log(step, loss, **metrics)

    def checkpoint(self, event: str | None = None) -> bool:
        """Write a checkpoint of the completed steps now (no-op without dir or ``save``).

        False when the disk is full: nothing is recorded (the previous complete checkpoint
        stays the newest) and a periodic checkpoint is simply tried again when next due."""
        if self.checkpoint_dir is None or self._save is None:
            return True
        if self._last_checkpoint_step != self.completed:
            self.progress.check_fence()
            try:
                checkpoint.write(self.checkpoint_dir, self.completed, self._save(), keep=self.keep)
            except OSError as exc:
                if exc.errno not in _DISK_FULL:
                    raise
                if not self._checkpoint_failing:  # once per streak, not once per step
                    _warn(f"checkpoint at step {self.completed} not written (retried when due): {exc}")
                self._checkpoint_failing = True
                self._retry_at = time.monotonic() + RETRY_AFTER_FULL
                return False
            self._checkpoint_failing = False
            self._last_checkpoint_step = self.completed
        self._last_checkpoint_time = time.monotonic()
        if event is not None:
            self.progress.event(event, step=self.completed)
        return True

    def _checkpoint_due(self) -> bool:
        last = self._last_checkpoint_step if self._last_checkpoint_step is not None else 0
        if self.completed == last or time.monotonic() < self._retry_at:
            return False
        if self.checkpoint_every is not None and self.completed - last >= self.checkpoint_every:
            return True
        return (
            self.checkpoint_interval is not None
            and time.monotonic() - self._last_checkpoint_time >= self.checkpoint_interval
        )

    def _stop(self) -> None:
        if not self.checkpoint():
            # The disk is full: claim nothing. The job exits as failed and is restarted
            # from its newest complete checkpoint (the runtime's save reports that one).
            self.progress.event("checkpoint_failed", step=self.completed)
            self.progress.close()
            raise SystemExit(1)
        self.progress.event("checkpointed", step=self.completed)
        self.outcome = "checkpointed"
        if self.exit_on_stop:
            raise SystemExit(EXIT_CHECKPOINTED)

    def _finish(self) -> None:
        # A final checkpoint makes a restart after completion a no-op instead of a retrain.
        # Its work done, the job waits out a full disk rather than die unrecorded.
        deadline = time.monotonic() + FINISH_PATIENCE
        while not self.checkpoint() or not self._write_done():
            if time.monotonic() > deadline or self.should_stop:
                raise OSError(errno.ENOSPC, "the disk stayed full: cannot record that the job finished")
            time.sleep(1.0)
        self.progress.event("finished", step=self.completed, steps=self.total)
        self.outcome = "finished"

    def _write_done(self) -> bool:
        if self.checkpoint_dir is None:
            return True
        marker = {"job": self.job_id, "steps": self.total, "finished": time.time()}
        self.progress.check_fence()
        try:
            _atomic_write_json(done_marker(self.checkpoint_dir), marker)
        except OSError as exc:
            if exc.errno not in _DISK_FULL:
                raise
            return False
        return True


def _atomic_write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    checkpoint.atomic_write(path, json.dumps(data).encode())


# -- PyTorch helpers (torch imported lazily) -----------------------------------------------
_PAYLOAD_FORMAT = 1


def rng_state() -> dict[str, Any]:
    """The global RNG states of Python, and of NumPy and torch when the script imported them.

    Only plain types and tensors, so ``torch.load(weights_only=True)`` accepts them.
    """
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {"python": [version, list(internal), gauss]}
    if "numpy" in sys.modules:
        name, keys, pos, has_gauss, cached = sys.modules["numpy"].random.get_state(legacy=True)
        state["numpy"] = [str(name), [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]
    if "torch" in sys.modules:
        state["torch"] = sys.modules["torch"].get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` captured (missing parts are left alone)."""
    if "python" in state:
        version, internal, gauss = state["python"]
        random.setstate((int(version), tuple(int(x) for x in internal), gauss))
    if "numpy" in state and "numpy" in sys.modules:
        np = sys.modules["numpy"]
        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    if "torch" in state and "torch" in sys.modules:
        sys.modules["torch"].set_rng_state(state["torch"])


DEVICES = ("auto", "cpu", "cuda")  # what ``--device`` offers (``cuda:N`` is accepted too)


def torch_device(name: str = "auto") -> torch.device:
    """The device to train on: ``auto`` is CUDA where torch sees a GPU, else the CPU; ``cpu``;
    ``cuda`` or ``cuda:N``. ``ValueError`` saying why for a device this process cannot use
    (CUDA asked for where there is none: a torch built without it, or no GPU visible)."""
    import torch  # noqa: PLC0415 - lazy: jobkit must work in scripts without torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ValueError(f"unknown device {name!r}: use auto, cpu, cuda or cuda:N") from exc
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device {name!r}: only auto, cpu, cuda and cuda:N are supported")
    if device.type == "cuda" and not torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        why = f"this torch ({torch.__version__}) is built without CUDA" if torch.version.cuda is None else ""
        why = why or "no GPU is visible" + ("" if visible is None else f" (CUDA_VISIBLE_DEVICES={visible!r})")
        raise ValueError(f"device {name!r}: CUDA is not available: {why}")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"device {name!r}: only {torch.cuda.device_count()} GPU(s) visible")
    return device


def _to_cpu(value: Any) -> Any:
    """``value`` with every tensor in it moved to the CPU: a checkpoint loads anywhere."""
    import torch  # noqa: PLC0415

    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_cpu(v) for v in value)
    return value


def torch_payload(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    extra: Any = None,
) -> bytes:
    """Serialise model, optimizer, global RNG states and ``extra`` with ``torch.save``.

    Every tensor is saved on the CPU, so the checkpoint loads on any device (``torch_restore``
    maps it to the model's). The CUDA generators are saved too once CUDA is in use.
    ``extra`` must be loadable with ``weights_only=True``: tensors, numbers, strings and
    lists/dicts/tuples of them (e.g. a ``torch.Generator.get_state()``).
    """
    import torch  # noqa: PLC0415 - lazy: jobkit must work in scripts without torch

    state = {
        "format": _PAYLOAD_FORMAT,
        "model": _to_cpu(model.state_dict()),
        "optimizer": _to_cpu(optimizer.state_dict()) if optimizer is not None else None,
        "rng": rng_state(),
        "extra": _to_cpu(extra),
    }
    cuda: Any = torch.cuda  # its is_initialized has no annotations
    if cuda.is_available() and cuda.is_initialized():
        state["cuda_rng"] = cuda.get_rng_state_all()
    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def torch_restore(
    payload: bytes,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    map_location: str | torch.device | None = None,
) -> Any:
    """Load a ``torch_payload`` into ``model``/``optimizer``, restore RNGs; return ``extra``.

    Tensors are loaded onto ``map_location``, by default the device of the model's first
    parameter (the CPU for a model without any), wherever they were saved: a job moved from a
    GPU to a CPU or back resumes where it stopped. The CUDA generators are restored where the
    same number of GPUs is visible; elsewhere the job's CUDA draws simply start afresh."""
    import torch  # noqa: PLC0415 - lazy: jobkit must work in scripts without torch

    if map_location is None:
        first = next(itertools.chain(model.parameters(), model.buffers()), None)
        map_location = first.device if first is not None else torch.device("cpu")
    state = torch.load(io.BytesIO(payload), map_location=map_location, weights_only=True)
    if not isinstance(state, dict) or state.get("format") != _PAYLOAD_FORMAT:
        raise ValueError("not a specon.jobkit torch payload")
    model.load_state_dict(state["model"])
    if optimizer is not None and state["optimizer"] is not None:
        for per_param in state["optimizer"].get("state", {}).values():
            # On the CPU, where a fresh optimizer keeps its step count (no GPU sync per step);
            # a fused or capturable one moves it to its parameter itself.
            if isinstance(step := per_param.get("step"), torch.Tensor):
                per_param["step"] = step.cpu()
        optimizer.load_state_dict(state["optimizer"])
    set_rng_state(state["rng"])
    cuda_rng = state.get("cuda_rng")
    if cuda_rng is not None and torch.cuda.is_available() and len(cuda_rng) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([s.cpu() for s in cuda_rng])
    return state["extra"]
