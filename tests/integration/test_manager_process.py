"""The real ``specon-manager`` process: CLI errors, HTTP on 127.0.0.1, clean exit on SIGTERM."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from manager_proc import MANAGER, Running, manager_env, running_manager, wait_healthy

from specon.model import Category, ContainerId, Resources, WorkerId
from specon.wire import protocol
from specon.wire.protocol import CommandBatch, ContainerReport, ErrorReply, Heartbeat
from specon.wire.status import Status

pytestmark = [pytest.mark.slow, pytest.mark.timeout(60)]

TOKEN = "integration-token-0123456789abcdef0123456789"


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[Running]:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    with running_manager(tmp_path, "--token-file", str(token_file)) as running:
        yield running


def _heartbeat() -> Heartbeat:
    return Heartbeat(
        worker=WorkerId("worker-1"),
        address="127.0.0.1:7701",
        seq=1,
        sent_at=1_700_000_000.0,
        capacity=Resources(cpu=4.0, memory=8 << 30),
        usage=0.3,
        containers=(ContainerReport(id=ContainerId("job-1"), category=Category.PROGRESSING),),
    )


async def test_serves_the_protocol_status_and_metrics_then_exits_cleanly_on_sigterm(manager: Running) -> None:
    auth = {protocol.AUTH_HEADER: f"Bearer {TOKEN}", "Content-Type": protocol.CONTENT_TYPE}
    async with aiohttp.ClientSession() as session:
        await wait_healthy(manager, session, tries=200)
        body = protocol.encode(_heartbeat())
        async with session.post(f"{manager.url}{protocol.HEARTBEAT_PATH}", data=body, headers=auth) as resp:
            assert resp.status == 200
            assert protocol.decode(await resp.read(), CommandBatch).ack == 1
        async with session.post(f"{manager.url}{protocol.HEARTBEAT_PATH}", data=body) as resp:
            assert resp.status == 401
            protocol.decode(await resp.read(), ErrorReply)
        async with session.get(f"{manager.url}{protocol.STATUS_PATH}") as resp:
            status = protocol.decode(await resp.read(), Status)
        async with session.get(f"{manager.url}/metrics") as resp:
            metrics = await resp.text()
    assert [w.id for w in status.workers] == ["worker-1"]
    assert [c.id for c in status.containers] == ["job-1"]
    assert 'specon_manager_heartbeats_total{worker="worker-1"} 1.0' in metrics
    assert (manager.state_dir / "journal.db").exists()

    manager.proc.send_signal(signal.SIGTERM)
    assert manager.proc.wait(15) == 0
    log = manager.log.read_text()
    assert "specon.manager.stopped" in log
    assert "Traceback" not in log


def test_help_describes_the_options() -> None:
    out = subprocess.run([str(MANAGER), "--help"], capture_output=True, text=True, timeout=30, check=True)
    assert "usage: specon-manager" in out.stdout
    for option in ("--listen", "--token-file", "--state-dir", "--policy", "--dry-run"):
        assert option in out.stdout


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ([], "no token"),
        (["--token-file", "/nonexistent/specon-token"], "cannot read the token file"),
        (["--token-file", "{placeholder}"], "the shared token is the documented placeholder"),
        (["--token-file", "{short}"], "the shared token is 12 bytes; at least 32 are required"),
        (["--agent-tokens", "{short_agent}"], "token of w0 is 5 bytes"),
        (["--agent-tokens", "{shared_agent}"], "w1 and w0 share a token"),
        (["--agent-tokens", "{bad_id}"], "invalid id 'w0\\n'"),
        (["--token-file", "{good}", "--read-token-file", "{short}"], "the read token is 12 bytes"),
    ],
    ids=[
        "no-token",
        "missing-token-file",
        "placeholder",
        "short",
        "short-agent",
        "shared-agent",
        "bad-id",
        "short-read",
    ],
)
def test_without_a_usable_token_it_exits_2_with_a_message(
    tmp_path: Path, extra: list[str], message: str
) -> None:
    files = {
        "placeholder": "REPLACE-ME-with-a-generated-token-0123456789",
        "short": "short-secret",
        "good": TOKEN,
        "short_agent": "w0: short\n",
        "shared_agent": f"w0: {TOKEN}\nw1: {TOKEN}\n",
        "bad_id": f'"w0\\n": {TOKEN}\n',
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    extra = [a.format(**{n: tmp_path / n for n in files}) for a in extra]
    out = subprocess.run(
        [str(MANAGER), "--listen", "127.0.0.1:0", "--state-dir", str(tmp_path), *extra],
        capture_output=True,
        text=True,
        timeout=30,
        env=manager_env(),
        check=False,
    )
    assert out.returncode == 2
    assert message in out.stderr
    assert "Traceback" not in out.stderr


async def _beat(session: aiohttp.ClientSession, url: str, hb: Heartbeat) -> CommandBatch:
    auth = {protocol.AUTH_HEADER: f"Bearer {TOKEN}", "Content-Type": protocol.CONTENT_TYPE}
    async with session.post(
        f"{url}{protocol.HEARTBEAT_PATH}", data=protocol.encode(hb), headers=auth
    ) as resp:
        assert resp.status == 200, await resp.text()
        return protocol.decode(await resp.read(), CommandBatch)


async def test_a_finished_jobs_quality_point_reaches_the_other_workers_and_outlives_a_restart(
    tmp_path: Path,
) -> None:
    """What one worker measured of a finished job is every worker's estimate for its model, also
    from the restarted manager (the journal keeps it; the job is counted once)."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    done = ContainerReport(
        id=ContainerId("job-1"),
        category=Category.CONVERGED,
        phase="finished",
        job={"model": "gru"},
        quality_share=0.4,
    )
    base = _heartbeat()  # job-1 running on worker-1
    first = dataclasses.replace(base, containers=(done,))
    other = dataclasses.replace(base, worker=WorkerId("worker-2"), containers=(), quality_version=0)
    for round_ in range(2):
        with running_manager(tmp_path, "--token-file", str(token_file)) as manager:
            async with aiohttp.ClientSession() as session:
                await wait_healthy(manager, session, tries=200)
                seq = 10 * round_
                if round_ == 0:  # the manager sees it run on worker-1, then finish there
                    await _beat(session, manager.url, dataclasses.replace(base, seq=1))
                await _beat(
                    session, manager.url, dataclasses.replace(first, seq=seq + 2)
                )  # again after the restart
                got = await _beat(session, manager.url, dataclasses.replace(other, seq=seq + 3))
                assert (got.quality_version, [(p.model, p.share) for p in got.quality]) == (1, [("gru", 0.4)])
                held = dataclasses.replace(other, seq=seq + 4, quality_version=1)
                assert (await _beat(session, manager.url, held)).quality_version is None
                async with session.get(f"{manager.url}/metrics") as resp:
                    metrics = await resp.text()
                assert 'specon_manager_quality_point{model="gru"} 0.4' in metrics
                assert 'specon_manager_quality_jobs{model="gru"} 1.0' in metrics
            manager.proc.send_signal(signal.SIGTERM)
            assert manager.proc.wait(15) == 0
    assert manager.log.read_text().count("specon.manager.quality_point") == 1
