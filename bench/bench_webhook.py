"""The pod admission webhook on a real kube-apiserver: what it adds to a pod create (target
<= 20 ms, median) and whether a burst of replacements is each steered.

The manager's webhook (``tests/k8s/webhook.py``: the manager's app over TLS on loopback, its
journal holding 100 moves in flight) is called by a real kube-apiserver v1.20 (built and
cached by ``tests/k8s/build-apiserver.sh``). Each round creates the same 100 managed pods one
at a time with the webhook registered and without it (in turns, the order alternating by
round), and times each create from the client; the figure is the median of the with-webhook
creates less the median of the without ones. Then the 100 pods are created at once
(32 threads) and each checked to be steered to its own move's target.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from kubernetes import client

from bench.figures import Figure
from specon.runtime.kubernetes import steering
from tests.k8s.cluster import KubeCluster, ensure_binaries
from tests.k8s.webhook import WebhookManager, create_at_once, job_pod, registered

TARGET_MS = 20.0
JOBS = 100
TARGETS = ("node-b", "node-c")


def _sequential(cluster: KubeCluster, namespace: str, names: str) -> list[float]:
    """Seconds of each of ``JOBS`` creates, one at a time; the pods are deleted after."""
    api = cluster.api_client()
    core = client.CoreV1Api(api)
    out = []
    try:
        for i in range(JOBS):
            t0 = time.perf_counter()
            core.create_namespaced_pod(namespace, job_pod(f"j{i}", name=f"{names}-{i}"))
            out.append(time.perf_counter() - t0)
        core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    finally:
        api.close()
    return out


def run(quick: bool = False) -> list[Figure]:
    rounds = 1 if quick else 5
    with_hook: list[float] = []
    without: list[float] = []
    per_round: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="bench-webhook-") as tmp,
        KubeCluster(ensure_binaries()) as cluster,
        cluster.temporary_namespace("webhook") as ns,
    ):
        manager = WebhookManager(Path(tmp), ns, {f"j{i}": TARGETS[i % 2] for i in range(JOBS)}).start()
        try:
            for r in range(rounds):
                for hooked in (r % 2 == 0, r % 2 != 0):
                    if hooked:
                        with registered(cluster, manager, ns):
                            times = _sequential(cluster, ns, f"w{r}")
                        with_hook += times
                    else:
                        times = _sequential(cluster, ns, f"p{r}")
                        without += times
                per_round.append(
                    1000 * (statistics.median(with_hook[-JOBS:]) - statistics.median(without[-JOBS:]))
                )
                print(
                    f"  round {r + 1}/{rounds}: webhook adds {per_round[-1]:.2f} ms (median create)",
                    flush=True,
                )
            with registered(cluster, manager, ns):
                burst = create_at_once(cluster, ns, [job_pod(f"j{i}") for i in range(JOBS)])
        finally:
            manager.close()
    steered = sum(
        steering.steered_to(pod) == TARGETS[int(pod["metadata"]["labels"]["specon.io/job"][1:]) % 2]
        for pod, _ in burst
    )
    added = 1000 * (statistics.median(with_hook) - statistics.median(without))
    detail = (
        f"{rounds} round(s) x {JOBS} creates each way; with {1000 * statistics.median(with_hook):.2f} ms, "
        f"without {1000 * statistics.median(without):.2f} ms; "
        f"per round {min(per_round):.2f}-{max(per_round):.2f} ms"
    )
    burst_ms = 1000 * statistics.median(s for _, s in burst)
    return [
        Figure(
            "webhook: added to a pod create (median)",
            added,
            "ms",
            target=TARGET_MS,
            detail=detail,
            clock="wall",
        ),
        Figure(
            "webhook: of 100 replacements created at once, steered to their target",
            steered,
            "pods",
            target=JOBS,
            better="min",
            detail=f"32 threads; median create {burst_ms:.1f} ms in the burst",
        ),
    ]
