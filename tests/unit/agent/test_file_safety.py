"""Files the agent reads on the shared volume, where a job may plant anything: a FIFO, a
device or a symlink in place of a progress log or a job record is refused (counted, logged,
or a clear error), never followed, never waited on; and log reading runs off the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import structlog
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from specon_agent.app import create_app
from specon_agent.client import ManagerClient
from specon_agent.core import Agent
from specon_agent.daemon import AgentDaemon

from specon.checkpoint import NotRegularFileError
from specon.config import ProgressConfig
from specon.model import ContainerId, Resources
from specon.progress import DirectoryTailer, Tailer, read_file
from specon.progress.last import last_event, last_record
from specon.progress.reader import FileReader
from specon.progress.samples import ProgressStats, Sample
from specon.runtime import JobSpec, volume
from specon.runtime.volume import CorruptRecordError, JobPaths, Owner
from specon.testing.fake_runtime import FakeClock, FakeRuntime, FakeVolume, JobScript
from tests.unit.manager_fakes import policy as make_policy

T = TypeVar("T")
Client = TestClient[web.Request, web.Application]
JSONL = ProgressConfig(format="jsonl")
RECORDS = b'{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.25}\n'


def finishes(fn: Callable[[], T], *, fifo: Path | None = None, within: float = 5.0) -> T:
    """``fn()``, asserting that it returns within ``within`` seconds.

    Run in a thread so that a hang fails the test instead of hanging it; a reader stuck
    opening ``fifo`` is released afterwards (by opening its other end).
    """
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(within)
    hung = thread.is_alive()
    if hung and fifo is not None:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(within)
    assert not hung, f"{fn} hung"
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    """A file outside the job's directory that a planted symlink points at."""
    path = tmp_path / "secret.jsonl"
    path.write_bytes(RECORDS)
    return path


@pytest.fixture
def job(tmp_path: Path) -> JobPaths:
    paths = JobPaths.of(tmp_path / "volume", "j1")
    paths.create()
    return paths


# --- the last record (how runtimes tell a job finished) ---------------------------------------


def test_a_fifo_in_place_of_the_progress_log_has_no_record_and_never_hangs(job: JobPaths) -> None:
    os.mkfifo(job.progress)

    assert finishes(lambda: last_record(job.progress), fifo=job.progress) is None
    assert finishes(job.finished, fifo=job.progress) is False


def test_a_symlinked_progress_log_is_not_followed(job: JobPaths, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.jsonl"
    elsewhere.write_text('{"event": "finished"}\n')
    job.progress.symlink_to(elsewhere)

    assert last_event(job.progress) is None
    assert not job.finished()


# --- the tailers ------------------------------------------------------------------------------


def test_the_tailer_refuses_a_symlink_counts_it_once_and_logs_it(tmp_path: Path, secret: Path) -> None:
    log = tmp_path / "progress.jsonl"
    log.symlink_to(secret)
    with Tailer(log, JSONL) as tailer, structlog.testing.capture_logs() as logs:
        polls = [tailer.poll() for _ in range(3)]

        assert polls == [[], [], []]
        assert tailer.stats.refused == 1 and tailer.stats.bytes_read == 0
        assert tailer.error is not None and "symlink" in tailer.error
    [event] = [e for e in logs if e["event"] == "specon.progress.file_refused"]
    assert event["kind"] == "a symlink" and event["path"] == str(log)


def test_the_tailer_refuses_a_fifo_without_hanging(tmp_path: Path) -> None:
    log = tmp_path / "progress.jsonl"
    os.mkfifo(log)
    with Tailer(log, JSONL) as tailer:
        assert finishes(tailer.poll, fifo=log) == []
        assert tailer.stats.refused == 1 and tailer.error is not None and "FIFO" in tailer.error


def test_a_log_replaced_by_a_symlink_is_finished_then_refused(tmp_path: Path, secret: Path) -> None:
    log = tmp_path / "progress.jsonl"
    log.write_bytes(RECORDS)
    with Tailer(log, JSONL) as tailer:
        assert len(tailer.poll()) == 2
        log.unlink()
        log.symlink_to(secret)

        assert tailer.poll() == [] and tailer.poll() == []
        assert tailer.stats.refused == 1 and tailer.stats.samples == 2


def test_a_refused_path_that_becomes_a_regular_file_is_read(tmp_path: Path) -> None:
    log = tmp_path / "progress.jsonl"
    os.mkfifo(log)
    with Tailer(log, JSONL) as tailer:
        assert tailer.poll() == []
        log.unlink()
        log.write_bytes(RECORDS)

        assert [s.step for s in tailer.poll()] == [1, 2]
        assert tailer.error is None


def test_opening_checks_what_was_opened_not_what_was_looked_at(tmp_path: Path, secret: Path) -> None:
    # The race between the tailer's lstat and its open: the opener itself refuses.
    fifo, link = tmp_path / "fifo", tmp_path / "link"
    os.mkfifo(fifo)
    link.symlink_to(secret)
    for path in (fifo, link):
        with pytest.raises(NotRegularFileError):
            finishes(functools.partial(FileReader.open, path, config=JSONL, stats=ProgressStats()), fifo=fifo)


def test_the_directory_tailer_refuses_symlinks_and_fifos_and_passes_over_directories(
    tmp_path: Path, secret: Path
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "a.jsonl").write_bytes(RECORDS)
    (logs / "b.jsonl").symlink_to(secret)
    os.mkfifo(logs / "c.jsonl")
    (logs / "d.jsonl").mkdir()
    with DirectoryTailer(logs, JSONL, "*.jsonl") as tailer:
        assert len(finishes(tailer.poll, fifo=logs / "c.jsonl")) == 2
        assert len(tailer.poll()) == 0

        assert tailer.files == [logs / "a.jsonl"]
        assert tailer.stats.refused == 2


def test_read_file_follows_a_users_symlink_but_refuses_a_fifo(tmp_path: Path, secret: Path) -> None:
    link, fifo = tmp_path / "link.jsonl", tmp_path / "fifo.jsonl"
    link.symlink_to(secret)
    os.mkfifo(fifo)

    samples, _ = read_file(link, JSONL)  # `specon classify` on a path its user chose

    assert len(samples) == 2
    with pytest.raises(OSError, match="FIFO"):
        finishes(lambda: read_file(fifo, JSONL), fifo=fifo)


# --- job records on the volume ----------------------------------------------------------------


def test_job_records_that_are_fifos_or_symlinks_are_clear_errors(job: JobPaths, tmp_path: Path) -> None:
    os.mkfifo(job.owner)
    outside = tmp_path / "spec.json"
    outside.write_text(json.dumps({"id": "j1", "command": ["sh"]}))
    job.spec.symlink_to(outside)
    os.mkfifo(job.exits)

    with pytest.raises(CorruptRecordError, match="FIFO"):
        finishes(job.read_owner, fifo=job.owner)
    with pytest.raises(CorruptRecordError, match="symlink"):
        job.read_spec()
    assert finishes(job.read_exits, fifo=job.exits) == ([], 1)


def test_an_oversized_owner_record_is_not_read(job: JobPaths) -> None:
    owner = Owner(worker="w0", run_id="r", started_at=1.0, host="h")  # type: ignore[arg-type]
    job.write_owner(owner)
    assert job.read_owner() == owner
    with job.owner.open("ab") as fh:
        fh.truncate(1 << 20)

    with pytest.raises(CorruptRecordError, match="larger than"):
        job.read_owner()


def test_a_huge_exit_log_is_read_from_its_end(job: JobPaths, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(volume, "EXITS_MAX", 200)
    job.exits.write_bytes(b"x" * 1000 + b"\n")
    assert job.read_exits() == ([], 1)


# --- the agent --------------------------------------------------------------------------------


@pytest.fixture
async def daemon(
    tmp_path: Path,
) -> AsyncIterator[tuple[AgentDaemon, Client]]:
    fake = FakeVolume(FakeClock(1000.0, autojump=True), root=tmp_path / "volume")
    runtime = FakeRuntime("w0", fake, capacity=Resources(cpu=2.0))
    pol = make_policy(monitor={"interval": 0.05}, messaging={"heartbeat_interval": 0.05})
    d = AgentDaemon(Agent(runtime=runtime, policy=pol), ManagerClient("http://127.0.0.1:9", "unused"))
    fake.script("a", JobScript(loss=lambda step: 100.0 - step))
    await runtime.start(JobSpec(id=ContainerId("a"), command=("train",)))
    async with TestClient(TestServer(create_app(d))) as client:
        yield d, client
    if d._tasks:
        await d.stop(goodbye=False)
    for w in d.agent.watched.values():
        w.tailer.close()


@pytest.fixture
def poll_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The name of the thread each tailer poll's reading ran in."""
    names: list[str] = []
    original = Tailer._poll

    def recording(self: Tailer) -> list[object]:
        names.append(threading.current_thread().name)
        return original(self)  # type: ignore[return-value]

    monkeypatch.setattr(Tailer, "_poll", recording)
    yield names


async def test_the_monitor_reads_logs_in_a_worker_thread(
    daemon: tuple[AgentDaemon, object], poll_threads: list[str]
) -> None:
    d, _ = daemon
    d.start()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10.0
    while d.agent.counters.ticks < 3 or d.agent.counters.samples == 0:
        assert loop.time() < deadline, "no ticks with samples"
        await asyncio.sleep(0.01)

    main = threading.main_thread().name
    # The first poll, at adoption, finds where the log ends; every tick's reading is off the loop.
    assert poll_threads[0] == main
    assert len(poll_threads) >= 4 and main not in poll_threads[1:]


async def test_healthz_answers_while_the_logs_are_being_read(
    daemon: tuple[AgentDaemon, Client], monkeypatch: pytest.MonkeyPatch
) -> None:
    d, client = daemon
    await d.agent.refresh()
    await d.agent.runtime.sleep(5.0)  # the fake job writes five records
    reading, release = threading.Event(), threading.Event()
    original = Tailer._poll

    def slow(self: Tailer) -> list[object]:
        reading.set()
        release.wait(10.0)  # a read that takes long: a huge log on a slow volume
        return original(self)  # type: ignore[return-value]

    monkeypatch.setattr(Tailer, "_poll", slow)
    read = asyncio.create_task(d.read_logs())
    assert await asyncio.to_thread(reading.wait, 5.0)

    resp = await asyncio.wait_for(client.get("/healthz"), 2.0)
    assert resp.status == 200 and (await resp.json())["containers"] == 1
    assert not read.done()
    release.set()
    await read
    monkeypatch.setattr(Tailer, "_poll", original)

    d.agent.tick(d.agent.runtime.now())  # hands over what the worker thread read
    assert d.agent.counters.samples == 5


def is_closed(reader: FileReader) -> bool:
    return reader._file.closed


def test_closing_a_tailer_never_waits_for_a_read_in_progress(tmp_path: Path) -> None:
    log = tmp_path / "progress.jsonl"
    log.write_bytes(RECORDS)
    tailer = Tailer(log, JSONL)
    assert len(tailer.poll()) == 2
    [reader] = tailer._readers()
    reading, release = threading.Event(), threading.Event()
    original = tailer._poll

    def slow() -> list[Sample]:
        reading.set()
        release.wait(10.0)  # a long read: a huge log, a slow volume
        return original()

    tailer._poll = slow  # type: ignore[method-assign]
    worker = threading.Thread(target=tailer.prefetch)
    worker.start()
    assert reading.wait(5.0)

    finishes(tailer.close, within=1.0)  # as the event loop would: it returns at once,
    assert not is_closed(reader)  # and the file being read stays open under the read
    release.set()
    worker.join(5.0)

    assert is_closed(reader)  # closed as the read returned
    assert tailer.poll() == []


def test_prefetch_then_poll_reads_once(tmp_path: Path) -> None:
    log = tmp_path / "progress.jsonl"
    log.write_bytes(RECORDS)
    with Tailer(log, JSONL) as tailer:
        tailer.prefetch()
        read = tailer.stats.bytes_read
        log.unlink()  # poll must not need the file any more

        assert [s.step for s in tailer.poll()] == [1, 2]
        assert tailer.stats.bytes_read == read
        tailer.close()
        assert tailer.poll() == []


async def test_metrics_count_watched_containers_whose_log_is_refused(
    daemon: tuple[AgentDaemon, Client],
) -> None:
    d, client = daemon
    await d.agent.refresh()
    progress = d.agent.watched[ContainerId("a")].info.progress_path
    progress.unlink()
    os.mkfifo(progress)

    d.agent.tick(d.agent.runtime.now())

    text = await (await client.get("/metrics")).text()
    assert "specon_agent_unreadable_logs 1.0" in text
