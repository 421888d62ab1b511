"""The Kubernetes backend's pure rules (specon.runtime.kubernetes.pods): no cluster needed."""

from __future__ import annotations

import json
from pathlib import PurePosixPath
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specon.model import ContainerId, Resources
from specon.runtime.base import ContainerState, JobSpec
from specon.runtime.kubernetes.pods import (
    ANN_GENERATION,
    ANN_RESTORED_FROM,
    ENV_RESTORE_CHECKPOINT,
    LABEL_JOB,
    TAINT_NOT_READY,
    TAINT_UNSCHEDULABLE,
    PodError,
    SharedVolume,
    controlling_job,
    job_files,
    job_id,
    job_spec,
    loads_template,
    matches,
    migratable,
    node_capacity,
    node_schedulable,
    node_taints,
    owners,
    parse_selector,
    qualified_id,
    quantity,
    restored_name,
    restored_pod,
    split_job_id,
    state_of,
    template_of,
    to_pod,
    to_volume,
)
from specon.runtime.kubernetes.steering import steered_to


def pod(
    name: str = "train-1",
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    mount: str = "/data",
    sub_path: str | None = None,
    volume: dict[str, Any] | None = None,
    phase: str = "Running",
) -> dict[str, Any]:
    vm: dict[str, Any] = {"name": "data", "mountPath": mount}
    if sub_path:
        vm["subPath"] = sub_path
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": "u-1",
            "resourceVersion": "42",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"specon.io/managed": "true", **(labels or {})},
            "annotations": dict(annotations or {}),
        },
        "spec": {
            "nodeName": "node-1",
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "train",
                    "image": "specon:0.1.0",
                    "command": ["python", "-m", "specon.workloads"],
                    "args": ["--model", "vae"],
                    "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
                    "resources": {
                        "requests": {"cpu": "500m", "memory": "1Gi"},
                        "limits": {"nvidia.com/gpu": 1},
                    },
                    "volumeMounts": [vm, {"name": "kube-api-access-abcde", "mountPath": "/var/run/secrets"}],
                }
            ],
            "volumes": [
                {"name": "data", **(volume or {"persistentVolumeClaim": {"claimName": "specon-data"}})},
                {"name": "kube-api-access-abcde", "projected": {"sources": []}},
            ],
        },
        "status": {"phase": phase, "startTime": "2026-01-01T00:00:05Z"},
    }


CONTRACT = {
    "SPECON_PROGRESS_FILE": "/data/jobs/j1/progress.jsonl",
    "SPECON_CHECKPOINT_DIR": "/data/jobs/j1/checkpoints",
}


def test_selector_parsing_and_matching() -> None:
    sel = parse_selector("specon.io/managed=true, tier!=test, gpu, !legacy")
    assert matches({"specon.io/managed": "true", "gpu": ""}, sel)
    assert not matches({"specon.io/managed": "false", "gpu": ""}, sel)
    assert not matches({"specon.io/managed": "true", "gpu": "", "tier": "test"}, sel)
    assert not matches({"specon.io/managed": "true"}, sel)
    assert not matches({"specon.io/managed": "true", "gpu": "", "legacy": "1"}, sel)
    with pytest.raises(PodError, match="set-based"):
        parse_selector("env in (a, b)")


def test_job_id_is_the_namespace_and_the_label_else_the_pod_name() -> None:
    assert job_id(pod(labels={LABEL_JOB: "vae-7"})) == "ml.vae-7"
    assert job_id(pod("bare-pod")) == "ml.bare-pod"
    # (namespace, job) is the identity: one name in two namespaces is two jobs.
    other = pod(labels={LABEL_JOB: "vae-7"})
    other["metadata"]["namespace"] = "vision"
    assert job_id(other) == "vision.vae-7" != job_id(pod(labels={LABEL_JOB: "vae-7"}))
    # The first dot splits: a namespace is a DNS label, a job may hold dots.
    assert split_job_id(job_id(pod(labels={LABEL_JOB: "run.v2"}))) == ("ml", "run.v2")
    assert qualified_id("ml", "run.v2") == "ml.run.v2"
    for bad in ("nodot", ".job", "ml.", "Upper.job", "a_b.job"):
        with pytest.raises(PodError):
            split_job_id(bad)
    with pytest.raises(PodError, match="job"):
        qualified_id("ml", "j\n")


def test_paths_from_env_map_through_the_claim_mount_and_subpath() -> None:
    files = job_files(pod(labels={LABEL_JOB: "j1"}, env=CONTRACT), SharedVolume())
    assert files.progress == PurePosixPath("jobs/j1/progress.jsonl")
    assert files.checkpoints == PurePosixPath("jobs/j1/checkpoints")
    # The pod mounts only a sub-directory of the volume, somewhere else.
    p = pod(env={"SPECON_PROGRESS_FILE": "/work/log.jsonl"}, mount="/work", sub_path="teams/a")
    assert job_files(p, SharedVolume()).progress == PurePosixPath("teams/a/log.jsonl")


def test_paths_through_a_host_path_under_the_shared_root() -> None:
    volume = {"hostPath": {"path": "/srv/shared/jobs"}}
    p = pod(env={"SPECON_CHECKPOINT_DIR": "/data/x/ckpt"}, volume=volume)
    files = job_files(p, SharedVolume(claim=None, host_path="/srv/shared"))
    assert files.checkpoints == PurePosixPath("jobs/x/ckpt")


def test_annotations_override_env_and_the_default_layout_applies_last() -> None:
    p = pod(labels={LABEL_JOB: "j1"}, annotations={"specon.io/progress-file": "logs/j1.csv"}, env=CONTRACT)
    files = job_files(p, SharedVolume())
    assert files.progress == PurePosixPath("logs/j1.csv")
    assert files.checkpoints == PurePosixPath("jobs/j1/checkpoints")
    bare = job_files(pod(labels={LABEL_JOB: "j2"}), SharedVolume())
    # The default layout is per (namespace, job): same-named jobs of two namespaces never share.
    assert bare == type(bare)(
        PurePosixPath("jobs/ml.j2/progress.jsonl"), PurePosixPath("jobs/ml.j2/checkpoints")
    )


@pytest.mark.parametrize(
    ("env", "volume", "why"),
    [
        ({"SPECON_PROGRESS_FILE": "/elsewhere/p.jsonl"}, None, "not on the shared volume"),
        (
            {"SPECON_PROGRESS_FILE": "/data/p.jsonl"},
            {"persistentVolumeClaim": {"claimName": "other"}},
            "not on",
        ),
        ({"SPECON_PROGRESS_FILE": "relative/p.jsonl"}, None, "absolute"),
        ({"SPECON_PROGRESS_FILE": "/data/../etc/passwd"}, None, "escapes"),
    ],
)
def test_paths_off_the_shared_volume_are_refused(
    env: dict[str, str], volume: dict[str, Any] | None, why: str
) -> None:
    with pytest.raises(PodError, match=why):
        job_files(pod(env=env, volume=volume), SharedVolume())


def test_annotation_paths_may_not_escape_the_volume() -> None:
    with pytest.raises(PodError, match="escapes"):
        job_files(pod(annotations={"specon.io/checkpoint-dir": "/abs"}), SharedVolume())


@pytest.mark.slow
@given(st.lists(st.text(alphabet="abcxyz019_-", min_size=1, max_size=8), min_size=1, max_size=4))
def test_to_pod_inverts_to_volume(parts: list[str]) -> None:
    p = pod(mount="/mnt/v", sub_path="base")
    inside = "/mnt/v/" + "/".join(parts)
    relative = to_volume(p, inside, SharedVolume())
    assert relative == PurePosixPath("base", *parts)
    assert to_pod(p, relative, SharedVolume()) == inside


def test_state_of_each_phase() -> None:
    assert state_of(pod(phase="Pending")) == (ContainerState.RUNNING, None)
    assert state_of(pod(phase="Running")) == (ContainerState.RUNNING, None)
    terminating = pod()
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    assert state_of(terminating)[0] is ContainerState.STOPPING
    done = pod(phase="Succeeded")
    assert state_of(done) == (ContainerState.EXITED, 0)
    failed = pod(phase="Failed")
    failed["status"]["containerStatuses"] = [{"name": "train", "state": {"terminated": {"exitCode": 75}}}]
    assert state_of(failed) == (ContainerState.FAILED, 75)


def test_opt_out_and_owners() -> None:
    assert migratable(pod())
    assert not migratable(pod(annotations={"specon.io/migratable": "false"}))
    owned = pod()
    owned["metadata"]["ownerReferences"] = [{"kind": "Job", "name": "train", "uid": "x"}]
    assert owners(owned) == ["Job/train"] and owners(pod()) == []


def test_quantities() -> None:
    assert quantity("500m") == 0.5
    assert quantity("2Gi") == 2 * 2**30
    assert quantity("1e3") == 1000.0
    assert quantity(4) == 4.0
    with pytest.raises(PodError):
        quantity("lots")


def test_a_jobs_pods_are_one_job_named_by_the_job() -> None:
    def owned(name: str, kind: str, api: str = "batch/v1", *, controller: bool = True) -> dict[str, Any]:
        p = pod(name)
        ref = {"apiVersion": api, "kind": kind, "name": "vae-7", "uid": "u", "controller": controller}
        p["metadata"]["ownerReferences"] = [ref]
        return p

    # A Job's pods (its replacements after an eviction too) share the Job's identity.
    assert job_id(owned("vae-7-x2k4p", "Job")) == job_id(owned("vae-7-9sd0q", "Job")) == "ml.vae-7"
    assert controlling_job(owned("vae-7-x2k4p", "Job")) == "vae-7"
    # Other controllers name their pods stably (an operator's "<job>-worker-0"): the pod name.
    assert job_id(owned("vae-7-worker-0", "PyTorchJob", "kubeflow.org/v1")) == "ml.vae-7-worker-0"
    assert job_id(owned("rs-pod", "ReplicaSet", "apps/v1")) == "ml.rs-pod"
    assert job_id(owned("vae-7-abc", "Job", controller=False)) == "ml.vae-7-abc"
    # An Indexed Job's pods are one job per completion index.
    indexed = owned("vae-7-2-x2k4p", "Job")
    indexed["metadata"]["annotations"] = {"batch.kubernetes.io/job-completion-index": "2"}
    assert job_id(indexed) == "ml.vae-7-2"
    # The label still names the job first.
    labelled = owned("vae-7-x2k4p", "Job")
    labelled["metadata"]["labels"] = {LABEL_JOB: "mine"}
    assert job_id(labelled) == "ml.mine"


def test_job_spec_carries_requests_labels_and_a_template() -> None:
    p = pod(
        labels={LABEL_JOB: "j1"},
        annotations={"specon.io/metric": "val_loss", "specon.io/steps": "300"},
        env=CONTRACT,
    )
    spec = job_spec(p)
    assert spec.id == "ml.j1"
    assert spec.command == ("python", "-m", "specon.workloads", "--model", "vae")
    assert spec.requests == Resources(cpu=0.5, memory=2**30, gpu=1)
    assert ("specon.io/metric", "val_loss") in spec.labels and spec.steps == 300
    assert spec.template is not None
    template = loads_template(spec.template)
    assert "nodeName" not in template["spec"] and "status" not in template
    assert "uid" not in template["metadata"] and "resourceVersion" not in template["metadata"]
    # The ServiceAccount token volume is injected per pod: a copy gets its own.
    assert [v["name"] for v in template["spec"]["volumes"]] == ["data"]
    assert [m["name"] for m in template["spec"]["containers"][0]["volumeMounts"]] == ["data"]
    # JobSpec carries the template through its JSON form unchanged.
    assert JobSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec


def test_restored_pod_is_pinned_with_lineage_and_restore_env() -> None:
    template = template_of(pod("train-1-g2", labels={LABEL_JOB: "j1"}, env=CONTRACT))
    new = restored_pod(
        template,
        job=ContainerId("ml.j1"),
        node="node-3",
        gen=3,
        restored_from="train-1-g2",
        restore_checkpoint="/data/jobs/j1/checkpoints/ckpt-000000000050.json",
    )
    assert new["metadata"]["name"] == "train-1-g3"
    assert "nodeName" not in new["spec"] and steered_to(new) == "node-3"  # through the scheduler
    assert new["metadata"]["labels"][LABEL_JOB] == "j1" and new["metadata"]["namespace"] == "ml"
    assert new["metadata"]["annotations"][ANN_RESTORED_FROM] == "train-1-g2"
    assert new["metadata"]["annotations"][ANN_GENERATION] == "3"
    env = {e["name"]: e["value"] for e in new["spec"]["containers"][0]["env"]}
    assert env[ENV_RESTORE_CHECKPOINT].endswith("ckpt-000000000050.json")
    assert env["SPECON_CHECKPOINT_DIR"] == "/data/jobs/j1/checkpoints"  # same volume, same paths
    assert new["spec"]["volumes"] == template["spec"]["volumes"]
    assert "uid" not in new["metadata"]


def test_restored_names_stay_dns_labels() -> None:
    long = template_of(pod("x" * 80))
    name = restored_name(long, 12)
    assert len(name) <= 63 and name.endswith("-g12")
    assert restored_name(template_of(pod("a-g7")), 8) == "a-g8"
    with pytest.raises(PodError, match="label value"):
        restored_pod(
            long,
            job=ContainerId("ml." + "j" * 100),
            node="n",
            gen=2,
            restored_from=None,
            restore_checkpoint=None,
        )
    # A template never moves a job to another namespace.
    with pytest.raises(PodError, match="namespace"):
        restored_pod(
            template_of(pod()), job=ContainerId("kube-system.train-1"), node="n", gen=2,
            restored_from=None, restore_checkpoint=None,
        )  # fmt: skip


def test_nodes_ready_schedulable_and_tainted() -> None:
    node: dict[str, Any] = {
        "metadata": {"name": "n1", "labels": {"zone": "a"}},
        "spec": {
            "taints": [{"key": "gpu", "effect": "NoSchedule"}, {"key": "soft", "effect": "PreferNoSchedule"}]
        },
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "allocatable": {"cpu": "3500m", "memory": "8Gi", "nvidia.com/gpu": "2"},
        },
    }
    assert node_schedulable(node) and node_taints(node) == ("gpu:NoSchedule",)
    assert node_capacity(node) == Resources(cpu=3.5, memory=8 * 2**30, gpu=2)
    node["spec"]["unschedulable"] = True
    node["status"]["conditions"][0]["status"] = "False"
    node["spec"]["taints"].append({"key": "dedicated", "value": "ml", "effect": "NoExecute"})
    assert not node_schedulable(node)
    assert node_taints(node) == tuple(
        sorted(
            (
                "gpu:NoSchedule",
                "dedicated=ml:NoExecute",
                f"{TAINT_UNSCHEDULABLE}:NoSchedule",
                f"{TAINT_NOT_READY}:NoSchedule",
            )
        )
    )


def test_pod_tolerations_and_node_selector_in_placement_notation() -> None:
    p = pod()
    p["spec"]["nodeSelector"] = {"zone": "a", "gpu": "a100"}
    p["spec"]["tolerations"] = [
        {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "ml"},
        {"key": "plain", "value": "v"},  # operator defaults to Equal
        {"key": "empty"},  # Equal with an empty value
        {"key": "soft", "operator": "Exists", "effect": "PreferNoSchedule"},  # no placement effect
        # Added by admission to every pod: temporary, the pod is evicted after it.
        {"key": TAINT_NOT_READY, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
        {"operator": "Equal", "value": "x"},  # malformed: an empty key needs Exists
    ]
    spec = job_spec(p)
    assert spec.selector == (("gpu", "a100"), ("zone", "a"))
    assert spec.tolerations == ("dedicated=ml", "empty=", "gpu:NoSchedule", "plain=v")
    assert JobSpec.from_json(spec.to_json()) == spec
    p["spec"]["tolerations"] = [{"operator": "Exists"}]
    assert job_spec(p).tolerations == ("*",)
    p["spec"]["tolerations"] = [{"operator": "Exists", "effect": "NoExecute"}]
    assert job_spec(p).tolerations == ("*:NoExecute",)
    del p["spec"]["tolerations"], p["spec"]["nodeSelector"]
    assert (job_spec(p).selector, job_spec(p).tolerations) == ((), ())
    assert "selector" not in job_spec(p).to_json(), "specs without constraints serialise as before"
