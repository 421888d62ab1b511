"""Each job's progress in the status: its declared total steps and the time it has left."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from specon_manager.status import Page, build_status, declared_steps, time_left

from specon.wire.protocol import STEPS_LABEL
from specon.wire.status import LossWindow
from specon.wire.validate import MAX_SECONDS
from tests.unit.manager_fakes import FakeAgent, FakeClock, coordinator, report


@pytest.mark.parametrize(
    ("label", "steps"),
    [("1200", 1200), ("0", None), ("-5", None), ("1e3", None), ("١٢", None), ("9" * 16, None), ("", None)],
)
def test_declared_steps_are_a_positive_integer_label_or_nothing(label: str, steps: int | None) -> None:
    assert declared_steps({STEPS_LABEL: label}) == steps
    assert declared_steps({}) is None


def test_the_time_left_is_the_steps_to_go_at_the_step_rate() -> None:
    assert time_left("running", 200, 1200, 4.0) == 250.0
    assert time_left("running", 1300, 1200, 4.0) == 0.0  # past its total (it logs its last steps)
    assert time_left("finished", None, None, None) == 0.0
    for phase, step, total, rate in [
        ("running", None, 1200, 4.0),
        ("running", 200, None, 4.0),
        ("running", 200, 1200, None),
        ("running", 200, 1200, 0.0),
        ("stopped", 200, 1200, 4.0),  # not stepping now: no honest estimate
        ("running", 0, 10**15, 1e-9),  # beyond any clock: unknown, never an infinity in the JSON
    ]:
        assert time_left(phase, step, total, rate) is None, (phase, step, total, rate)  # type: ignore[arg-type]
    assert MAX_SECONDS < 10**15 / 1e-9


def test_the_status_lists_each_job_with_its_window_total_and_time_left(tmp_path: Path) -> None:
    clock = FakeClock()
    coord = coordinator(tmp_path, clock)
    window = LossWindow(first_step=0, last_step=300, loss=(2.0, 1.0), steps_per_second=5.0)
    job = dataclasses.replace(report("job"), step=300, job={STEPS_LABEL: "1300"}, window=window)
    coord.on_heartbeat(FakeAgent("w0", clock).heartbeat(job, report("plain")))
    st = build_status(coord.core, clock(), Page())
    by_id = {c.id: c for c in st.containers}
    assert (by_id["job"].window, by_id["job"].total_steps, by_id["job"].eta) == (window, 1300, 200.0)
    assert (by_id["plain"].window, by_id["plain"].total_steps, by_id["plain"].eta) == (None, None, None)


def test_the_page_s_links_to_the_jobs_and_the_migrations_are_cursors_the_status_takes(tmp_path: Path) -> None:
    clock = FakeClock()
    coord = coordinator(tmp_path, clock)
    coord.on_heartbeat(FakeAgent("w0", clock).heartbeat(report("b"), report("a")))
    jobs = build_status(coord.core, clock(), Page.parse(None, "c:"))
    assert (jobs.workers, [c.id for c in jobs.containers]) == ((), ["a", "b"])
    migrations = build_status(coord.core, clock(), Page.parse(None, "m:0"))
    assert (migrations.workers, migrations.containers, migrations.next) == ((), (), None)
