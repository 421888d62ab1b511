"""The demo's status page: the page kept at the run's busiest moment, and no screenshot (said, not
failed) where Chromium is missing. The screenshot itself: tests/integration/test_status_views.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from specon.embedded import demo
from specon.model import Category, ContainerId, WorkerId
from specon.wire.status import ContainerStatus, LossWindow, Phase, Status

CURVE = LossWindow(first_step=0, last_step=5, loss=(1.0, 0.5))


def status(*jobs: tuple[Phase, LossWindow | None]) -> Status:
    return Status(
        now=0.0,
        mode="default",
        policy_generation=1,
        containers=tuple(
            ContainerStatus(
                id=ContainerId(f"j{i}"),
                worker=WorkerId("w0"),
                category=Category.PROGRESSING,
                phase=phase,
                window=w,
            )
            for i, (phase, w) in enumerate(jobs)
        ),
    )


def test_the_page_kept_is_the_one_with_the_most_running_jobs_drawing_a_curve() -> None:
    keeper = demo.PageKeeper()
    two = status(("running", CURVE), ("running", CURVE), ("finished", CURVE))
    page_of_two = b"two" + demo.CURVE_MARK * 2
    assert keeper.due(0.0, status())
    keeper.keep(0.0, page_of_two)
    assert not keeper.due(demo.PAGE_EVERY / 2, two)  # looked at a moment ago
    assert not keeper.due(demo.PAGE_EVERY, status(("running", CURVE), ("running", None)))  # fewer curves
    assert keeper.due(demo.PAGE_EVERY, two)  # as many: the later page
    later = b"later" + demo.CURVE_MARK * 2
    keeper.keep(demo.PAGE_EVERY, later)
    assert (keeper.html, keeper.curves) == (later, 2)
    # A page older than the status that made it due (the manager shares a built page for a
    # second) draws fewer curves: the one kept stays.
    keeper.keep(2 * demo.PAGE_EVERY, b"stale" + demo.CURVE_MARK)
    assert (keeper.html, keeper.curves) == (later, 2)


def test_without_chromium_the_demo_says_so_and_writes_no_screenshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(demo.shutil, "which", lambda _name: None)
    why = demo.screenshot(b"<!doctype html><title>x</title>", tmp_path / "status-page.png")
    assert why is not None and "chromium is not installed" in why and "apt-get install chromium" in why
    assert not (tmp_path / "status-page.png").exists()
