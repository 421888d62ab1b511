"""The systemd units of ``specon systemd``, rendered (pure: a validated unit in, its text out).

``render_agent`` / ``render_manager`` return the unit text for an ``AgentUnit`` /
``ManagerUnit``; the templates are package data in ``specon/data/systemd/``. The command
(``specon.cli.cmd_systemd``) validates its arguments into these and writes the files.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

import specon
from specon.daemon.cli_args import split_listen

AGENT_UNIT = "specon-agent.service"
MANAGER_UNIT = "specon-manager.service"
DEFAULT_ENV_FILE = Path("/etc/specon/specon-agent.env")
# Where a systemd unit may read the token it is given (LoadCredential= copies it at start).
CREDENTIAL = "${CREDENTIALS_DIRECTORY}"

Runtime = Literal["local", "docker"]
TokenVia = Literal["credential", "environment"]


@dataclass(frozen=True)
class AgentUnit:
    exec_path: Path
    manager: str
    worker: str
    token_file: Path
    volume: Path
    runtime: Runtime = "local"
    docker_host: str | None = None
    # --runtime docker: host path prefixes jobs may bind read-only.
    allow_bind: tuple[Path, ...] = ()
    listen: str = "127.0.0.1:7701"
    cpus: float | None = None
    cluster: str | None = None
    policy: Path | None = None
    # --runtime local: fork the built-in workloads' jobs from a warm interpreter.
    warm: bool = False
    token_via: TokenVia = "credential"
    env_file: Path = DEFAULT_ENV_FILE
    protect_home: Literal["yes", "read-only"] = "yes"
    # An https manager's CA (agent --ca-file), loaded as a credential like the token.
    ca_file: Path | None = None
    insecure_http: bool = False
    source_address: str | None = None
    # GPUs: the agent reads them through NVML (the NVIDIA device nodes opened for it), and a
    # Docker host lets its jobs request up to ``docker_allow_gpus`` of them.
    gpu: bool = False
    docker_allow_gpus: int = 0
    # --runtime docker: images to keep standby containers of (agent --docker-standby-image).
    docker_standby_images: tuple[str, ...] = ()


# What NVML opens (``/proc/devices`` names): the control node and the GPUs. Nothing else of /dev.
NVML_DEVICES = ("char-nvidiactl", "char-nvidia-frontend")


@dataclass(frozen=True)
class ManagerUnit:
    exec_path: Path
    listen: str = "127.0.0.1:7700"
    agent_tokens: Path | None = None
    token_file: Path | None = None
    read_token_file: Path | None = None
    policy: Path | None = None
    user: str | None = None  # None: DynamicUser=yes
    protect_home: Literal["yes", "read-only"] = "yes"
    # Both or neither (validated): HTTPS with this certificate chain and key.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    fronts: int = 0  # specon-manager --fronts: front processes beside the decider (0: none)


# -- rendering (pure) -------------------------------------------------------------------


def _template(name: str) -> str:
    return (resources.files("specon") / "data" / "systemd" / name).read_text(encoding="utf-8")


def _fill(text: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        text = text.replace(f"@{key}@", value)
    left = re.findall(r"@[A-Z_]+@", text)
    if left:  # a template and its renderer out of step: a bug, not a user error
        raise AssertionError(f"unfilled template placeholders: {sorted(set(left))}")
    return text


def escape(value: str) -> str:
    """``value`` as it must appear in a unit file: systemd expands ``%`` specifiers there."""
    return value.replace("%", "%%")


def exec_arg(value: str) -> str:
    """One literal ``ExecStart=`` argument: specifiers and ``$`` variables escaped, quoted if
    it holds anything the command-line parser would split or interpret."""
    s = escape(value).replace("$", "$$")
    if s and not re.search(r'[\s"\'\\;]', s):
        return s
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _exec_start(lines: list[list[str]]) -> str:
    # One option a line: a long command stays readable in `systemctl cat`.
    return " \\\n    ".join(" ".join(words) for words in lines)


def render_agent(unit: AgentUnit) -> str:
    """The text of ``specon-agent.service`` for ``unit`` (already validated)."""
    argv = [[exec_arg(str(unit.exec_path))], ["--manager", exec_arg(unit.manager)]]
    argv += [["--worker", exec_arg(unit.worker)], ["--volume", exec_arg(str(unit.volume))]]
    argv += [["--listen", exec_arg(unit.listen)], ["--runtime", unit.runtime]]
    if unit.source_address:
        argv.append(["--source-address", exec_arg(unit.source_address)])
    if unit.insecure_http:
        argv.append(["--insecure-http"])
    if unit.docker_host:
        argv.append(["--docker-host", exec_arg(unit.docker_host)])
    for prefix in unit.allow_bind:
        argv.append(["--allow-bind", exec_arg(str(prefix))])
    if unit.docker_allow_gpus:
        argv.append(["--docker-allow-gpus", str(unit.docker_allow_gpus)])
    for image in unit.docker_standby_images:
        argv.append(["--docker-standby-image", exec_arg(image)])
    if unit.cpus is not None:
        argv.append(["--cpus", f"{unit.cpus:g}"])
    if unit.warm:
        argv.append(["--warm"])
    if unit.cluster:
        argv.append(["--cluster", exec_arg(unit.cluster)])
    if unit.policy:
        argv.append(["--policy", exec_arg(str(unit.policy))])
    argv.append(["--state-dir", "/var/lib/specon-agent"])
    if unit.token_via == "credential":
        # The variable is systemd's own (not escaped): the private copy LoadCredential= makes.
        argv.append(["--token-file", f"{CREDENTIAL}/token"])
        token = (
            "# The agent's own token (one per worker, from the manager's --agent-tokens), copied by\n"
            "# systemd at each start into a directory only this service can read. Rotating it\n"
            "# needs `systemctl restart specon-agent` (the copy is made at start).\n"
            f"LoadCredential=token:{escape(str(unit.token_file))}"
        )
    else:
        token = (
            "# The agent's own token as SPECON_TOKEN, from a root-only file (mode 0600).\n"
            f"EnvironmentFile={escape(str(unit.env_file))}"
        )
    if unit.ca_file:
        argv.append(["--ca-file", f"{CREDENTIAL}/ca.crt"])
        token += (
            "\n# The CA the manager's certificate must chain to, copied at each start like the token.\n"
            f"LoadCredential=ca.crt:{escape(str(unit.ca_file))}"
        )
    read_write = [str(unit.volume)] + (["/sys/fs/cgroup"] if unit.runtime == "local" else [])
    return _fill(
        _template("specon-agent.service.in"),
        {
            "VERSION": specon.__version__,
            "WORKER": escape(unit.worker),
            "AFTER": " docker.service" if unit.runtime == "docker" else "",
            "EXEC_START": _exec_start(argv),
            "TOKEN": token,
            "PROTECT_HOME": unit.protect_home,
            "READ_WRITE": " ".join(escape(p) for p in read_write),
            "RUNTIME": _template(f"agent-{unit.runtime}.in")
            + (_gpu_devices() if unit.gpu else "")
            + (_STANDBY_MOUNTS if unit.docker_standby_images else ""),
        },
    )


# A standby container gets its job's directory as a detached mount clone (open_tree), which
# needs CAP_SYS_ADMIN and the mount system calls (docs/docker-hosts.md, "Standby containers").
_STANDBY_MOUNTS = (
    "\n# --docker-standby-image: a job's directory reaches its standby container as a detached\n"
    "# mount clone (open_tree): CAP_SYS_ADMIN and the mount calls, for this only.\n"
    "CapabilityBoundingSet=CAP_SYS_ADMIN\nSystemCallFilter=@mount\n"
)


def _gpu_devices() -> str:
    lines = "\n".join(f"DeviceAllow={name} rw" for name in NVML_DEVICES)
    return (
        "\n# --gpu: NVML opens the NVIDIA control and GPU nodes read-write; every other device stays"
        f"\n# closed.\nPrivateDevices=no\nDevicePolicy=closed\n{lines}\n"
    )


def render_env_file(token: str) -> str:
    """The ``EnvironmentFile=`` for ``--token-via environment`` (mode 0600)."""
    head = "# specon-agent's token, written by `specon systemd agent`. Keep it mode 0600.\n"
    return f"{head}SPECON_TOKEN={token}\n"


def render_manager(unit: ManagerUnit) -> str:
    """The text of ``specon-manager.service`` for ``unit`` (already validated)."""
    argv = [[exec_arg(str(unit.exec_path))], ["--listen", exec_arg(unit.listen)]]
    argv.append(["--state-dir", "/var/lib/specon-manager"])
    creds: list[str] = []
    for flag, name, path in (
        ("--agent-tokens", "agent-tokens", unit.agent_tokens),
        ("--token-file", "token", unit.token_file),
        ("--read-token-file", "read-token", unit.read_token_file),
    ):
        if path is not None:
            argv.append([flag, f"{CREDENTIAL}/{name}"])
            creds.append(f"LoadCredential={name}:{escape(str(path))}")
    if unit.tls_cert and unit.tls_key:
        argv += [["--tls-cert", f"{CREDENTIAL}/tls.crt"], ["--tls-key", f"{CREDENTIAL}/tls.key"]]
        creds += [
            "# HTTPS: systemd copies the certificate and key at each start, so a renewed pair",
            "# serves after `systemctl restart specon-manager` (a renewal hook's last step).",
            f"LoadCredential=tls.crt:{escape(str(unit.tls_cert))}",
            f"LoadCredential=tls.key:{escape(str(unit.tls_key))}",
        ]
    if unit.policy:
        argv.append(["--policy", exec_arg(str(unit.policy))])
    if unit.fronts:
        argv.append(["--fronts", str(unit.fronts)])
    if unit.user:
        user = f"User={escape(unit.user)}"
    else:
        user = "# A user allocated at each start, owning nothing but the state directory.\nDynamicUser=yes"
    _, port = split_listen(unit.listen)
    # Only a port below 1024 needs a capability; otherwise the manager holds none at all.
    caps = "CAP_NET_BIND_SERVICE" if port < 1024 else ""
    return _fill(
        _template("specon-manager.service.in"),
        {
            "VERSION": specon.__version__,
            "EXEC_START": _exec_start(argv),
            "USER": user,
            "CREDENTIALS": "\n".join(creds),
            "PROTECT_HOME": unit.protect_home,
            "CAPABILITIES": caps,
        },
    )


# -- validation -------------------------------------------------------------------------
