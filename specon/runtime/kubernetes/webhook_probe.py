"""Whether the admission webhook answers in a namespace, asked before a Job's pod is evicted.

A Job's controller makes the replacement of an evicted pod at once, while the evicted copy
still saves; only the webhook steers that replacement to the move's target and makes it wait
for the evicted copy to end (``admission``). Without it the replacement would be scheduled
anywhere and start training beside the copy still checkpointing: so a Job's pod is evicted
only once the webhook answered a probe in its namespace. The probe is a pod created with
``dryRun=All`` (admission runs, nothing is stored); an answer is kept for ``FRESH_S``.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable

import structlog

from specon.runtime.kubernetes import pods
from specon.runtime.kubernetes.admission import ANN_PROBE_ANSWER, probe_pod
from specon.runtime.kubernetes.api import KubeApi, KubeError, pods_path

log = structlog.get_logger()

FRESH_S = 60.0  # how long an answer stands for the namespace


class WebhookProbe:
    """Asks, with ``api``'s identity (it may create pods in the training namespaces)."""

    def __init__(self, api: KubeApi, selector: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.labels = {r.key: r.value for r in pods.parse_selector(selector) if r.op in ("=", "exists")}
        self.clock = clock
        self._answered: dict[str, float] = {}

    async def answers(self, namespace: str) -> bool:
        """Whether the webhook answered a probe in ``namespace`` within ``FRESH_S``."""
        at = self._answered.get(namespace)
        if at is not None and self.clock() - at < FRESH_S:
            return True
        nonce = secrets.token_hex(8)
        try:
            made = await asyncio.to_thread(
                self.api.request,
                "POST",
                pods_path(namespace),
                query={"dryRun": "All"},
                body=probe_pod(namespace, self.labels, nonce),
            )
        except KubeError as exc:
            log.warning("specon.k8s.webhook_probe_failed", namespace=namespace, error=str(exc))
            return False
        if pods.annotations_of(made).get(ANN_PROBE_ANSWER) != nonce:
            log.warning("specon.k8s.webhook_unanswered", namespace=namespace)
            return False
        self._answered[namespace] = self.clock()
        return True
