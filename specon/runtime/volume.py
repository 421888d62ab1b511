"""The shared persistent volume: where a job's state lives, whichever worker runs it.

Layout under a root directory (the same for every backend that mounts the volume)::

    <root>/jobs/<job_id>/spec.json        the JobSpec, written at each start
                        progress.jsonl   the job's progress log ($SPECON_PROGRESS_FILE)
                        checkpoints/     specon.checkpoint files ($SPECON_CHECKPOINT_DIR)
                        done             the job's done marker ($SPECON_DONE_FILE)
                        owner.json       who runs it now; absent when it runs nowhere
                        generation.json  the newest run's generation (fencing, ``specon.fence``)
                        exits.jsonl      one ExitRecord per ended run
                        owner.lock       flock serialising start/forget across agents
                        stdout.log, stderr.log

The progress log and checkpoints stay in place when a job moves between workers: that is
the point of the volume. ``owner.json`` is replaced atomically (temp file, fsync, rename)
and removed when the job stops running anywhere.

Jobs can write in their own directory, so its records are read as untrusted files: through
``specon.checkpoint.open_regular`` (a symlink is not followed, a FIFO never waited on) and
with a size bound, so a record cannot hang, flood or redirect the agent that reads it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from specon.checkpoint import (
    FileTooLargeError,
    NotRegularFileError,
    atomic_write,
    fsync_dir,
    open_regular,
    read_regular,
)
from specon.fence import ENV_GENERATION, GENERATION_FILE
from specon.model import ContainerId, WorkerId
from specon.progress.last import last_event
from specon.runtime.base import (
    ENV_CHECKPOINT_DIR,
    ENV_DONE_FILE,
    ENV_JOB_ID,
    ENV_PROGRESS_FILE,
    ENV_WORKER,
    JobSpec,
    RuntimeFailure,
    valid_job_id,
)
from specon.runtime.local.launcher import ExitRecord, append_exit
from specon.wire import codec

__all__ = [
    "CorruptRecordError",
    "ExitRecord",
    "JobPaths",
    "Owner",
    "append_exit",
    "iter_job_ids",
    "job_lock",
    "read_spec",
    "write_spec",
]

# The agent's environment a local job must not inherit.
AGENT_ONLY_ENV = frozenset(
    {"SPECON_TOKEN", "CREDENTIALS_DIRECTORY", "NOTIFY_SOCKET", "INVOCATION_ID", "JOURNAL_STREAM"}
)

# Largest record files read whole: far above any real owner.json or spec.json.
OWNER_MAX = 1 << 16
SPEC_MAX = 1 << 20
# exits.jsonl gains a line per run; beyond this only its newest lines are read.
EXITS_MAX = 1 << 22


class CorruptRecordError(ValueError):
    """A record on the volume (owner.json, spec.json) cannot be read; says which and why."""


@dataclass(frozen=True, slots=True)
class Owner:
    """``owner.json``: which worker runs a job and how to recognise its process."""

    worker: WorkerId
    run_id: str
    started_at: float
    # The host's boot id: a pid and start time identify a process only on the host (and
    # boot) that issued them, so a record from elsewhere can never be verified here.
    host: str
    pid: int | None = None
    # Process start time in clock ticks since boot (/proc/<pid>/stat field 22); with the pid
    # it is safe against pid reuse.
    start_ticks: int | None = None
    # An opaque backend handle (a Docker container id, a pod name) for non-local backends.
    handle: str | None = None
    # The run's generation (``generation.json`` as its start set it; None: an older agent's).
    generation: int | None = None

    @property
    def provisional(self) -> bool:
        """Written ahead of the launch: neither a pid nor a handle names the run yet."""
        return self.pid is None and self.handle is None


@dataclass(frozen=True, slots=True)
class JobPaths:
    """Every path of one job on the volume."""

    root: Path
    job: ContainerId

    @classmethod
    def of(cls, root: Path, job: str) -> JobPaths:
        """The paths of ``job``; ``ValueError`` if the id is not a safe path component."""
        return cls(root, valid_job_id(job))

    @property
    def dir(self) -> Path:
        return self.root / "jobs" / self.job

    @property
    def spec(self) -> Path:
        return self.dir / "spec.json"

    @property
    def progress(self) -> Path:
        return self.dir / "progress.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.dir / "checkpoints"

    @property
    def done(self) -> Path:
        return self.dir / "done"

    @property
    def owner(self) -> Path:
        return self.dir / "owner.json"

    @property
    def exits(self) -> Path:
        return self.dir / "exits.jsonl"

    @property
    def lock(self) -> Path:
        return self.dir / "owner.lock"

    @property
    def stdout(self) -> Path:
        return self.dir / "stdout.log"

    @property
    def stderr(self) -> Path:
        return self.dir / "stderr.log"

    def create(self) -> None:
        self.checkpoints.mkdir(parents=True, exist_ok=True)

    def env(self, spec: JobSpec, worker: WorkerId, generation: int | None = None) -> dict[str, str]:
        """The environment a local run of ``spec`` on ``worker`` gets (the job contract's),
        naming the ``generation`` the run starts in (``specon.fence``)."""
        # Never the agent's own secrets: a job is not the agent (its token speaks for the
        # worker, and under systemd the credentials directory holds it).
        env = {k: v for k, v in os.environ.items() if k not in AGENT_ONLY_ENV}
        env["OMP_NUM_THREADS"] = "1"  # jobs share a small CPU budget; the job's env may override
        env.update(spec.env)
        env.update(
            {
                ENV_JOB_ID: spec.id,
                ENV_WORKER: worker,
                ENV_PROGRESS_FILE: str(self.progress),
                ENV_CHECKPOINT_DIR: str(self.checkpoints),
                ENV_DONE_FILE: str(self.done),
            }
        )
        if generation is not None:
            env[ENV_GENERATION] = str(generation)
        return env

    # -- owner.json -------------------------------------------------------------------
    def read_owner(self) -> Owner | None:
        """The owner record, None when the job runs nowhere; ``CorruptRecordError`` if unreadable."""
        try:
            raw = json.loads(read_regular(self.owner, OWNER_MAX))
        except FileNotFoundError:
            return None
        except (NotRegularFileError, FileTooLargeError, ValueError) as exc:
            raise CorruptRecordError(f"{self.owner}: {exc}") from exc
        try:
            # Keys a newer agent added are ignored: the volume is shared across versions.
            return codec.from_data(Owner, raw, strict=False)
        except codec.SchemaError as e:
            raise CorruptRecordError(f"{self.owner}: {codec.explain(e)}") from None

    def write_owner(self, owner: Owner) -> None:
        data = codec.to_data(owner, Owner)
        if data.get("generation") is None:  # an older agent's record is written back as it was
            data.pop("generation", None)
        atomic_write(self.owner, json.dumps(data, sort_keys=True).encode())
        fsync_dir(self.dir)

    def clear_owner(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.owner.unlink()
            fsync_dir(self.dir)

    # -- spec.json --------------------------------------------------------------------
    # -- generation.json ----------------------------------------------------------------
    @property
    def generation(self) -> Path:
        return self.dir / GENERATION_FILE

    def read_generation(self) -> int:
        """The newest run's generation (0: none started with one); ``CorruptRecordError``."""
        return read_generation(self.generation)

    def bump_generation(self) -> int:
        """Start a new generation (call with the job's lock held): every older run is stale
        from now on and a job using ``specon.jobkit`` stops at its next commit without writing."""
        n = self.read_generation() + 1
        atomic_write(self.generation, json.dumps({"generation": n}).encode())
        fsync_dir(self.dir)
        return n

    def read_spec(self) -> JobSpec:
        return read_spec(self.spec)

    def write_spec(self, spec: JobSpec) -> None:
        write_spec(self.spec, spec)

    # -- exits.jsonl ------------------------------------------------------------------
    def read_exits(self) -> tuple[list[ExitRecord], int]:
        """All exit records, oldest first, and the number of unreadable lines skipped.

        Of a file longer than ``EXITS_MAX`` only the newest records are read (the line cut
        counts as unreadable); a file that is not a regular one has no readable record.
        """
        try:
            fd = open_regular(self.exits)
        except FileNotFoundError:
            return [], 0
        except NotRegularFileError:
            return [], 1
        try:
            size = os.fstat(fd).st_size
            start = max(0, size - EXITS_MAX)
            lines = os.pread(fd, size - start, start).splitlines()
        finally:
            os.close(fd)
        records: list[ExitRecord] = []
        bad = 0
        if start > 0 and lines:
            lines, bad = lines[1:], 1  # the cut line
        for line in lines:
            if not line.strip():
                continue
            try:
                records.append(ExitRecord.decode(line))
            except ValueError:
                bad += 1
        return records, bad

    def exit_of(self, run_id: str) -> ExitRecord | None:
        """The first record of one run: the launcher's own, when it wrote one, comes first."""
        return next((r for r in self.read_exits()[0] if r.run_id == run_id), None)

    def append_exit(self, record: ExitRecord) -> None:
        append_exit(self.exits, record)

    # -- completion -------------------------------------------------------------------
    def finished(self) -> bool:
        """The job completed its work: a done marker, or a final ``{"event": "finished"}``."""
        return self.done.exists() or last_event(self.progress) == "finished"


def read_spec(path: Path) -> JobSpec:
    """A ``JobSpec`` file (``spec.json``, the Docker agents' recorded specs);
    ``CorruptRecordError`` saying why when it is missing or unreadable."""
    try:
        return JobSpec.from_json(json.loads(read_regular(path, SPEC_MAX)))
    except FileNotFoundError as exc:
        raise CorruptRecordError(f"{path}: missing") from exc
    except (NotRegularFileError, FileTooLargeError, ValueError) as exc:
        raise CorruptRecordError(f"{path}: {exc}") from exc


def write_spec(path: Path, spec: JobSpec) -> None:
    """Replace ``path`` with ``spec`` atomically."""
    atomic_write(path, json.dumps(spec.to_json(), sort_keys=True).encode())


LOCK_TIMEOUT_S = 10.0


@contextlib.asynccontextmanager
async def job_lock(paths: JobPaths, sleep: Callable[[float], Awaitable[None]]) -> AsyncIterator[None]:
    """The job's cross-agent lock: ``flock`` on ``owner.lock``, per open file, so it also
    works between runtimes of one process. ``RuntimeFailure`` if it stays held 10 s."""
    fd = os.open(paths.lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise RuntimeFailure(paths.job, f"{paths.lock} stayed locked") from None
                await sleep(0.01)
        yield
    finally:
        os.close(fd)


def iter_job_ids(root: Path) -> Iterator[ContainerId]:
    """The ids of every job directory on the volume (names that are not ids are skipped)."""
    try:
        names = sorted(os.listdir(root / "jobs"))
    except FileNotFoundError:
        return
    for name in names:
        with contextlib.suppress(ValueError):
            yield valid_job_id(name)


def read_generation(path: Path) -> int:
    """The generation in ``path`` (0: absent); ``CorruptRecordError`` if it cannot be read."""
    try:
        raw = json.loads(read_regular(path, OWNER_MAX))
    except FileNotFoundError:
        return 0
    except (NotRegularFileError, FileTooLargeError, ValueError) as exc:
        raise CorruptRecordError(f"{path}: {exc}") from exc
    n = raw.get("generation") if isinstance(raw, dict) else None
    if not isinstance(n, int) or isinstance(n, bool) or n < 0:
        raise CorruptRecordError(f'{path}: expected {{"generation": N}}, got {str(raw)[:80]}')
    return n
