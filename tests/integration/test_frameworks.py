"""Framework jobs moved by specon: a Lightning, a Hugging Face Trainer and a Keras job, each
made migratable by its ``specon.integrations`` callback and nothing else, run on the embedded
cluster (real manager and agents, the local runtime). Their loss converges, specon moves them
from w0 to w1 (SIGTERM, the callback's checkpoint, a restore on w1), and each ends with
exactly its steps and the same final weights, bit for bit, as a run of the same seed that
was never moved (run beside the cluster, outside specon).

Bit-for-bit equality holds because each integration restores everything the next steps
draw on: the framework's own state, the data position (the Trainer's batch skipping,
Lightning with ``ResumableLoader``, Keras at an epoch end) and the RNG states; the job
scripts pin torch to one thread so both runs do the same arithmetic.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from specon import jobkit
from specon.embedded.cluster import EmbeddedCluster
from specon.model import ContainerId, WorkerId
from specon.runtime.base import JobSpec
from tests.integration.test_e2e_local import POLICY, job, records, trained_steps, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(900)]

JOBS = Path(__file__).parent / "jobs" / "frameworks"
# Nothing is downloaded: the models are built from configs, the data generated.
OFFLINE = (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("KERAS_BACKEND", "torch"))


@dataclass(frozen=True)
class Framework:
    name: str
    module: str  # the framework the script imports: the test is skipped without it
    args: tuple[str, ...]
    steps: int
    out: str

    def command(self) -> tuple[str, ...]:
        script = JOBS / f"{self.name}_job.py"
        return (sys.executable, str(script), *self.args, "--out", self.out)

    def spec(self, jid: str) -> JobSpec:
        command = self.command()
        return JobSpec(id=ContainerId(jid), command=command, env=OFFLINE, steps=self.steps, model=self.name)


SLOW = ("--step-seconds", "0.05")  # time for the loss to be seen converging before the job ends
FRAMEWORKS = {
    "lightning": Framework("lightning", "lightning", ("--steps", "300", *SLOW), 300, "final.pt"),
    "transformers": Framework("transformers", "transformers", ("--steps", "300", *SLOW), 300, "final.pt"),
    # 16 batches an epoch.
    "keras": Framework("keras", "keras", ("--epochs", "20", *SLOW), 320, "final.npz"),
}


def load_weights(path: Path) -> dict[str, Any]:
    if path.suffix == ".npz":
        import numpy as np  # noqa: PLC0415  (lazy: the module collects without the train extra)

        with np.load(path) as data:
            return {k: data[k] for k in data.files}
    import torch  # noqa: PLC0415  (lazy: the module collects without the train extra)

    return dict(torch.load(path, map_location="cpu", weights_only=True))


def same_weights(a: dict[str, Any], b: dict[str, Any]) -> bool:
    import numpy as np  # noqa: PLC0415  (lazy: the module collects without the train extra)

    return a.keys() == b.keys() and all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)


def unmoved_run(fw: Framework, directory: Path) -> subprocess.Popen[bytes]:
    """The same script and seed outside specon's cluster, never stopped."""
    directory.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECON_")} | dict(OFFLINE)
    env |= {
        jobkit.ENV_PROGRESS_FILE: str(directory / "progress.jsonl"),
        jobkit.ENV_CHECKPOINT_DIR: str(directory / "checkpoints"),
    }
    log = (directory / "output.log").open("wb")
    return subprocess.Popen(fw.command(), cwd=directory, env=env, stdout=log, stderr=subprocess.STDOUT)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[EmbeddedCluster]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    # A core per worker: the frameworks' imports alone take seconds of CPU.
    async with EmbeddedCluster(tmp_path / "c", workers=2, cpus_per_worker=1.0, policy=policy) as c:
        yield c


@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
async def test_a_framework_job_is_moved_and_ends_as_if_it_never_was(
    cluster: EmbeddedCluster, tmp_path: Path, name: str
) -> None:
    if importlib.util.find_spec(FRAMEWORKS[name].module) is None:  # looked up, not imported
        pytest.skip(f"{FRAMEWORKS[name].module} is not installed (the {name} extra)")
    await framework_job_moves_exactly(cluster, FRAMEWORKS[name], tmp_path / "unmoved")


async def framework_job_moves_exactly(cluster: EmbeddedCluster, fw: Framework, reference: Path) -> None:
    """The scenario (tests/docker runs it too): the converged framework job moves once from
    w0 to w1 and finishes with exactly its steps and the unmoved run's weights."""
    unmoved = unmoved_run(fw, reference)
    try:
        w0 = WorkerId("w0")
        await cluster.submit(fw.spec("fw"), w0)
        # A co-tenant that keeps progressing: the framework job is the one to move.
        await cluster.submit(job("steady", 4000, "linear"), w0)

        async def migrated() -> bool:
            st = await cluster.status()
            return any(m.container == "fw" and m.state.value == "done" for m in st.migrations)

        await wait_for(migrated, f"the {fw.name} job's migration", timeout=400)
        st = await cluster.status()
        m = next(m for m in st.migrations if m.container == "fw")
        assert (m.source, m.target, m.reason) == ("w0", "w1", "converged")

        def finished() -> bool:
            return any(r.get("event") == "finished" for r in records(cluster, "fw"))

        await wait_for(finished, f"the moved {fw.name} job to finish", timeout=400)
        # Its weights come after its `finished` record, written whole (atomically).
        out = cluster.volume / "jobs" / "fw" / fw.out
        await wait_for(out.exists, f"the moved {fw.name} job's weights", timeout=120)
        exit_code = await asyncio.to_thread(unmoved.wait, 400)
    finally:
        if unmoved.poll() is None:
            unmoved.kill()
            unmoved.wait()
    assert exit_code == 0, (reference / "output.log").read_text()[-3000:]

    # Exactly its steps: each trained once, though it ran on two workers.
    assert sorted(trained_steps(cluster, "fw")) == list(range(1, fw.steps + 1))
    events = [r for r in records(cluster, "fw") if "event" in r]
    kinds = [e["event"] for e in events]
    assert kinds.count("checkpointed") == 1 and kinds[-1] == "finished"
    assert [e["steps"] for e in events if e["event"] == "started"] == [fw.steps, fw.steps]
    resumed_at = next(e["step"] for e in events if e["event"] == "checkpointed")
    assert 0 < resumed_at < fw.steps
    print(f"\n{fw.name.upper()} JOB MOVED at step {resumed_at} of {fw.steps}")

    # The same weights as the run nobody moved.
    moved = load_weights(out)
    assert same_weights(moved, load_weights(reference / fw.out))
    fw_info = next(c for c in st.containers if c.id == "fw")
    assert fw_info.worker == "w1" and fw_info.migrated
