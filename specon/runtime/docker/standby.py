"""Standby containers on a Docker host, as plain data: what a host keeps primed, which jobs
may use one, the hand-over request and the job's environment in it.

A GPU job restored cold spends 10-16 s before its first step (importing torch, building the
model and optimizer, initialising CUDA); handed to a process that did all of that beforehand,
0.10-2.99 s (docs/INFRA.md, "GPU"). On a Docker host that process must already be in the job's
container, so the host keeps one *standby container* per (GPU, image) it is told to
(``StandbyConfig``: the agent's ``--docker-standby-image``, never a recipe or a message),
created with the job-independent part of a job's config: the image, network ``none``, no
privileges, the read-only binds the host names, one GPU (``DeviceIDs`` of that GPU, where the
host allows GPUs) and the labels ``specon.io/managed`` and ``specon.io/standby``. Its main
process is ``specon.runtime.docker.standby_server``: it primes torch, then waits for one job.

The hand-over. A standby does not know its job when it is created, and mounting the whole
volume into it would break the rule that a job's only writable mount is its own directory.
The agent instead passes the job's directory as an open file descriptor over a unix socket
(SCM_RIGHTS): a *detached clone* of it (``open_tree(OPEN_TREE_CLONE)``), never a plain
directory descriptor, from which ``..`` walks up the host's tree, out of the container
(measured on the private engine: it listed the host's ``/tmp``); at the root of a detached
mount ``..`` stays where it is. The standby ``fchdir``s into it, and the job contract's paths
in its environment are relative to that directory (``job_env``; jobkit and the workloads open
them relative to the working directory). The process's working directory is then unreachable
from its root: ``os.getcwd()`` fails with ENOENT, so a job that calls it (or ``abspath``,
``Path.resolve``) runs cold instead; the built-in workloads do not.

Which jobs (``refusal``): a recipe of one of the standby images, run as ``<python> -m <the
module> ...`` with the standby's own interpreter name, asking for exactly one GPU (none for a
host's CPU standbys: tests), network ``none``, the image's own user, no init, no memory limit,
the same read-only binds as the standby, in the job directory, moved by the job contract
(CRIU of a standby container would restore its standby command). Everything else starts cold,
unchanged. CPU limits are set on the standby (``docker update``) before it is handed the job.

Pure: no Docker import (the in-container server imports this module).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from specon.runtime.base import ENV_CHECKPOINT_DIR, ENV_DONE_FILE, ENV_JOB_ID, ENV_PROGRESS_FILE, ENV_WORKER
from specon.runtime.docker.recipe import LABEL_MIGRATION, Bind, HostRules, Recipe, problems
from specon.runtime.local.zygote import MAX_REQUEST, WORKLOADS_MODULE, WORKLOADS_PRELOAD

__all__ = [
    "LABEL_STANDBY",
    "SOCKET_DIR_INSIDE",
    "HandOver",
    "StandbyConfig",
    "config_problems",
    "idle_standby",
    "job_env",
    "refusal",
    "server_command",
    "standby_name",
]

# ``specon.io/standby=<gpu>``: a standby container (idle, or the job it was handed).
LABEL_STANDBY = "specon.io/standby"
# Idle standbys are named with underscores, which no job id has (``valid_job_id``): a listing
# never takes one for a job. Handed a job, the container is renamed to the job's id.
NAME_PREFIX = "specon_standby_"
# Where the agent's socket directory appears in a standby (read-only).
SOCKET_DIR_INSIDE = "/run/specon-standby"
SOCKET_NAME = "s"
# Not ``-m``: the package imports the module first and runpy would run it a second time.
_SERVE = "import sys; from specon.runtime.docker.standby_server import main; sys.exit(main(sys.argv[1:]))"


@dataclass(frozen=True, slots=True)
class StandbyConfig:
    """What a Docker host keeps primed: a standby per GPU in ``gpus`` for each of ``images``.

    ``gpu_devices``: each standby holds its GPU (a ``DeviceIDs`` request) and takes one-GPU
    jobs; False: no device request and it takes jobs without GPUs (a host with no GPU: tests).
    ``python``: the interpreter's name or path in the image, exactly as the jobs' commands name
    it; ``module``: the one module a standby runs; ``binds``: read-only binds every standby has
    (checked as any recipe's), and which a job's recipe must have exactly. ``socket_dir``: the
    host directory of the agent's sockets (default: ``docker/standby/<worker>`` on the volume).
    """

    images: tuple[str, ...]
    gpus: tuple[int, ...]
    gpu_devices: bool = True
    python: str = "python3"
    module: str = WORKLOADS_MODULE
    preload: tuple[str, ...] = WORKLOADS_PRELOAD
    prime: bool = True
    binds: tuple[Bind, ...] = ()
    socket_dir: Path | None = field(default=None, compare=False)


def config_problems(config: StandbyConfig, rules: HostRules) -> list[str]:
    """Every reason this host's rules refuse ``config`` (empty: fine): its images and binds are
    judged as a job's recipe would be, and its GPUs must be allowed here."""
    out = []
    if len(set(config.gpus)) != len(config.gpus) or any(g < 0 for g in config.gpus):
        out.append(f"standby GPUs must be distinct indexes >= 0, got {list(config.gpus)}")
    if config.gpu_devices and config.gpus and rules.gpus < 1:
        out.append("standby GPUs: this host allows no GPU per job (--docker-allow-gpus)")
    if not config.python or not config.module:
        out.append("standby: python and module must be non-empty")
    for image in config.images:
        probe = Recipe(image=image, command=(config.python,), binds=config.binds)
        out += [f"standby image {image!r}: {why}" for why in problems(probe, rules)]
    return out


def standby_name(gpu: int, token: str) -> str:
    return f"{NAME_PREFIX}g{gpu}_{token}"


def idle_standby(labels: Mapping[str, str], name: str) -> bool:
    """A standby container not (yet) handed a job: not a job of any listing."""
    return LABEL_STANDBY in labels and name.lstrip("/").startswith(NAME_PREFIX)


def server_command(config: StandbyConfig, gpu: int) -> list[str]:
    """The standby container's command: the server, its module and what it imports ahead."""
    argv = [config.python, "-c", _SERVE, f"{SOCKET_DIR_INSIDE}/{SOCKET_NAME}", "--gpu", str(gpu)]
    argv += ["--module", config.module, *(a for m in config.preload for a in ("--preload", m))]
    return argv if config.prime else [*argv, "--no-prime"]


def refusal(recipe: Recipe, config: StandbyConfig, *, migration_mode: str) -> str | None:
    """Why ``recipe``'s job may not use a standby of ``config`` (None: it may)."""
    cmd = recipe.command
    if recipe.image not in config.images:
        return f"no standby for image {recipe.image!r}"
    if len(cmd) < 3 or cmd[0] != config.python or cmd[1] != "-m" or cmd[2] != config.module:
        return f"the command is not {config.python} -m {config.module} ..."
    wanted = 1 if config.gpu_devices else 0
    if recipe.gpus != wanted or len(recipe.device_requests) != wanted:
        return f"it requests {recipe.gpus} GPUs, a standby holds {wanted}"
    if recipe.network_mode != "none" or recipe.user is not None or recipe.init or recipe.mem_limit:
        return "network, user, init or memory limit differ from a standby's"
    if set(recipe.binds) != set(config.binds):
        return "its read-only binds differ from a standby's"
    inside = PurePosixPath(recipe.volume_target) / "jobs"
    if recipe.working_dir is not None and PurePosixPath(recipe.working_dir).parent != inside:
        return f"working directory {recipe.working_dir} is not its job directory"
    if migration_mode != "checkpoint" or dict(recipe.labels).get(LABEL_MIGRATION) == "criu":
        return "it moves by CRIU, which would restore a standby's command"
    return None


def job_env(recipe: Recipe, job: str, worker: str) -> dict[str, str]:
    """The job's environment as a cold start gives it (``engine.create_kwargs``), the job
    contract's paths relative to its directory, the standby's working directory."""
    env = dict(recipe.env)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(
        {
            ENV_JOB_ID: job,
            ENV_WORKER: worker,
            ENV_PROGRESS_FILE: "progress.jsonl",
            ENV_CHECKPOINT_DIR: "checkpoints",
            ENV_DONE_FILE: "done",
        }
    )
    return env


@dataclass(frozen=True, slots=True)
class HandOver:
    """One job for a standby: ``python -m module *args`` with ``env`` as ``run_id``; its
    directory travels beside it, as the one descriptor of the message."""

    module: str
    args: tuple[str, ...]
    env: dict[str, str]
    run_id: str
    worker: str

    def encode(self) -> bytes:
        data = {"module": self.module, "args": list(self.args), "env": self.env}
        return json.dumps(data | {"run_id": self.run_id, "worker": self.worker}).encode() + b"\n"

    @classmethod
    def decode(cls, raw: bytes) -> HandOver:
        """Parse one request; ``ValueError`` saying what is wrong."""
        if len(raw) > MAX_REQUEST:
            raise ValueError(f"request over {MAX_REQUEST} bytes")
        try:
            d = json.loads(raw)
            args, env = d["args"], d["env"]
            if not isinstance(args, list) or not isinstance(env, dict):
                raise TypeError("args must be a list and env an object")
            if not all(isinstance(a, str) for a in args):
                raise TypeError("args must be strings")
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
                raise TypeError("env must map strings to strings")
            return cls(str(d["module"]), tuple(args), dict(env), str(d["run_id"]), str(d["worker"]))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"bad request: {exc!r}") from exc
