"""Framework jobs moved between real Kubernetes nodes: the scenario of
tests/integration/test_frameworks.py as pods on two kubelets v1.20.2 with their own
containerd (tests/k8s/nodes.py). The pods run the offline training image with the repo and
the venv (and so the frameworks) bound read-only, write under the shared claim at /data,
declare their steps with the ``specon.io/steps`` annotation, and are moved by eviction (the
kubelet's SIGTERM and grace period) and a restore on the other node. Each ends with exactly
its steps and the same weights as the same script run beside the cluster, never moved."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from typing import Any

import pytest

from specon.runtime.kubernetes.pods import ANN_STEPS
from tests.integration.test_frameworks import (
    FRAMEWORKS,
    JOBS,
    OFFLINE,
    Framework,
    load_weights,
    same_weights,
    unmoved_run,
)
from tests.k8s.test_e2e_kubernetes import (
    Deployment,
    both_agents,
    finished,
    migration_of,
    steady,
    submit,
)
from tests.k8s.test_real_nodes import real_deployment  # noqa: F401  (the fixture)
from tests.k8s.test_runtime_kubernetes import records, trained, training_pod, until

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900)]


def framework_pod(fw: Framework, name: str) -> dict[str, Any]:
    """A pod of the framework's job script on node-1, its files under /data/jobs/<name>."""
    pod = training_pod(name, "node-1", steps=fw.steps, annotations={ANN_STEPS: str(fw.steps)})
    c = pod["spec"]["containers"][0]
    script = str(JOBS / f"{fw.name}_job.py")
    c["command"] = ["python", script, *fw.args, "--out", f"/data/jobs/{name}/{fw.out}"]
    c["env"] += [{"name": k, "value": v} for k, v in OFFLINE]
    return pod


@pytest.mark.parametrize("name", ["lightning", "transformers"])
async def test_a_framework_pod_moves_between_real_nodes_exactly(
    real_deployment: Deployment,  # noqa: F811
    tmp_path: Path,
    name: str,
) -> None:
    fw = FRAMEWORKS[name]
    if importlib.util.find_spec(fw.module) is None:
        pytest.skip(f"{fw.module} is not installed (the {name} extra)")
    d = real_deployment

    await until(both_agents(d), "both agents heartbeating", timeout=120)
    unmoved = unmoved_run(fw, tmp_path / "unmoved")
    try:
        await submit(d, framework_pod(fw, "fw"))
        await submit(d, steady("steady", 4000))
        probe = migration_of(d, f"{d.namespace}.fw", lambda m: m.state.value == "done")
        m = await until(probe, f"the {name} pod's migration", timeout=400)
        assert (m.source, m.target, m.reason) == ("node-1", "node-2", "converged")
        await until(lambda: finished(d.volume, "fw"), f"the moved {name} pod to finish", timeout=400)
        # Its weights come after its `finished` record, written whole (atomically).
        out = d.volume / "jobs" / "fw" / fw.out
        await until(out.exists, f"the moved {name} pod's weights", timeout=120)
        exit_code = await asyncio.to_thread(unmoved.wait, 400)
    finally:
        if unmoved.poll() is None:
            unmoved.kill()
            unmoved.wait()
    assert exit_code == 0, (tmp_path / "unmoved" / "output.log").read_text()[-3000:]

    assert sorted(trained(d.volume, "fw")) == list(range(1, fw.steps + 1))  # every step exactly once
    events = [r for r in records(d.volume, "fw") if "event" in r]
    kinds = [e["event"] for e in events]
    assert kinds.count("checkpointed") == 1 and kinds[-1] == "finished"
    moved = load_weights(out)
    assert same_weights(moved, load_weights(tmp_path / "unmoved" / fw.out))
