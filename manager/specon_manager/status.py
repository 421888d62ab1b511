"""``GET /v1/status`` in pages: workers, then containers, then migrations, by id.

A page holds at most ``limit`` entries of that one stream (a worker counts once plus
once per container it lists); ``Status.next`` is the cursor
of the next page (None on the last). Cursors are ``w:<id>``, ``c:<id>`` or ``m:<n>`` (a
position among the migrations listed: the newest finished ones, then those in flight).
Ids are bisected in orders the cluster state caches, so a page costs its own size, not
the cluster's: 20 clients reading a 100k-container cluster leave ``/healthz`` fast.

Each container listed also gets its progress: its declared total steps (its
``STEPS_LABEL`` job label) and the seconds it has left at its loss window's step rate.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, replace

from specon.coordinator.machine import Coordinator
from specon.daemon.settings import ManagerSettings
from specon.model import ContainerId, WorkerId
from specon.wire.operator import DrainReply
from specon.wire.protocol import STEPS_LABEL
from specon.wire.status import ContainerStatus, MigrationStatus, Phase, Status
from specon.wire.validate import MAX_SECONDS

_DEFAULTS = ManagerSettings()
# The page sizes' defaults (the manager's settings ``status_page_limit``, ``status_page_max``).
DEFAULT_LIMIT = _DEFAULTS.status_page_limit
MAX_LIMIT = _DEFAULTS.status_page_max


class BadPageError(ValueError):
    """A ``limit`` or ``after`` that cannot be used."""


@dataclass(frozen=True, slots=True)
class Page:
    limit: int = DEFAULT_LIMIT
    section: str = "w"  # where the page starts: w(orkers), c(ontainers), m(igrations)
    after: str | None = None  # an id (w, c) or a position (m); None: from the section's start

    @classmethod
    def parse(cls, limit: str | None, after: str | None, settings: ManagerSettings = _DEFAULTS) -> Page:
        """A page from the query's ``limit`` and ``after`` (``settings``: the page sizes)."""
        default, maximum = settings.status_page_limit, settings.status_page_max
        if limit is not None and not (limit.isascii() and limit.isdigit() and len(limit) <= 6):
            raise BadPageError(f"limit: expected an integer, got {ascii(limit)[:24]}")
        n = default if limit is None else int(limit)
        if not 1 <= n <= maximum:
            raise BadPageError(f"limit: must be within [1, {maximum}], got {n}")
        if not after:
            return cls(n)
        section, sep, key = after.partition(":")
        if not sep or section not in ("w", "c", "m") or len(after) > 300:
            raise BadPageError("after: expected a cursor from Status.next (w:<id>, c:<id> or m:<n>)")
        if section == "m" and not (key.isascii() and key.isdigit()):  # not "²" or "٣"
            raise BadPageError("after: a migrations cursor is m:<n>")
        return cls(n, section, key)


def build_status(coord: Coordinator, now: float, page: Page | None = None) -> Status:
    page = page or Page()
    state = coord.state
    timeout = coord.policy.messaging.worker_timeout
    left = page.limit
    next_cursor: str | None = None

    workers: list[WorkerId] = []
    if page.section == "w":
        order = state.worker_order()
        i = 0 if page.after is None else bisect_right(order, page.after)
        # A worker costs one entry plus one per container it lists: a page stays a page
        # even when every worker runs a thousand containers (at least one worker a page).
        for wid in order[i:]:
            cost = 1 + len(state.workers[wid].reported)
            if workers and cost > left:
                break
            workers.append(wid)
            left = max(0, left - cost)
        if i + len(workers) < len(order):
            next_cursor = f"w:{workers[-1]}"
    containers: list[ContainerId] = []
    if next_cursor is None and page.section in ("w", "c"):
        order_c = state.container_order()
        after = page.after if page.section == "c" else None
        i = 0 if not after else bisect_right(order_c, after)
        containers = order_c[i : i + left]
        left -= len(containers)
        if i + len(containers) < len(order_c):
            # Out of room: the next page goes on after the last listed (or from the start).
            next_cursor = f"c:{containers[-1] if containers else after or ''}"
    migrations: list[MigrationStatus] = []
    if next_cursor is None:
        listed = [*coord.recent, *sorted(coord.migrations.values(), key=lambda m: m.decided_at)]
        i = int(page.after) if page.section == "m" and page.after else 0
        chunk = listed[i : i + left]
        migrations = [MigrationStatus.of(m) for m in chunk]
        if i + len(chunk) < len(listed):
            next_cursor = f"m:{i + len(chunk)}"
    return Status(
        now=now,
        mode=coord.policy.mode,
        policy_generation=coord.generation,
        dry_run=coord.policy.migration.dry_run,
        workers=state.worker_status(now, timeout, workers),
        containers=tuple(map(with_progress, state.container_status(coord.marks, containers))),
        migrations=tuple(migrations),
        next=next_cursor,
        total_workers=len(state.workers),
        total_containers=len(state.containers),
        total_migrations=len(coord.recent) + len(coord.migrations),
    )


def declared_steps(job: Mapping[str, str]) -> int | None:
    """The total steps a job declared (its ``STEPS_LABEL`` label), if a positive integer."""
    text = job.get(STEPS_LABEL)
    if text is None or not (text.isascii() and text.isdigit()) or len(text) > 15:
        return None
    return int(text) or None


def time_left(phase: Phase, step: int | None, total: int | None, rate: float | None) -> float | None:
    """Seconds a job has left: its steps still to go at ``rate`` steps a second; 0 once
    finished; None when unknown (no total, no step, no rate, not running, or beyond any clock)."""
    if phase == "finished":
        return 0.0
    if phase != "running" or total is None or step is None or rate is None or rate <= 0:
        return None
    left = max(0, total - step) / rate
    return round(left, 1) if left <= MAX_SECONDS else None


def with_progress(c: ContainerStatus) -> ContainerStatus:
    """``c`` with its declared total steps and the time it has left."""
    total = declared_steps(c.job)
    rate = None if c.window is None else c.window.steps_per_second
    eta = time_left(c.phase, c.step, total, rate)
    return c if total is None and eta is None else replace(c, total_steps=total, eta=eta)


def drain_reply(coord: Coordinator, worker: WorkerId) -> DrainReply:
    """``worker``'s drain: cordoned or not, its jobs, and the moves that took its jobs off since
    it was cordoned (the last drain's, once uncordoned: none)."""
    cordon = coord.cordons.get(worker)
    since = cordon.since if cordon is not None else float("inf")
    ours = (m for m in (*coord.migrations.values(), *coord.recent) if m.source == worker)
    moves = sorted(
        (m for m in ours if m.reason == "evacuated" and m.decided_at >= since),
        key=lambda m: (m.decided_at, m.id),
    )
    return DrainReply(
        worker=worker,
        cordoned=cordon is not None,
        deadline=None if cordon is None else cordon.deadline,
        jobs=tuple(coord.jobs_on(worker)),
        moves=tuple(MigrationStatus.of(m) for m in moves),
    )
