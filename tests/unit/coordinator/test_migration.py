"""The migration state machine: legal transitions and next_step in every state, including recovery."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specon.coordinator.migration import (
    Advance,
    IssueSave,
    IssueStart,
    Migration,
    State,
    TransitionError,
    Wait,
    next_step,
)
from specon.model import ContainerId, WorkerId

A, B, C = WorkerId("a"), WorkerId("b"), WorkerId("c")
ALL = frozenset({A, B, C})


def mig(state: State = State.DECIDED, **kw: object) -> Migration:
    m = Migration("m1", ContainerId("job"), A, B, "converged", decided_at=1.0)
    return Migration(**{**{f: getattr(m, f) for f in m.__dataclass_fields__}, "state": state, **kw})  # type: ignore[arg-type]


def test_happy_path_is_the_spec_chain() -> None:
    m = mig()
    for s in (State.SAVING, State.SAVED, State.RESTORING, State.RUNNING, State.DONE):
        m = m.to(s, at=2.0)
    assert m.state is State.DONE and not m.in_flight


def test_illegal_transition_raises() -> None:
    with pytest.raises(TransitionError, match="decided -> done"):
        mig().to(State.DONE, at=1.0)
    with pytest.raises(TransitionError):
        mig(State.DONE).to(State.FAILED, at=1.0)


def test_downtime_from_stop_and_start() -> None:
    assert mig(stopped_at=10.0, started_at=11.5).downtime == 1.5
    assert mig(stopped_at=10.0).downtime is None


def test_decided_proceeds_only_while_on_source_and_target_alive() -> None:
    assert next_step(mig(), running_on=A, finished=False, alive=ALL) == Advance(State.SAVING)
    assert next_step(mig(), running_on=C, finished=False, alive=ALL) == Advance(State.FAILED)
    assert next_step(mig(), running_on=A, finished=False, alive=frozenset({A})) == Advance(State.FAILED)


def test_saving_repeats_save_until_result() -> None:
    m = mig(State.SAVING)
    assert next_step(m, running_on=A, finished=False, alive=ALL) == IssueSave(A)
    # Stopped but the result was lost (e.g. manager restarted): asking again gets it.
    assert next_step(m, running_on=None, finished=False, alive=ALL) == IssueSave(A)
    assert next_step(m, running_on=C, finished=False, alive=ALL) == Advance(State.FAILED)
    assert next_step(m, running_on=None, finished=False, alive=frozenset({B})) == Advance(State.FAILED)


def test_restoring_starts_on_target_until_the_start_result_says_it_runs() -> None:
    m = mig(State.RESTORING, checkpoint="/v/ck", stopped_at=5.0)
    assert next_step(m, running_on=None, finished=False, alive=ALL) == IssueStart(B, "/v/ck", rollback=False)
    # Listed there is not yet running (it may die before its first record): the start,
    # repeated, is answered by the copy there; only its result moves the migration on.
    assert next_step(m, running_on=B, finished=False, alive=ALL) == IssueStart(B, "/v/ck", rollback=False)
    assert next_step(m, running_on=C, finished=False, alive=ALL) == Advance(State.FAILED)
    assert next_step(m, running_on=None, finished=False, alive=frozenset({A})) == Advance(State.FAILED)
    assert next_step(m, running_on=B, finished=False, alive=frozenset({A})) == Advance(State.FAILED)


def test_failed_restarts_on_source_else_target_never_while_running() -> None:
    m = mig(State.FAILED, checkpoint="/v/ck", stopped_at=5.0)
    assert next_step(m, running_on=None, finished=False, alive=ALL) == IssueStart(A, "/v/ck", rollback=True)
    assert next_step(m, running_on=None, finished=False, alive=frozenset({B})) == IssueStart(
        B, "/v/ck", rollback=True
    )
    assert isinstance(next_step(m, running_on=None, finished=False, alive=frozenset()), Wait)
    assert next_step(m, running_on=A, finished=False, alive=ALL) == Advance(State.ROLLED_BACK)


def test_a_rollback_avoids_a_source_cordoned_meanwhile_and_turns_after_each_refusal() -> None:
    m = mig(State.FAILED, checkpoint="/c")
    # Drained while its job was moving: the target takes it back if it can.
    assert next_step(m, running_on=None, finished=False, alive=ALL, cordoned={A}) == IssueStart(
        B, "/c", rollback=True
    )
    # Each refused restart turns to the other worker: one that refuses for good (its
    # capacity taken) never leaves the job running nowhere while the other could take it.
    assert next_step(m, running_on=None, finished=False, alive=ALL, refused=1) == IssueStart(
        B, "/c", rollback=True
    )
    assert next_step(m, running_on=None, finished=False, alive=ALL, refused=2) == IssueStart(
        A, "/c", rollback=True
    )
    assert next_step(m, running_on=None, finished=False, alive=ALL, cordoned={A}, refused=1) == IssueStart(
        A, "/c", rollback=True
    )
    # Both cordoned, or the other silent: the cordoned one rather than nowhere (a drain moves it again).
    assert next_step(m, running_on=None, finished=False, alive=ALL, cordoned={A, B}) == IssueStart(
        A, "/c", rollback=True
    )
    assert next_step(
        m, running_on=None, finished=False, alive=frozenset({A}), cordoned={A}, refused=3
    ) == IssueStart(A, "/c", rollback=True)


def test_failed_waits_while_its_save_may_still_stop_the_job_on_the_source() -> None:
    # Rolled back now, the save that then stops the job would leave it running nowhere.
    m = mig(State.FAILED, checkpoint=None)
    assert isinstance(next_step(m, running_on=A, finished=False, alive=ALL, saving=True), Wait)
    assert next_step(m, running_on=A, finished=False, alive=ALL) == Advance(State.ROLLED_BACK)
    # Stopped (the result on its way) or running elsewhere: nothing for the save to stop.
    assert next_step(m, running_on=None, finished=False, alive=ALL, saving=True) == IssueStart(
        A, None, rollback=True
    )
    assert next_step(m, running_on=B, finished=False, alive=ALL, saving=True) == Advance(State.ROLLED_BACK)
    assert next_step(m, running_on=A, finished=True, alive=ALL, saving=True) == Advance(State.ROLLED_BACK)


def test_finished_job_ends_any_migration() -> None:
    assert next_step(mig(State.SAVED), running_on=None, finished=True, alive=ALL) == Advance(State.FAILED)
    assert next_step(mig(State.FAILED), running_on=None, finished=True, alive=ALL) == Advance(
        State.ROLLED_BACK
    )
    assert next_step(mig(State.RUNNING), running_on=None, finished=True, alive=ALL) == Advance(State.DONE)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(
    state=st.sampled_from(list(State)),
    running_on=st.sampled_from([None, A, B, C]),
    finished=st.booleans(),
    alive=st.frozensets(st.sampled_from([A, B, C])),
    saving=st.booleans(),
)
def test_never_starts_a_second_copy_and_advances_legally(
    state: State, running_on: WorkerId | None, finished: bool, alive: frozenset[WorkerId], saving: bool
) -> None:
    m = mig(state)
    step = next_step(m, running_on=running_on, finished=finished, alive=alive, saving=saving)
    if isinstance(step, IssueStart):
        # Never where another copy may run; repeated where the copy runs, the start is
        # answered by that copy.
        assert running_on in (None, step.worker) and not finished and step.worker in alive
        assert running_on is None or (state is State.RESTORING and step.worker == m.target)
    if isinstance(step, IssueSave):
        assert step.worker == m.source
    if isinstance(step, Advance):
        m.to(step.state, at=2.0)  # raises if illegal
