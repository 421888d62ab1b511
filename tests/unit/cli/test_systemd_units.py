"""``specon systemd``: the units it renders, its argument checks, the files it writes, and
``systemd-analyze verify`` on what it renders (tests/docker/test_systemd.py runs them for real)."""

from __future__ import annotations

import dataclasses
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from specon.cli import cmd_systemd, systemd_units
from specon.cli.main import main
from specon.cli.systemd_units import AgentUnit, ManagerUnit, exec_arg, render_agent, render_manager

TOKEN = "0123456789abcdef" * 4
BIN = Path(sys.executable).parent
AGENT = AgentUnit(
    exec_path=BIN / "specon-agent",
    manager="http://127.0.0.1:7700",
    worker="node-1",
    token_file=Path("/etc/specon/agent.token"),
    volume=Path("/srv/specon"),
)
MANAGER = ManagerUnit(exec_path=BIN / "specon-manager", agent_tokens=Path("/etc/specon/agent-tokens.yaml"))


def _directives(text: str) -> dict[str, list[str]]:
    """Each directive's values, in order (continuation lines joined)."""
    out: dict[str, list[str]] = {}
    for line in text.replace("\\\n", " ").splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def _exec_start(text: str) -> list[str]:
    return _directives(text)["ExecStart"][0].split()


# -- rendering --------------------------------------------------------------------------


def test_agent_local_unit() -> None:
    text = render_agent(AGENT)
    d = _directives(text)
    argv = _exec_start(text)
    assert argv[0] == str(BIN / "specon-agent")
    pairs = dict(zip(argv[1::2], argv[2::2], strict=True))
    assert pairs == {
        "--manager": "http://127.0.0.1:7700",
        "--worker": "node-1",
        "--volume": "/srv/specon",
        "--listen": "127.0.0.1:7701",
        "--runtime": "local",
        "--state-dir": "/var/lib/specon-agent",
        "--token-file": "${CREDENTIALS_DIRECTORY}/token",  # systemd's, expanded at start
    }
    assert d["LoadCredential"] == ["token:/etc/specon/agent.token"]
    assert "EnvironmentFile" not in d and "User" not in d and "DynamicUser" not in d
    for key, value in {
        "Restart": "on-failure",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "PrivateTmp": "yes",
        "KillMode": "process",  # jobs are children: an agent restart must not kill them
        "StateDirectory": "specon-agent",
        "RestartPreventExitStatus": "2",
    }.items():
        assert d[key] == [value], key
    assert d["ReadWritePaths"] == ["/srv/specon /sys/fs/cgroup"]
    assert "ProtectControlGroups" not in d  # it writes its jobs' cgroups
    assert "@" not in text.replace("${", "")  # every placeholder filled


def test_agent_docker_unit() -> None:
    unit = dataclasses.replace(AGENT, runtime="docker", docker_host="unix:///run/docker.sock", cpus=2.5)
    text = render_agent(unit)
    d = _directives(text)
    assert "docker.service" in d["After"][0]
    argv = " ".join(_exec_start(text))
    assert "--runtime docker --docker-host unix:///run/docker.sock --cpus 2.5" in argv
    assert d["ReadWritePaths"] == ["/srv/specon"]
    assert d["ProtectControlGroups"] == d["ProtectKernelTunables"] == d["PrivateDevices"] == ["yes"]
    assert "KillMode" not in d  # its jobs are dockerd's children, not its own


def test_agent_gpu_docker_unit() -> None:
    unit = dataclasses.replace(AGENT, runtime="docker", gpu=True, docker_allow_gpus=2)
    text = render_agent(unit)
    d = _directives(text)
    argv = " ".join(_exec_start(text))
    assert "--docker-allow-gpus 2" in argv
    # NVML's device nodes only: the later PrivateDevices=no wins, every other device is closed.
    assert d["PrivateDevices"] == ["yes", "no"] and d["DevicePolicy"] == ["closed"]
    assert d["DeviceAllow"] == ["char-nvidiactl rw", "char-nvidia-frontend rw"]
    assert "DeviceAllow" not in _directives(render_agent(AGENT))


def test_agent_docker_standby_unit_keeps_what_open_tree_needs() -> None:
    unit = dataclasses.replace(AGENT, runtime="docker", docker_standby_images=("trainer:1=python3",))
    text = render_agent(unit)
    d = _directives(text)
    assert "--docker-standby-image trainer:1=python3" in " ".join(_exec_start(text))
    # systemd merges repeated bounding sets and allow-lists by OR: CAP_SYS_ADMIN and @mount are added.
    assert "CAP_SYS_ADMIN" in d["CapabilityBoundingSet"] and "@mount" in d["SystemCallFilter"]
    plain = _directives(render_agent(dataclasses.replace(AGENT, runtime="docker")))
    assert "CAP_SYS_ADMIN" not in " ".join(plain["CapabilityBoundingSet"])


def test_agent_environment_token() -> None:
    unit = dataclasses.replace(AGENT, runtime="docker", token_via="environment")
    d = _directives(render_agent(unit))
    assert d["EnvironmentFile"] == ["/etc/specon/specon-agent.env"]
    assert "LoadCredential" not in d
    assert "--token-file" not in d["ExecStart"][0]
    assert systemd_units.render_env_file(TOKEN).endswith(f"\nSPECON_TOKEN={TOKEN}\n")


def test_manager_unit() -> None:
    text = render_manager(
        dataclasses.replace(
            MANAGER, read_token_file=Path("/etc/specon/read.token"), policy=Path("/etc/p.yaml")
        )
    )
    d = _directives(text)
    assert " ".join(_exec_start(text)[1:]) == (
        "--listen 127.0.0.1:7700 --state-dir /var/lib/specon-manager "
        "--agent-tokens ${CREDENTIALS_DIRECTORY}/agent-tokens "
        "--read-token-file ${CREDENTIALS_DIRECTORY}/read-token --policy /etc/p.yaml"
    )
    assert d["LoadCredential"] == [
        "agent-tokens:/etc/specon/agent-tokens.yaml",
        "read-token:/etc/specon/read.token",
    ]
    assert d["DynamicUser"] == ["yes"] and "User" not in d
    assert d["CapabilityBoundingSet"] == d["AmbientCapabilities"] == [""]  # none at all
    assert d["StateDirectory"] == ["specon-manager"] and d["ProtectSystem"] == ["strict"]
    assert d["NoNewPrivileges"] == ["yes"] and d["Restart"] == ["on-failure"]


def test_agent_tls_unit() -> None:
    unit = dataclasses.replace(
        AGENT,
        manager="https://manager.example:7700",
        ca_file=Path("/etc/specon/ca.crt"),
        source_address="198.51.100.3",
    )
    text = render_agent(unit)
    d = _directives(text)
    argv = _exec_start(text)
    pairs = dict(zip(argv[1::2], argv[2::2], strict=True))
    assert pairs["--manager"] == "https://manager.example:7700"
    assert pairs["--ca-file"] == "${CREDENTIALS_DIRECTORY}/ca.crt"
    assert pairs["--source-address"] == "198.51.100.3"
    assert d["LoadCredential"] == ["token:/etc/specon/agent.token", "ca.crt:/etc/specon/ca.crt"]
    assert "--insecure-http" not in argv
    # With the token in an environment file the CA still comes as a credential.
    env = _directives(render_agent(dataclasses.replace(unit, runtime="docker", token_via="environment")))
    assert env["LoadCredential"] == ["ca.crt:/etc/specon/ca.crt"]
    assert env["EnvironmentFile"] == ["/etc/specon/specon-agent.env"]


def test_agent_insecure_http_is_passed_through() -> None:
    unit = dataclasses.replace(AGENT, manager="http://198.51.100.2:7700", insecure_http=True)
    assert "--insecure-http" in _exec_start(render_agent(unit))


def test_manager_unit_with_fronts() -> None:
    text = render_manager(dataclasses.replace(MANAGER, fronts=2))
    assert _exec_start(text)[-2:] == ["--fronts", "2"]
    assert "--fronts" not in render_manager(MANAGER)


def test_manager_tls_unit() -> None:
    unit = dataclasses.replace(
        MANAGER, tls_cert=Path("/etc/specon/tls/manager.crt"), tls_key=Path("/etc/specon/tls/manager.key")
    )
    text = render_manager(unit)
    d = _directives(text)
    assert " ".join(_exec_start(text)[1:]).endswith(
        "--tls-cert ${CREDENTIALS_DIRECTORY}/tls.crt --tls-key ${CREDENTIALS_DIRECTORY}/tls.key"
    )
    assert d["LoadCredential"] == [
        "agent-tokens:/etc/specon/agent-tokens.yaml",
        "tls.crt:/etc/specon/tls/manager.crt",
        "tls.key:/etc/specon/tls/manager.key",
    ]
    assert "systemctl restart specon-manager" in text  # how a renewed pair gets in


def test_manager_low_port_and_user() -> None:
    d = _directives(render_manager(dataclasses.replace(MANAGER, listen="127.0.0.1:80", user="specon")))
    assert d["CapabilityBoundingSet"] == d["AmbientCapabilities"] == ["CAP_NET_BIND_SERVICE"]
    assert d["User"] == ["specon"] and "DynamicUser" not in d


def test_exec_arg_escapes() -> None:
    assert exec_arg("/srv/specon") == "/srv/specon"
    assert exec_arg("50%") == "50%%"  # a specifier otherwise
    assert exec_arg("$HOME") == "$$HOME"  # a variable otherwise
    assert exec_arg('a "b"\\c') == '"a \\"b\\"\\\\c"'
    assert exec_arg(";") == '";"'  # a command separator otherwise
    assert exec_arg("") == '""'


def test_protect_home() -> None:
    assert cmd_systemd.protect_home([Path("/opt/specon/bin/specon-agent")]) == "yes"
    assert cmd_systemd.protect_home([Path("/opt/x"), Path("/root/.pyenv/bin/python")]) == "read-only"
    assert cmd_systemd.protect_home([Path("/home/me/venv/bin/python")]) == "read-only"


# -- systemd-analyze verify -------------------------------------------------------------

VERIFY = shutil.which("systemd-analyze")


@pytest.mark.skipif(VERIFY is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize(
    "name, text",
    [
        ("specon-agent.service", render_agent(AGENT)),
        ("specon-agent.service", render_agent(dataclasses.replace(AGENT, runtime="docker"))),
        (
            "specon-agent.service",
            render_agent(dataclasses.replace(AGENT, runtime="docker", gpu=True, docker_allow_gpus=1)),
        ),
        (
            "specon-agent.service",
            render_agent(dataclasses.replace(AGENT, runtime="docker", docker_standby_images=("t:1",))),
        ),
        (
            "specon-agent.service",
            render_agent(dataclasses.replace(AGENT, runtime="docker", token_via="environment")),
        ),
        ("specon-manager.service", render_manager(MANAGER)),
        ("specon-manager.service", render_manager(dataclasses.replace(MANAGER, listen="0.0.0.0:443"))),
        (
            "specon-agent.service",
            render_agent(
                dataclasses.replace(
                    AGENT,
                    manager="https://198.51.100.2:7700",
                    ca_file=Path("/etc/specon/ca.crt"),
                    source_address="198.51.100.3",
                )
            ),
        ),
        (
            "specon-manager.service",
            render_manager(
                dataclasses.replace(
                    MANAGER, tls_cert=Path("/etc/specon/t.crt"), tls_key=Path("/etc/specon/t.key")
                )
            ),
        ),
    ],
    ids=[
        "agent-local",
        "agent-docker",
        "agent-docker-gpu",
        "agent-docker-standby",
        "agent-env",
        "manager",
        "manager-port-443",
        "agent-tls",
        "manager-tls",
    ],
)
def test_systemd_analyze_verify(tmp_path: Path, name: str, text: str) -> None:
    unit = tmp_path / name
    unit.write_text(text)
    assert VERIFY is not None
    done = subprocess.run(
        [VERIFY, "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60, check=False
    )
    # Silent and 0: no unknown directive, bad value or missing executable.
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), done.stderr


# -- the command ------------------------------------------------------------------------


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "agent.token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


def _agent_argv(token_file: Path, *extra: str) -> list[str]:
    return [
        "systemd",
        "agent",
        "--manager",
        "http://127.0.0.1:7700",
        "--worker",
        "node-1",
        "--token-file",
        str(token_file),
        "--volume",
        "/srv/specon",
        *extra,
    ]


def test_writes_the_agent_unit(tmp_path: Path, token_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dest = tmp_path / "units"
    assert main(_agent_argv(token_file, "--dest", str(dest))) == 0
    unit = dest / "specon-agent.service"
    assert stat.S_IMODE(unit.stat().st_mode) == 0o644
    assert f"LoadCredential=token:{token_file}" in unit.read_text()
    assert TOKEN not in unit.read_text()  # the unit names the token file, never the token
    assert "systemctl daemon-reload" in capsys.readouterr().out
    assert [p.name for p in dest.iterdir()] == ["specon-agent.service"]  # no temporary left


def test_warm_passes_to_a_local_agent_only(
    tmp_path: Path, token_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_agent_argv(token_file, "--warm", "--print")) == 0
    assert "--warm" in capsys.readouterr().out
    assert main(_agent_argv(token_file, "--print")) == 0
    assert "--warm" not in capsys.readouterr().out
    assert main(_agent_argv(token_file, "--warm", "--runtime", "docker", "--print")) == 2
    assert "--warm goes with --runtime local" in capsys.readouterr().err


def test_an_install_under_tmp_is_written_with_a_warning_that_it_cannot_start(
    tmp_path: Path, token_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exe = tmp_path / "venv/bin/specon-agent"  # pytest's tmp_path is under /tmp
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/usr/bin/python3\n")
    exe.chmod(0o755)
    assert main(_agent_argv(token_file, "--exec", str(exe), "--dest", str(tmp_path / "units"))) == 0
    err = capsys.readouterr().err
    assert f"warning: {exe} is under /tmp or /var/tmp" in err and "PrivateTmp=" in err
    assert main(_agent_argv(token_file, "--exec", str(exe), "--print")) == 0
    assert "warning" not in capsys.readouterr().err  # --print only shows the unit


def test_environment_file_is_root_only(tmp_path: Path, token_file: Path) -> None:
    env = tmp_path / "etc/specon/agent.env"
    argv = _agent_argv(token_file, "--runtime", "docker", "--token-via", "environment")
    assert main([*argv, "--env-file", str(env), "--dest", str(tmp_path / "units")]) == 0
    assert stat.S_IMODE(env.stat().st_mode) == 0o600
    assert stat.S_IMODE(env.parent.stat().st_mode) == 0o700
    assert f"SPECON_TOKEN={TOKEN}" in env.read_text()
    assert f"EnvironmentFile={env}" in (tmp_path / "units/specon-agent.service").read_text()


def test_print_writes_nothing(tmp_path: Path, token_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(_agent_argv(token_file, "--print", "--dest", str(tmp_path / "units"))) == 0
    assert capsys.readouterr().out.startswith("# specon-agent for worker node-1")
    assert not (tmp_path / "units").exists()


@pytest.mark.parametrize(
    "change, message",
    [
        (("--manager", "ftp://x"), "--manager must be an http:// or https:// URL"),
        (("--manager", "http://198.51.100.2:7700"), "refusing to send the bearer token in clear text"),
        (("--ca-file", "/etc/specon/ca.crt"), "--ca-file is for an https:// manager"),
        (("--source-address", "nowhere"), "--source-address: expected an IP address"),
        (("--worker", "a/b"), "--worker"),
        (("--volume", "srv"), "--volume must be an absolute path"),
        (("--volume", "/srv/my volume"), "may hold no space"),
        (("--volume", "/tmp/vol"), "PrivateTmp= hides /tmp"),
        (
            ("--docker-host", "unix:///run/docker.sock"),
            "--docker-host and --allow-bind go with --runtime docker",
        ),
        (("--token-via", "environment"), "would hand the token to every local job"),
        (("--cpus", "0"), "--cpus must be a positive number"),
        (("--listen", "nowhere"), "--listen"),
        (("--exec", "/nonexistent/specon-agent"), "is not an executable file"),
        (("--policy", "/nonexistent/policy.yaml"), "--policy"),
    ],
)
def test_agent_refuses(
    token_file: Path, change: tuple[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = _agent_argv(token_file, "--print")
    flag, value = change
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_token_file_must_be_private_and_strong(
    tmp_path: Path, token_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    token_file.chmod(0o644)
    assert main(_agent_argv(token_file, "--print")) == 2
    assert f"mode 0644): chmod 600 {token_file}" in capsys.readouterr().err
    token_file.chmod(0o600)
    token_file.write_text("change-me\n")
    assert main(_agent_argv(token_file, "--print")) == 2
    assert "placeholder" in capsys.readouterr().err
    assert main(_agent_argv(tmp_path / "missing", "--print")) == 2
    assert "No such file" in capsys.readouterr().err


def test_enable_needs_systemd(
    tmp_path: Path, token_file: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cmd_systemd, "systemd_is_pid1", lambda: False)
    assert main(_agent_argv(token_file, "--enable", "--dest", str(tmp_path / "units"))) == 2
    assert "--enable needs systemd as the init system" in capsys.readouterr().err
    assert not (tmp_path / "units").exists()  # refused before writing anything


def test_enable_runs_systemctl(tmp_path: Path, token_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, ...]] = []
    monkeypatch.setattr(cmd_systemd, "systemd_is_pid1", lambda: True)
    monkeypatch.setattr(cmd_systemd, "systemctl", lambda *args: calls.append(args) or 0)
    assert main(_agent_argv(token_file, "--enable", "--dest", str(tmp_path))) == 0
    assert calls == [("daemon-reload",), ("enable", "--now", "specon-agent.service")]
    monkeypatch.setattr(cmd_systemd, "systemctl", lambda *args: 1)
    assert main(_agent_argv(token_file, "--enable", "--dest", str(tmp_path))) == 1


def test_manager_command(tmp_path: Path, token_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tokens = tmp_path / "agent-tokens.yaml"
    tokens.write_text(f"node-1: {TOKEN}\n")
    tokens.chmod(0o600)
    assert main(["systemd", "manager", "--print"]) == 2
    assert "needs --agent-tokens FILE" in capsys.readouterr().err
    # A DynamicUser= cannot read an install behind a 0700 directory (pytest's tmp is one).
    script = tmp_path / "bin/specon-manager"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    tmp_path.chmod(0o700)
    argv = ["systemd", "manager", "--agent-tokens", str(tokens), "--exec", str(script), "--print"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "runs as a DynamicUser=, which cannot read" in err and "--user NAME" in err
    assert main([*argv, "--user", "specon"]) == 0
    out = capsys.readouterr().out
    assert "User=specon" in out and re.search(r"^LoadCredential=agent-tokens:.*agent-tokens.yaml$", out, re.M)


# -- TLS options ------------------------------------------------------------------------


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(CA certificate, manager certificate, its key: mode 0600) of a throwaway CA."""
    from specon.testing.certs import TestCA  # noqa: PLC0415 - cryptography: a dev extra

    ca = TestCA.create(tmp_path / "ca")
    cert, key = ca.issue(tmp_path / "tls", names=["198.51.100.2", "manager.example"])
    return ca.cert_path, cert, key


def test_agent_command_with_tls(
    tmp_path: Path,
    token_file: Path,
    tls_files: tuple[Path, Path, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    ca, _, _ = tls_files
    argv = _agent_argv(token_file, "--print", "--ca-file", str(ca), "--source-address", "198.51.100.3")
    argv[argv.index("--manager") + 1] = "https://198.51.100.2:7700"
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"LoadCredential=ca.crt:{ca}" in out and "--source-address 198.51.100.3" in out
    argv[argv.index("--ca-file") + 1] = str(tmp_path / "tls" / "server.key")
    assert main(argv) == 2
    assert "--ca-file: the CA file" in capsys.readouterr().err
    plain = _agent_argv(token_file, "--print", "--insecure-http")
    plain[plain.index("--manager") + 1] = "http://198.51.100.2:7700"
    assert main(plain) == 0
    assert "--insecure-http" in capsys.readouterr().out


def test_manager_command_with_tls(
    tmp_path: Path, tls_files: tuple[Path, Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    _, cert, key = tls_files
    tokens = tmp_path / "agent-tokens.yaml"
    tokens.write_text(f"node-1: {TOKEN}\n")
    tokens.chmod(0o600)
    base = ["systemd", "manager", "--agent-tokens", str(tokens), "--user", "specon", "--print"]
    assert main([*base, "--tls-cert", str(cert), "--tls-key", str(key)]) == 0
    out = capsys.readouterr().out
    assert f"LoadCredential=tls.crt:{cert}" in out and f"LoadCredential=tls.key:{key}" in out
    assert main([*base, "--tls-cert", str(cert)]) == 2
    assert "--tls-cert and --tls-key go together" in capsys.readouterr().err
    assert main([*base, "--tls-cert", str(tmp_path / "ca" / "ca.crt"), "--tls-key", str(key)]) == 2
    assert "does not belong to the certificate" in capsys.readouterr().err
    key.chmod(0o644)
    assert main([*base, "--tls-cert", str(cert), "--tls-key", str(key)]) == 2
    assert f"mode 0644): chmod 600 {key}" in capsys.readouterr().err
