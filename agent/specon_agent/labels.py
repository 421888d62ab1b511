"""The labels an agent reports with each job (``ContainerReport.job``): its spec's labels, with
its model and declared steps where the spec has them. The manager keys a job's model by these,
and so does the agent's own priority (``specon_agent.priority``): one definition for both."""

from __future__ import annotations

from specon.runtime.base import JobSpec
from specon.wire.protocol import STEPS_LABEL


def job_labels(spec: JobSpec) -> dict[str, str]:
    """Its job labels, with its model and declared steps where the spec has them."""
    out = {k: v for k, v in spec.labels}
    if spec.model:
        out.setdefault("model", spec.model)
    if spec.steps is not None:
        out.setdefault(STEPS_LABEL, str(spec.steps))
    return out
