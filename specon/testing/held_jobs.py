"""Jobs whose end the test controls: the test job's ``--until-released FILE``
(tests/integration/jobs/curve_job.py) trains its steps, then on until FILE exists.

A test releases such a job only once the event it waits for has happened (the save returned,
the migration is done, the partition mended), so no loaded machine can end the job first; it
then reads how many steps the job trained in all from its ``finished`` record.
"""

from __future__ import annotations

from pathlib import Path

from specon.model import ContainerId
from specon.runtime.volume import JobPaths
from specon.testing.progress_log import job_records

#: The release file's name in the job's own folder on the shared volume, which every runtime
#: shows the job at the same path (a Docker container mounts just that folder; a pod sees the
#: volume at ``/data``).
RELEASE = "released"


def release_file(volume: Path, job: str) -> Path:
    """The release file of ``job`` on the shared volume ``volume``."""
    return JobPaths(volume, ContainerId(job)).dir / RELEASE


def release(gate: Path) -> None:
    """Let the job held by ``gate`` finish, at its first step boundary past its steps."""
    gate.parent.mkdir(parents=True, exist_ok=True)
    gate.touch()


def finished_steps(volume: Path, job: str) -> int:
    """How many steps ``job`` trained in all, from its (last) ``finished`` record: a held job
    trains as many as it had when released, if that is more than its steps."""
    done = [r for r in job_records(volume, job) if r.get("event") == "finished"]
    assert done, f"{job}: not finished"
    return int(done[-1]["steps"])
