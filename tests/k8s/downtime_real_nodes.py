"""Measure a move's downtime through real kubelets (issue 13 item 4).

    .venv/bin/python -m tests.k8s.downtime_real_nodes --runs 5

Each run: a training pod on node-1; ``KubernetesRuntime.save`` evicts it (SIGTERM, the job
checkpoints, the kubelet tears the pod down and confirms the deletion); the copy is created on
node-2 from the checkpoint. Times from the eviction request: the job's "checkpointed" record,
the save's end (pod gone from the API), the new pod Running (API status, polled every 0.1 s:
it can lag the job itself), the first training record after the restart (the job's own
``ts``). Runs alternate between the training image already in node-2's containerd
("present") and removed from it beforehand, imported with ``ctr images import`` once the save
is done ("imported"; the offline stand-in for a pull). Prints each run and the medians.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from specon.model import ContainerId
from specon.runtime.kubernetes.backend import KubeApi, KubernetesRuntime
from tests.k8s.cluster import KubeCluster, ensure_binaries
from tests.k8s.nodes import TRAIN_IMAGE, RealNodes, ensure_node_binaries, on_real_node, real_nodes
from tests.k8s.test_runtime_kubernetes import records, shared_volume, trained, training_pod, until


async def one_run(
    cluster: KubeCluster, nodes: RealNodes, namespace: str, volume: Path, *, run: int, fresh: bool
) -> dict[str, float]:
    train_archive = nodes.images[1]
    admin = KubeApi(cluster.api_client())
    rts = {
        n: KubernetesRuntime(cluster.api_client(), n, volume_root=volume, namespace=namespace)
        for n in ("node-1", "node-2")
    }
    job, name = f"j{run}", f"p{run}"
    try:
        pod = on_real_node(training_pod(name, "node-1", job=job, steps=100000, step_seconds=0.05))
        await asyncio.to_thread(admin.request, "POST", f"/api/v1/namespaces/{namespace}/pods", body=pod)
        await until(lambda: len(trained(volume, job)) >= 20, "training on node-1", timeout=60)
        spec = next(c.spec for c in await rts["node-1"].list_containers() if c.id.endswith(f".{job}"))
        node2 = nodes.nodes["node-2"]
        if fresh:
            nodes.remove_image(node2, TRAIN_IMAGE)
        t0 = time.time()
        res = await rts["node-1"].save(ContainerId(f"{namespace}.{job}"), grace=10)
        t_saved = time.time()
        if fresh:
            await asyncio.to_thread(nodes.import_images, node2, [train_archive])
        t_imported = time.time()
        started = await rts["node-2"].start(spec, checkpoint=res.checkpoint)
        new_name = str(started.handle).partition("/")[2]

        async def phase_running() -> float | None:
            p = await asyncio.to_thread(
                admin.request, "GET", f"/api/v1/namespaces/{namespace}/pods/{new_name}"
            )
            return time.time() if p.get("status", {}).get("phase") == "Running" else None

        t_running = await until(phase_running, "the copy Running", timeout=60)

        def first_record() -> float | None:
            recs = records(volume, job)
            i = next(
                (i for i, r in enumerate(recs) if r.get("event") == "started" and r.get("resumed")), None
            )
            return next((float(r["ts"]) for r in recs[i:] if "loss" in r), None) if i is not None else None

        t_first = await until(first_record, "the first record on node-2", timeout=60)
        ckpt_ts = next(float(r["ts"]) for r in records(volume, job) if r.get("event") == "checkpointed")
        return {
            "checkpointed": ckpt_ts - t0,  # SIGTERM reached the job, which saved and exits
            "saved": t_saved - t0,  # the kubelet confirmed the pod gone (the API object deleted)
            "import": t_imported - t_saved,
            "running": t_running - t0,
            "first_record": t_first - t0,
        }
    finally:
        for rt in rts.values():
            rt.close()
        nodes.drain(namespace)


async def main(runs: int) -> None:
    binaries, node_binaries = ensure_binaries(), ensure_node_binaries()
    results: dict[str, list[dict[str, float]]] = {"present": [], "imported": []}
    with (
        KubeCluster(binaries) as cluster,
        tempfile.TemporaryDirectory() as tmp,
        real_nodes(cluster, node_binaries, Path(tmp)) as nodes,
    ):
        admin = KubeApi(cluster.api_client())
        for run in range(2 * runs):
            fresh = run % 2 == 1
            with cluster.temporary_namespace() as ns:
                volume = Path(tmp) / f"shared-{run}"
                shared_volume(admin, ns, volume)
                got = await one_run(cluster, nodes, ns, volume, run=run, fresh=fresh)
                admin.request("DELETE", f"/api/v1/persistentvolumes/specon-data-{ns}")
            mode = "imported" if fresh else "present"
            results[mode].append(got)
            print(
                f"run {run} image {mode:8}: " + ", ".join(f"{k} {v:.2f} s" for k, v in got.items()),
                flush=True,
            )
    for mode, rows in results.items():
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        print(
            f"median, image {mode} ({len(rows)} runs): " + ", ".join(f"{k} {v:.2f} s" for k, v in med.items())
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3, help="runs per image mode")
    asyncio.run(main(parser.parse_args().runs))
