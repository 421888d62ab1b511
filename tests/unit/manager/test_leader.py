"""The Lease elector (``specon_manager.leader``) against an in-process fake of the Lease API
with the API server's concurrency rules (a write carrying an old resourceVersion, or a
create of an existing name, gets 409), on a fake clock where a test steps it by hand; and
the journal fence. The real API server: tests/k8s/test_failover.py."""

from __future__ import annotations

import asyncio
import copy
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from specon_manager.journal import Journal
from specon_manager.leader import FencedJournal, LeaseElector, NotLeaderError, Outcome, default_identity
from specon_manager.lease import Record, Timing

from specon.coordinator.migration import Mark, Migration, State
from specon.model import ContainerId, WorkerId
from specon.runtime.kubernetes.api import KubeError
from tests.unit.manager_fakes import FakeClock

NS = "specon"
PATH = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases"


class FakeLeases:
    """Leases by name, with resourceVersions and 404/409 as the API server answers them.
    ``down``: every call fails as if the API were unreachable; ``hold``: calls block until set."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.version = 0
        self.lock = threading.Lock()
        self.down = False
        self.hold: threading.Event | None = None
        self.writes: list[tuple[str, str]] = []  # (method, holder written)

    def request(self, method: str, path: str, *, body: object = None) -> Any:
        if self.hold is not None:
            self.hold.wait(10)
        if self.down:
            raise KubeError(0, "Unavailable", f"{method} {path}: connection refused")
        with self.lock:
            if method == "GET":
                name = path.rsplit("/", 1)[1]
                if name not in self.objects:
                    raise KubeError(404, "NotFound", f"leases {name!r} not found")
                return copy.deepcopy(self.objects[name])
            assert isinstance(body, dict)
            name = body["metadata"]["name"]
            if method == "POST":
                assert path == PATH
                if name in self.objects:
                    raise KubeError(409, "AlreadyExists", f"leases {name!r} already exists")
            else:
                assert method == "PUT" and path == f"{PATH}/{name}"
                current = self.objects.get(name)
                if current is None:
                    raise KubeError(404, "NotFound", f"leases {name!r} not found")
                if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                    raise KubeError(409, "Conflict", "the object has been modified")
            self.version += 1
            obj = copy.deepcopy(body)
            obj["metadata"]["resourceVersion"] = str(self.version)
            self.objects[name] = obj
            self.writes.append((method, body["spec"]["holderIdentity"]))
            return copy.deepcopy(obj)

    def holder(self, name: str = "specon-manager") -> Record:
        return Record.of(self.objects[name])


def elector(api: FakeLeases, identity: str, clock: FakeClock | None = None, **timing: Any) -> LeaseElector:
    """A candidate on the fake API: on ``clock`` (else the real monotonic clock), with ``timing``."""
    return LeaseElector(
        api,
        namespace=NS,
        name="specon-manager",
        identity=identity,
        timing=Timing(**timing),
        clock=clock or time.monotonic,
    )


async def nothing() -> None:
    """A take-over with nothing to do."""


async def test_the_first_candidate_creates_the_lease_the_second_follows_until_it_expires(
    clock: FakeClock,
) -> None:
    api = FakeLeases()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    assert (await a._attempt()).outcome is Outcome.HELD
    a.leading = True
    assert api.holder() == Record("a", 8, api.holder().acquire_time, api.holder().renew_time, 0)
    assert (await b._attempt()).outcome is Outcome.OTHER and b.leader == "a"
    clock.advance(7.9)
    assert (await b._attempt()).outcome is Outcome.OTHER  # 7.9 s unchanged: not expired yet
    clock.advance(0.1)
    got = await b._attempt()  # 8 s since b first saw it as it is: a has stopped renewing
    assert got.outcome is Outcome.HELD and api.holder().holder == "b" and api.holder().transitions == 1
    # a's renewal from its stale version: 409, then it reads b's record and knows it lost.
    assert (await a._attempt()).outcome is Outcome.OTHER and a.leader == "b"


async def test_renewals_keep_the_standby_waiting(clock: FakeClock) -> None:
    api = FakeLeases()
    a, b = elector(api, "a", clock), elector(api, "b", clock)
    await a._attempt()
    a.leading = True
    for _ in range(30):  # 30 s of renewals every second: b never judges it expired
        clock.advance(1.0)
        assert (await a._attempt()).outcome is Outcome.HELD
        assert (await b._attempt()).outcome is Outcome.OTHER
    assert [m for m, _ in api.writes] == ["POST"] + ["PUT"] * 30
    assert api.holder().transitions == 0


async def test_a_leader_whose_lease_was_given_back_never_takes_it_again(clock: FakeClock) -> None:
    api = FakeLeases()
    a = elector(api, "a", clock)
    await a._attempt()
    a.leading = True
    other = elector(api, "a", clock)  # the same identity releasing (as a stopping process would)
    assert await other.release()
    assert api.holder().holder == ""
    assert (await a._attempt()).outcome is Outcome.OTHER  # not "acquire": it missed a turn


def test_of_many_candidates_trying_at_once_exactly_one_wins() -> None:
    api = FakeLeases()
    start = threading.Barrier(8)

    def attempt(i: int) -> Outcome:
        e = elector(api, f"c{i}")
        start.wait()
        return e._try(None, False).outcome

    with ThreadPoolExecutor(8) as pool:
        first = list(pool.map(attempt, range(8)))
    assert first.count(Outcome.HELD) == 1, first
    # The holder dies; every candidate saw its record long ago: all judge it expired at once.
    dead = api.objects["specon-manager"]
    clock = FakeClock()
    seen = [elector(api, f"d{i}", clock) for i in range(8)]
    for e in seen:
        e._seen = e._try(None, False).seen
    clock.advance(60)
    start = threading.Barrier(8)

    def retake(e: LeaseElector) -> Outcome:
        start.wait()
        return e._try(e._seen, False).outcome

    with ThreadPoolExecutor(8) as pool:
        second = list(pool.map(retake, seen))
    assert second.count(Outcome.HELD) == 1, second
    assert api.holder().transitions == Record.of(dead).transitions + 1


async def test_an_unreachable_api_is_a_failed_try_logged_once(clock: FakeClock) -> None:
    api = FakeLeases()
    a = elector(api, "a", clock)
    api.down = True
    for _ in range(3):
        got = await a._attempt()
        assert got.outcome is Outcome.FAILED and got.error and "connection refused" in got.error
    assert a._failing is not None and not a.holds()


@pytest.mark.slow
async def test_the_loop_leads_once_and_stops_at_the_renew_deadline_when_the_api_goes_away() -> None:
    api = FakeLeases()
    a = elector(api, "a", lease_duration=2, renew_deadline=0.5, retry_period=0.05)
    led: list[float] = []
    lost: list[str] = []

    async def on_lead() -> None:
        led.append(time.monotonic())

    run = asyncio.create_task(a.run(on_lead, lost.append))
    while not led:
        await asyncio.sleep(0.01)
    assert a.holds()  # leading, renewed within the deadline
    api.down = True
    await asyncio.wait_for(run, 10)
    assert len(led) == 1 and lost and "renew deadline" in lost[0] and a.lost == lost[0]
    assert not a.leading and not a.holds()


@pytest.mark.slow
async def test_a_hung_call_does_not_hold_the_leader_past_its_deadline() -> None:
    api = FakeLeases()
    a = elector(api, "a", lease_duration=2, renew_deadline=0.5, retry_period=0.05)
    lost: list[str] = []
    run = asyncio.create_task(a.run(nothing, lost.append))
    while not a.leading:
        await asyncio.sleep(0.01)
    api.hold = threading.Event()  # the API stops answering (no error: the call just hangs)
    try:
        await asyncio.wait_for(run, 5)
    finally:
        api.hold.set()
        a.close()
    assert lost and "renew deadline" in lost[0]


async def test_a_failed_take_over_is_a_loss() -> None:
    api = FakeLeases()
    a = elector(api, "a", lease_duration=2, renew_deadline=0.5, retry_period=0.05)

    async def on_lead() -> None:
        raise RuntimeError("the journal cannot be read")

    lost: list[str] = []
    await asyncio.wait_for(a.run(on_lead, lost.append), 5)
    assert lost == ["taking over failed: the journal cannot be read"]


@pytest.mark.slow
async def test_a_released_lease_goes_to_the_standby_at_its_next_try() -> None:
    api = FakeLeases()
    fast: dict[str, Any] = {"lease_duration": 30, "renew_deadline": 10, "retry_period": 0.05}
    a, b = elector(api, "a", **fast), elector(api, "b", **fast)
    b_led = asyncio.Event()

    async def b_leads() -> None:
        b_led.set()

    run_a = asyncio.create_task(a.run(nothing, lambda _r: None))
    while not a.leading:
        await asyncio.sleep(0.01)
    run_b = asyncio.create_task(b.run(b_leads, lambda _r: None))
    await asyncio.sleep(0.2)
    assert not b_led.is_set() and b.leader == "a"
    run_a.cancel()  # a graceful stop: the campaign ends, then the lease is given back
    with pytest.raises(asyncio.CancelledError):
        await run_a
    assert await a.release()
    assert not a.holds()
    await asyncio.wait_for(b_led.wait(), 5)  # far sooner than the 30 s lease
    assert api.holder().holder == "b" and api.holder().transitions == 1  # a release is no transition
    assert not await a.release()  # not a's any more: left alone
    run_b.cancel()
    with pytest.raises(asyncio.CancelledError):
        await run_b


def test_identities_are_unique_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "specon-manager-7d9f-x2x")
    a, b = default_identity(), default_identity()
    assert a != b and a.startswith("specon-manager-7d9f-x2x_") and b.startswith("specon-manager-7d9f-x2x_")


def test_the_fence_refuses_writes_without_the_lease_and_lets_reads_through(tmp_path: Path) -> None:
    inner = Journal(tmp_path / "journal.db")
    held = [True]
    journal = FencedJournal(inner, lambda: held[0])
    m = Migration("m1", ContainerId("c1"), WorkerId("a"), WorkerId("b"), "converged", State.SAVING, 1.0, 1.0)
    journal.put(m)
    journal.set_meta("started_at", "1.0")
    held[0] = False
    with pytest.raises(NotLeaderError, match="does not hold the lease"):
        journal.put(m.to(State.SAVED, at=2.0))
    with pytest.raises(NotLeaderError):
        journal.put_mark(Mark(ContainerId("c1"), 2.0, 1, 0))
    with pytest.raises(NotLeaderError):
        journal.set_meta("started_at", "2.0")
    assert journal.get("m1") == m and journal.in_flight() == [m] and journal.all() == [m]
    assert journal.marks() == {} and journal.get_meta("started_at") == "1.0"
    journal.close()


def _main(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> int:
    """``specon-manager`` in-process, structlog left as the tests configured it."""
    from specon_manager.__main__ import main  # noqa: PLC0415

    from specon.daemon import logs  # noqa: PLC0415

    monkeypatch.setattr(logs, "configure", lambda **_kw: None)
    token = tmp_path / "token"
    token.write_text("t" * 40)
    return main(["--token-file", str(token), "--state-dir", str(tmp_path / "state"), *args])


def test_leader_election_needs_the_kubernetes_journal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _main(tmp_path, monkeypatch, "--leader-elect") == 2
    assert "--leader-elect needs --journal kubernetes" in capsys.readouterr().err
    assert not (tmp_path / "state").exists()  # refused before any journal was opened


def test_unusable_lease_settings_are_refused_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ("--leader-elect", "--journal", "kubernetes", "--leader-elect-renew-deadline", "9")
    assert _main(tmp_path, monkeypatch, *args) == 2
    assert "must be greater than the renew deadline" in capsys.readouterr().err


def test_every_election_option_has_help() -> None:
    from specon_manager.__main__ import build_parser  # noqa: PLC0415

    text = build_parser().format_help()
    for flag in (
        "",
        "-lease-name",
        "-namespace",
        "-identity",
        "-lease-duration",
        "-renew-deadline",
        "-retry-period",
    ):
        assert f"--leader-elect{flag} " in text or f"--leader-elect{flag}\n" in text, flag
    args = build_parser().parse_args([])
    assert not args.leader_elect and args.leader_elect_lease_name == "specon-manager"
    assert (args.leader_elect_lease_duration, args.leader_elect_renew_deadline) == (8.0, 5.0)
