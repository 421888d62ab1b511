"""Oracle detection: the classifier's verdict replaced by the trace's true convergence point.

``specon-oracle`` (``specon.policy.experiments``) measures what perfect detection is worth:
the same policy as ``specon``, but each simulated agent calls a job converged at the first
tick at which it has trained past its trace's ground truth (``specon.sim.detection``: the
smoothed best loss within 5 % of its final improvement), never before, and never takes it
back. Only the simulator knows that point, so only the simulator runs this.

The classifier still ticks every job (its E and G stay as the agent would report them, for
the rules that weigh the gain); the oracle then decides the category, the time of
convergence and whether the job wants a move, and the worker's request rule
(``monitor.apply_request_rule``) raises requests as it does for the real classifier.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from specon.model import Category, ContainerId
from specon.policy.classifier import Classifier, WorkerTickResult
from specon.policy.monitor import MonitorState, apply_request_rule


def verdict(before: MonitorState, ticked: MonitorState, converged: bool, now: float) -> MonitorState:
    """``ticked`` (the classifier's state after this tick) with the oracle's verdict: CC and
    wanting a move from the first tick past the truth (``t_cc`` that tick), PC before it. A
    moved job stays as the classifier froze it; a pending request stays pending."""
    if ticked.migrated:
        return ticked
    if not converged:
        return replace(ticked, category=Category.PROGRESSING, wants_request=False, pending_request=False)
    was_cc = before.category is Category.CONVERGED and before.t_cc is not None
    return replace(
        ticked,
        category=Category.CONVERGED,
        t_cc=before.t_cc if was_cc else now,
        wants_request=True,
        pending_request=before.pending_request,
    )


def detect_worker(
    classifier: Classifier,
    states: Mapping[ContainerId, MonitorState],
    samples: Mapping[ContainerId, Sequence[float]],
    now: float,
    converged: Mapping[ContainerId, bool],
) -> WorkerTickResult:
    """One oracle tick for a worker's jobs (``converged``: each job is past its truth)."""
    ticked = {
        cid: verdict(s, classifier.tick(s, samples.get(cid, ()), now), converged[cid], now)
        for cid, s in states.items()
    }
    new_states, requests = apply_request_rule(ticked, classifier.cfg)
    return WorkerTickResult(new_states, requests)
