"""The chaos run's judges of a progress log, on logs written by hand (fast: no process)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chaos_run import LogTail
from jobwatch import handover_gaps, stale_commits


def started(gen: int | None, step: int = 0) -> dict[str, Any]:
    r: dict[str, Any] = {"event": "started", "step": step, "resumed": step > 0, "job": "j"}
    return r if gen is None else {**r, "generation": gen}


def event(name: str, gen: int | None, step: int) -> dict[str, Any]:
    return {"event": name, "step": step} if gen is None else {"event": name, "step": step, "generation": gen}


def sample(step: int) -> dict[str, Any]:
    return {"step": step, "loss": 1.0 / step, "ts": 0.0, "trained": step}


def test_a_log_of_one_copy_after_another_has_no_stale_commit() -> None:
    log = [started(1), sample(1), event("checkpoint", 1, 1), sample(2), event("checkpointed", 1, 2)]
    log += [started(2, 2), sample(3), event("checkpoint", 2, 3), event("finished", 2, 3)]
    assert stale_commits(log) == []


def test_an_older_copy_writing_after_a_newer_one_started_is_stale() -> None:
    # The host of generation 1 was taken for lost (a partition); its copy wrote on.
    log = [started(1), sample(1), started(2, 0), sample(1), event("checkpoint", 1, 2)]
    log += [event("checkpointed", 1, 2), event("finished", 2, 3)]
    assert stale_commits(log) == [
        "record 5: checkpoint (step 2) of generation 1 after 2 started",
        "record 6: checkpointed (step 2) of generation 1 after 2 started",
    ]


def test_a_stale_start_is_stale_and_changes_nothing() -> None:
    # Generation 1's copy was slow to load its checkpoint: generation 2 announced itself first.
    log = [started(2), started(1), sample(1), event("finished", 2, 1)]
    assert stale_commits(log) == ["record 2: started (step 0) of generation 1 after 2 started"]


def test_writes_after_the_job_finished_are_stale_until_a_new_start() -> None:
    log = [started(1), sample(1), event("finished", 1, 1), sample(2), event("checkpoint", 1, 2)]
    assert stale_commits(log) == [
        "record 4: a training sample (step 2) after the job finished",
        "record 5: checkpoint (step 2) after the job finished",
    ]
    # A start after the end is a start too many (the step check's), not a stale write.
    assert stale_commits([*log[:3], started(2, 1), event("finished", 2, 1)]) == []


def test_a_record_without_a_generation_after_a_fenced_start_is_stale() -> None:
    log = [started(None), sample(1), started(1, 0), event("checkpoint", None, 2)]
    assert stale_commits(log) == ["record 4: checkpoint (step 2) of generation 0 after 1 started"]


def test_handover_gaps_run_from_the_last_record_before_each_restart() -> None:
    seen = [(10.0, started(1)), (10.5, sample(1)), (11.0, sample(2)), (19.0, started(2, 0))]
    seen += [(19.2, sample(1)), (20.0, event("checkpointed", 2, 1)), (22.5, started(3, 1))]
    assert [(round(gap, 1), r["generation"]) for gap, r in handover_gaps(seen)] == [(8.0, 2), (2.5, 3)]
    assert handover_gaps(seen[:3]) == []  # the first start is no restart
    assert handover_gaps([]) == []
    # The first copy was seen alive (silent) until 15 s: a live copy until then. One seen
    # after the restart (a fenced copy yet to stop) leaves no gap at all.
    assert [round(g, 1) for g, _ in handover_gaps(seen, {1: 15.0, 2: 20.5})] == [4.0, 2.0]
    assert [round(g, 1) for g, _ in handover_gaps(seen, {1: 25.0})] == [0.0, 0.0]


def test_handover_gaps_end_at_the_newest_launch_of_the_restarts_generation() -> None:
    seen = [(10.0, started(1)), (11.0, sample(1)), (19.0, started(2, 0)), (19.5, sample(1))]
    seen += [(30.0, started(3, 0))]
    # Generation 2 launched at 14 s (its interpreter took 5 s to start and restore); the
    # first launch of generation 3 (at 20 s) crashed and the one at 27 s wrote the record.
    launched = {1: [9.5], 2: [14.0], 3: [20.0, 27.0, 31.0]}
    assert [round(g, 1) for g, _ in handover_gaps(seen, None, launched)] == [3.0, 7.5]
    # A launch before the old copy's last sign of life leaves no gap (an overlap), and a
    # generation never seen launched (too brief for the scan) ends at its record.
    assert [round(g, 1) for g, _ in handover_gaps(seen, {1: 16.0}, {2: [14.0]})] == [0.0, 10.5]


def test_the_tail_stamps_whole_records_when_first_seen(tmp_path: Path) -> None:
    log = tmp_path / "progress.jsonl"
    tail = LogTail(log)
    tail.read(1.0)  # no log yet
    log.write_text('{"event":"started","step":0}\n{"step":1,"lo')  # a record half written
    tail.read(2.0)
    with log.open("a") as f:
        f.write('ss":1.0}\n{"event":"saving","step":1}\n')
    tail.read(3.0)
    assert [(t, r.get("event")) for t, r in tail.seen] == [(2.0, "started"), (3.0, None), (3.0, "saving")]
    assert tail.slow_saves == 1 and not tail.finished and not tail.broken
