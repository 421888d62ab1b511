"""The agent's commands: save, start, mark-migrated and stop a job as the manager asks,
each once per command id, its result kept until a heartbeat's ``ack`` says it arrived.
A part of ``specon_agent.core.Agent``.

A start runs the job as this runtime recorded it at submission, never a recipe from the
wire; a start refused because a copy runs elsewhere says so (``running_elsewhere``), so
the manager does not count it as a restart.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, assert_never

import structlog

from specon.config import Policy
from specon.daemon.settings import AgentSettings
from specon.model import ContainerId, WorkerId
from specon.policy.classifier import Classifier
from specon.policy.monitor import MonitorState
from specon.progress.last import last_record
from specon.runtime.base import (
    AlreadyFinished,
    AlreadyRunning,
    ContainerInfo,
    JobSpec,
    Runtime,
    RuntimeFailure,
    Supersede,
    supersede_of,
)
from specon.wire.protocol import Action, Command, CommandBatch, CommandResult
from specon_agent.gpu_share import GpuShare
from specon_agent.resumed import FirstRecord, first_record_after, log_size, start_or_fall_back
from specon_agent.watched import AgentCounters, Watched

log = structlog.get_logger()


class Executing:
    """Run the manager's commands (a mixin of ``Agent``)."""

    runtime: Runtime
    policy: Policy
    settings: AgentSettings
    counters: AgentCounters
    watched: dict[ContainerId, Watched]
    leaving: set[ContainerId]
    saved_states: dict[ContainerId, MonitorState]
    changed: set[ContainerId]
    gpu_share: GpuShare
    done: dict[str, CommandResult]
    running: dict[str, asyncio.Task[CommandResult]]
    unacked: dict[str, tuple[int | None, CommandResult]]
    classifier: Classifier

    if TYPE_CHECKING:  # the agent's, used here

        @property
        def worker(self) -> WorkerId: ...

        def _watch(self, info: ContainerInfo) -> None: ...
        def _save_states(self) -> None: ...
        def acknowledge(self, batch: CommandBatch) -> None: ...

    def accept(self, batch: CommandBatch) -> list[asyncio.Task[CommandResult]]:
        """Start every new command in ``batch``; repeats of known commands are ignored."""
        self.acknowledge(batch)
        started = []
        for cmd in batch.commands:
            if cmd.id in self.running:
                continue
            if cmd.id in self.done:
                # Executed before and the manager still asks: its result got lost. Resend.
                self.unacked.setdefault(cmd.id, (None, self.done[cmd.id]))
                continue
            task = asyncio.create_task(self._run(cmd, batch.remaining(cmd)), name=f"specon-cmd-{cmd.id}")
            self.running[cmd.id] = task
            started.append(task)
        return started

    async def _run(self, cmd: Command, remaining: float) -> CommandResult:
        action = cmd.action.value if isinstance(cmd.action, Action) else "unknown"
        self.counters.commands[action] = self.counters.commands.get(action, 0) + 1
        log.info("specon.agent.command_started", command=cmd.id, action=action, container=cmd.container)
        try:
            res = await self.execute(cmd, remaining)
        except Exception as exc:  # a bug or an unexpected backend error: report, never die
            log.exception("specon.agent.command_crashed", command=cmd.id)
            res = CommandResult(command=cmd.id, ok=False, error=f"{type(exc).__name__}: {exc}")
        if not res.ok:
            self.counters.command_failures += 1
        log.info("specon.agent.command_finished", command=cmd.id, ok=res.ok, error=res.error)
        self.done[cmd.id] = res
        while len(self.done) > self.settings.result_memory:
            self.done.pop(next(iter(self.done)))
        self.unacked[cmd.id] = (None, res)
        self.running.pop(cmd.id, None)
        return res

    async def execute(self, cmd: Command, remaining: float) -> CommandResult:
        known = isinstance(cmd.action, Action)
        if not known:
            # Decode refuses an unknown action; one that got here anyway (a newer manager's,
            # a bug) is an error, never a stop: nothing is done to the container.
            error = f"{cmd.container}: unknown action {cmd.action!r}; nothing done"
            return CommandResult(command=cmd.id, ok=False, error=error)
        if cmd.action is Action.SAVE:
            return await self._save(cmd, remaining)
        if cmd.action is Action.START:
            return await self._start(cmd)
        if cmd.action is Action.MARK_MIGRATED:
            return self._mark(cmd)
        if cmd.action is Action.STOP:
            return await self._stop(cmd)
        assert_never(cmd.action)  # every action is handled above (mypy checks it)

    async def _save(self, cmd: Command, remaining: float) -> CommandResult:
        grace = max(1.0, min(self.policy.migration.grace_period, remaining))
        w = self.watched.get(cmd.container)
        # Its log, also when it is not watched yet (just started here): the save's lost steps.
        progress = w.info.progress_path if w is not None else await self._progress_path(cmd.container)
        self.leaving.add(cmd.container)
        began = self.runtime.now()  # the job stops training at the SIGTERM: downtime starts here
        try:
            await self.gpu_share.before_save(cmd.container)  # thawed, and left alone from now on
            res = await self.runtime.save(cmd.container, grace=grace)
        except RuntimeFailure as exc:
            # Not saved: the job keeps running here (or was never here) and is watched again.
            self.leaving.discard(cmd.container)
            return CommandResult(command=cmd.id, ok=False, error=str(exc))
        now = self.runtime.now()
        # The step it had trained to: with the checkpoint's, what a save cut short lost.
        last = None if progress is None else await asyncio.to_thread(last_record, progress)
        if w is not None:
            self.saved_states[cmd.container] = w.state
            w.tailer.close()
        self.watched.pop(cmd.container, None)
        self._save_states()
        return CommandResult(
            command=cmd.id,
            ok=True,
            checkpoint=str(res.checkpoint) if res.checkpoint else None,
            checkpoint_step=res.step,
            finished_at=now,
            detail={
                "began_at": began,
                "seconds": round(res.seconds, 3),
                "forced": res.forced,
                "rolled_back": res.rolled_back,
                "finished": res.finished,
                # No record yet: it had trained no step (None: its log is not known here).
                "last_step": (0 if progress else None) if last is None else last.get("step"),
            },
        )

    async def _progress_path(self, container: ContainerId) -> Path | None:
        try:
            listed = await self.runtime.list_containers()
        except RuntimeFailure:
            return None
        return next((c.progress_path for c in listed if c.id == container), None)

    async def _start(self, cmd: Command) -> CommandResult:
        # What runs is the job as submitted, from this runtime's own record (the spec on
        # the volume, the original pod in the API server), never a recipe that came over
        # the wire: a forged save result must not choose what this host executes.
        if cmd.spec:
            log.warning("specon.agent.command_spec_ignored", command=cmd.id, container=cmd.container)
        # Off the loop: on Kubernetes the record is read from the API server.
        spec = await asyncio.to_thread(self.runtime.job_spec, cmd.container)
        if spec is None:
            return CommandResult(command=cmd.id, ok=False, error=f"{cmd.container}: no job spec on record")
        if spec.id != cmd.container:
            return CommandResult(
                command=cmd.id, ok=False, error=f"{cmd.container}: the recorded spec is for job {spec.id}"
            )
        checkpoint = Path(cmd.checkpoint) if cmd.checkpoint else None
        self.leaving.discard(cmd.container)
        if cmd.migrated:
            base = self.saved_states.get(cmd.container) or self.classifier.initial()
            self.saved_states[cmd.container] = self.classifier.mark_migrated(base, self.runtime.now())
        starting = self.runtime.now()
        try:
            supersede = supersede_of(cmd.supersede, cmd.lost)
            info = await self._start_from(spec, checkpoint, supersede=supersede)
        except AlreadyRunning as exc:
            here = {i.id for i in await self.runtime.list_containers() if i.alive}
            if cmd.container in here:  # a repeated start: it is running here, as asked
                w = self.watched.get(cmd.container)
                if cmd.migrated and w is not None and not w.state.migrated:
                    w.state = self.classifier.mark_migrated(w.state, self.runtime.now())
                    self.changed.add(cmd.container)
                    self._save_states()
                return CommandResult(command=cmd.id, ok=True, finished_at=self.runtime.now())
            # Not a restart: a copy runs elsewhere (the manager may not hear from it yet).
            return CommandResult(command=cmd.id, ok=False, error=str(exc), detail={"running_elsewhere": True})
        except AlreadyFinished as exc:
            # Not an error to retry: the manager ends the migration (nothing left to run).
            return CommandResult(command=cmd.id, ok=False, error=str(exc), detail={"finished": True})
        except RuntimeFailure as exc:
            return CommandResult(command=cmd.id, ok=False, error=str(exc))
        offset = log_size(info.progress_path)  # what earlier runs (other hosts, other clocks) wrote
        self._watch(info)
        self._save_states()
        first = await first_record_after(
            self.runtime, info, starting, offset, self.settings.first_record_timeout
        )
        if first.never_ran:
            return await self._died_at_start(cmd, first)
        return CommandResult(command=cmd.id, ok=True, finished_at=first.at)

    async def _died_at_start(self, cmd: Command, first: FirstRecord) -> CommandResult:
        """The copy ended before its first record (a crash on restore, an OOM, a kubelet that
        refused it): no copy runs here, so the start failed, and the manager restarts the job
        elsewhere. The dead run is unlisted before the result goes out (no heartbeat may show
        it running) and forgotten, so that its record blocks no start on another host."""
        code = None if first.ended is None else first.ended.exit_code
        gone = self.watched.pop(cmd.container, None)
        if gone is not None:
            gone.tailer.close()
        try:
            await self.runtime.forget(cmd.container)
        except RuntimeFailure as exc:
            log.warning("specon.agent.forget_failed", container=cmd.container, error=str(exc))
        log.warning("specon.agent.start_died", command=cmd.id, container=cmd.container, exit_code=code)
        error = f"{cmd.container}: the started copy ended before its first progress record (exit code {code})"
        return CommandResult(command=cmd.id, ok=False, error=error, detail={"died": True})

    async def _start_from(self, spec: JobSpec, ckpt: Path | None, *, supersede: Supersede) -> ContainerInfo:
        spec = self.gpu_share.start_spec(spec)  # its MPS percentage, under mps and both
        return await start_or_fall_back(self.runtime, spec, ckpt, supersede=supersede)

    def _mark(self, cmd: Command) -> CommandResult:
        w = self.watched.get(cmd.container)
        if w is None:
            return CommandResult(command=cmd.id, ok=False, error=f"{cmd.container}: not on {self.worker}")
        w.state = self.classifier.mark_migrated(w.state, self.runtime.now())
        self.changed.add(cmd.container)
        self._save_states()
        return CommandResult(command=cmd.id, ok=True, finished_at=self.runtime.now())

    async def _stop(self, cmd: Command) -> CommandResult:
        try:
            await self.runtime.stop(cmd.container, grace=self.policy.migration.grace_period)
        except RuntimeFailure as exc:
            return CommandResult(command=cmd.id, ok=False, error=str(exc))
        return CommandResult(command=cmd.id, ok=True, finished_at=self.runtime.now())
