"""The pod admission webhook (``POST /v1/kubernetes/admission/pods``): the node a managed pod
should go to, answered as a JSON Patch the API server applies as it creates the pod.

What is answered is decided by ``specon.runtime.kubernetes.admission`` (the patch) from this
manager's own state: a pod of a job in a move is steered (required node affinity) to where
the move sends it now (``migration.heading``); any other managed pod gets Algorithm 2's best
nodes as preferred affinities. A pod the manager steered itself, a pod no selector term
names, a pod of no job, an update, a new pod that names its node: allowed unchanged (a move's
replacement that names its node, a Job's template with ``nodeName``, is steered all the same),
and so is every pod while this replica does not lead (it holds no heartbeats to rank by).

The API server calls without a credential (as it calls any webhook): what anyone may learn
from the answer is where the manager would place the pod they send; nothing is written or
decided by a review. The webhook is registered with ``failurePolicy: Ignore``: a manager
down, slow or refusing never stops a pod from being created, it only loses the hint.
"""

from __future__ import annotations

import time
from typing import Any

import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram

from specon.coordinator.migration import heading
from specon.fence import ENV_AWAIT_PREVIOUS, ENV_RUN_LOCK
from specon.model import Category, ContainerId, ContainerSnapshot, WorkerId
from specon.policy.placement import ClusterIndex, ranked_homes
from specon.runtime.kubernetes import pods
from specon.runtime.kubernetes.admission import (
    MAX_PREFERRED,
    WEBHOOK_PATH,
    PodReview,
    answer,
    bound,
    holds_run_lock,
    job_env_patch,
    preference_patch,
    probe_patch,
    read_review,
    steered_already,
    steering_patch,
)
from specon.runtime.kubernetes.gpu import pod_gpu_memory
from specon.runtime.kubernetes.selectors import matches, parse_selector
from specon_manager.shell import ManagerShell

log = structlog.get_logger()

# How long one ranking of the cluster answers new pods: a burst of creates (a Job's
# parallelism, a queue admitting many) shares one index instead of building one each.
INDEX_TTL_S = 1.0
# Beyond the save's own time bound, for the pod's termination after its checkpoint.
AWAIT_SLACK_S = 30.0


class PodAdmission:
    """Answers ``AdmissionReview``s of pod creates from ``shell``'s state."""

    def __init__(self, shell: ManagerShell, selector: str, *, preferred: int = MAX_PREFERRED) -> None:
        self.shell = shell
        self.preferred = min(preferred, MAX_PREFERRED)
        self._requirements = parse_selector(selector)
        self._index: tuple[float, ClusterIndex] | None = None
        # Registered by ``create_app`` in the manager's registry.
        self.reviews = Counter(
            "specon_admission_reviews",
            "Pod admission reviews answered, by outcome "
            "(steered, preferred, run_lock, probe, unchanged, unread, invalid)",
            ["outcome"],
            registry=None,
        )
        self.seconds = Histogram(
            "specon_admission_review_seconds",
            "Time to answer one pod admission review",
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25),
            registry=None,
        )

    def review(self, body: object) -> dict[str, Any]:
        """The answer to ``body``; ``ReviewError`` for a body that is no review of a pod."""
        t0 = time.perf_counter()
        review = read_review(body)
        try:
            outcome, response = self._answer(review)
        except Exception as exc:
            log.warning(
                "specon.manager.admission_unread", uid=review.uid, error=f"{type(exc).__name__}: {exc}"
            )
            outcome, response = "unread", answer(review.uid)
        self.reviews.labels(outcome=outcome).inc()
        self.seconds.observe(time.perf_counter() - t0)
        return response

    def invalid(self) -> None:
        self.reviews.labels(outcome="invalid").inc()

    def _answer(self, review: PodReview) -> tuple[str, dict[str, Any]]:
        pod = review.pod
        if (
            not review.creates_pod
            or not self.shell.leading
            or not matches(pods.labels_of(pod), self._requirements)
        ):
            return "unchanged", answer(review.uid)
        if review.dry_run and (probe := probe_patch(pod)):  # before a Job's pod is evicted
            return "probe", answer(review.uid, probe)
        if steered_already(pod):
            return "unchanged", answer(review.uid)
        cid = pods.job_id(pod)
        now = self.shell.clock()
        # A copy may find the evicted one still saving: it waits as long as a save may take.
        wait = self.shell.core.policy.migration.save_timeout + AWAIT_SLACK_S
        if (heading := self._heading(cid, now)) is not None:
            mid, node = heading
            log.info("specon.manager.admission_steered", job=cid, node=node, migration=mid)
            return "steered", answer(review.uid, steering_patch(pod, node, move=mid, await_previous=wait))
        # Each pod a Job makes holds its run lock and waits for its previous copy's, so a
        # replacement waits even when a move's state was not yet known here.
        job_made = pods.controlling_job(pod) is not None and not holds_run_lock(pod)
        lock = job_env_patch(pod, {ENV_AWAIT_PREVIOUS: f"{wait:g}", ENV_RUN_LOCK: "1"}) if job_made else []
        # A pod that names its node itself: a preference would change nothing.
        patch = [] if bound(pod) else preference_patch(pod, self._homes(cid, pod, now))
        outcome = "preferred" if patch else "run_lock" if lock else "unchanged"
        return outcome, answer(review.uid, patch + lock)

    def _heading(self, cid: ContainerId, now: float) -> tuple[str, WorkerId] | None:
        """The move of job ``cid`` in flight and where it sends the job now (None: none)."""
        core = self.shell.core
        for m in core.migrations.values():
            if m.container == cid:
                alive = core.state.alive(now, core.policy.messaging.worker_timeout)
                node = heading(m, alive, core.state.cordoned, core.refusals.get(m.id, 0))
                return None if node is None else (m.id, node)
        return None

    def _homes(self, cid: ContainerId, pod: dict[str, Any], now: float) -> list[str]:
        """Algorithm 2's best nodes for a new job of ``pod``'s requests and constraints."""
        if self.preferred <= 0:
            return []
        if self._index is None or now - self._index[0] >= INDEX_TTL_S:
            self._index = (now, self.shell.core.index(now))
        job = ContainerSnapshot(
            id=cid,
            worker=WorkerId(""),
            category=Category.PROGRESSING,
            requests=pods.pod_requests(pod),
            selector=pods.pod_node_selector(pod),
            tolerations=pods.pod_tolerations(pod),
            gpu_memory=pod_gpu_memory(pod),
        )
        core = self.shell.core
        return [
            str(w)
            for w in ranked_homes(
                self._index[1],
                job,
                cfg=core.policy.placement,
                worker_timeout=core.policy.messaging.worker_timeout,
                limit=self.preferred,
            )
        ]

    def install(self, app: web.Application, registry: CollectorRegistry) -> None:
        """Serve ``WEBHOOK_PATH`` in ``app`` (open: the API server sends no credential) and
        count in ``registry``."""
        app[ADMISSION] = self
        registry.register(self.reviews)
        registry.register(self.seconds)
        app.router.add_post(WEBHOOK_PATH, _handle)


ADMISSION = web.AppKey("pod_admission", PodAdmission)


async def _handle(request: web.Request) -> web.Response:
    admission = request.app[ADMISSION]
    try:
        body = await request.json()
        return web.json_response(admission.review(body))
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # not JSON, too deep, or ReviewError
        admission.invalid()
        log.warning("specon.manager.admission_invalid", error=str(exc), peer=request.remote)
        return web.json_response({"error": f"not an AdmissionReview of a pod: {exc}"}, status=400)
