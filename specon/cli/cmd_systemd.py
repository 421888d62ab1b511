"""``specon systemd``: write hardened systemd units for ``specon-agent`` and ``specon-manager``.

The command validates its arguments into an ``AgentUnit`` / ``ManagerUnit``, renders them
(``specon.cli.systemd_units``, pure) and writes the files (mode 0644 units, 0600 secrets,
atomically), and with ``--enable`` runs ``systemctl``.
"""

from __future__ import annotations

import argparse
import os
import re
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

import specon
from specon.argtypes import non_negative_int
from specon.cli.systemd_units import (
    AGENT_UNIT,
    DEFAULT_ENV_FILE,
    MANAGER_UNIT,
    AgentUnit,
    ManagerUnit,
    render_agent,
    render_env_file,
    render_manager,
)
from specon.config import PolicyError, load_policy
from specon.daemon.cli_args import WeakTokenError, check_token_strength, ip_address, split_listen
from specon.daemon.manager_url import InsecureURLError, check_manager_url
from specon.daemon.tls import TLSConfigError, client_context, server_context
from specon.wire.validate import InvalidIdError, valid_id

DEFAULT_DEST = Path("/etc/systemd/system")
# ProtectHome=yes hides these; an install under them needs read-only instead.
HOME_DIRS = (Path("/home"), Path("/root"), Path("/run/user"))
# What the units' PrivateTmp= replaces with an empty directory of the service's own.
TMP_DIRS = (Path("/tmp"), Path("/var/tmp"))
# Characters a path in a unit file may not hold: a space splits ReadWritePaths=, quotes and
# backslashes are parsed, control characters have no place in a unit at all.
_BAD_PATH = re.compile(r'[\s"\'\\\x00-\x1f\x7f]')


class UnitError(ValueError):
    """An argument no unit can be written for; the message says what to do instead."""


def _abs_path(value: str | Path, what: str) -> Path:
    path = Path(value)
    if not path.is_absolute():
        raise UnitError(f"{what} must be an absolute path, got {str(value)!r}")
    if _BAD_PATH.search(str(path)):
        raise UnitError(f"{what} may hold no space, quote, backslash or control character: {str(path)!r}")
    return path


def _secret_file(value: str | Path, what: str) -> Path:
    """An absolute, readable regular file that only its owner may read (a token)."""
    path = _abs_path(value, what)
    try:
        st = path.stat()
    except OSError as exc:
        raise UnitError(f"{what} {path}: {exc.strerror or exc}") from exc
    if not stat.S_ISREG(st.st_mode):
        raise UnitError(f"{what} {path} is not a regular file")
    if st.st_mode & 0o077:
        raise UnitError(
            f"{what} {path} is readable by others (mode {stat.S_IMODE(st.st_mode):04o}): chmod 600 {path}"
        )
    return path


def _read_token(path: Path, what: str) -> str:
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise UnitError(f"cannot read {what} {path}: {exc}") from exc
    try:
        return check_token_strength(token, what=f"token in {path}")
    except WeakTokenError as exc:
        raise UnitError(str(exc)) from exc


def _manager_url(value: str, *, insecure_http: bool) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname or re.search(r"\s", value):
        raise UnitError(f"--manager must be an http:// or https:// URL, got {value!r}")
    try:
        check_manager_url(value, insecure_http=insecure_http)  # what the agent would refuse at start
    except InsecureURLError as exc:
        raise UnitError(str(exc)) from exc
    return value


def _ca_file(value: str | None, manager: str) -> Path | None:
    """``--ca-file``: an absolute path to PEM CA certificates, for an https:// manager."""
    if value is None:
        return None
    if not manager.startswith("https://"):
        raise UnitError(f"--ca-file is for an https:// manager, and --manager is {manager}")
    path = _abs_path(value, "--ca-file")
    try:
        client_context(path)
    except TLSConfigError as exc:
        raise UnitError(f"--ca-file: {exc}") from exc
    return path


def _tls_pair(cert: str | None, key: str | None) -> tuple[Path | None, Path | None]:
    """``--tls-cert``/``--tls-key``: both or neither; a pair that loads, the key private."""
    if (cert is None) != (key is None):
        raise UnitError("--tls-cert and --tls-key go together: give both (HTTPS) or neither (HTTP)")
    if cert is None or key is None:
        return None, None
    cert_path, key_path = _abs_path(cert, "--tls-cert"), _secret_file(key, "--tls-key")
    try:
        server_context(cert_path, key_path)
    except TLSConfigError as exc:
        raise UnitError(str(exc)) from exc
    return cert_path, key_path


def _source_address(value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return ip_address(value)
    except argparse.ArgumentTypeError as exc:
        raise UnitError(f"--source-address: {exc}") from exc


def _docker_host(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("unix", "tcp", "http", "https", "ssh") or re.search(r"\s", value):
        raise UnitError(f"--docker-host must be a URL like unix:///run/docker.sock, got {value!r}")
    return value


def _listen(value: str) -> str:
    try:
        split_listen(value)
    except argparse.ArgumentTypeError as exc:
        raise UnitError(f"--listen: {exc}") from exc
    return value


def _policy(value: str | None) -> Path | None:
    if value is None:
        return None
    path = _abs_path(value, "--policy")
    try:
        load_policy(path)
    except (PolicyError, OSError) as exc:
        raise UnitError(f"--policy: {exc}") from exc
    return path


def _executable(value: str | None, name: str) -> Path:
    """The daemon's script: ``--exec``, else the one installed beside this interpreter."""
    # Not resolved: a venv's bin/ is what makes its interpreter use the venv.
    path = _abs_path(value, "--exec") if value else Path(sys.executable).with_name(name)
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise UnitError(f"{path} is not an executable file: pass --exec PATH to {name}")
    return path


def install_paths(exec_path: Path) -> list[Path]:
    """What the daemon reads to run: its script, its interpreter (from the ``#!`` line) and
    this specon's package directory, each as written and resolved."""
    paths = [exec_path, exec_path.resolve(), Path(specon.__file__).resolve().parent]
    try:
        with exec_path.open("rb") as f:
            first = f.readline(4096)
    except OSError:
        first = b""
    if first.startswith(b"#!"):
        words = first[2:].decode(errors="replace").split()
        if words:
            paths += [Path(words[0]), Path(words[0]).resolve()]
    return paths


def hidden_by_private_tmp(paths: list[Path]) -> Path | None:
    """The first of ``paths`` under /tmp or /var/tmp, which the service cannot see."""
    return next((p for p in paths if any(p.is_relative_to(t) for t in TMP_DIRS)), None)


def warn_if_hidden(daemon: str, exec_path: Path) -> None:
    """Say so when this install is where the unit cannot see it (a checkout or venv under
    /tmp): the unit is still written, for an install that will be moved, but cannot start."""
    hidden = hidden_by_private_tmp(install_paths(exec_path))
    if hidden is not None:
        print(
            f"specon systemd {daemon}: warning: {hidden} is under /tmp or /var/tmp, which the unit's "
            "PrivateTmp= hides from the service, so it will not start: install specon elsewhere "
            "(python3 -m venv /opt/specon)",
            file=sys.stderr,
        )


def protect_home(paths: list[Path]) -> Literal["yes", "read-only"]:
    """``yes`` (home directories hidden) unless the daemon needs something under one."""
    return "read-only" if any(p.is_relative_to(h) for p in paths for h in HOME_DIRS) else "yes"


def unreadable_by_others(path: Path) -> Path | None:
    """The first directory on the way to ``path`` (or ``path`` itself) a user other than its
    owner cannot get through; None when every user can read it (a DynamicUser= can)."""
    for p in [*reversed(path.parents), path]:
        try:
            mode = p.stat().st_mode
        except OSError:
            return p
        need = stat.S_IXOTH if stat.S_ISDIR(mode) else stat.S_IROTH
        if not mode & need:
            return p
    return None


def agent_unit(args: argparse.Namespace) -> AgentUnit:
    """An ``AgentUnit`` from ``specon systemd agent``'s arguments; ``UnitError`` saying what is wrong."""
    try:
        worker = valid_id(args.worker, what="--worker")
        cluster = valid_id(args.cluster, what="--cluster") if args.cluster else None
    except InvalidIdError as exc:
        raise UnitError(str(exc)) from exc
    if (args.docker_host or args.allow_bind) and args.runtime != "docker":
        raise UnitError("--docker-host and --allow-bind go with --runtime docker")
    if args.warm and args.runtime != "local":
        raise UnitError("--warm goes with --runtime local")
    if args.docker_allow_gpus and args.runtime != "docker":
        raise UnitError("--docker-allow-gpus goes with --runtime docker")
    if args.docker_standby_image and args.runtime != "docker":
        raise UnitError("--docker-standby-image goes with --runtime docker")
    if args.docker_allow_gpus < 0:
        raise UnitError(f"--docker-allow-gpus must be >= 0, got {args.docker_allow_gpus}")
    if args.cpus is not None and not 0 < args.cpus < 1e6:
        raise UnitError(f"--cpus must be a positive number of cores, got {args.cpus}")
    if args.token_via == "environment" and args.runtime == "local":
        # volume.env hands a local job the agent's environment: SPECON_TOKEN would leak to it.
        raise UnitError(
            "--token-via environment would hand the token to every local job (they inherit the "
            "agent's environment): use the default, --token-via credential"
        )
    token_file = _secret_file(args.token_file, "--token-file")
    _read_token(token_file, "--token-file")
    exec_path = _executable(args.exec, "specon-agent")
    volume = _abs_path(args.volume, "--volume")
    if hidden_by_private_tmp([volume]):
        raise UnitError(f"--volume {volume}: the unit's PrivateTmp= hides /tmp and /var/tmp: use another")
    policy = _policy(args.policy)
    needed = install_paths(exec_path) + [volume] + ([policy] if policy else [])
    manager = _manager_url(args.manager, insecure_http=args.insecure_http)
    return AgentUnit(
        exec_path=exec_path,
        manager=manager,
        worker=worker,
        token_file=token_file,
        volume=volume,
        runtime=args.runtime,
        docker_host=_docker_host(args.docker_host) if args.docker_host else None,
        allow_bind=tuple(_abs_path(p, "--allow-bind") for p in args.allow_bind),
        listen=_listen(args.listen),
        cpus=args.cpus,
        warm=args.warm,
        cluster=cluster,
        policy=policy,
        token_via=args.token_via,
        env_file=_abs_path(args.env_file, "--env-file"),
        protect_home=protect_home(needed),
        ca_file=_ca_file(args.ca_file, manager),
        insecure_http=args.insecure_http,
        source_address=_source_address(args.source_address),
        gpu=args.gpu,
        docker_allow_gpus=args.docker_allow_gpus,
        docker_standby_images=tuple(args.docker_standby_image),
    )


def manager_unit(args: argparse.Namespace) -> ManagerUnit:
    """A ``ManagerUnit`` from ``specon systemd manager``'s arguments; ``UnitError`` if wrong."""
    files = {
        flag: _secret_file(value, flag) if value else None
        for flag, value in (
            ("--agent-tokens", args.agent_tokens),
            ("--token-file", args.token_file),
            ("--read-token-file", args.read_token_file),
        )
    }
    if not (files["--agent-tokens"] or files["--token-file"]):
        raise UnitError("the manager needs --agent-tokens FILE (a token per agent) or a shared --token-file")
    for flag in ("--token-file", "--read-token-file"):
        path = files[flag]
        if path is not None:
            _read_token(path, flag)
    tls_cert, tls_key = _tls_pair(args.tls_cert, args.tls_key)
    if args.user is not None and not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", args.user):
        raise UnitError(f"--user must be a user name, got {args.user!r}")
    exec_path = _executable(args.exec, "specon-manager")
    policy = _policy(args.policy)
    needed = install_paths(exec_path) + ([policy] if policy else [])
    if args.user is None:
        for path in needed:
            blocked = unreadable_by_others(path)
            if blocked is not None:
                raise UnitError(
                    f"the manager runs as a DynamicUser=, which cannot read {path} ({blocked} is mode "
                    f"{stat.S_IMODE(blocked.stat().st_mode) if blocked.exists() else 0:04o}): install specon "
                    "where every user can read it (python3 -m venv /opt/specon), or pass --user NAME"
                )
    return ManagerUnit(
        exec_path=exec_path,
        listen=_listen(args.listen),
        agent_tokens=files["--agent-tokens"],
        token_file=files["--token-file"],
        read_token_file=files["--read-token-file"],
        policy=policy,
        user=args.user,
        protect_home=protect_home(needed),
        tls_cert=tls_cert,
        tls_key=tls_key,
        fronts=args.fronts,
    )


# -- writing ----------------------------------------------------------------------------


def write_file(path: Path, text: str, mode: int) -> None:
    """Write ``text`` to ``path`` atomically with ``mode`` from the first byte (a secret is
    never readable by others, not even while it is written)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o755 if mode & 0o044 else 0o700)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def systemd_is_pid1() -> bool:
    """sd_booted(3): this machine runs systemd as its init system."""
    return Path("/run/systemd/system").is_dir()


def systemctl(*args: str) -> int:
    """Run ``systemctl ARGS``; its exit status."""
    return subprocess.run(["systemctl", *args], check=False).returncode


def _enable(unit: str) -> int:
    for args in (("daemon-reload",), ("enable", "--now", unit)):
        rc = systemctl(*args)
        if rc != 0:
            print(f"specon systemd: systemctl {' '.join(args)} failed ({rc})", file=sys.stderr)
            return 1
    print(f"enabled and started {unit}")
    return 0


def _install(args: argparse.Namespace, unit: str, text: str, secrets: dict[Path, str]) -> int:
    if args.print:
        sys.stdout.write(text)
        return 0
    if args.enable and not systemd_is_pid1():
        print(
            "specon systemd: --enable needs systemd as the init system (PID 1), and this machine "
            "does not run it: write the units without --enable",
            file=sys.stderr,
        )
        return 2
    dest = _abs_path(args.dest, "--dest")
    try:
        for path, content in secrets.items():
            write_file(path, content, 0o600)
            print(f"wrote {path} (mode 0600)")
        write_file(dest / unit, text, 0o644)
    except OSError as exc:
        print(f"specon systemd: cannot write {exc.filename or dest}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"wrote {dest / unit}")
    if args.enable:
        return _enable(unit)
    print(f"next: systemctl daemon-reload && systemctl enable --now {unit}")
    return 0


def _agent(args: argparse.Namespace) -> int:
    try:
        unit = agent_unit(args)
    except UnitError as exc:
        print(f"specon systemd agent: {exc}", file=sys.stderr)
        return 2
    if not args.print:
        warn_if_hidden("agent", unit.exec_path)
    secrets: dict[Path, str] = {}
    if unit.token_via == "environment" and not args.print:
        secrets[unit.env_file] = render_env_file(_read_token(unit.token_file, "--token-file"))
    return _install(args, AGENT_UNIT, render_agent(unit), secrets)


def _manager(args: argparse.Namespace) -> int:
    try:
        unit = manager_unit(args)
    except UnitError as exc:
        print(f"specon systemd manager: {exc}", file=sys.stderr)
        return 2
    if not args.print:
        warn_if_hidden("manager", unit.exec_path)
    return _install(args, MANAGER_UNIT, render_manager(unit), {})


def _common(parser: argparse.ArgumentParser, daemon: str) -> None:
    parser.add_argument(
        "--exec",
        metavar="PATH",
        help=f"the {daemon} script to run (default: the one installed beside this specon)",
    )
    parser.add_argument("--policy", metavar="FILE", help="policy YAML passed to the daemon (checked now)")
    parser.add_argument(
        "--dest",
        default=str(DEFAULT_DEST),
        metavar="DIR",
        help=f"directory to write the unit into (default {DEFAULT_DEST})",
    )
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--print", action="store_true", help="print the unit on standard output, write nothing")
    out.add_argument(
        "--enable",
        action="store_true",
        help="then run systemctl daemon-reload and enable --now (needs systemd as PID 1)",
    )


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "systemd",
        help="write hardened systemd units for specon-agent and specon-manager",
        description="Write a systemd unit for a specon daemon on a host without Kubernetes: "
        "Restart=on-failure, NoNewPrivileges=, ProtectSystem=strict, tokens through LoadCredential= "
        "(systemd >= 247), TLS files too. Token and key files must be mode 0600. See docs/docker-hosts.md, "
        "'Installing the agent with systemd', and docs/tls.md.",
    )
    actions = parser.add_subparsers(dest="systemd_action", metavar="UNIT", required=True)

    agent = actions.add_parser(
        "agent",
        help=f"write {AGENT_UNIT} for one worker",
        description=f"Write {AGENT_UNIT}: the node agent of one worker, as root in a sandbox that "
        "may write only the volume (and, with --runtime local, the cgroup tree).",
    )
    agent.add_argument(
        "--manager",
        required=True,
        metavar="URL",
        help="the manager's base URL: https://HOST:PORT, or http:// on loopback (or with --insecure-http)",
    )
    agent.add_argument(
        "--ca-file",
        metavar="FILE",
        help="with an https:// --manager: PEM CA certificate(s) its certificate must chain to "
        "(default: the system trust store); loaded as a credential",
    )
    agent.add_argument(
        "--insecure-http",
        action="store_true",
        help="let the agent use an http:// manager off loopback (its token then crosses the network "
        "in clear text); passed to the agent",
    )
    agent.add_argument(
        "--source-address",
        metavar="ADDR",
        help="bind the agent's requests to the manager to this local IP address (passed to the agent)",
    )
    agent.add_argument("--worker", required=True, metavar="ID", help="this host's worker id")
    agent.add_argument(
        "--token-file",
        required=True,
        metavar="FILE",
        help="this worker's own token (its entry in the manager's --agent-tokens), mode 0600",
    )
    agent.add_argument("--volume", required=True, metavar="DIR", help="the shared volume")
    agent.add_argument(
        "--runtime",
        choices=("local", "docker"),
        default="local",
        help="local = jobs as processes in a cgroup budget (default); docker = jobs as containers",
    )
    agent.add_argument("--docker-host", metavar="URL", help="with --runtime docker: the engine's URL")
    agent.add_argument(
        "--allow-bind",
        action="append",
        default=[],
        metavar="PREFIX",
        help="with --runtime docker: a host path prefix jobs may bind read-only (repeatable)",
    )
    agent.add_argument(
        "--listen", default="127.0.0.1:7701", metavar="HOST:PORT", help="where /healthz and /metrics listen"
    )
    agent.add_argument("--cpus", type=float, help="this worker's CPU budget in cores (local runtime)")
    agent.add_argument(
        "--gpu",
        action="store_true",
        help="read this host's NVIDIA GPUs through NVML (agent --gpu auto; the unit opens the NVIDIA "
        "device nodes for it, and no other device)",
    )
    agent.add_argument(
        "--docker-allow-gpus",
        type=int,
        default=0,
        metavar="N",
        help="with --runtime docker: GPUs one job's container may request (default 0: none)",
    )
    agent.add_argument(
        "--docker-standby-image",
        action="append",
        default=[],
        metavar="IMAGE[=PYTHON]",
        help="with --runtime docker: keep primed standby containers of IMAGE (agent "
        "--docker-standby-image; the unit then keeps CAP_SYS_ADMIN and the mount calls for it)",
    )
    agent.add_argument(
        "--warm",
        action="store_true",
        help="with --runtime local: fork built-in workload jobs from a warm interpreter (agent --warm)",
    )
    agent.add_argument("--cluster", metavar="NAME", help="cgroup namespace of this cluster's workers")
    agent.add_argument(
        "--token-via",
        choices=("credential", "environment"),
        default="credential",
        help="credential = LoadCredential= (default); environment = an EnvironmentFile= (mode 0600) "
        "for systemd older than 247 (not with --runtime local: jobs inherit the environment)",
    )
    agent.add_argument(
        "--env-file",
        default=str(DEFAULT_ENV_FILE),
        metavar="FILE",
        help=f"with --token-via environment: where the file goes (default {DEFAULT_ENV_FILE})",
    )
    _common(agent, "specon-agent")
    agent.set_defaults(func=_agent)

    manager = actions.add_parser(
        "manager",
        help=f"write {MANAGER_UNIT}",
        description=f"Write {MANAGER_UNIT}: the manager as a DynamicUser= with no capabilities, "
        "writing only its state directory (/var/lib/specon-manager).",
    )
    manager.add_argument(
        "--agent-tokens",
        metavar="FILE",
        help="YAML 'worker id: token', one token per agent (recommended), mode 0600",
    )
    manager.add_argument("--token-file", metavar="FILE", help="a shared token for every agent, mode 0600")
    manager.add_argument("--read-token-file", metavar="FILE", help="the token status reads need, mode 0600")
    manager.add_argument(
        "--listen", default="127.0.0.1:7700", metavar="HOST:PORT", help="address to serve on"
    )
    manager.add_argument(
        "--tls-cert",
        metavar="FILE",
        help="serve HTTPS with this PEM certificate chain (with --tls-key); loaded as a credential, "
        "so a renewed one needs a restart",
    )
    manager.add_argument("--tls-key", metavar="FILE", help="the certificate's private key (PEM), mode 0600")
    manager.add_argument(
        "--user",
        metavar="NAME",
        help="run as this existing user instead of a DynamicUser= (when the install is not world-readable)",
    )
    manager.add_argument(
        "--fronts",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="passed to the manager: serve from N front processes beside the deciding one, for a "
        "cluster past one core's heartbeats (default 0; docs/architecture.md, Past one core)",
    )
    _common(manager, "specon-manager")
    manager.set_defaults(func=_manager)
