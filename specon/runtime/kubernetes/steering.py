"""Steering a restored copy to the node the manager chose, through kube-scheduler.

A copy is not bound with ``spec.nodeName`` (that skips every check the scheduler makes: node
affinity, taints, topology spread, priority and preemption, the node's free resources
counting every pod). It carries a *required* node affinity naming its target, ANDed into
every term the pod already requires, so the scheduler places it there or nowhere; a copy
that stays unplaced is withdrawn and the move rolls back (``placement``).

The term specon adds is recorded in the pod's ``specon.io/steered-to`` annotation, so the
next copy made from this one replaces it instead of requiring two nodes at once; a term the
user wrote is kept as it is.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

ANN_STEERED = "specon.io/steered-to"
# On a controller's replacement pod the admission webhook steered for a move (the move's id):
# its agent does not list it until a start of the move adopts it (``ANN_ADOPTED``), so the
# manager does not see the job run on the target while the source still saves it.
ANN_MOVE = "specon.io/move"
ANN_ADOPTED = "specon.io/adopted"
# The nodes the admission webhook added as a new pod's preferred affinities (not twice).
ANN_PREFERRED = "specon.io/preferred"
# Past the longest a move's save and start may take (``migration.save_timeout`` +
# ``restore_timeout``: 420 s by default), a replacement no start adopted is listed anyway.
ADOPTION_HOLD_S = 600.0
# How long a copy may stay unplaced before it is withdrawn (``placement``; the agent's
# ``--placement-deadline``): well inside ``migration.restore_timeout`` (300 s).
PLACEMENT_DEADLINE_S = 60.0
FIELD = "metadata.name"  # the node's name, as a node selector's matchFields names it


def _term_for(node: str) -> dict[str, Any]:
    return {"key": FIELD, "operator": "In", "values": [node]}


def _required(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    return ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return (pod.get("metadata") or {}).get("annotations") or {}


def steer(pod: dict[str, Any], node: str) -> None:
    """Make ``pod`` (a copy being built, changed in place) schedulable only onto ``node``:
    no ``nodeName``, specon's earlier steering term (if any) removed, and ``metadata.name In
    [node]`` added to every required node selector term (one term holding only it if there
    were none)."""
    spec = pod.setdefault("spec", {})
    spec.pop("nodeName", None)
    meta = pod.setdefault("metadata", {})
    annotations = meta.setdefault("annotations", {})
    earlier = annotations.get(ANN_STEERED)
    affinity = spec.setdefault("affinity", {})
    node_affinity = affinity.setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = [copy.deepcopy(t) for t in required.get("nodeSelectorTerms") or [] if isinstance(t, dict)]
    kept: list[dict[str, Any]] = []
    for term in terms:
        fields = [f for f in term.get("matchFields") or [] if not (earlier and f == _term_for(earlier))]
        if fields:
            term["matchFields"] = fields
        else:
            term.pop("matchFields", None)
        if term:  # a term that held only specon's earlier steering goes with it
            kept.append(term)
    if not kept:
        kept = [{}]
    for term in kept:
        term["matchFields"] = [*(term.get("matchFields") or []), _term_for(node)]
    required["nodeSelectorTerms"] = kept
    annotations[ANN_STEERED] = node


def steered_to(pod: Mapping[str, Any]) -> str | None:
    """The node ``pod`` runs on or is steered to: its ``nodeName`` once bound, else the node
    specon's steering term names (None: neither)."""
    spec = pod.get("spec") or {}
    if node := spec.get("nodeName"):
        return str(node)
    node = _annotations(pod).get(ANN_STEERED)
    if not node:
        return None
    terms = _required(spec).get("nodeSelectorTerms") or []
    steering = _term_for(str(node))
    if terms and all(steering in (t.get("matchFields") or []) for t in terms if isinstance(t, dict)):
        return str(node)
    return None


def unschedulable(pod: Mapping[str, Any]) -> str | None:
    """Why the scheduler could not place ``pod`` (its ``PodScheduled`` condition's message),
    or None while it has not said so."""
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if (
            isinstance(cond, dict)
            and cond.get("type") == "PodScheduled"
            and cond.get("status") == "False"
            and cond.get("reason") == "Unschedulable"
        ):
            return str(cond.get("message") or "unschedulable")
    return None


def awaiting_adoption(pod: Mapping[str, Any], now: float, created: float) -> bool:
    """Whether ``pod`` (created at epoch ``created``) is a replacement steered for a move that
    no start has adopted yet, and young enough to wait for one."""
    annotations = _annotations(pod)
    return ANN_MOVE in annotations and ANN_ADOPTED not in annotations and now - created < ADOPTION_HOLD_S
