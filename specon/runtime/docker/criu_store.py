"""The CRIU images of jobs on the volume, between a save and the next start (``criu``).

``CriuStore`` keeps one image per job in the agents' own area of the volume, never in a
job's directory (a job must not be able to forge the image it is restored from): a CRIU save
dumps the container there (``dump``); the next start of the job, on any engine, restores
the newest image into its new container and removes it whatever happens (``restore``), so an
image is used at most once. The engine calls themselves are in ``criu``.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import docker.errors
import structlog
from docker.models.containers import Container

from specon.config import MigrationMode
from specon.model import ContainerId
from specon.runtime.base import RuntimeFailure
from specon.runtime.docker import criu as docker_criu

log = structlog.get_logger()


class CriuStore:
    """The images under ``area`` (one directory per job), dumped and restored on one engine."""

    def __init__(
        self, area: Path, api: docker_criu.CheckpointApi, engine_info: Mapping[str, Any], data_root: Path
    ) -> None:
        self.area = area
        self._api = api
        self._engine_info = engine_info
        self._data_root = data_root

    def dir(self, job: ContainerId) -> Path:
        return self.area / job

    def refusal(self, c: Container, mode: MigrationMode) -> str | None:
        """Why a save of ``c`` (in migration mode ``mode``) cannot be a CRIU dump (None: it will be)."""
        if mode != "criu":
            return "migration mode is checkpoint"
        return docker_criu.criu_refusal(c.attrs, self._engine_info)

    def dump(self, job: ContainerId, run_id: str, c: Container) -> None:
        """Checkpoint the container's processes into the job's directory here and stop it;
        the image is named after the run it captures."""
        target = self.dir(job)
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        docker_criu.checkpoint(self._api, str(c.id), run_id, target)

    def has_image(self, job: ContainerId) -> bool:
        """An image of the job's last run is on record here (its next start restores it)."""
        store = self.dir(job)
        return store.is_dir() and any(d.is_dir() for d in store.iterdir())

    def restore(self, job: ContainerId, c: Container) -> bool:
        """Restore the job's image into ``c`` (created, not started) if one is on record; the
        image is used once, whatever happens. False: start normally (the job contract)."""
        store = self.dir(job)
        names = sorted(d.name for d in store.iterdir() if d.is_dir()) if store.is_dir() else []
        if not names:
            return False
        try:
            if self._engine_info.get("ExperimentalBuild") is not True:
                why = "engine not --experimental"
                log.warning("specon.docker.criu_restore_refused", container=job, reason=why)
                return False
            docker_criu.restore(self._api, str(c.id), names[-1], store, self._data_root)
            return True
        except RuntimeFailure as exc:
            log.warning("specon.docker.criu_restore_failed", container=job, error=str(exc))
            with contextlib.suppress(docker.errors.APIError):
                c.reload()  # a restore that failed half-way may have changed its state
            return False
        finally:
            shutil.rmtree(store, ignore_errors=True)
