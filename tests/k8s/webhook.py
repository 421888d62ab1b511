"""The manager's pod admission webhook as a real API server calls it, for the tests
(tests/k8s/test_admission_webhook.py) and the benchmark (bench/bench_webhook.py).

``WebhookManager`` serves the manager's app (its admission route) over TLS on loopback in a
thread, from a shell whose journal holds moves in flight, so the webhook steers those jobs'
pods; ``registered`` installs a ``MutatingWebhookConfiguration`` pointing at it by URL, limited
to one labelled namespace, and removes it afterwards (it is cluster-wide: another test's pods
must not reach a manager that is gone).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import ssl
import threading
import time
from collections.abc import Coroutine, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web
from kubernetes import client
from specon_manager.admission import PodAdmission
from specon_manager.app import create_app
from specon_manager.journal import Journal
from specon_manager.shell import ManagerShell

from specon.config import default_policy
from specon.coordinator.migration import Migration, State
from specon.model import ContainerId, WorkerId
from specon.runtime.kubernetes.admission import WEBHOOK_PATH
from specon.testing.certs import TestCA
from tests.k8s.cluster import KubeCluster, free_ports

T = TypeVar("T")
SELECTOR = "specon.io/managed=true"
NAMESPACE_LABEL = "specon-test/webhook"
SOURCE = WorkerId("node-a")
PROBE, PROBE_NODE = "specon-probe", "node-probe"


class WebhookManager:
    """A manager serving only what the webhook needs, on ``https://127.0.0.1:<port>``."""

    def __init__(self, root: Path, namespace: str, moves: Mapping[str, str], *, preferred: int = 5) -> None:
        """``moves``: job (in ``namespace``) -> the node its move goes to; the job ``PROBE``
        moves too (``registered`` waits until its pods come out steered)."""
        self.root = root
        self.moves = {f"{namespace}.{job}": node for job, node in {**moves, PROBE: PROBE_NODE}.items()}
        self.preferred = preferred
        ca = TestCA.create(root / "ca")
        self.cert, self.key = ca.issue(root / "server", names=["127.0.0.1"])
        self.ca_pem = ca.cert_path.read_bytes()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="webhook-manager", daemon=True)
        self._runner: web.AppRunner | None = None
        self.shell: ManagerShell | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}{WEBHOOK_PATH}"

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the manager's loop; its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def start(self) -> WebhookManager:
        journal = Journal(self.root / "journal.db")
        now = time.time()
        for i, (job, target) in enumerate(sorted(self.moves.items())):
            m = Migration(f"m{i}", ContainerId(job), SOURCE, WorkerId(target), "converged", decided_at=now)
            journal.put(m.to(State.SAVING, at=now))
        self._thread.start()
        self.call(self._serve(journal))
        return self

    async def _serve(self, journal: Journal) -> None:
        self.shell = ManagerShell(policy=default_policy(), journal=journal)
        app = create_app(
            self.shell,
            token="t" * 32,
            tick=False,
            extensions=[PodAdmission(self.shell, SELECTOR, preferred=self.preferred)],
        )
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(self.cert, self.key)
        (self.port,) = free_ports(1)
        await web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=ctx).start()

    def stop(self) -> None:
        """Stop serving (the webhook is then down: connections refused)."""
        if self._runner is not None:
            self.call(self._runner.cleanup())
            self._runner = None

    def close(self) -> None:
        self.stop()
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
        self.loop.close()


@contextlib.contextmanager
def registered(cluster: KubeCluster, manager: WebhookManager, namespace: str) -> Iterator[str]:
    """``webhook`` for ``manager``: its probe job's pods come out steered."""
    with webhook(cluster, manager.url, manager.ca_pem, namespace, job_pod(PROBE)) as name:
        yield name


@contextlib.contextmanager
def webhook(
    cluster: KubeCluster, url: str, ca_pem: bytes, namespace: str, probe: dict[str, Any]
) -> Iterator[str]:
    """A ``MutatingWebhookConfiguration`` as components/webhook ships it, but calling ``url``
    (trusting ``ca_pem``) and only for ``namespace`` (labelled here); deleted on exit. Entered
    once a dry run of ``probe`` comes back with an affinity (the API server calls it), left
    once it no longer does."""
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    core.patch_namespace(namespace, {"metadata": {"labels": {NAMESPACE_LABEL: namespace}}})
    name = f"specon-test-{namespace}"
    body = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "pods.specon.io",
                "admissionReviewVersions": ["v1"],
                "sideEffects": "None",
                "failurePolicy": "Ignore",
                "timeoutSeconds": 2,
                "reinvocationPolicy": "IfNeeded",
                "matchPolicy": "Equivalent",
                "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_pem).decode()},
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
                "objectSelector": {"matchLabels": {"specon.io/managed": "true"}},
                "namespaceSelector": {"matchLabels": {NAMESPACE_LABEL: namespace}},
            }
        ],
    }
    hooks = client.AdmissionregistrationV1Api(api)
    hooks.create_mutating_webhook_configuration(body)
    try:
        _wait_until(core, namespace, probe, called=True)
        yield name
    finally:
        hooks.delete_mutating_webhook_configuration(name)
        _wait_until(core, namespace, probe, called=False)
        api.close()


def _wait_until(
    core: client.CoreV1Api, namespace: str, probe: dict[str, Any], *, called: bool, timeout: float = 30.0
) -> None:
    """Until the API server calls the webhook (or no longer does): it reads configurations
    through an informer, so the first creates after a change may not see it. A dry run (a
    webhook without side effects is called for it too) of ``probe``, until it comes back with
    an affinity (or without)."""
    deadline = time.monotonic() + timeout
    while True:
        made = core.create_namespaced_pod(namespace, probe, dry_run="All")
        if (made.spec.affinity is not None) == called:
            return
        if time.monotonic() > deadline:
            state = "call" if called else "stop calling"
            raise TimeoutError(f"the API server did not {state} the webhook within {timeout:.0f} s")
        time.sleep(0.05)


def job_pod(job: str, *, name: str | None = None) -> dict[str, Any]:
    """A managed pod of job ``job`` (label ``specon.io/job``; a Job's own pods name it by
    their owner), requesting a little CPU."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            **({"name": name} if name else {"generateName": f"{job}-"}),
            "labels": {"specon.io/managed": "true", "specon.io/job": job},
        },
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "train", "image": "trainer", "resources": {"requests": {"cpu": "100m"}}}],
        },
    }


def create_at_once(
    cluster: KubeCluster, namespace: str, pods: list[dict[str, Any]], *, threads: int = 32
) -> list[tuple[dict[str, Any], float]]:
    """Create ``pods`` concurrently; each as the API server returned it, with the seconds its
    create took."""
    conf = cluster.configuration()
    conf.connection_pool_maxsize = threads
    api = client.ApiClient(conf)
    core = client.CoreV1Api(api)

    def create(pod: dict[str, Any]) -> tuple[dict[str, Any], float]:
        t0 = time.perf_counter()
        made = core.create_namespaced_pod(namespace, pod)
        return api.sanitize_for_serialization(made), time.perf_counter() - t0

    try:
        with ThreadPoolExecutor(threads) as pool:
            return list(pool.map(create, pods))
    finally:
        api.close()
