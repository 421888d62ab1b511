"""A local runtime's side of the warm interpreter (``specon.runtime.local.zygote``): start it, say
which jobs it can run, ask it to fork one, stop it.

Only a job whose command is ``<this Python> -m specon.workloads ...`` (the built-in
workloads, the demo's and the benchmarks' jobs) runs warm; any other command, and every job
while the interpreter is still importing or has died, starts cold as before. The server
runs in a directory only this user can enter, with the environment a job gets (never the
agent's secrets), and exits when the runtime's process does.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from specon.runtime.local.zygote import WORKLOADS_MODULE, WORKLOADS_PRELOAD, Request, read_line
from specon.runtime.volume import AGENT_ONLY_ENV

log = structlog.get_logger()

# A request forks a launcher that enters its cgroups and opens its files: milliseconds.
_REPLY_TIMEOUT_S = 10.0
_STOP_WAIT_S = 5.0
_SERVE = "import sys; from specon.runtime.local.zygote import main; sys.exit(main(sys.argv[1:]))"


class WarmLaunchError(Exception):
    """The warm interpreter tried and could not set the job up (nothing runs)."""


class WarmNoAnswerError(Exception):
    """The request reached the warm interpreter but its answer did not come back: a job may
    or may not run. Never start it cold then; the run's provisional owner record lets a
    later start find its launcher by name if it does."""


@dataclass(frozen=True, slots=True)
class WarmSpec:
    """Which module a worker's warm interpreter runs, and what it imports ahead for it."""

    module: str = WORKLOADS_MODULE
    preload: tuple[str, ...] = WORKLOADS_PRELOAD


def module_args(command: Sequence[str], python: str, module: str) -> tuple[str, ...] | None:
    """The module's arguments if ``command`` is ``<python> -m <module> ...`` (``python`` the
    same interpreter, by path or found on ``PATH``); None for any other command."""
    if len(command) < 3 or command[1] != "-m" or command[2] != module:
        return None
    exe = shutil.which(command[0]) if os.sep not in command[0] else command[0]
    if exe is None or os.path.realpath(exe) != os.path.realpath(python):
        return None
    return tuple(command[3:])


class WarmInterpreter:
    """One warm interpreter for one worker's jobs."""

    def __init__(self, worker: str, spec: WarmSpec = WarmSpec(), *, python: str = sys.executable) -> None:
        self.worker = worker
        self.python = python
        self.module = spec.module
        self._dir = Path(tempfile.mkdtemp(prefix=f"specon-warm-{worker}-"))  # mode 0700
        self.socket = self._dir / "zygote.sock"
        self.launches = 0
        env = {k: v for k, v in os.environ.items() if k not in AGENT_ONLY_ENV}
        # Not ``-m specon.runtime.local.zygote``: the package imports the module first, and runpy
        # would then run it a second time as __main__ (a RuntimeWarning in every server's log).
        argv = [python, "-c", _SERVE, str(self.socket), "--module", spec.module]
        argv += ["--parent", str(os.getpid())]  # it may be gone before the server looks
        argv += [a for m in spec.preload for a in ("--preload", m)]
        with open(self._dir / "zygote.log", "ab") as out:
            self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env=env,
                cwd=self._dir,
                start_new_session=True,  # a Ctrl-C meant for the agent is not its own
                close_fds=True,
            )
        log.info("specon.runtime.warm_starting", worker=worker, pid=self._proc.pid, module=spec.module)

    def runs(self, command: Sequence[str]) -> tuple[str, ...] | None:
        """The module's arguments if this interpreter can run ``command`` (``module_args``)."""
        return module_args(command, self.python, self.module)

    @property
    def ready(self) -> bool:
        """Imported and serving (else a launch starts cold)."""
        return self._proc is not None and self._proc.poll() is None and self.socket.exists()

    def launch(self, req: Request) -> int | None:
        """Fork ``req``'s job; the launcher's pid (its process group). None when the warm
        interpreter is not there to ask (start it cold); ``WarmLaunchError`` when it tried and
        could not set the job up; ``WarmNoAnswerError`` when it was asked but did not answer."""
        if not self.ready:
            return None
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(_REPLY_TIMEOUT_S)
            try:
                s.connect(str(self.socket))
            except OSError as exc:  # nothing was asked: a cold start is safe
                log.warning("specon.runtime.warm_unavailable", worker=self.worker, error=str(exc))
                return None
            try:
                s.sendall(req.encode())
                reply = read_line(s)
                answer = json.loads(reply)
            except (OSError, ValueError) as exc:
                raise WarmNoAnswerError(f"no answer from the warm interpreter: {exc}") from exc
        if isinstance(answer, dict) and isinstance(answer.get("pid"), int):
            self.launches += 1
            return int(answer["pid"])
        error = answer.get("error") if isinstance(answer, dict) else None
        raise WarmLaunchError(str(error or f"unexpected reply {reply[:200]!r}"))

    def close(self) -> None:
        """Stop the interpreter (its jobs run on: each is in a session of its own)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(_STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        with contextlib.suppress(OSError):
            shutil.rmtree(self._dir)
