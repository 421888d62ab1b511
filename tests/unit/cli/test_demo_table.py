"""What `specon demo` (`make run`) prints: time-to-quality beside the average JCT, against DS."""

from __future__ import annotations

from specon.cli.cmd_demo import _table
from specon.evaluation import JobResult, RunResult, compare


def _run(*jobs: tuple[float, float | None, float | None]) -> RunResult:
    return RunResult(
        tuple(
            JobResult(f"job-{i:02d}", "gru", submit, finish, 100, 100, quality_time=q)
            for i, (submit, finish, q) in enumerate(jobs)
        )
    )


def test_the_demo_prints_time_to_quality_beside_the_average_jct() -> None:
    ds = _run((0.0, 100.0, 40.0), (10.0, 210.0, 90.0))  # JCT 100, 200; time-to-quality 40, 80
    ours = _run((0.0, 90.0, 30.0), (10.0, 160.0, 70.0))  # JCT 90, 150; 30, 60
    lines = _table(ds, ours, compare(ds, ours)).splitlines()
    jct = next(i for i, line in enumerate(lines) if line.startswith("average JCT"))
    assert lines[jct] == "average JCT   DS 150.0 s   specon 120.0 s   reduction  +20.0%"
    assert lines[jct + 2] == (
        "time-to-quality (95 % of the final loss reduction, mean)   DS 60.0 s   specon 45.0 s   "
        "reduction  +25.0%"
    )


def test_a_job_without_a_loss_record_leaves_time_to_quality_unknown_not_wrong() -> None:
    ds = _run((0.0, 100.0, 40.0), (10.0, 210.0, None))
    ours = _run((0.0, 90.0, 30.0), (10.0, 160.0, 70.0))
    text = _table(ds, ours, compare(ds, ours))
    assert "DS n/a s   specon 45.0 s   reduction    n/a" in text
