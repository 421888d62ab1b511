"""Bounded reads and bounded state: status pages, pruning, the heap freezer, auth identities."""

from __future__ import annotations

import dataclasses
import gc
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from specon_manager.auth import Identity, StaticTokens, load_agent_tokens
from specon_manager.heap import HeapFreezer
from specon_manager.metrics import ManagerMetrics
from specon_manager.page import render_status_page
from specon_manager.status import MAX_LIMIT, BadPageError, Page, build_status

from specon.coordinator.inline import InlineCoordinator
from specon.coordinator.machine import NotHostedError
from specon.model import ContainerId, WorkerId
from specon.wire.protocol import ReallocationRequest
from tests.unit.manager_fakes import FakeAgent, FakeClock, coordinator, policy, report

TOKEN_A, TOKEN_B, SHARED, READ = ("a" * 32, "b" * 32, "s" * 32, "r" * 32)


def cluster(tmp_path: Path, clock: FakeClock, workers: int, per_worker: int) -> InlineCoordinator:
    coord = coordinator(tmp_path, clock)
    for w in range(workers):
        agent = FakeAgent(f"w{w:02d}", clock)
        coord.on_heartbeat(agent.heartbeat(*(report(f"w{w:02d}-c{i:03d}") for i in range(per_worker))))
    return coord


def walk(coord: InlineCoordinator, limit: int) -> tuple[list[str], list[str], int]:
    """Every worker and container id over all pages of ``limit``, and the page count."""
    workers: list[str] = []
    containers: list[str] = []
    after: str | None = None
    pages = 0
    while True:
        st = build_status(coord.core, coord.clock(), Page.parse(str(limit), after))
        pages += 1
        workers += [w.id for w in st.workers]
        containers += [c.id for c in st.containers]
        assert st.total_workers == len(coord.state.workers)
        assert st.total_containers == len(coord.state.containers)
        if st.next is None:
            return workers, containers, pages
        after = st.next
        assert pages < 10_000


@pytest.mark.parametrize("limit", [1, 7, 50, 1000])
def test_pages_cover_every_worker_and_container_exactly_once(tmp_path: Path, limit: int) -> None:
    coord = cluster(tmp_path, FakeClock(), workers=4, per_worker=30)
    workers, containers, pages = walk(coord, limit)
    assert workers == sorted(coord.state.workers)
    assert containers == sorted(coord.state.containers)
    if limit == 1000:
        assert pages == 1


def test_a_page_counts_the_containers_a_worker_lists(tmp_path: Path) -> None:
    coord = cluster(tmp_path, FakeClock(), workers=5, per_worker=40)
    first = build_status(coord.core, coord.clock(), Page.parse("50", None))
    # Each worker lists 40 containers: one worker (41 entries) fits a page of 50, two do not.
    assert [w.id for w in first.workers] == ["w00"] and first.next == "w:w00"
    assert len(first.containers) == 0


def test_a_page_holds_at_least_one_worker_however_many_containers_it_lists(tmp_path: Path) -> None:
    coord = cluster(tmp_path, FakeClock(), workers=2, per_worker=40)
    first = build_status(coord.core, coord.clock(), Page.parse("3", None))
    assert [w.id for w in first.workers] == ["w00"] and len(first.workers[0].containers) == 40


@pytest.mark.parametrize(
    ("limit", "after", "says"),
    [
        ("0", None, "limit: must be within"),
        (str(MAX_LIMIT + 1), None, "limit: must be within"),
        ("x", None, "limit: expected an integer"),
        (None, "nonsense", "after: expected a cursor"),
        (None, "m:x", "m:<n>"),
        (None, "z:abc", "after: expected a cursor"),
    ],
)
def test_a_bad_page_is_refused_saying_why(limit: str | None, after: str | None, says: str) -> None:
    with pytest.raises(BadPageError, match=says):
        Page.parse(limit, after)


def test_unseen_workers_and_finished_containers_are_pruned_but_unfinished_jobs_keep_theirs(
    tmp_path: Path,
) -> None:
    clock = FakeClock()
    coord = cluster(tmp_path, clock, workers=3, per_worker=2)
    msg = coord.policy.messaging
    # w01's jobs finish before it goes silent; w02's are still running when it does.
    w01 = FakeAgent("w01", clock)
    w01.seq = 10
    coord.on_heartbeat(w01.heartbeat(*(report(f"w01-c{i:03d}", phase="finished") for i in range(2))))
    keep_alive = FakeAgent("w00", clock)
    keep_alive.seq = 10
    clock.advance(msg.prune_after * msg.worker_timeout / 2)
    coord.on_heartbeat(keep_alive.heartbeat(report("w00-c000"), report("w00-c001", phase="finished")))
    clock.advance(msg.prune_after * msg.worker_timeout / 2 + 1)
    coord.on_heartbeat(keep_alive.heartbeat(report("w00-c000")))
    coord.step(rebalance=True)
    # w02 and its unfinished jobs stay until they run elsewhere (their recoveries are open).
    assert set(coord.state.workers) == {"w00", "w02"}
    assert set(coord.state.containers) == {"w00-c000", "w00-c001", "w02-c000", "w02-c001"}
    assert {m.container for m in coord.migrations.values()} == {"w02-c000", "w02-c001"}
    assert coord.state.pruned == 1 + 2
    assert not coord.outbox.keys() - {"w00"}


def test_a_worker_may_only_ask_to_move_its_own_containers(tmp_path: Path) -> None:
    clock = FakeClock()
    coord = cluster(tmp_path, clock, workers=2, per_worker=1)
    req = ReallocationRequest(
        worker=WorkerId("w01"), container=ContainerId("w00-c000"), t_cc=0.0, g=0.0, sent_at=clock()
    )
    with pytest.raises(NotHostedError, match="not running on worker w01"):
        coord.on_request(req)
    assert not coord.requests


def test_a_seq_far_ahead_of_the_managers_clock_is_implausible(tmp_path: Path) -> None:
    clock = FakeClock()
    coord = coordinator(tmp_path, clock, policy())
    hb = FakeAgent("w", clock).heartbeat()
    now_us = int(clock() * 1e6)
    assert coord.state.seq_plausible(hb, clock())
    assert coord.state.seq_plausible(type(hb)(**{**_fields(hb), "seq": now_us + 3600 * 10**6}), clock())
    assert not coord.state.seq_plausible(type(hb)(**{**_fields(hb), "seq": 2**62}), clock())


def _fields(obj: object) -> dict[str, object]:
    return {name: getattr(obj, name) for name in obj.__slots__}  # type: ignore[attr-defined]


@pytest.mark.slow
def test_the_heap_freezer_freezes_once_per_growth_step() -> None:
    freezer = HeapFreezer(growth=2.0, minimum=100)
    try:
        assert not freezer.maybe_freeze(99)
        assert freezer.maybe_freeze(100) and gc.get_freeze_count() > 0
        assert not freezer.maybe_freeze(150)
        assert freezer.maybe_freeze(200)
    finally:
        gc.unfreeze()


# --- identities --------------------------------------------------------------------------


async def test_each_token_proves_exactly_its_identity() -> None:
    auth = StaticTokens(agents={"a": TOKEN_A, "b": TOKEN_B}, shared=SHARED, read=READ)
    a = await auth.authenticate(TOKEN_A)
    assert a == Identity("agent:a", WorkerId("a"))
    assert a.may_speak_for("a") and not a.may_speak_for("b")
    shared = await auth.authenticate(SHARED)
    assert shared is not None and shared.may_speak_for("a") and shared.may_speak_for("zz")
    reader = await auth.authenticate(READ)
    assert reader is not None and not reader.may_speak_for("a")
    for wrong in ("", TOKEN_A[:-1], TOKEN_A + "x", "tök\udcff"):
        assert await auth.authenticate(wrong) is None


def test_two_identities_may_not_share_a_token() -> None:
    with pytest.raises(ValueError, match="reuses the token"):
        StaticTokens(agents={"a": TOKEN_A}, read=TOKEN_A)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("[]", "expected a non-empty mapping"),
        ("{}", "expected a non-empty mapping"),
        (f"'../x': {TOKEN_A}", "invalid id"),
        ("w: 12345", "expected a string"),
        ("w: change-me", "documented placeholder"),
        ("w: [unclosed", "not YAML"),
    ],
)
def test_a_bad_agent_tokens_file_is_refused_saying_why(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "agents.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=says):
        load_agent_tokens(path)


# -- CPU weights: in the status, on the page, in /metrics -------------------------------------
def weight_samples(metrics: ManagerMetrics) -> dict[tuple[str, str], float]:
    text = generate_latest(metrics.registry).decode()
    return {
        (s.labels["worker"], s.labels["container"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "specon_manager_container_cpu_weight"
    }


def test_the_cpu_weight_an_agent_reports_shows_in_status_page_and_metrics(tmp_path: Path) -> None:
    clock = FakeClock()
    coord = coordinator(tmp_path, clock, policy())
    metrics = ManagerMetrics()
    metrics.watch(coord.core)
    agent = FakeAgent("w0", clock)
    heavy = dataclasses.replace(report("heavy"), cpu_weight=10_000)
    light = dataclasses.replace(report("light"), cpu_weight=100)
    coord.on_heartbeat(agent.heartbeat(heavy, light, report("old-agent")))
    st = build_status(coord.core, clock())
    assert {c.id: c.cpu_weight for c in st.containers} == {"heavy": 10_000, "light": 100, "old-agent": None}
    page = render_status_page(st)
    assert "CPU weight 10000" in page and "CPU weight 100<" in page
    assert weight_samples(metrics) == {("w0", "heavy"): 10_000.0, ("w0", "light"): 100.0}
    # "light" leaves the worker (no longer listed): no weight in the status, no series left.
    coord.on_heartbeat(agent.heartbeat(dataclasses.replace(heavy, cpu_weight=1)))
    st = build_status(coord.core, clock())
    assert {c.id: c.cpu_weight for c in st.containers} == {"heavy": 1, "light": None, "old-agent": None}
    assert weight_samples(metrics) == {("w0", "heavy"): 1.0}
