"""``specon demo --lose WORKER@SECONDS``: its argument, the steps a lost host cost, the summary."""

from __future__ import annotations

import pytest

from specon.cli.cmd_demo import _losses
from specon.cli.main import build_parser
from specon.embedded.host_loss import HostLoss, lost_steps, parse_loss
from specon.evaluation import JobResult, RunResult
from specon.model import WorkerId


def test_a_loss_reads_as_worker_at_seconds() -> None:
    assert parse_loss("w1@60") == HostLoss(WorkerId("w1"), 60.0)
    args = build_parser().parse_args(["demo", "--lose", "w1@60", "--lose", "w0@12.5"])
    assert args.lose == [HostLoss(WorkerId("w1"), 60.0), HostLoss(WorkerId("w0"), 12.5)]
    assert build_parser().parse_args(["demo"]).lose == []


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("w1", "expected WORKER@SECONDS (e.g. w1@60), got 'w1'"),
        ("@60", "expected WORKER@SECONDS (e.g. w1@60), got '@60'"),
        ("w1@soon", "SECONDS must be a number, got 'soon' in 'w1@soon'"),
        ("w1@-3", "SECONDS must be >= 0, got '-3' in 'w1@-3'"),
        ("w1@inf", "SECONDS must be >= 0, got 'inf' in 'w1@inf'"),
    ],
)
def test_a_bad_loss_is_an_argparse_error(
    value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["demo", "--lose", value])
    assert info.value.code == 2
    assert f"argument --lose: {message}" in capsys.readouterr().err


def _trained(start: int, end: int) -> list[dict[str, object]]:
    return [{"step": s, "loss": 1.0} for s in range(start + 1, end + 1)]


def test_steps_lost_are_those_a_killed_run_trained_past_where_the_next_began() -> None:
    killed_then_restored = [
        {"event": "started", "step": 0},
        *_trained(0, 250),
        {"event": "checkpoint", "step": 200},
        {"event": "started", "step": 200},  # killed at 250; resumed from the checkpoint
        *_trained(200, 300),
        {"event": "finished", "step": 300},
    ]
    assert lost_steps(killed_then_restored) == 50
    from_scratch = [{"event": "started", "step": 0}, *_trained(0, 250), {"event": "started", "step": 0}]
    assert lost_steps(from_scratch) == 250
    moved = [{"event": "started", "step": 0}, *_trained(0, 80), {"event": "checkpointed", "step": 80},
             {"event": "started", "step": 80}, *_trained(80, 100)]  # fmt: skip
    assert lost_steps(moved) == 0 and lost_steps([]) == 0


def test_the_summary_says_what_the_lost_hosts_cost_each_run() -> None:
    jobs = (JobResult("job-01", "gru", 0.0, 10.0, 100, 100),)
    ds = RunResult(jobs, meta={"failures": {"hosts_lost": 1, "lost_steps": 250, "recoveries": 1}})
    ours = RunResult(jobs, meta={"failures": {"hosts_lost": 1, "lost_steps": 50, "recoveries": 1}})
    assert _losses(ds, ours, "specon") == [
        "host lost     DS: 1 host(s), 1 job(s) recovered elsewhere, 250 step(s) lost",
        "host lost     specon: 1 host(s), 1 job(s) recovered elsewhere, 50 step(s) lost",
    ]
    assert _losses(RunResult(jobs), RunResult(jobs), "specon") == []
