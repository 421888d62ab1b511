"""The agent's systemd unit, for real: systemd as PID 1 in a container (INFRA.md's measured
recipe: debootstrap image, ``--cap-add SYS_ADMIN``, never ``--privileged``).

Inside the container ``specon systemd agent`` writes the unit (the install command itself,
run as an operator would), ``systemd-analyze verify`` checks it against that systemd, and
``systemctl start`` runs it; the agent heartbeats a real ``specon-manager`` on the host (host
network, 127.0.0.0/8 only) with its own token from ``--agent-tokens``, delivered through
``LoadCredential=``. Then ``systemctl kill -s SIGKILL``: systemd must restart it
(NRestarts=1) and the new process must heartbeat again. The manager's own unit runs as a
``DynamicUser=`` serving HTTPS with a certificate and key it gets through ``LoadCredential=``,
and the agent's unit verifies it with a CA delivered the same way.

Cold, the image's debootstrap takes about 45-90 s (cached in ``~/.cache/specon/images``).
"""

from __future__ import annotations

import contextlib
import glob
import io
import json
import os
import secrets
import signal
import ssl
import subprocess
import sys
import tarfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from specon.cli.cmd_systemd import hidden_by_private_tmp, install_paths
from specon.embedded.cluster import free_port
from tests.docker.engines import DockerUnavailable, Engine
from tests.docker.systemd_image import ensure_image, run_kwargs

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(300)]

BIN = Path(sys.executable).parent  # the venv's bin/, bound at the same path in the container
TOKEN_INSIDE = "/etc/specon/agent.token"
VOLUME_INSIDE = "/srv/specon"


def _addr() -> str:
    """A random loopback address: parallel runs (and other engineers) do not collide."""
    return f"127.{secrets.randbelow(200) + 20}.{secrets.randbelow(250) + 1}.{secrets.randbelow(250) + 2}"


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """A real ``specon-manager`` on the host: ``(url, worker, that worker's token)``."""
    worker, token = f"sd-{secrets.token_hex(3)}", secrets.token_hex(32)
    tokens = tmp_path / "agent-tokens.yaml"
    tokens.write_text(f"{worker}: {token}\n")
    tokens.chmod(0o600)
    host = _addr()
    port = free_port(host)
    log = tmp_path / "manager.log"
    env = {k: v for k, v in os.environ.items() if k != "SPECON_TOKEN"}
    argv = [str(BIN / "specon-manager"), "--listen", f"{host}:{port}", "--agent-tokens", str(tokens)]
    argv += ["--state-dir", str(tmp_path / "state")]
    with log.open("wb") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env)
    url = f"http://{host}:{port}"
    try:
        _until(lambda: _get(f"{url}/healthz") is not None, 20, "the manager to answer", log)
        yield url, worker, token
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def booted(docker_engine: Engine) -> Iterator[Any]:
    """A container running systemd as PID 1 (removed afterwards, also on failure)."""
    hidden = hidden_by_private_tmp(install_paths(BIN / "specon-agent"))
    if hidden is not None:
        pytest.skip(
            f"this checkout's install ({hidden}) is under /tmp or /var/tmp, which the units' "
            "PrivateTmp= hides from the service, so they cannot start from it: run make test from "
            "a checkout elsewhere (specon systemd warns about such an install)"
        )
    client = docker_engine.client()
    try:
        image = ensure_image(client)
    except DockerUnavailable as err:
        pytest.skip(f"no systemd image: {err}")
    container = client.containers.run(**run_kwargs(image, f"specon-systemd-{secrets.token_hex(3)}"))
    try:
        state = ""
        deadline = time.monotonic() + 60
        while state not in ("running", "degraded"):
            if time.monotonic() > deadline:
                logs = container.logs()[-3000:].decode(errors="replace")
                pytest.fail(f"systemd did not boot: {state!r}\n{logs}")
            time.sleep(0.5)
            state = _exec(container, "systemctl is-system-running", check=False).strip()
        yield container
    finally:
        # A clean stop lets the agent prune the job cgroups it made under the container's own.
        with contextlib.suppress(Exception):
            _exec(container, "systemctl stop specon-agent", check=False)
        cid = container.id
        with contextlib.suppress(docker.errors.APIError):
            container.remove(force=True)
        for leftover in sorted(glob.glob(f"/sys/fs/cgroup/*/docker/{cid}/**/", recursive=True), reverse=True):
            with contextlib.suppress(OSError):
                os.rmdir(leftover)


def test_agent_unit_restarts_and_heartbeats(manager: tuple[str, str, str], booted: Any) -> None:
    url, worker, token = manager
    _put_secret(booted, TOKEN_INSIDE, token)
    _exec(booted, f"mkdir -p {VOLUME_INSIDE}")
    listen = f"{_addr()}:{free_port()}"
    # The install command, as an operator runs it on the node.
    out = _exec(
        booted,
        f"{BIN / 'specon'} systemd agent --manager {url} --worker {worker} --token-file {TOKEN_INSIDE} "
        f"--volume {VOLUME_INSIDE} --listen {listen}",
    )
    assert "wrote /etc/systemd/system/specon-agent.service" in out
    verify = booted.exec_run(["systemd-analyze", "verify", "/etc/systemd/system/specon-agent.service"])
    assert verify.exit_code == 0 and not verify.output.strip(), verify.output.decode(errors="replace")
    _exec(booted, "systemctl daemon-reload && systemctl start specon-agent")

    def journal() -> str:
        return _exec(booted, "journalctl -u specon-agent --no-pager -o cat", check=False)

    first = _until(lambda: _heartbeat(url, worker), 30, "the agent's first heartbeat", journal)
    pid = _show(booted)["MainPID"]
    # The token reached it through LoadCredential= only: the process sees no SPECON_TOKEN.
    environ = _exec(booted, f"tr '\\0' '\\n' < /proc/{pid}/environ")
    assert "SPECON_TOKEN" not in environ and "CREDENTIALS_DIRECTORY=" in environ

    assert first[1] <= first[0]
    _exec(booted, "systemctl kill -s SIGKILL specon-agent")
    # The manager's clock after the old process died: a heartbeat newer than this is the new one's.
    killed_at = _until(lambda: _heartbeat(url, worker), 10, "the status after the kill", journal)[0]

    def restarted() -> dict[str, str] | None:
        shown = _show(booted)
        up = shown["ActiveState"] == "active" and shown["MainPID"] not in ("0", pid)
        return shown if up and shown["NRestarts"] == "1" else None

    shown = _until(restarted, 30, "systemd to restart the agent", journal)
    assert shown["Result"] == "success"  # the unit is back up, no start failures on the way
    # A heartbeat the manager received after the kill, from the new process.
    _until(lambda: (hb := _heartbeat(url, worker)) and hb[1] > killed_at, 30, "a fresh heartbeat", journal)
    assert journal().count("specon.agent.started") == 2


@pytest.mark.parametrize("fronts", [0, 2])
def test_manager_unit_runs_as_a_dynamic_user_over_tls(booted: Any, tmp_path: Path, fronts: int) -> None:
    """The manager's unit, with its sandbox and syscall filter, serves an agent's unit over
    HTTPS: certificate, key and CA reach the services only through ``LoadCredential=``. With
    ``--fronts 2`` the fronts run in the same sandbox, relay the agent's heartbeats, and
    ``systemctl stop`` (SIGTERM to every process of the unit) ends them all cleanly."""
    from specon.testing.certs import TestCA  # noqa: PLC0415 - cryptography: a dev extra

    worker, token = f"sd-{secrets.token_hex(3)}", secrets.token_hex(32)
    _put_secret(booted, "/etc/specon/agent-tokens.yaml", f"{worker}: {token}")
    _put_secret(booted, TOKEN_INSIDE, token)
    host, port = _addr(), free_port()
    ca = TestCA.create(tmp_path / "ca")
    cert, key = ca.issue(tmp_path / "tls", names=[host])
    for name, path in (("ca.crt", ca.cert_path), ("manager.crt", cert), ("manager.key", key)):
        _put_secret(booted, f"/etc/specon/tls/{name}", path.read_text().strip())
    # The image's own /root (0700) stands between a DynamicUser= and the bound Python install;
    # on a real host specon lives somewhere world-readable (/opt/specon).
    _exec(booted, f"chmod 0755 /root && mkdir -p {VOLUME_INSIDE}")
    url = f"https://{host}:{port}"
    specon = BIN / "specon"
    _exec(
        booted,
        f"{specon} systemd manager --agent-tokens /etc/specon/agent-tokens.yaml --listen {host}:{port} "
        f"--tls-cert /etc/specon/tls/manager.crt --tls-key /etc/specon/tls/manager.key --fronts {fronts} && "
        f"{specon} systemd agent --manager {url} --worker {worker} --token-file {TOKEN_INSIDE} "
        f"--volume {VOLUME_INSIDE} --listen {_addr()}:{free_port()} --ca-file /etc/specon/tls/ca.crt",
    )
    verify = booted.exec_run(["systemd-analyze", "verify", "/etc/systemd/system/specon-manager.service"])
    assert verify.exit_code == 0 and not verify.output.strip(), verify.output.decode(errors="replace")
    _exec(booted, "systemctl daemon-reload && systemctl start specon-manager specon-agent")

    def journal() -> str:
        return _exec(booted, "journalctl -u specon-manager -u specon-agent --no-pager -o cat", check=False)

    _until(
        lambda: _heartbeat(url, worker, ca.cert_path),
        30,
        "the agent's heartbeat at the manager's unit",
        journal,
    )
    assert '"tls": true' in journal() and "specon.agent.tls_error" not in journal()
    shown = _exec(booted, "systemctl show -p MainPID,NRestarts specon-manager")
    assert "NRestarts=0" in shown, journal()  # never killed by its syscall filter
    pid = shown.split("MainPID=")[1].split()[0]
    status = dict(
        line.split(":", 1) for line in _exec(booted, f"cat /proc/{pid}/status").splitlines() if ":" in line
    )
    assert status["Uid"].split()[0] != "0"  # a dynamic user
    assert int(status["CapEff"], 16) == 0 and int(status["CapBnd"], 16) == 0  # no capability at all
    assert status["NoNewPrivs"].strip() == "1"
    # The journal is in its state directory, owned by that user and by nobody else.
    _exec(booted, "test -s /var/lib/private/specon-manager/journal.db")
    children = _exec(booted, f"cat /proc/{pid}/task/*/children").split()
    assert len(children) == fronts, journal()
    if fronts:
        relayed = _until(lambda: _relayed(url, ca.cert_path), 30, "heartbeats relayed by the fronts", journal)
        assert relayed >= 1
        _exec(booted, "systemctl stop specon-manager")
        stopped = _exec(booted, "systemctl show -p Result,ActiveState specon-manager")
        assert "Result=success" in stopped and "ActiveState=inactive" in stopped, journal()
        # Stopped, not lost: no front was started again while the unit stopped.
        assert journal().count('"specon.manager.front_started"') == fronts, journal()


# -- helpers ----------------------------------------------------------------------------


def _exec(container: Any, command: str, *, check: bool = True) -> str:
    result = container.exec_run(["sh", "-c", command])
    text = result.output.decode(errors="replace")
    if check and result.exit_code != 0:
        pytest.fail(f"{command!r} exited {result.exit_code}:\n{text}")
    return str(text)


def _show(container: Any) -> dict[str, str]:
    text = _exec(container, "systemctl show -p MainPID,NRestarts,ActiveState,Result specon-agent")
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def _put_secret(container: Any, path: str, content: str) -> None:
    """Write a root-only file into the container (not through a command line)."""
    data = (content + "\n").encode()
    info = tarfile.TarInfo(Path(path).name)
    info.size, info.mode = len(data), 0o600
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.addfile(info, io.BytesIO(data))
    _exec(container, f"mkdir -p -m 0700 {Path(path).parent}")
    assert container.put_archive(str(Path(path).parent), buf.getvalue())


def _get(url: str, ca: Path | None = None) -> Any:
    context = ssl.create_default_context(cafile=str(ca)) if ca else None
    with (
        contextlib.suppress(OSError, ValueError),
        urllib.request.urlopen(url, timeout=5, context=context) as resp,
    ):
        return json.loads(resp.read())
    return None


def _heartbeat(url: str, worker: str, ca: Path | None = None) -> tuple[float, float] | None:
    """``(manager now, manager time of the worker's last heartbeat)``, None before the first
    (an https manager verified against ``ca``)."""
    status = _get(f"{url}/v1/status", ca)
    for w in (status or {}).get("workers", []):
        if w["id"] == worker and w["heartbeat_age"] is not None:
            return float(status["now"]), float(status["now"]) - float(w["heartbeat_age"])
    return None


def _relayed(url: str, ca: Path) -> float | None:
    """``specon_manager_relayed_heartbeats_total`` of an https manager (None while 0 or unread)."""
    with (
        contextlib.suppress(OSError, ValueError),
        urllib.request.urlopen(
            f"{url}/metrics", timeout=5, context=ssl.create_default_context(cafile=str(ca))
        ) as r,
    ):
        for line in r.read().decode().splitlines():
            if line.startswith("specon_manager_relayed_heartbeats_total "):
                return float(line.split()[1]) or None
    return None


def _until(probe: Any, timeout: float, what: str, log: Any) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            detail = log.read_text() if isinstance(log, Path) else log()
            pytest.fail(f"timed out waiting for {what}:\n{detail[-4000:]}")
        time.sleep(0.5)
