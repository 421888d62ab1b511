"""The pod a ``start`` creates: a copy of the job's trusted original (``k8s_restore``), pinned
to the target node, checked before it is sent.

Checked, each refusal a ``StartFailed`` (or ``AlreadyFinished``) saying why. On the target's
volume, by its agent (``checked_checkpoint``; blocking: the checkpoint is hashed, call it off
the event loop): the checkpoint asked for is in the job's own directory and verifies, the job
has not finished. By whoever creates the pod (``restored_copy``, ``writes.PodWrites``): the
copy gains no privilege the original lacked, and a GPU job that keeps to a product
(``k8s_gpu``) lands on a node of that product. The copy keeps the original's resources (its
GPU limits included) and, for a GPU job, the product pin of the node the original ran on.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

from specon import checkpoint as ckpt
from specon import jobkit
from specon.model import ContainerId
from specon.progress.last import last_event
from specon.runtime.base import AlreadyFinished, AlreadyRunning, StartFailed
from specon.runtime.kubernetes import gpu, pods, restore
from specon.runtime.kubernetes.pods import Manifest, PodError, SharedVolume


def finished(progress: Path, checkpoints: Path) -> bool:
    """The job completed its work: jobkit's done marker, or a final ``finished`` record."""
    return jobkit.read_done(checkpoints) is not None or last_event(progress) == "finished"


def restorable(
    job: ContainerId, original: Mapping[str, Any] | None, existing: Sequence[Mapping[str, Any]]
) -> Mapping[str, Any]:
    """The original to restore ``job`` from (``PodCalls.lookup``'s answer), or why not: a pod
    of the job that has not terminated (``AlreadyRunning``), or nothing trusted to copy."""
    running = [o for o in existing if pods.alive(o)]
    if running:
        where = ", ".join(f"{'/'.join(pods.key_of(o))} on {pods.node_of(o) or 'no node'}" for o in running)
        raise AlreadyRunning(job, f"a pod of the job has not terminated: {where}")
    if original is None:
        namespace, _ = pods.split_job_id(job)
        raise StartFailed(
            job,
            f"no pod of the job and no restore record in namespace {namespace} "
            "(a save writes it): nothing trusted to restore from",
        )
    return original


def checked_checkpoint(
    original: Mapping[str, Any],
    *,
    job: ContainerId,
    volume: SharedVolume,
    volume_root: Path,
    checkpoint: Path | None,
) -> str | None:
    """What the node's agent checks on the volume before it asks for a copy of ``job``: the
    checkpoint is in the job's own directory (its files as ``original`` says) and verifies,
    and the job has not finished. The checkpoint's manifest file name (None: from scratch)."""
    files = _files(_probe(original, job), job, volume)
    ckpt_dir = volume_root / files.checkpoints
    name = None
    if checkpoint is not None:
        manifest = checkpoint.with_suffix(".json")
        if manifest.parent.resolve() != ckpt_dir.resolve():
            raise StartFailed(job, f"{checkpoint} is not in the job's checkpoint directory {ckpt_dir}")
        try:
            ckpt.verify(manifest)
        except ckpt.CheckpointError as exc:
            raise StartFailed(job, f"checkpoint does not verify: {exc}") from exc
        name = manifest.name
    if finished(volume_root / files.progress, ckpt_dir):
        raise AlreadyFinished(job, "already finished (done marker or final progress record)")
    return name


def _probe(original: Mapping[str, Any], job: ContainerId) -> Manifest:
    """A copy of ``original`` as a start would make it: where its files are."""
    try:
        return pods.restored_pod(
            pods.template_of(original), job=job, node="-", gen=1, restored_from=None, restore_checkpoint=None
        )
    except PodError as exc:
        raise StartFailed(job, str(exc)) from exc


def _files(probe: Mapping[str, Any], job: ContainerId, volume: SharedVolume) -> pods.JobFiles:
    try:
        return pods.job_files(probe, volume)
    except PodError as exc:
        raise StartFailed(job, str(exc)) from exc


def restored_copy(
    original: Mapping[str, Any],
    existing: Sequence[Mapping[str, Any]],
    *,
    job: ContainerId,
    node: str,
    volume: SharedVolume,
    checkpoint: str | None,
    source_labels: Mapping[str, str],
    node_labels: Mapping[str, str] | None,
) -> Manifest:
    """The pod to create for ``job`` on ``node``: ``original`` (pinned to the GPU product of
    ``source_labels``, the labels of the node it ran on, where it keeps to one), generation one
    above every pod of the job, restoring from ``checkpoint`` (a manifest's file name in the
    job's checkpoint directory: ``checked_checkpoint``). ``node_labels``: the target node's
    labels (None: not known, the kubelet checks the product alone)."""
    template = pods.template_of(gpu.pin_product(original, source_labels))
    restore_in_pod = None
    if checkpoint is not None:
        probe = _probe(template, job)
        files = _files(probe, job, volume)
        with contextlib.suppress(ValueError, PodError):
            restore_in_pod = pods.to_pod(probe, PurePosixPath(files.checkpoints, checkpoint), volume)
    gen = max([pods.generation(original), *(pods.generation(o) for o in existing)]) + 1
    try:
        body = pods.restored_pod(
            template,
            job=job,
            node=node,
            gen=gen,
            restored_from=str(pods.meta(original).get("name") or "") or None,
            restore_checkpoint=restore_in_pod,
        )
    except PodError as exc:
        raise StartFailed(job, str(exc)) from exc
    gains = restore.privilege_gains(original, body)
    if gains:
        raise StartFailed(
            job,
            f"refused: the copy would gain what pod {'/'.join(pods.key_of(original))} lacked: "
            + "; ".join(gains),
        )
    conflict = None if node_labels is None else gpu.product_conflict(body, node_labels)
    if conflict is not None:
        raise StartFailed(job, f"refused on node {node}: {conflict}")
    return body
