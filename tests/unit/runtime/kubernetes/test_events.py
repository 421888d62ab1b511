"""The Event recorder's rules, on a fake API: a repeat joins the first Event's series, each
pod has a token bucket, nothing waits on the API, a failure is counted and logged once; and
what the Events say."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
import structlog

from specon.model import ContainerId, WorkerId
from specon.runtime.base import RuntimeFailure, SaveResult
from specon.runtime.kubernetes import events
from specon.runtime.kubernetes.api import KubeError
from specon.runtime.kubernetes.events import BURST, REFILL_S, SERIES_WINDOW_S, EventRecorder

POD = {"metadata": {"namespace": "training", "name": "train", "uid": "u-1", "annotations": {}}}


class FakeEvents:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.down = False
        self.hold: threading.Event | None = None

    def request(self, method: str, path: str, *, body: object = None, content_type: str = "") -> Any:
        if self.hold is not None:
            self.hold.wait(10)
        if self.down:
            raise KubeError(503, "ServiceUnavailable", "the server is unavailable")
        self.calls.append((method, path, body))
        assert isinstance(body, dict)
        return {"metadata": {"name": f"train.{len(self.calls)}"}}


class Clock:
    def __init__(self) -> None:
        self.t = 1_000.0

    def __call__(self) -> float:
        return self.t


async def test_a_repeat_within_the_window_joins_the_series_and_a_later_one_is_new() -> None:
    api, clock = FakeEvents(), Clock()
    rec = EventRecorder(api, "specon-agent-node-1", clock=clock)
    for _ in range(3):
        rec.record(POD, "Warning", "SaveFailed", "Save", "PDB blocks it")
        clock.t += 60
    await rec.drain()
    (post, *patches) = api.calls
    assert post[0] == "POST" and post[1] == "/apis/events.k8s.io/v1/namespaces/training/events"
    body = post[2]
    assert body["regarding"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "training",
        "name": "train",
        "uid": "u-1",
    }
    assert (body["reason"], body["type"], body["action"], body["reportingController"]) == (
        "SaveFailed",
        "Warning",
        "Save",
        "specon.io/agent",
    )
    assert body["eventTime"].endswith("Z") and body["metadata"]["name"].startswith("train.")
    assert [(m, p.rsplit("/", 1)[1], b["series"]["count"]) for m, p, b in patches] == [
        ("PATCH", "train.1", 2),
        ("PATCH", "train.1", 3),
    ]
    clock.t += SERIES_WINDOW_S
    rec.record(POD, "Warning", "SaveFailed", "Save", "PDB blocks it")
    rec.record(POD, "Warning", "SaveFailed", "Save", "another reason")  # another note: its own Event
    await rec.drain()
    assert [m for m, _, _ in api.calls[3:]] == ["POST", "POST"]
    assert (rec.counters.sent, rec.counters.repeated) == (3, 2)
    rec.close()


async def test_each_pod_gets_a_burst_then_one_event_per_refill() -> None:
    api, clock = FakeEvents(), Clock()
    rec = EventRecorder(api, "a", clock=clock)
    for i in range(BURST + 5):
        rec.record(POD, "Normal", "Saving", "Save", f"note {i}")
    other = {"metadata": {"namespace": "training", "name": "other", "uid": "u-2"}}
    rec.record(other, "Normal", "Saving", "Save", "its own bucket")
    await rec.drain()
    assert (rec.counters.sent, rec.counters.dropped) == (BURST + 1, 5)
    clock.t += REFILL_S
    rec.record(POD, "Normal", "Saving", "Save", "one more, a refill later")
    await rec.drain()
    assert rec.counters.sent == BURST + 2
    rec.close()


async def test_recording_never_waits_on_the_api_and_a_failure_is_counted_and_logged_once() -> None:
    api = FakeEvents()
    api.hold = threading.Event()  # the API hangs
    rec = EventRecorder(api, "a")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    for i in range(50):
        rec.record(POD, "Normal", "Saving", "Save", f"n{i}")
    assert loop.time() - t0 < 0.5  # queued, not posted
    api.down = True
    with structlog.testing.capture_logs() as logs:
        api.hold.set()
        await rec.drain()
    # Failed posts spend the pod's tokens as sent ones do: the rest are dropped, not posted.
    assert (rec.counters.failed, rec.counters.dropped, rec.counters.sent) == (BURST, 50 - BURST, 0)
    assert [e["event"] for e in logs].count("specon.k8s.event_failed") == 1
    rec.close()


async def test_what_the_saved_restored_and_converged_events_say() -> None:
    api = FakeEvents()
    rec = EventRecorder(api, "a")
    done = SaveResult(
        ContainerId("training.j"), WorkerId("node-1"), 120, Path("/v/ckpt-000000000120.json"), 2.34
    )

    async def ok() -> SaveResult:
        return done

    async def refused() -> SaveResult:
        raise RuntimeFailure(ContainerId("training.j"), "blocked by a PodDisruptionBudget")

    assert await events.saved(rec, POD, 30.0, ok()) is done
    with pytest.raises(RuntimeFailure):
        await events.saved(rec, POD, 30.0, refused())
    lineage = {"specon.io/generation": "3", "specon.io/restored-from": "train-g2"}
    copy = {"metadata": {"namespace": "training", "name": "train-g3", "uid": "u-3", "annotations": lineage}}
    events.restored(rec, copy, "node-2", Path("/v/ckpt-000000000120.json"))
    events.classified(rec, POD, {"specon.io/category": "converged"})
    events.classified(
        rec,
        {"metadata": {**POD["metadata"], "annotations": {"specon.io/category": "converged"}}},
        {"specon.io/category": "converged"},
    )  # fmt: skip  (already said)
    await rec.drain()
    said = [(b["reason"], b["note"]) for m, _, b in api.calls if m == "POST"]
    assert said[0] == ("Saving", "evicted to checkpoint and move; 30 s to exit")
    assert said[1] == ("Saved", "checkpoint at step 120, in 2.3 s")
    # The second save's Saving repeats the first: a series count, not a new Event.
    assert said[2][0] == "SaveFailed" and "PodDisruptionBudget" in said[2][1]
    assert [m for m, _, _ in api.calls].count("PATCH") == 1
    assert said[3] == (
        "Restored",
        "restored on node node-2 from the checkpoint at step 120, generation 3, after pod train-g2",
    )
    assert [r for r, _ in said[4:]] == ["Converged"]
    rec.close()
