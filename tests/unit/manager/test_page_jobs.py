"""The status page's job cards and workers: curves, bars, time left, history, moves, escaping."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest
from specon_manager import page_jobs
from specon_manager.page import render_status_page
from specon_manager.page_jobs import duration, loss_curve, progress, timeline
from specon_manager.status import with_progress

from specon.coordinator.migration import State
from specon.model import Category, ContainerId, Resources, WorkerId
from specon.wire.protocol import STEPS_LABEL
from specon.wire.status import ContainerStatus, LossWindow, MigrationStatus, Status, WorkerStatus

EVIL = '<img src=x onerror="alert(1)">&'
NOW = 1_700_000_000.0


def _points(svg: str) -> list[tuple[int, int]]:
    (points,) = re.findall(r'<polyline points="([^"]*)"', svg)
    return [(int(x), int(y)) for x, y in (p.split(",") for p in points.split())]


def job(cid: str = "job-1", **kw: object) -> ContainerStatus:
    fields: dict[str, object] = {
        "id": ContainerId(cid),
        "worker": WorkerId("w0"),
        "category": Category.PROGRESSING,
    }
    return with_progress(ContainerStatus(**(fields | kw)))  # type: ignore[arg-type]


def test_the_curve_is_a_line_through_every_point_highest_loss_at_the_top() -> None:
    svg = loss_curve(
        LossWindow(first_step=100, last_step=400, loss=(3.0, 1.0, 2.0, 0.5), metric="train_loss")
    )
    assert _points(svg) == [(0, 0), (1, 800), (2, 400), (3, 1000)]  # y grows downwards
    assert 'viewBox="0 0 3 1000"' in svg and "train_loss" in svg and ">400<" in svg and "100" in svg
    assert "<title>train_loss over steps 100-400: 3 to 0.5</title>" in svg


@pytest.mark.parametrize(
    "loss",
    [(1e308, -1e308, 0.0), (5.0, 5.0, 5.0), (-1e-300, 1e-300), (7.0,)],
    ids=["extremes", "flat", "tiny", "one"],
)
def test_any_finite_curve_draws_within_its_box(loss: tuple[float, ...]) -> None:
    svg = loss_curve(LossWindow(first_step=0, last_step=10 if len(loss) > 1 else 0, loss=loss))
    if len(loss) == 1:
        assert "<circle" in svg and "<polyline" not in svg
    else:
        assert all(0 <= y <= 1000 for _, y in _points(svg))
    if len(set(loss)) == 1 and len(loss) > 1:
        assert {y for _, y in _points(svg)} == {500}


def test_no_window_says_so_and_a_metric_name_from_an_agent_is_escaped() -> None:
    assert "no loss curve yet" in loss_curve(None)
    assert "no loss curve yet" in loss_curve(LossWindow(first_step=0, last_step=0))
    svg = loss_curve(LossWindow(first_step=0, last_step=1, loss=(1.0, 0.5), metric=EVIL))
    assert "<img" not in svg and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;&amp;" in svg


def test_the_bar_shows_steps_against_the_declared_total_and_the_time_left() -> None:
    window = LossWindow(first_step=0, last_step=250, loss=(1.0, 0.9), steps_per_second=2.0)
    html = progress(job(step=250, job={STEPS_LABEL: "1000"}, window=window))
    assert 'style="width:25.0%"' in html and "250 / 1,000 steps · 25.0 % · 6 min 15 s left" in html
    assert "finished" in progress(job(step=1000, phase="finished", job={STEPS_LABEL: "1000"}))
    assert "time left unknown yet" in progress(job(step=10, job={STEPS_LABEL: "1000"}))  # no rate yet
    assert 'style="width:100.0%"' in progress(job(step=1200, job={STEPS_LABEL: "1000"}))
    assert "step 42 · no declared total" in progress(job(step=42))
    assert "no step logged yet" in progress(job())


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0 s"),
        (44.6, "45 s"),
        (60, "1 min"),
        (200, "3 min 20 s"),
        (7500, "2 h 5 min"),
        (90_000, "1 d 1 h"),
    ],
)
def test_durations_read_as_a_person_says_them(seconds: float, text: str) -> None:
    assert duration(seconds) == text
    assert duration(400 * 86_400) == duration(float("inf")) == "over a year"


def test_the_history_strip_spans_the_job_s_life_in_proportion() -> None:
    c = job(
        history=(
            (NOW - 100, Category.PROGRESSING),
            (NOW - 25, Category.WATCHING),
            (NOW - 0, Category.CONVERGED),
        )
    )
    widths = [float(w) for w in re.findall(r"width:([\d.]+)%", timeline(c, NOW))]
    assert widths == [75.0, 25.0, 0.0]
    assert timeline(job(), NOW) == ""


def _status() -> Status:
    w = WorkerStatus(
        id=WorkerId("w0"),
        address="127.0.0.1:7701",
        ready=True,
        reachable=True,
        heartbeat_age=1.5,
        capacity=Resources(cpu=4.0),
        usage=0.97,
        containers=(ContainerId("job-1"), ContainerId("job-9")),
    )
    moved = MigrationStatus(
        id="m1",
        container=ContainerId("job-1"),
        source=WorkerId("w1"),
        target=WorkerId("w0"),
        reason="converged",
        state=State.DONE,
        decided_at=NOW - 60,
        updated_at=NOW - 50,
        downtime=2.25,
    )
    c = job(
        step=500,
        job={STEPS_LABEL: "1000", "model": EVIL},
        window=LossWindow(first_step=0, last_step=500, loss=(2.0, 1.0, 0.7), steps_per_second=10.0),
        migrations=1,
        history=((NOW - 100, Category.PROGRESSING),),
        last_g=0.0123,
        cpu_weight=250,
    )
    return Status(
        now=NOW,
        mode="default",
        policy_generation=3,
        workers=(w,),
        containers=(c,),
        migrations=(moved,),
        total_workers=1,
        total_containers=2,
        total_migrations=1,
    )


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


def test_the_page_has_a_card_per_job_linked_from_its_worker_and_escapes_what_agents_sent() -> None:
    html = render_status_page(_status())
    parser = _Tags()
    parser.feed(html)
    tags = parser.tags
    assert not any(t in {"script", "img"} for t, _ in tags)
    assert EVIL not in html and "&lt;img" in html
    cards = [a for t, a in tags if t == "section" and a.get("class") == "job"]
    assert [a["id"] for a in cards] == ["job-job-1"]
    chips = [(t, a) for t, a in tags if (a.get("class") or "").split()[:1] == ["chip"]]
    assert [(t, a.get("href")) for t, a in chips] == [
        ("a", "#job-job-1"),
        ("span", None),
    ]  # job-9: another page
    assert html.count("<polyline") == 1 and "500 / 1,000 steps · 50.0 % · 50 s left" in html
    assert "w1 &rarr; w0 · converged · done" in html and "down 2.2 s" in html
    assert "G 0.0123" in html and "CPU weight 250" in html and "97%" in html
    assert 'href="/?after=c:"' in html and 'href="/?after=m:0"' in html
    assert "Jobs (1 of 2)" in html and "Workers (1 of 1)" in html


def test_curves_are_drawn_once_per_window() -> None:
    page_jobs.loss_curve.cache_clear()
    w = LossWindow(first_step=0, last_step=1, loss=(1.0, 0.5))
    assert loss_curve(w) is loss_curve(LossWindow(first_step=0, last_step=1, loss=(1.0, 0.5)))
    assert page_jobs.loss_curve.cache_info().hits == 1
