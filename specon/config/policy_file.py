"""Loading, validating and writing the policy file (``apiVersion: specon/v1alpha1``).

Loading is: parse YAML (1.2 scalars) -> lay the file over the mode's defaults -> check
every field against its type hint (``specon.wire.codec``) and the rules no type can express
(``_semantic_problems``) -> a frozen ``Policy``, or one ``PolicyError`` that lists every
problem as ``path: problem`` in file order. The sections themselves are in
``specon.config.sections``.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specon.config.sections import (
    API_VERSION,
    DOCS,
    KIND,
    PAPER_OVERRIDES,
    PLUGGABLE,
    Mode,
    Policy,
)
from specon.config.yaml12 import YamlError, load_yaml, scalar_yaml
from specon.wire import codec

# --- loading and validation --------------------------------------------------------------

MODES: tuple[Mode, ...] = typing.get_args(Mode)


class PolicyError(ValueError):
    """A policy file that cannot be used; ``errors`` lists every problem as ``path: problem``."""

    def __init__(self, errors: Sequence[str], *, source: str = "<policy>") -> None:
        self.errors = tuple(errors)
        self.source = source
        count = f"{len(self.errors)} error{'s' if len(self.errors) != 1 else ''}"
        super().__init__(f"{source}: {count}\n" + "\n".join(f"  {e}" for e in self.errors))


def metric_pattern(regex: str, metric: str) -> re.Pattern[str]:
    """The free-text pattern for ``metric``: ``{metric}`` becomes the escaped metric name.

    (Plain substitution, not ``str.format``: the pattern has its own braces.)
    Raises ``re.error`` if it does not compile.
    """
    return re.compile(regex.replace("{metric}", re.escape(metric)))


def default_policy(mode: Mode = "default") -> Policy:
    """The complete policy for ``mode`` when the file sets nothing else."""
    try:
        return _DEFAULTS[mode]
    except KeyError:
        raise ValueError(f"unknown mode {mode!r} (known: {', '.join(MODES)})") from None


def _mode_defaults(mode: Mode) -> Policy:
    data: dict[str, object] = {"mode": mode, **(PAPER_OVERRIDES if mode == "paper" else {})}
    return codec.from_data(Policy, _merge(codec.to_data(Policy()), data))


def policy_to_dict(policy: Policy) -> dict[str, Any]:
    """The policy as plain data, in the file's shape; ``policy_from_dict`` reads it back."""
    out: dict[str, Any] = codec.to_data(policy)
    return out


def policy_from_dict(data: object, *, source: str = "<dict>") -> Policy:
    """Validate ``data`` (a parsed policy file) and fill in defaults.

    ``mode: paper`` starts from ``PAPER_OVERRIDES``; the file's values win over them.
    Raises ``PolicyError`` listing every problem found, never anything else.
    """
    if not isinstance(data, dict):
        raise PolicyError([f"(top level): expected a mapping, got {codec.describe(data)}"], source=source)
    problems = [
        codec.Problem((key,), f"missing; expected {expected!r}")
        for key, expected in (("apiVersion", API_VERSION), ("kind", KIND))
        if key not in data
    ]
    mode = data.get("mode", "default")
    base = default_policy(mode if isinstance(mode, str) and mode in MODES else "default")
    policy: Policy | None
    try:
        policy = codec.from_data(Policy, _merge(policy_to_dict(base), data))
    except codec.SchemaError as e:
        problems += e.problems
        policy = e.partial  # bad values replaced by defaults, so the checks below still run
    if policy is not None:
        problems += _semantic_problems(policy)
    if problems or policy is None:
        problems.sort(key=lambda p: _schema_rank(Policy, p.path))  # in the order of the file
        raise PolicyError([str(p) for p in problems], source=source)
    return policy


def parse_policy(text: str, *, source: str = "<string>") -> Policy:
    """Parse a policy from YAML text (YAML 1.2 scalars: ``off`` is a string, ``1e-9`` a number)."""
    try:
        data = load_yaml(text)
    except YamlError as e:
        raise PolicyError([str(e)], source=source) from None
    if data is None:
        raise PolicyError(
            [f"empty policy; it needs at least 'apiVersion: {API_VERSION}' and 'kind: {KIND}'"],
            source=source,
        )
    return policy_from_dict(data, source=source)


def load_policy(path: str | Path) -> Policy:
    """Read, validate and default the policy file at ``path``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise PolicyError([f"cannot read: {e.strerror or e}"], source=str(path)) from None
    except UnicodeDecodeError as e:
        raise PolicyError([f"not UTF-8 text: {e.reason} at byte {e.start}"], source=str(path)) from None
    return parse_policy(text, source=str(path))


def _merge(base: dict[str, Any], override: dict[Any, Any]) -> dict[Any, Any]:
    """``override`` laid over ``base``, recursively for mappings present in both."""
    out: dict[Any, Any] = dict(base)
    for key, value in override.items():
        below = out.get(key)
        out[key] = _merge(below, value) if isinstance(below, dict) and isinstance(value, dict) else value
    return out


def _schema_rank(cls: type[Any] | None, path: tuple[codec.PathPart, ...]) -> tuple[int, ...]:
    """Sort key placing ``path`` where its field is declared (unknown keys last)."""
    if not path:
        return ()
    fields = dataclasses.fields(cls) if cls is not None else ()
    keys = [codec.wire_key(f) for f in fields]
    if path[0] not in keys:
        return (len(keys),)
    i = keys.index(str(path[0]))
    tp = typing.get_type_hints(cls)[fields[i].name]
    below = tp if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None
    return (i, *_schema_rank(below, path[1:]))


# A taint's key as Kubernetes spells one: an optional DNS-subdomain prefix and "/", then a name.
TAINT_KEY = re.compile(
    r"(?:[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
)


def _semantic_problems(p: Policy) -> list[codec.Problem]:
    """Checks a type cannot express. Paths are the keys in the file."""
    out: list[codec.Problem] = []

    def need(ok: bool, path: str, message: str) -> None:
        if not ok:
            out.append(codec.Problem(tuple(path.split(".")), message))

    def positive(path: str, value: float) -> None:
        need(value > 0, path, f"must be > 0, got {value}")

    def at_least(path: str, value: int, low: int) -> None:
        need(value >= low, path, f"must be >= {low}, got {value}")

    need(
        p.api_version == API_VERSION, "apiVersion", f"unsupported {p.api_version!r}; expected {API_VERSION!r}"
    )
    need(p.kind == KIND, "kind", f"must be {KIND!r}, got {p.kind!r}")

    pr = p.progress
    need(pr.metric != "", "progress.metric", "must not be empty")
    try:
        pattern = metric_pattern(pr.regex, pr.metric)
    except re.error as e:
        need(False, "progress.regex", f"does not compile: {e}")
    else:
        # The reader takes group ``value`` if named, else group 1 (specon.progress.text);
        # several unnamed groups would make that choice silently.
        need(
            pattern.groups == 1 or "value" in pattern.groupindex,
            "progress.regex",
            "must have exactly one capture group (the number) or a group named 'value', "
            f"has {pattern.groups}",
        )
    at_least("progress.max_line_bytes", pr.max_line_bytes, 1)
    at_least("progress.max_poll_bytes", pr.max_poll_bytes, 1)

    m = p.monitor
    positive("monitor.interval", m.interval)
    positive("monitor.alpha", m.alpha)
    at_least("monitor.stale_ticks", m.stale_ticks, 0)
    at_least("monitor.request_min_active", m.request_min_active, 0)

    pl = p.placement
    w = pl.weights
    for name in ("progressing", "watching", "converged"):
        positive(f"placement.weights.{name}", getattr(w, name))
    need(
        w.progressing > w.watching > w.converged,
        "placement.weights",
        "must satisfy progressing > watching > converged, got "
        f"{w.progressing} > {w.watching} > {w.converged}",
    )
    need(pl.tolerance >= 0, "placement.tolerance", f"must be >= 0, got {pl.tolerance}")
    at_least("placement.max_migrations_per_container", pl.max_migrations_per_container, 1)

    at_least("rebalance.max_rebalances_per_container", p.rebalance.max_rebalances_per_container, 0)

    mi = p.migration
    at_least("migration.max_concurrent", mi.max_concurrent, 1)
    at_least("migration.max_concurrent_per_worker", mi.max_concurrent_per_worker, 1)
    positive("migration.grace_period", mi.grace_period)
    need(
        mi.save_timeout > mi.grace_period,
        "migration.save_timeout",
        f"must be > grace_period ({mi.grace_period}): a save may take that long, got {mi.save_timeout}",
    )
    positive("migration.restore_timeout", mi.restore_timeout)
    positive("migration.park_after", mi.park_after)
    for name in ("min_residence", "move_downtime", "restore_cpu", "max_push", "cost_prior_weight"):
        value = getattr(mi, name)
        need(math.isfinite(value) and value >= 0, f"migration.{name}", f"must be >= 0, got {value}")

    # Each classifier's and priority rule's own checks of its knobs, "field: problem".
    for section, plugins in PLUGGABLE.items():
        knobs = getattr(p, section)
        for plugin in plugins.values():
            if plugin.args is None:
                continue
            for message in plugin.problems(getattr(knobs, plugin.name)):
                key, _, text = message.partition(": ")
                need(False, f"{section}.{plugin.name}.{key}", text)

    g = p.gpu
    at_least("gpu.concurrency", g.concurrency, 1)
    need(math.isfinite(g.quantum) and g.quantum >= 0, "gpu.quantum", f"must be >= 0, got {g.quantum}")
    need(0 <= g.memory_headroom < 1, "gpu.memory_headroom", f"must be within [0, 1), got {g.memory_headroom}")
    need(
        1 <= g.mps_min_percentage <= 100,
        "gpu.mps_min_percentage",
        f"must be within [1, 100], got {g.mps_min_percentage}",
    )

    ms = p.messaging
    positive("messaging.heartbeat_interval", ms.heartbeat_interval)
    need(
        ms.worker_timeout > ms.heartbeat_interval,
        "messaging.worker_timeout",
        f"must be > heartbeat_interval ({ms.heartbeat_interval}), got {ms.worker_timeout}",
    )
    # Smaller than this cannot even hold a heartbeat of an empty worker.
    at_least("messaging.max_body_bytes", ms.max_body_bytes, 1024)
    at_least("messaging.max_containers_per_heartbeat", ms.max_containers_per_heartbeat, 1)
    need(ms.prune_after >= 2, "messaging.prune_after", f"must be >= 2, got {ms.prune_after}")

    rc = p.recovery
    # Shorter than worker_timeout is taken as worker_timeout (a worker is not lost before it
    # is unreachable): an older file with a long worker_timeout stays valid.
    need(math.isfinite(rc.after) and rc.after > 0, "recovery.after", f"must be > 0, got {rc.after}")
    need(math.isfinite(rc.backoff) and rc.backoff >= 0, "recovery.backoff", f"must be >= 0, got {rc.backoff}")
    need(
        math.isfinite(rc.max_backoff) and rc.max_backoff >= rc.backoff,
        "recovery.max_backoff",
        f"must be >= backoff ({rc.backoff}), got {rc.max_backoff}",
    )
    at_least("recovery.limit", rc.limit, 0)
    positive("recovery.evacuate_deadline", rc.evacuate_deadline)
    for key in rc.evacuate_taints:
        need(
            TAINT_KEY.fullmatch(key) is not None,
            "recovery.evacuate_taints",
            f"each must be a taint key (prefix/name, no value or effect), got {key!r}",
        )
    return out


_DEFAULTS: dict[str, Policy] = {mode: _mode_defaults(mode) for mode in MODES}


def _choices(tp: object) -> list[str]:
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return [str(m.value) for m in tp]
    if typing.get_origin(tp) is typing.Literal:
        return [str(a) for a in typing.get_args(tp)]
    return []


def policy_to_yaml(policy: Policy, *, comments: bool = True) -> str:
    """The policy as a complete YAML policy file that loads back to ``policy``.

    With ``comments``, every knob carries its documentation, its allowed values and,
    where it differs, the default-mode value.
    """
    lines: list[str] = []
    if comments:
        lines += [
            f"# specon policy file ({API_VERSION}). Only apiVersion and kind are required;",
            "# every other key may be left out to take the value of the mode's defaults.",
            "# Check a file with: specon config validate FILE",
        ]
    baseline = policy_to_dict(default_policy("default"))
    _render(Policy, policy_to_dict(policy), baseline, (), lines, comments=comments)
    return "\n".join(lines) + "\n"


def _render(
    cls: type[Any],
    data: dict[str, Any],
    baseline: dict[str, Any],
    path: tuple[str, ...],
    lines: list[str],
    *,
    comments: bool,
) -> None:
    hints = typing.get_type_hints(cls)
    pad = "  " * len(path)
    for f in dataclasses.fields(cls):
        key = codec.wire_key(f)
        tp = hints[f.name]
        doc = DOCS.get(".".join((*path, key)), "")
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            if comments and doc:
                lines.append(f"{pad}# {doc}")
            lines.append(f"{pad}{key}:")
            _render(tp, data[key], baseline[key], (*path, key), lines, comments=comments)
            continue
        line = f"{pad}{key}: {scalar_yaml(data[key])}"
        if comments:
            notes = [doc] if doc else []
            if choices := _choices(tp):
                notes.append(f"[{' | '.join(choices)}]")
            if data[key] != baseline[key] and (*path, key) != ("mode",):
                notes.append(f"(default mode: {scalar_yaml(baseline[key])})")
            if notes:
                line += "  # " + " ".join(notes)
        lines.append(line)
