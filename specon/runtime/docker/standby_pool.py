"""The Docker runtime's standby containers (``standby`` says what and why): one per (GPU,
image) the host names, which job may use one, the hand-over, and a fresh one after each.

Each standby has its own directory under the agent's socket directory (mode 0700), where the
agent listens on a unix socket before the container starts; the container sees only that
directory, read-only, and its server connects once primed and says so. The connection is the
standby's lifeline: when the agent goes, the idle standby reads EOF and exits.

The hand-over of a job (``launch``, blocking: the runtime calls it in a thread), with the
job's lock and its write-ahead owner record held by the runtime:

1. a ready standby of the job's image (``refusal`` decides whether the job may use one);
2. the recipe's CPU limits on it (``docker update``) and its new name, the job's id (``docker
   rename``; labels cannot change, names can), so every listing reports it as the job;
3. the owner record naming that container, before anything can run in it;
4. the request with a detached clone of the job's directory (``detached_clone``); the
   standby's answer ``{"pid": N}``.

Any failure on the way removes the standby's container (nothing runs in it then) and the job
starts cold. Whatever happened, a fresh standby for that GPU and image starts in the
background; one that dies without a job is replaced no sooner than ``RESPAWN_S`` after its
start.
"""

from __future__ import annotations

import array
import contextlib
import ctypes
import errno
import json
import os
import shutil
import socket
import threading
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

import docker
import docker.errors
import structlog

from specon.runtime.docker.engine import standby_kwargs
from specon.runtime.docker.recipe import HostRules, Recipe
from specon.runtime.docker.standby import (
    LABEL_STANDBY,
    NAME_PREFIX,
    SOCKET_NAME,
    HandOver,
    StandbyConfig,
    config_problems,
    idle_standby,
    job_env,
    refusal,
    standby_name,
)
from specon.runtime.local.zygote import read_line
from specon.runtime.volume import JobPaths, Owner

__all__ = ["RESPAWN_S", "StandbyContainers", "cpu_limits", "detached_clone"]

log = structlog.get_logger()

RESPAWN_S = 30.0
_REPLY_TIMEOUT_S = 10.0
_HELLO_TIMEOUT_S = 2.0
_SYS_OPEN_TREE = 428  # the same number on every architecture since Linux 5.2
_OPEN_TREE_CLONE = 1
_AT_FDCWD = -100
_CPU_PERIOD_US = 100_000


def detached_clone(path: Path) -> int:
    """A descriptor of a detached bind mount of the directory ``path`` (``open_tree`` with
    ``OPEN_TREE_CLONE``): ``..`` from its root stays there, so a process handed it reaches
    nothing above it, in any mount namespace. ``OSError`` where the kernel (before 5.2) or
    the caller's privileges (CAP_SYS_ADMIN) do not allow it."""
    libc = ctypes.CDLL(None, use_errno=True)
    flags = _OPEN_TREE_CLONE | os.O_CLOEXEC
    fd = int(libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, os.fsencode(path), flags))
    if fd < 0:
        err = ctypes.get_errno() or errno.EINVAL
        raise OSError(err, f"open_tree({path}): {os.strerror(err)}")
    return fd


def cpu_limits(recipe: Recipe) -> dict[str, int]:
    """``docker update`` arguments for the recipe's CPU limits (the SDK updates no
    ``nano_cpus``: the same limit as a quota per period)."""
    out = {} if recipe.cpu_shares is None else {"cpu_shares": recipe.cpu_shares}
    if recipe.nano_cpus is not None:
        out |= {"cpu_period": _CPU_PERIOD_US, "cpu_quota": recipe.nano_cpus * _CPU_PERIOD_US // 10**9}
    return out


def _listen(directory: Path) -> socket.socket:
    """A listener on ``directory/s``, however long the path (bound through /proc/self/fd)."""
    dfd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        srv.bind(f"/proc/self/fd/{dfd}/{SOCKET_NAME}")
        os.chmod(directory / SOCKET_NAME, 0o666)  # the image's user connects: only it sees the directory
        srv.listen(1)
        srv.setblocking(False)
    except OSError:
        srv.close()
        raise
    finally:
        os.close(dfd)
    return srv


@dataclass
class _Standby:
    gpu: int
    image: str
    name: str
    id: str
    dir: Path
    listener: socket.socket
    started: float
    conn: socket.socket | None = None

    def close(self) -> None:
        for s in (self.conn, self.listener):
            if s is not None:
                s.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class StandbyContainers:
    """One Docker host's standby containers (``config``), checked against its ``rules``."""

    def __init__(
        self,
        client: docker.DockerClient,
        worker: str,
        config: StandbyConfig,
        rules: HostRules,
        *,
        socket_dir: Path,
        migration_mode: str,
    ) -> None:
        why = config_problems(config, rules)
        if why:
            raise ValueError("standby containers: " + "; ".join(why))
        self.client = client
        self.worker = worker
        self.config = config
        self.migration_mode = migration_mode
        self.launches = 0
        self.failures = 0
        self.respawns = 0
        self._dir = socket_dir
        self._lock = threading.Lock()
        self._closed = False
        self._standbys: dict[tuple[str, int], _Standby] = {}
        self._threads: list[threading.Thread] = []
        self._dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self._dir, 0o700)
        self.off: str | None = None
        try:
            os.close(detached_clone(self._dir))
        except OSError as exc:
            self.off = f"cannot hand a job its directory: {exc} (needs Linux >= 5.2 and CAP_SYS_ADMIN)"
            log.warning("specon.docker.standby_off", worker=worker, reason=self.off)
            return
        self._remove_leftovers()
        for image in config.images:
            for gpu in config.gpus:
                self._spawn(image, gpu)

    # -- what the runtime calls ----------------------------------------------------------------
    def launch(self, recipe: Recipe, job: str, paths: JobPaths, owner: Owner) -> Owner | None:
        """Hand ``job`` (its recipe, directory and write-ahead record) to a ready standby; the
        owner record naming its container, or None: it starts cold (nothing runs here then)."""
        sb = None if job.startswith(NAME_PREFIX) else self.take(recipe)  # it would look idle
        if sb is None:
            return None
        try:
            return self._hand_over(sb, recipe, job, paths, owner)
        finally:
            sb.close()
            self._spawn_later(sb.image, sb.gpu)

    def take(self, recipe: Recipe) -> _Standby | None:
        """The ready standby ``recipe``'s job may use now, no longer offered to any other."""
        why = refusal(recipe, self.config, migration_mode=self.migration_mode)
        if why is not None or self.off is not None:
            return None
        with self._lock:
            self._tend()
            for key, sb in sorted(self._standbys.items()):
                if sb.image == recipe.image and self._ready(sb):
                    del self._standbys[key]
                    return sb
        return None

    def ready(self) -> dict[tuple[str, int], bool]:
        """Which standbys are primed and connected now, by (image, GPU)."""
        with self._lock:
            return {key: self._ready(sb) for key, sb in self._standbys.items()}

    def close(self) -> None:
        """Remove the idle standbys (jobs handed over run on) and the socket directory."""
        with self._lock:
            self._closed = True
            standbys, self._standbys = list(self._standbys.values()), {}
        for t in self._threads:
            t.join(timeout=30)
        for sb in standbys:
            self._remove(sb.id)
            sb.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    # -- the hand-over -------------------------------------------------------------------------
    def _hand_over(
        self, sb: _Standby, recipe: Recipe, job: str, paths: JobPaths, owner: Owner
    ) -> Owner | None:
        assert sb.conn is not None
        step = "update"
        try:
            c = self.client.containers.get(sb.id)
            limits = cpu_limits(recipe)
            if limits:
                c.update(**limits)
            step = "rename"
            c.rename(job)
            step = "owner record"
            full = replace(owner, handle=c.id)
            paths.write_owner(full)  # before anything can run in it
            step = "hand-over"
            req = HandOver(self.config.module, tuple(recipe.command[3:]), job_env(recipe, job, self.worker),
                           owner.run_id, self.worker)  # fmt: skip
            fd = detached_clone(paths.dir)
            try:
                sb.conn.sendmsg(
                    [req.encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
                )
            finally:
                os.close(fd)
            sb.conn.settimeout(_REPLY_TIMEOUT_S)
            reply = json.loads(read_line(sb.conn) or b"null")
            pid = reply.get("pid") if isinstance(reply, dict) else None
            if not isinstance(pid, int):
                raise ValueError(f"the standby refused: {reply}")
        except (docker.errors.APIError, OSError, ValueError) as exc:
            self.failures += 1
            self._remove(sb.id)  # nothing may run unrecorded: the job starts cold
            log.warning(
                "specon.docker.standby_failed",
                worker=self.worker,
                container=job,
                gpu=sb.gpu,
                step=step,
                error=str(exc),
            )
            return None
        self.launches += 1
        log.info(
            "specon.docker.standby_used",
            worker=self.worker,
            container=job,
            gpu=sb.gpu,
            image=sb.image,
            pid=pid,
        )
        return full

    # -- standbys --------------------------------------------------------------------------------
    def _ready(self, sb: _Standby) -> bool:
        """Primed and connected (its hello read), accepting the connection if it is new."""
        if sb.conn is not None:
            return True
        try:
            conn, _ = sb.listener.accept()
        except (BlockingIOError, InterruptedError):
            return False
        conn.setblocking(True)
        conn.settimeout(_HELLO_TIMEOUT_S)
        try:
            hello = json.loads(read_line(conn) or b"null")
        except (OSError, ValueError):
            hello = None
        if not (isinstance(hello, dict) and hello.get("ready") is True):
            conn.close()
            return False
        sb.conn = conn
        took = hello.get("primed_s")
        log.info("specon.docker.standby_ready", worker=self.worker, gpu=sb.gpu, image=sb.image, primed_s=took)
        return True

    def _spawn(self, image: str, gpu: int) -> None:
        token = uuid.uuid4().hex[:12]
        name = standby_name(gpu, token)
        d = self._dir / token
        try:
            d.mkdir(mode=0o711)
            os.chmod(d, 0o711)  # searchable by the image's user; the parent keeps everyone else out
            listener = _listen(d)
        except OSError as exc:
            log.warning(
                "specon.docker.standby_failed", worker=self.worker, gpu=gpu, step="socket", error=str(exc)
            )
            shutil.rmtree(d, ignore_errors=True)
            return
        try:
            kwargs = standby_kwargs(self.config, image, gpu, name=name, socket_dir=d)
            c = self.client.containers.create(**kwargs)
            c.start()
        except docker.errors.APIError as exc:  # ImageNotFound included
            listener.close()
            shutil.rmtree(d, ignore_errors=True)
            self._remove(name)
            log.warning(
                "specon.docker.standby_failed", worker=self.worker, gpu=gpu, step="create", error=str(exc)
            )
            return
        sb = _Standby(gpu, image, name, str(c.id), d, listener, time.monotonic())
        with self._lock:
            if self._closed:
                closed = True
            else:
                closed = False
                self._standbys[(image, gpu)] = sb
        if closed:
            self._remove(sb.id)
            sb.close()
            return
        log.info("specon.docker.standby_starting", worker=self.worker, gpu=gpu, image=image, container=name)

    def _spawn_later(self, image: str, gpu: int) -> None:
        t = threading.Thread(target=self._spawn, args=(image, gpu), name=f"standby-g{gpu}", daemon=True)
        self._threads = [x for x in self._threads if x.is_alive()] + [t]
        t.start()

    def _tend(self) -> None:
        """Replace a standby whose container ended without a job (held lock)."""
        now = time.monotonic()
        for key, sb in list(self._standbys.items()):
            if sb.conn is not None or now - sb.started < RESPAWN_S:
                continue
            try:
                status = self.client.containers.get(sb.id).status
            except docker.errors.NotFound:
                status = "gone"
            except docker.errors.APIError:
                continue
            if status in ("running", "created", "restarting"):
                continue
            log.warning(
                "specon.docker.standby_died", worker=self.worker, gpu=sb.gpu, image=sb.image, status=status
            )
            del self._standbys[key]
            self._remove(sb.id)
            sb.close()
            self.respawns += 1
            self._spawn_later(sb.image, sb.gpu)

    def _remove(self, ident: str) -> None:
        with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
            self.client.api.remove_container(ident, force=True)

    def _remove_leftovers(self) -> None:
        """A previous agent's idle standbys (its sockets are gone: they exit or never start)."""
        found = self.client.containers.list(all=True, filters={"label": LABEL_STANDBY}, ignore_removed=True)
        for c in found:
            if idle_standby(c.labels or {}, c.name or ""):
                self._remove(str(c.id))
        for entry in self._dir.iterdir():
            shutil.rmtree(entry, ignore_errors=True)
