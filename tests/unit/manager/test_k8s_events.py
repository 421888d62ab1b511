"""The manager's Events for ended moves (``specon_manager.k8s_events``); on the real API server
with the manager's RBAC: tests/k8s/test_manifests.py."""

from __future__ import annotations

from dataclasses import replace

from specon_manager.k8s_events import event_of

from specon.coordinator.migration import Migration, State
from specon.model import ContainerId, WorkerId

M = Migration(
    "m1", ContainerId("training.j1"), WorkerId("node-1"), WorkerId("node-2"), "converged", State.RESTORING
)


def test_a_move_that_ended_says_where_from_where_to_and_the_downtime() -> None:
    done = replace(M, state=State.DONE, checkpoint_step=400, stopped_at=10.0, started_at=12.5, lost_steps=0)
    assert event_of(done) == (
        "Normal",
        "Moved",
        "Move",
        "moved from node-1 to node-2 (converged) at step 400; down 2.5 s, 0 steps lost",
    )


def test_a_recovery_and_a_rollback_say_what_they_are() -> None:
    recovered = replace(M, reason="recovered", state=State.DONE, stopped_at=1.0, started_at=61.0)
    assert event_of(recovered) == (
        "Normal",
        "Recovered",
        "Recover",
        "restored on node-2 from the start (recovered: it ran nowhere after node-1); down 60.0 s",
    )
    back = replace(M, state=State.ROLLED_BACK, error="the copy ended before its first progress record")
    kind, reason, _, note = event_of(back) or ("", "", "", "")
    assert (kind, reason) == ("Warning", "MoveRolledBack") and note.endswith("first progress record")


def test_a_migration_under_way_leaves_none() -> None:
    assert all(event_of(replace(M, state=s)) is None for s in State if not s.terminal)
