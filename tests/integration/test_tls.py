"""TLS between real ``specon-manager`` and ``specon-agent`` processes over loopback.

The manager serves HTTPS on 127.0.0.1 with a certificate of a throwaway CA
(``specon.testing.certs``); the agent verifies it with ``--ca-file``. A good certificate
carries the heartbeats; a wrong CA, an expired certificate and a wrong host name are each
refused with one ``specon.agent.tls_error`` line, however often the agent retries, and a
renewed certificate (the manager re-reads its files) heals the link without a restart. An
agent told to send its token over plain HTTP off loopback refuses to start (exit 2), unless
``--insecure-http``; the manager refuses a half or unusable pair of files (exit 2).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from listening import serve_on_free_port

from specon.testing.certs import TestCA

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

MANAGER = Path(sys.executable).with_name("specon-manager")
TOKEN = "tls-integration-token-0123456789abcdef0123"
WORKER = "w0"
# Quick retries: the tests watch the agent retry a refused handshake several times.
AGENT_ENV = {"SPECON_AGENT_BACKOFF_INITIAL": "0.2", "SPECON_AGENT_BACKOFF_MAX": "1"}
MANAGER_ENV = {"SPECON_MANAGER_TLS_RELOAD_INTERVAL": "0.2"}


def _env(extra: dict[str, str]) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k != "SPECON_TOKEN"}, **extra}


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    url: str
    log: Path

    def events(self, name: str) -> list[dict[str, Any]]:
        """The JSON log lines of event ``name``."""
        out = []
        for line in self.log.read_text(errors="replace").splitlines():
            if f'"{name}"' in line:
                out.append(json.loads(line))
        return [e for e in out if e.get("event") == name]


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # the agent releases its cgroup on a clean stop
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Rig:
    """Starts daemons in ``root`` and stops every one of them at the end."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.procs: list[subprocess.Popen[bytes]] = []
        self.token = root / "token"
        self.token.write_text(TOKEN + "\n")
        self.ca = TestCA.create(root / "ca")

    def manager(self, cert: Path, key: Path, *extra: str) -> Daemon:
        log = self.root / "manager.log"

        def start(port: int) -> subprocess.Popen[bytes]:
            argv = [str(MANAGER), "--listen", f"127.0.0.1:{port}", "--token-file", str(self.token)]
            argv += ["--state-dir", str(self.root / "state"), "--tls-cert", str(cert), "--tls-key", str(key)]
            argv += extra
            with log.open("ab") as err:
                return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=_env(MANAGER_ENV))

        proc, port = serve_on_free_port(start, log)
        self.procs.append(proc)
        return Daemon(proc, f"https://127.0.0.1:{port}", log)

    def agent_argv(self, manager_url: str, *extra: str, listen: str) -> list[str]:
        return [
            sys.executable, "-m", "specon_agent",
            "--worker", WORKER,
            "--listen", listen,
            "--manager", manager_url,
            "--volume", str(self.root / "volume"),
            "--cpus", "0.5",
            "--cluster", f"tls{os.getpid()}",
            "--token-file", str(self.token),
            *extra,
        ]  # fmt: skip

    def agent(self, manager_url: str, *extra: str) -> Daemon:
        log = self.root / "agent.log"

        def start(port: int) -> subprocess.Popen[bytes]:
            argv = self.agent_argv(manager_url, *extra, listen=f"127.0.0.1:{port}")
            with log.open("ab") as err:
                return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=_env(AGENT_ENV))

        proc, port = serve_on_free_port(start, log)
        self.procs.append(proc)
        return Daemon(proc, f"http://127.0.0.1:{port}", log)

    def close(self) -> None:
        for proc in reversed(self.procs):
            _stop(proc)


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path)
    try:
        yield r
    finally:
        r.close()


def _get(url: str, ca: Path | None = None) -> bytes:
    """GET ``url``; an https one verified against ``ca``, or not verified at all when None
    (the test looking at a manager whose certificate is the one under test)."""
    context = None
    if url.startswith("https://"):
        context = ssl.create_default_context(cafile=str(ca)) if ca else ssl._create_unverified_context()
    with urllib.request.urlopen(url, timeout=5, context=context) as resp:
        return resp.read()  # type: ignore[no-any-return]


def _workers(manager: Daemon, ca: Path | None = None) -> list[str]:
    status = json.loads(_get(f"{manager.url}/v1/status", ca))
    return [w["id"] for w in status["workers"]]


def _tls_errors(agent: Daemon) -> float:
    text = _get(f"{agent.url}/metrics").decode()
    match = re.search(r"^specon_agent_tls_errors_total (\S+)$", text, re.M)
    assert match, text
    return float(match.group(1))


def _until(probe: Callable[[], Any], what: str, *logs: Daemon, timeout: float = 45.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        for d in logs:
            assert d.proc.poll() is None, f"{d.log.name} exited:\n{d.log.read_text()[-3000:]}"
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {d.log.name}\n{d.log.read_text()[-3000:]}" for d in logs)
            pytest.fail(f"timed out waiting for {what}\n{tails}")
        time.sleep(0.2)


def _renew(rig: Rig, live: Path, names: list[str]) -> None:
    """Replace the manager's files as a renewal does: new files renamed over the old."""
    fresh = rig.root / f"renewed-{time.monotonic_ns()}"
    for path in rig.ca.issue(fresh, names=names):
        shutil.move(path, live / path.name)


# -- a good certificate -------------------------------------------------------------------


def test_a_good_certificate_carries_the_heartbeats(rig: Rig) -> None:
    cert, key = rig.ca.issue(rig.root / "tls", names=["127.0.0.1"])
    manager = rig.manager(cert, key)
    agent = rig.agent(manager.url, "--ca-file", str(rig.ca.cert_path))
    _until(lambda: WORKER in _workers(manager, rig.ca.cert_path), "the agent's heartbeat", manager, agent)
    metrics = _get(f"{manager.url}/metrics", rig.ca.cert_path).decode()
    assert f'specon_manager_heartbeats_total{{worker="{WORKER}"}}' in metrics
    assert 'specon_manager_tls_reloads_total{result="ok"} 0.0' in metrics
    (started,) = agent.events("specon.agent.started")
    assert started["tls"] is True and started["source_address"] is None
    assert manager.events("specon.manager.starting")[0]["tls"] is True
    assert not agent.events("specon.agent.tls_error")
    assert _tls_errors(agent) == 0
    # The manager's port speaks TLS only: a plain request gets no answer.
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        _get(manager.url.replace("https://", "http://") + "/healthz")
    assert TOKEN not in agent.log.read_text() + manager.log.read_text()


# -- refused certificates ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "reason", "heals"),
    [
        ("wrong-ca", "certificate verify failed: unable to get local issuer certificate", False),
        ("expired", "certificate verify failed: certificate has expired", True),
        (
            "wrong-name",
            "certificate verify failed: IP address mismatch, certificate is not valid for '127.0.0.1'.",
            True,
        ),
    ],
)
def test_a_bad_certificate_is_refused_with_one_clear_line_and_retried(
    rig: Rig, case: str, reason: str, heals: bool
) -> None:
    live = rig.root / "tls"
    names = ["198.51.100.7", "specon-manager"] if case == "wrong-name" else ["127.0.0.1"]
    past = datetime.now(UTC) - timedelta(hours=1) if case == "expired" else None
    cert, key = rig.ca.issue(live, names=names, not_after=past)
    manager = rig.manager(cert, key)
    trusted = TestCA.create(rig.root / "other-ca").cert_path if case == "wrong-ca" else rig.ca.cert_path
    agent = rig.agent(manager.url, "--ca-file", str(trusted))

    _until(lambda: _tls_errors(agent) >= 4, "several refused handshakes", manager, agent)
    (line,) = agent.events("specon.agent.tls_error")  # once, not once per retry
    assert line["reason"] == reason and line["level"] == "error" and line["hint"]
    assert line["manager"] == manager.url
    assert _workers(manager) == []  # nothing got through
    if not heals:
        return
    # The manager gets a good certificate: the agent's next retry goes through, no restart.
    _renew(rig, live, ["127.0.0.1"])
    _until(lambda: WORKER in _workers(manager), "a heartbeat after the renewal", agent)
    assert manager.events("specon.manager.tls_reloaded")
    # The agent logs it once the reply is back, which can be after the manager listed it.
    _until(lambda: bool(agent.events("specon.agent.tls_ok")), "the agent to say TLS is fine again", agent)
    assert len(agent.events("specon.agent.tls_error")) == 1


def test_fronts_serve_tls_and_the_renewed_certificate(rig: Rig) -> None:
    """With ``--fronts``, the fronts end TLS: a real agent's heartbeats are relayed through
    them once the manager's certificate is renewed from one the agent refuses."""
    live = rig.root / "tls"
    cert, key = rig.ca.issue(live, names=["198.51.100.7"])
    manager = rig.manager(cert, key, "--fronts", "2")
    agent = rig.agent(manager.url, "--ca-file", str(rig.ca.cert_path))
    _until(lambda: _tls_errors(agent) >= 2, "refused handshakes", manager, agent)
    _renew(rig, live, ["127.0.0.1"])
    _until(lambda: WORKER in _workers(manager), "a heartbeat after the renewal", agent)

    def relayed() -> float:
        text = _get(f"{manager.url}/metrics").decode()
        match = re.search(r"^specon_manager_relayed_heartbeats_total (\S+)$", text, re.M)
        assert match, text
        return float(match.group(1))

    _until(lambda: relayed() >= 2, "heartbeats relayed by the fronts", agent)
    assert manager.events("specon.manager.front_started") and not manager.events(
        "specon.manager.front_exited"
    )


# -- refused before starting -----------------------------------------------------------------


def _run_agent(rig: Rig, *args: str) -> subprocess.CompletedProcess[str]:
    argv = rig.agent_argv(*args, listen="127.0.0.1:0")
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=_env({}), check=False)


def test_plain_http_to_a_remote_manager_is_refused_before_anything(rig: Rig) -> None:
    rig.token.unlink()  # refused before the token is even read: nothing could be sent
    out = _run_agent(rig, "http://198.51.100.9:7700")
    assert out.returncode == 2
    (line,) = out.stderr.splitlines()
    assert line.startswith(
        "specon-agent: refusing to send the bearer token in clear text to http://198.51.100.9:7700"
    )
    assert "--insecure-http" in line


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("http://127.0.0.1:9", "--ca-file", "{ca}"), "--ca-file is for an https:// manager"),
        (("https://127.0.0.1:9", "--ca-file", "{missing}"), "--ca-file: cannot read the CA file"),
        (("https://127.0.0.1:9", "--ca-file", "{token}"), "--ca-file: the CA file"),
    ],
    ids=["ca-with-http", "missing-ca", "not-a-ca"],
)
def test_an_unusable_ca_file_stops_the_agent(rig: Rig, args: tuple[str, ...], says: str) -> None:
    files = {"ca": rig.ca.cert_path, "missing": rig.root / "absent.crt", "token": rig.token}
    out = _run_agent(rig, *(a.format(**files) for a in args))
    assert out.returncode == 2
    assert says in out.stderr and "Traceback" not in out.stderr


def test_insecure_http_lets_the_agent_start(rig: Rig) -> None:
    """In a network namespace of its own (loopback only): the manager address is unreachable
    there, so the agent's attempts never leave this process's namespace."""
    unshare = shutil.which("unshare")
    probe = subprocess.run([unshare or "unshare", "-n", "true"], capture_output=True, check=False)
    if unshare is None or probe.returncode != 0:
        pytest.skip(f"no private network namespace here: {probe.stderr.decode(errors='replace').strip()}")
    argv = rig.agent_argv("http://198.51.100.9:7700", "--insecure-http", listen="127.0.0.1:7701")
    log = rig.root / "agent.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(
            [unshare, "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *argv],
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=_env(AGENT_ENV),
        )
    rig.procs.append(proc)
    agent = Daemon(proc, "", log)
    _until(lambda: agent.events("specon.agent.manager_unreachable"), "a first attempt", agent)
    (started,) = agent.events("specon.agent.started")
    assert started["manager"] == "http://198.51.100.9:7700" and started["tls"] is False
    _stop(proc)
    assert proc.returncode == 0


# -- the manager's pair of files -----------------------------------------------------------


@pytest.mark.parametrize(
    ("which", "says"),
    [
        ("cert-only", "--tls-cert and --tls-key go together"),
        ("missing", "cannot read the certificate"),
        ("mismatched", "does not belong to the certificate"),
    ],
)
def test_the_manager_refuses_an_unusable_pair(rig: Rig, which: str, says: str) -> None:
    cert, key = rig.ca.issue(rig.root / "a", names=["127.0.0.1"])
    _, other_key = rig.ca.issue(rig.root / "b", names=["127.0.0.1"])
    tls = {
        "cert-only": ["--tls-cert", str(cert)],
        "missing": ["--tls-cert", str(rig.root / "absent.crt"), "--tls-key", str(key)],
        "mismatched": ["--tls-cert", str(cert), "--tls-key", str(other_key)],
    }[which]
    argv = [str(MANAGER), "--listen", "127.0.0.1:0", "--token-file", str(rig.token)]
    argv += ["--state-dir", str(rig.root / "state"), *tls]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=_env({}), check=False)
    assert out.returncode == 2
    assert says in out.stderr and "Traceback" not in out.stderr
