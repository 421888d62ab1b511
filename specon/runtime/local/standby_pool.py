"""A local runtime's side of the GPU standbys (``specon.runtime.local.standby``): one primed
interpreter per GPU, which jobs may use one, the hand-over, and a fresh standby after each.

Which jobs: one that asks for exactly one GPU (``requests.gpu == 1``: a standby's CUDA sees its
own GPU only) and whose command is ``<this Python> -m <the module>`` (the built-in workloads by
default; a request names a module, never a program). The GPU request decides, not a
``--device`` argument: the runtime never parses a job's arguments, and the request is what
placement reserved the GPU for. A job whose own environment names its GPU
(``CUDA_VISIBLE_DEVICES``, one index) gets that GPU's standby or none; any other gets the
first ready standby in the order the runtime was given, and its environment then names that
GPU. Every other job, and every job while no fitting standby is ready (priming, or just used),
starts as before: from the warm interpreter where it runs one, else cold.

A standby handed a job is the job from then on (its keeper is the run's launcher, a child of
this process, reaped here); the pool starts a fresh one for that GPU at once, which primes in
the background. A standby that died without a job (a failed import, a CUDA error) is started
again at most every ``RESPAWN_S`` seconds. Standbys run with the environment a job gets (never
the agent's secrets) and exit when this process does.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from specon.runtime.base import JobSpec
from specon.runtime.local.warm import WarmLaunchError, WarmNoAnswerError, module_args
from specon.runtime.local.zygote import WORKLOADS_MODULE, WORKLOADS_PRELOAD, Request, read_line
from specon.runtime.volume import AGENT_ONLY_ENV

log = structlog.get_logger()

DEVICE_ENV = "CUDA_VISIBLE_DEVICES"
# A standby that died without a job is started again no sooner than this after its start.
RESPAWN_S = 30.0
# The hand-over enters cgroups and opens files in two processes: milliseconds.
_REPLY_TIMEOUT_S = 10.0
_STOP_WAIT_S = 5.0
# Not ``-m``: the package imports the module first and runpy would run it a second time.
_SERVE = "import sys; from specon.runtime.local.standby import main; sys.exit(main(sys.argv[1:]))"


@dataclass(frozen=True, slots=True)
class StandbySpec:
    """What a worker's standbys run and import ahead; ``prime`` False skips the torch warm-up
    (imports only: for modules that do not use torch)."""

    module: str = WORKLOADS_MODULE
    preload: tuple[str, ...] = WORKLOADS_PRELOAD
    prime: bool = True


def gpu_env(gpu: int) -> dict[str, str]:
    """The environment that shows CUDA the one GPU ``gpu``, numbered as NVML numbers it (PCI
    bus order: CUDA's own default order is fastest first)."""
    return {DEVICE_ENV: str(gpu), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def choose(spec: JobSpec, gpus: Sequence[int], ready: Callable[[int], bool]) -> int | None:
    """The GPU whose standby may run ``spec`` now (the module's command is checked apart):
    None unless the job asks for exactly one GPU; the GPU its environment names, if it names
    one, else the first ready one of ``gpus``."""
    if spec.requests.gpu != 1:
        return None
    named = dict(spec.env).get(DEVICE_ENV)
    candidates = list(gpus) if named is None else [g for g in gpus if str(g) == named.strip()]
    return next((g for g in candidates if ready(g)), None)


class Standby:
    """One GPU's standby: its keeper process (the group) and the socket it serves once primed."""

    def __init__(self, pool: StandbyPool, gpu: int, proc: subprocess.Popen[bytes], path: Path) -> None:
        self.gpu = gpu
        self.proc = proc
        self.socket = path
        self.started = time.monotonic()
        self._pool = pool

    @property
    def module(self) -> str:
        return self._pool.spec.module

    @property
    def env(self) -> dict[str, str]:
        """What the job's environment gains: the GPU this standby's CUDA was initialised on."""
        return gpu_env(self.gpu)

    @property
    def ready(self) -> bool:
        """Primed and serving (the socket appears only then)."""
        return self.proc.poll() is None and self.socket.exists()

    def runs(self, command: Sequence[str]) -> tuple[str, ...] | None:
        """The module's arguments if this standby can run ``command`` (``warm.module_args``)."""
        return self._pool.runs(command)

    def launch(self, req: Request) -> int | None:
        """Hand ``req``'s job over (``StandbyPool.launch``)."""
        return self._pool.launch(self, req)


class StandbyPool:
    """One worker's standbys, one per GPU index (numbered as NVML numbers them)."""

    def __init__(
        self,
        worker: str,
        gpus: Sequence[int],
        spec: StandbySpec | None = None,
        *,
        python: str = sys.executable,
    ) -> None:
        if len(set(gpus)) != len(gpus) or any(isinstance(g, bool) or g < 0 for g in gpus):
            raise ValueError(f"GPU indexes must be distinct integers >= 0, got {list(gpus)}")
        self.worker = worker
        self.spec = spec or StandbySpec()
        self.python = python
        self.gpus = tuple(int(g) for g in gpus)
        self.launches = 0
        self.respawns = 0
        self._generation = 0
        self._spent: list[subprocess.Popen[bytes]] = []  # keepers handed a job: reaped here
        self._dir = Path(tempfile.mkdtemp(prefix=f"specon-standby-{worker}-"))  # mode 0700
        self._env = {k: v for k, v in os.environ.items() if k not in AGENT_ONLY_ENV}
        self.standbys = {g: self._spawn(g) for g in self.gpus}

    def runs(self, command: Sequence[str]) -> tuple[str, ...] | None:
        """The module's arguments if ``command`` is ``<this python> -m <module> ...``."""
        return module_args(command, self.python, self.spec.module)

    def take(self, spec: JobSpec) -> Standby | None:
        """The ready standby that may run ``spec`` now, if any (``choose``)."""
        self._tend()
        if self.runs(spec.command) is None:
            return None
        gpu = choose(spec, self.gpus, lambda g: self.standbys[g].ready)
        return None if gpu is None else self.standbys[gpu]

    def launch(self, standby: Standby, req: Request) -> int | None:
        """Hand ``req``'s job to ``standby``; the keeper's pid (the job's process group). None
        when it is not there to ask (start otherwise); ``WarmLaunchError`` when it tried and
        could not set the job up; ``WarmNoAnswerError`` when it was asked but did not answer
        (a job may run: never start it otherwise)."""
        if self.standbys.get(standby.gpu) is not standby or not standby.ready:
            return None
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(_REPLY_TIMEOUT_S)
            try:
                s.connect(str(standby.socket))
            except OSError as exc:  # nothing was asked: another start is safe
                log.warning(
                    "specon.runtime.standby_unavailable", worker=self.worker, gpu=standby.gpu, error=str(exc)
                )
                return None
            try:
                s.sendall(req.encode())
                reply = read_line(s)
                answer = json.loads(reply)
            except (OSError, ValueError) as exc:
                self._used(standby)
                raise WarmNoAnswerError(f"no answer from the GPU {standby.gpu} standby: {exc}") from exc
        pid = answer.get("pid") if isinstance(answer, dict) else None
        if isinstance(pid, int) and pid == standby.proc.pid:
            self._used(standby)
            self.launches += 1
            log.info("specon.runtime.standby_used", worker=self.worker, gpu=standby.gpu, pid=pid)
            return pid
        if isinstance(pid, int):  # not its keeper: a job may run that nothing here knows
            self._used(standby)
            raise WarmNoAnswerError(f"the GPU {standby.gpu} standby answered pid {pid}, not its keeper's")
        if isinstance(answer, dict) and answer.get("spent") is True:
            self._used(standby)
        error = answer.get("error") if isinstance(answer, dict) else None
        raise WarmLaunchError(str(error or f"unexpected reply {reply[:200]!r}"))

    def close(self) -> None:
        """Stop the standbys not handed a job (their groups: keeper and standby); jobs run on."""
        standbys, self.standbys = self.standbys, {}
        for sb in standbys.values():
            if sb.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(sb.proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    sb.proc.wait(_STOP_WAIT_S)
        self._reap()
        with contextlib.suppress(OSError):
            shutil.rmtree(self._dir)

    # -- internals ---------------------------------------------------------------------------
    def _spawn(self, gpu: int) -> Standby:
        self._generation += 1
        path = self._dir / f"g{gpu}-{self._generation}.sock"  # a unix socket path has 107 bytes
        argv = [self.python, "-c", _SERVE, str(path), "--gpu", str(gpu), "--module", self.spec.module]
        argv += ["--parent", str(os.getpid())]  # it may be gone before the keeper looks
        argv += [a for m in self.spec.preload for a in ("--preload", m)]
        if not self.spec.prime:
            argv.append("--no-prime")
        with open(self._dir / f"g{gpu}.log", "ab") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=self._env | gpu_env(gpu),
                cwd=self._dir,
                start_new_session=True,  # the group the runtime signals once it is a job
                close_fds=True,
            )
        log.info("specon.runtime.standby_starting", worker=self.worker, gpu=gpu, pid=proc.pid)
        return Standby(self, gpu, proc, path)

    def _used(self, standby: Standby) -> None:
        """``standby`` was handed a job (or may have been): never asked again; a fresh one."""
        self._spent.append(standby.proc)
        self.standbys[standby.gpu] = self._spawn(standby.gpu)

    def _tend(self) -> None:
        self._reap()
        now = time.monotonic()
        for gpu, sb in list(self.standbys.items()):
            code = sb.proc.poll()
            if code is not None and now - sb.started >= RESPAWN_S:
                log.warning(
                    "specon.runtime.standby_died",
                    worker=self.worker,
                    gpu=gpu,
                    exit_code=code,
                    log=str(self._dir / f"g{gpu}.log"),
                )
                self.respawns += 1
                self.standbys[gpu] = self._spawn(gpu)

    def _reap(self) -> None:
        self._spent = [p for p in self._spent if p.poll() is None]
