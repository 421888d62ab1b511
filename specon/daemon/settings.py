"""The daemons' operational settings: how long, how often, how much — never what to decide.

The policy file (``specon.config``) says what specon decides and when: alpha, the
interval, the weights, and the heartbeat interval and worker timeout the decisions rest
on. These settings tune the machinery around the decisions instead (long-poll waits, the
manager's ticker, the agent's retry backoff, HTTP timeouts, caches and page sizes), and
every default suits any cluster. Each is read from an environment variable named after it
(``SPECON_AGENT_POLL_WAIT=30``, ``SPECON_MANAGER_STATUS_TTL=2``): the daemons' manifests
set them like any other variable, and the policy file stays about policy.

``AgentSettings.from_env()`` / ``ManagerSettings.from_env()`` report every bad value at
once (``SettingsError``), each under its variable's name; constructing the classes
directly checks the same rules. docs/reference.md lists them all (``specon config reference``).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self, TypeVar

_T = TypeVar("_T", int, float)


class SettingsError(ValueError):
    """Settings that cannot be used; ``errors`` lists every problem as ``NAME: problem``."""

    def __init__(self, errors: Sequence[str]) -> None:
        self.errors = tuple(errors)
        count = f"{len(self.errors)} error{'s' if len(self.errors) != 1 else ''}"
        super().__init__(f"invalid settings: {count}\n" + "\n".join(f"  {e}" for e in self.errors))


def _setting(default: _T, doc: str, *, zero_ok: bool = False) -> _T:
    """A setting: its default and what it means (docs/reference.md prints it). It must
    be > 0, or >= 0 with ``zero_ok``; an integer setting is an integer."""
    return field(default=default, metadata={"doc": doc, "zero_ok": zero_ok})


def _problem(f: dataclasses.Field[Any], value: object) -> str | None:
    """What is wrong with ``value`` for the setting ``f`` (None: nothing)."""
    if isinstance(f.default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            return f"expected an integer, got {value!r}"
    elif isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return f"expected a finite number, got {value!r}"
    zero_ok = bool(f.metadata.get("zero_ok"))
    if value < 0 or (value == 0 and not zero_ok):
        return f"must be {'>= 0' if zero_ok else '> 0'}, got {value!r}"
    return None


def _parse(f: dataclasses.Field[Any], text: str) -> int | float:
    try:
        return int(text) if isinstance(f.default, int) else float(text)
    except ValueError:
        kind = "an integer" if isinstance(f.default, int) else "a number"
        raise ValueError(f"expected {kind}, got {text!r}") from None


def _number(value: object) -> int | float:
    assert isinstance(value, int | float)
    return value


class _Settings:
    """What both settings classes share: the checks and the environment."""

    __slots__ = ()
    PREFIX: ClassVar[str]

    def __post_init__(self) -> None:
        fields = dataclasses.fields(self)  # type: ignore[arg-type]
        errors = [f"{f.name}: {p}" for f in fields if (p := _problem(f, getattr(self, f.name))) is not None]
        if errors:
            raise SettingsError(errors)
        if errors := self._cross_problems():
            raise SettingsError(errors)

    def _cross_problems(self) -> list[str]:
        """Rules between settings (each settings' own rule holds)."""
        return []

    @classmethod
    def variable(cls, name: str) -> str:
        """The environment variable of the setting ``name``."""
        return cls.PREFIX + name.upper()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """The defaults, overridden by the prefixed variables (``environ``: os.environ)."""
        env = os.environ if environ is None else environ
        names = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        values: dict[str, Any] = {}
        errors: list[str] = []
        for name, f in names.items():
            var = cls.variable(name)
            if var not in env:
                continue
            try:
                values[name] = _parse(f, env[var].strip())
            except ValueError as exc:
                errors.append(f"{var}: {exc}")
                continue
            if (p := _problem(f, values[name])) is not None:
                errors.append(f"{var}: {p}")
        if errors:
            raise SettingsError(errors)
        try:
            return cls(**values)
        except SettingsError as exc:  # a rule between settings: name the variable
            renamed = []
            for e in exc.errors:
                head, sep, tail = e.partition(":")
                renamed.append((cls.variable(head) if head in names else head) + sep + tail)
            raise SettingsError(renamed) from None

    @classmethod
    def unknown_variables(cls, environ: Mapping[str, str] | None = None) -> list[str]:
        """Variables with this prefix that name no setting (most likely a typo), each with
        the nearest setting's variable if one is close. Kubernetes' service links
        (``SPECON_MANAGER_SERVICE_HOST``, ``SPECON_MANAGER_PORT_7700_TCP``, ...) are left out."""
        env = os.environ if environ is None else environ
        known = [f.name.upper() for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        found = []
        for var in sorted(env):
            rest = var[len(cls.PREFIX) :]
            if not var.startswith(cls.PREFIX) or rest in known or rest.startswith(("SERVICE_", "PORT")):
                continue
            near = difflib.get_close_matches(rest, known, n=1)
            found.append(f"{var} (did you mean {cls.PREFIX}{near[0]}?)" if near else var)
        return found

    @classmethod
    def documented(cls) -> list[tuple[str, str, int | float, str]]:
        """(name, variable, default, meaning) of every setting, in order."""
        return [
            (f.name, cls.variable(f.name), _number(f.default), str(f.metadata["doc"]))
            for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        ]


@dataclass(frozen=True, slots=True)
class AgentSettings(_Settings):
    """The agent's operational knobs (``specon-agent``), from ``SPECON_AGENT_<NAME>``."""

    PREFIX: ClassVar[str] = "SPECON_AGENT_"

    poll_wait: float = _setting(
        20.0,
        "Seconds a long poll waits at the manager for commands (the manager holds one at most "
        "`SPECON_MANAGER_MAX_POLL_WAIT`).",
    )
    poll_timeout_margin: float = _setting(10.0, "Seconds a poll's HTTP timeout allows beyond `poll_wait`.")
    request_timeout: float = _setting(10.0, "HTTP timeout of a heartbeat or a reallocation request, seconds.")
    shutdown_timeout: float = _setting(
        3.0, "HTTP timeout of the last heartbeat and of the goodbye when the agent stops, seconds."
    )
    backoff_initial: float = _setting(
        0.5,
        "First retry delay while the manager is unreachable or refuses, seconds. It doubles with each "
        "failure (each wait is drawn between half and all of it) and starts again after a success.",
    )
    backoff_max: float = _setting(
        30.0,
        "Cap of that retry delay, seconds (a heartbeat is retried at least every "
        "`messaging.heartbeat_interval`).",
    )
    crash_pause: float = _setting(
        1.0, "Seconds before a loop that crashed on a bug runs again.", zero_ok=True
    )
    first_record_timeout: float = _setting(
        120.0,
        "Seconds a started job has to write its first progress record (the end of a migration's "
        "downtime) before its start is reported finished anyway; a copy that ends before its first "
        "record without finishing fails its start.",
    )
    result_memory: int = _setting(
        1000, "Results of executed commands kept, so that a repeated command is answered, not run again."
    )
    state_retention: float = _setting(
        3600.0,
        "Seconds the classifier state of a container gone from this worker is kept (it comes back "
        "with a rollback or a restart of the agent); then it is forgotten, so the state file stays "
        "bounded. The default outlasts a migration's deadlines (save 120 s, restore 300 s) many times.",
    )

    def _cross_problems(self) -> list[str]:
        if self.backoff_max < self.backoff_initial:
            return [
                f"backoff_max: must be >= backoff_initial ({self.backoff_initial}), got {self.backoff_max}"
            ]
        return []


@dataclass(frozen=True, slots=True)
class ManagerSettings(_Settings):
    """The manager's operational knobs (``specon-manager``), from ``SPECON_MANAGER_<NAME>``."""

    PREFIX: ClassVar[str] = "SPECON_MANAGER_"

    ticker_period: float = _setting(
        1.0,
        "Seconds between the ticker's passes, which drive timeouts, retries and rebalancing when no "
        "message arrives.",
    )
    max_poll_wait: float = _setting(
        60.0, "Longest an agent's long poll is held, seconds (a longer `wait` is cut to this).", zero_ok=True
    )
    status_ttl: float = _setting(
        1.0, "Seconds a built status page is shared by all readers while nothing changed.", zero_ok=True
    )
    status_cache_size: int = _setting(256, "Built status pages kept for those readers.")
    status_page_limit: int = _setting(1000, "Entries in a status page when the reader gives no `?limit=`.")
    status_page_max: int = _setting(10_000, "Largest `?limit=` a status reader may ask for.")
    shutdown_timeout: float = _setting(5.0, "Seconds open requests get to finish when the manager stops.")
    tls_reload_interval: float = _setting(
        10.0,
        "Seconds between checks of `--tls-cert`/`--tls-key` for changed files (a renewed certificate "
        "serves new connections once loaded; a pair that does not load is logged and skipped).",
    )
    journal_retention: float = _setting(
        604_800.0,
        "Seconds an ended migration stays in the journal (7 days); older ones are deleted, checked "
        "hourly, except the newest 1,000 (the status's recent migrations). In-flight ones and "
        "jobs' marks always stay.",
    )
    session_ttl: float = _setting(
        43_200.0,
        "Seconds a browser's login to the status page lasts (its session cookie's lifetime; a "
        "restarted manager forgets every session). Only with a read token configured.",
    )

    def _cross_problems(self) -> list[str]:
        if self.status_page_limit > self.status_page_max:
            return [
                f"status_page_limit: must be <= status_page_max ({self.status_page_max}), "
                f"got {self.status_page_limit}"
            ]
        return []
