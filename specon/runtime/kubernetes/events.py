"""Kubernetes Events (``events.k8s.io/v1``) on a job's pod: what specon did to it, for
``kubectl describe pod`` and ``kubectl get events``, as the scheduler and the kubelet tell
what they did.

Recorded the way client-go's event recorder records them:

* never in a decision's way: ``record`` only queues (bounded; a full queue drops the event,
  counted) and one background task posts;
* aggregated: the same reason and note on the same pod within ``SERIES_WINDOW_S`` (6 min,
  client-go's) becomes a series on the first Event (``series.count``, ``lastObservedTime``),
  not a new object;
* rate-limited per pod by a token bucket (burst 25, a token every 5 minutes: client-go's spam
  filter), so a pod refused in a loop cannot flood the API server; an event over the limit is
  dropped, counted.

A failed post is logged once per reason of failure and counted, never retried: an Event is a
courtesy to the reader, not a record specon relies on (the journal is).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import structlog

from specon.checkpoint import step_of
from specon.runtime.base import RuntimeFailure, SaveResult
from specon.runtime.kubernetes.api import MERGE_PATCH, KubeError
from specon.runtime.kubernetes.pods import ANN_GENERATION, ANN_RESTORED_FROM, controlling_job, meta

log = structlog.get_logger()

CONTROLLER = "specon.io/agent"  # reportingController: who reports (the agents; the manager's own)
MANAGER_CONTROLLER = "specon.io/manager"
SERIES_WINDOW_S = 6 * 60.0  # a repeat within this joins the first Event's series (client-go)
BURST = 25  # events per pod at once (client-go's spam filter)
REFILL_S = 300.0  # then one per this many seconds
QUEUE = 1000  # events waiting to be posted; beyond, dropped
NOTE_MAX = 1024  # the API's limit on an Event's note


class EventsApi(Protocol):
    def request(self, method: str, path: str, *, body: object = None, content_type: str = ...) -> Any: ...


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


@dataclass(slots=True)
class _Series:
    name: str
    count: int
    first: float


@dataclass(slots=True)
class EventCounters:
    sent: int = 0  # new Event objects
    repeated: int = 0  # repeats folded into a series
    dropped: int = 0  # over a pod's rate, or the queue full
    failed: int = 0  # posts the API refused or did not answer
    by_reason: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Event:
    pod: Mapping[str, Any]
    type: str
    reason: str
    action: str
    note: str
    at: float


def micro_time(t: float) -> str:
    """An Event's ``MicroTime``: RFC 3339 with microseconds, in UTC."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class EventRecorder:
    """Events on pods, reported by ``instance`` (this agent: its node) of ``controller``."""

    def __init__(
        self,
        api: EventsApi,
        instance: str,
        *,
        controller: str = CONTROLLER,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api, self.instance, self.clock = api, instance, clock
        self.controller = controller
        self.counters = EventCounters()
        self._queue: asyncio.Queue[_Event] | None = None
        self._task: asyncio.Task[None] | None = None
        self._buckets: dict[str, _Bucket] = {}
        self._series: dict[tuple[str, str, str], _Series] = {}
        self._failing: str | None = None

    def record(self, pod: Mapping[str, Any], type_: str, reason: str, action: str, note: str) -> None:
        """Queue an Event on ``pod`` (its manifest as the API server holds it; or another
        object of the namespace: its ``apiVersion`` and ``kind`` say which); returns at once."""
        if self._queue is None:
            self._queue = asyncio.Queue(QUEUE)
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"events-{self.instance}")
        try:
            self._queue.put_nowait(_Event(pod, type_, reason, action, note[:NOTE_MAX], self.clock()))
        except asyncio.QueueFull:
            self.counters.dropped += 1

    async def drain(self) -> None:
        """Wait until every queued event is posted (tests, a graceful stop)."""
        if self._queue is not None:
            await self._queue.join()

    def close(self) -> None:
        """Stop posting; an event recorded later starts a new posting task."""
        if self._task is not None:
            self._task.cancel()
        self._task = self._queue = None

    async def _run(self) -> None:
        queue = self._queue
        assert queue is not None
        while True:
            ev = await queue.get()
            try:
                await asyncio.to_thread(self.post, ev)
            except Exception:  # a bug in a post must not end the posting (nor hang ``drain``)
                self.counters.failed += 1
                log.exception("specon.k8s.event_post_crashed", reason=ev.reason)
            finally:
                queue.task_done()

    # -- the recorder's rules (in the posting thread, one event at a time) --------------------
    def post(self, ev: _Event) -> None:
        meta = ev.pod.get("metadata") or {}
        ns, name, uid = meta.get("namespace", ""), meta.get("name", ""), meta.get("uid", "")
        key = (uid or f"{ns}/{name}", ev.reason, ev.note)
        path = f"/apis/events.k8s.io/v1/namespaces/{ns}/events"
        try:
            series = self._series.get(key)
            if series is not None and ev.at - series.first < SERIES_WINDOW_S:
                series.count += 1
                patch = {"series": {"count": series.count, "lastObservedTime": micro_time(ev.at)}}
                self.api.request("PATCH", f"{path}/{series.name}", body=patch, content_type=MERGE_PATCH)
                self.counters.repeated += 1
                return
            if not self._allowed(key[0], ev.at):
                self.counters.dropped += 1
                return
            made = self.api.request("POST", path, body=self._body(ev, ns, name, uid, _kind_of(ev.pod)))
        except KubeError as exc:
            self.counters.failed += 1
            if str(exc) != self._failing:  # once per distinct failure
                log.warning("specon.k8s.event_failed", pod=f"{ns}/{name}", reason=ev.reason, error=str(exc))
            self._failing = str(exc)
            return
        self._failing = None
        self._series[key] = _Series((made.get("metadata") or {}).get("name", ""), 1, ev.at)
        self.counters.sent += 1
        self.counters.by_reason[ev.reason] = self.counters.by_reason.get(ev.reason, 0) + 1
        self._forget_old(ev.at)

    def _body(self, ev: _Event, ns: str, name: str, uid: str, kind: tuple[str, str]) -> dict[str, Any]:
        regarding = {"apiVersion": kind[0], "kind": kind[1], "namespace": ns, "name": name}
        if uid:
            regarding["uid"] = uid
        return {
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            # client-go's name: the object's and the time in hex nanoseconds (a generateName
            # may not end in the dot).
            "metadata": {"name": f"{name}.{time.time_ns():x}", "namespace": ns},
            "eventTime": micro_time(ev.at),
            "reportingController": self.controller,
            "reportingInstance": self.instance,
            "action": ev.action,
            "reason": ev.reason,
            "note": ev.note,
            "type": ev.type,
            "regarding": regarding,
        }

    def _allowed(self, pod: str, now: float) -> bool:
        b = self._buckets.get(pod)
        if b is None:
            b = self._buckets[pod] = _Bucket(float(BURST), now)
        b.tokens = min(float(BURST), b.tokens + (now - b.at) / REFILL_S)
        b.at = now
        if b.tokens < 1.0:
            return False
        b.tokens -= 1.0
        return True

    def _forget_old(self, now: float) -> None:
        """Series past their window and buckets that refilled: bounded memory per pod seen."""
        if len(self._series) > 4 * QUEUE:
            for old in [k for k, v in self._series.items() if now - v.first >= SERIES_WINDOW_S]:
                del self._series[old]
        if len(self._buckets) > 4 * QUEUE:
            for pod in [k for k, b in self._buckets.items() if now - b.at >= BURST * REFILL_S]:
                del self._buckets[pod]


# -- what each Event says ------------------------------------------------------------------------
CATEGORY_ANNOTATION = "specon.io/category"  # the agent's classification (Algorithm 1) on the pod


async def saved(
    recorder: EventRecorder, pod: Mapping[str, Any], grace: float, save: Awaitable[SaveResult]
) -> SaveResult:
    """``save``'s result, with a ``Saving`` Event on ``pod`` before it and a ``Saved`` (or
    ``SaveFailed``, ``Finished``) one after."""
    recorder.record(pod, "Normal", "Saving", "Save", f"evicted to checkpoint and move; {grace:g} s to exit")
    try:
        res = await save
    except RuntimeFailure as exc:
        recorder.record(pod, "Warning", "SaveFailed", "Save", str(exc))
        raise
    where = (
        "no checkpoint: it restarts from its beginning"
        if res.step is None
        else f"checkpoint at step {res.step}"
    )
    how = " (killed at the end of its grace period: its newest complete checkpoint)" if res.forced else ""
    if res.finished:
        recorder.record(
            pod, "Normal", "Finished", "Save", "it completed its work while being saved: nothing to move"
        )
    else:
        recorder.record(pod, "Normal", "Saved", "Save", f"{where}, in {res.seconds:.1f} s{how}")
    return res


def restored(recorder: EventRecorder, pod: Mapping[str, Any], node: str, checkpoint: Path | None) -> None:
    """A ``Restored`` Event on a new copy: where, from what, its lineage."""
    recorder.record(pod, "Normal", "Restored", "Restore", restored_note(pod, node, checkpoint))


def restored_note(pod: Mapping[str, Any], node: str, checkpoint: Path | None) -> str:
    """What a ``Restored`` Event on a new copy says: where, from what, its lineage."""
    ann = meta(pod).get("annotations") or {}
    step = None if checkpoint is None else step_of(checkpoint)
    start = (
        "from its newest complete checkpoint"
        if checkpoint is None
        else f"from the checkpoint at step {step}"
        if step is not None
        else f"from {checkpoint.name}"
    )
    before = ann.get(ANN_RESTORED_FROM)
    return f"restored on node {node} {start}, generation {ann.get(ANN_GENERATION, '?')}" + (
        f", after pod {before}" if before else ""
    )


def classified(recorder: EventRecorder, pod: Mapping[str, Any], annotations: Mapping[str, str]) -> None:
    """A ``Converged`` Event when ``annotations`` turn the pod's category to converged."""
    now = annotations.get(CATEGORY_ANNOTATION)
    before = (meta(pod).get("annotations") or {}).get(CATEGORY_ANNOTATION)
    if now == "converged" and before != "converged":
        note = "its loss curve has flattened: specon may move it to make room for jobs still improving"
        recorder.record(pod, "Normal", "Converged", "Classify", note)


def _kind_of(obj: Mapping[str, Any]) -> tuple[str, str]:
    """(apiVersion, kind) of what an Event is about: a pod unless the object says otherwise."""
    return str(obj.get("apiVersion") or "v1"), str(obj.get("kind") or "Pod")


def owner_of(pod: Mapping[str, Any]) -> dict[str, Any] | None:
    """The Job that controls ``pod`` (``pods.controlling_job``), as an object an Event can be
    about (None: no Job)."""
    name = controlling_job(pod)
    if name is None:
        return None
    m = meta(pod)
    ref = next(r for r in m.get("ownerReferences") or [] if isinstance(r, dict) and r.get("name") == name)
    job = {"name": name, "namespace": m.get("namespace", "")} | (
        {"uid": ref["uid"]} if ref.get("uid") else {}
    )
    return {"apiVersion": str(ref.get("apiVersion")), "kind": "Job", "metadata": job}
