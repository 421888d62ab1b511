"""Range and identity checks at the protocol boundary, beyond what the types say.

The codec checks shapes (a float is a finite number, an id is a string); these rules
check meaning, once, for every message decoded: ids follow the one id rule
(``specon.wire.validate``), times are finite and bounded, usage and capacity are not
negative, counts and strings are bounded. ``check`` returns every problem as
``(path, why)``; an empty list means the message is fit to act on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from specon.model import WEIGHT_MAX, WEIGHT_MIN
from specon.wire.validate import MAX_SECONDS, is_valid_id, valid_id

if TYPE_CHECKING:
    from specon.model import Resources

Problems = list[tuple[str, str]]

# Bounds that no honest agent reaches; each keeps one message from costing the manager
# unbounded memory or time.
MAX_SEQ = 2**63 - 1
MAX_CPU = 1e6  # cores
MAX_BYTES = 2**60
MAX_GPU = 1_000_000
MAX_TEXT = 4096  # address, error messages, paths
MAX_LABELS = 128
MAX_LABEL_KEY = 317  # a Kubernetes label key: 253 prefix + "/" + 63 name
MAX_LABEL_VALUE = 1024
MAX_RESULTS = 1000
# A taint or toleration, ``key[=value][:Effect]``: a label key, a 63-character value, an effect.
MAX_TAINT = MAX_LABEL_KEY + 1 + 63 + 1 + 16
MAX_TAINTS = MAX_LABELS
MAX_POLL_WAIT = 3600.0


def check(msg: object) -> Problems:
    """Every meaning problem in ``msg`` (a decoded protocol message)."""
    rule = _RULES.get(type(msg).__name__)
    return [] if rule is None else rule(msg)


def _id(out: Problems, path: str, value: object, what: str) -> None:
    if not is_valid_id(value):
        try:
            valid_id(value, what=what)
        except ValueError as exc:
            out.append((path, str(exc)))


def _time(out: Problems, path: str, value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and -MAX_SECONDS <= value <= MAX_SECONDS):
        out.append((path, f"must be a time within ±{MAX_SECONDS:g} s, got {value!r}"))


def _range(out: Problems, path: str, value: float | None, lo: float, hi: float) -> None:
    if value is not None and not lo <= value <= hi:
        out.append((path, f"must be within [{lo:g}, {hi:g}], got {value!r}"))


def _text(out: Problems, path: str, value: str | None, limit: int = MAX_TEXT) -> None:
    if value is not None and len(value) > limit:
        out.append((path, f"longer than {limit} characters ({len(value)})"))


def _resources(out: Problems, path: str, r: Resources) -> None:
    _range(out, f"{path}.cpu", r.cpu, 0.0, MAX_CPU)
    _range(out, f"{path}.memory", r.memory, 0, MAX_BYTES)
    _range(out, f"{path}.gpu", r.gpu, 0, MAX_GPU)


def _labels(out: Problems, path: str, labels: Mapping[str, str]) -> None:
    if len(labels) > MAX_LABELS:
        out.append((path, f"more than {MAX_LABELS} labels ({len(labels)})"))
        return
    for k, v in labels.items():
        if not k or len(k) > MAX_LABEL_KEY or not k.isprintable():
            out.append(
                (f"{path}.{ascii(k)[:40]}", f"a label key must be 1-{MAX_LABEL_KEY} printable characters")
            )
        elif len(v) > MAX_LABEL_VALUE:
            out.append((f"{path}.{k}", f"a label value must be at most {MAX_LABEL_VALUE} characters"))


def _taints(out: Problems, path: str, values: tuple[str, ...], what: str) -> None:
    """Taints or tolerations (``specon.policy.placement.tolerates``): bounded in number and
    length, each non-empty and printable."""
    if len(values) > MAX_TAINTS:
        out.append((path, f"more than {MAX_TAINTS} {what} ({len(values)})"))
        return
    for i, t in enumerate(values):
        if not t or not t.isprintable():
            out.append((f"{path}[{i}]", "must be non-empty printable text"))
        else:
            _text(out, f"{path}[{i}]", t, MAX_TAINT)


def _heartbeat(hb: Any) -> Problems:
    out: Problems = []
    _id(out, "worker", hb.worker, "worker id")
    _text(out, "address", hb.address, 512)
    _range(out, "seq", hb.seq, 0, MAX_SEQ)
    _time(out, "sent_at", hb.sent_at)
    _resources(out, "capacity", hb.capacity)
    _range(out, "usage", hb.usage, 0.0, 1.0)
    _labels(out, "labels", hb.labels)
    _taints(out, "taints", hb.taints, "taints")
    if len(hb.results) > MAX_RESULTS:
        out.append(("results", f"more than {MAX_RESULTS} results ({len(hb.results)})"))
    ids: set[str] = set()
    for i, c in enumerate(hb.containers):
        if c.id in ids:
            out.append((f"containers[{i}].id", f"container {c.id} reported twice"))
        ids.add(c.id)
        if _plain(c):
            continue  # the common case, checked without building a path
        p = f"containers[{i}]"
        _id(out, f"{p}.id", c.id, "container id")
        if c.last_g is not None and not math.isfinite(c.last_g):
            out.append((f"{p}.last_g", "must be finite"))
        _time(out, f"{p}.t_cc", c.t_cc)
        _range(out, f"{p}.step", c.step, 0, MAX_SEQ)
        _range(out, f"{p}.cpu_weight", c.cpu_weight, WEIGHT_MIN, WEIGHT_MAX)
        _resources(out, f"{p}.requests", c.requests)
        _labels(out, f"{p}.job", c.job)
        if c.selector:
            _labels(out, f"{p}.selector", c.selector)
        if c.tolerations:
            _taints(out, f"{p}.tolerations", c.tolerations, "tolerations")
        if len(out) > 50:
            break
    for i, r in enumerate(hb.results[:MAX_RESULTS]):
        p = f"results[{i}]"
        _text(out, f"{p}.command", r.command, 512)
        _text(out, f"{p}.error", r.error)
        _text(out, f"{p}.checkpoint", r.checkpoint)
        _range(out, f"{p}.checkpoint_step", r.checkpoint_step, 0, MAX_SEQ)
        _time(out, f"{p}.finished_at", r.finished_at)
        if len(out) > 50:
            break
    return out


def _plain(c: Any) -> bool:
    """True if report ``c`` passes every rule below (a fast path: no strings built)."""
    r, t, s, g = c.requests, c.t_cc, c.step, c.last_g
    return (
        is_valid_id(c.id)
        and (t is None or -MAX_SECONDS <= t <= MAX_SECONDS)  # NaN and infinities fail these
        and (s is None or 0 <= s <= MAX_SEQ)
        and (c.cpu_weight is None or WEIGHT_MIN <= c.cpu_weight <= WEIGHT_MAX)
        and (g is None or math.isfinite(g))
        and 0.0 <= r.cpu <= MAX_CPU
        and 0 <= r.memory <= MAX_BYTES
        and 0 <= r.gpu <= MAX_GPU
        and not c.selector
        and not c.tolerations
        and len(c.job) <= MAX_LABELS
        and all(
            k and len(k) <= MAX_LABEL_KEY and k.isprintable() and len(v) <= MAX_LABEL_VALUE
            for k, v in c.job.items()
        )
    )


def _request(req: Any) -> Problems:
    out: Problems = []
    _id(out, "worker", req.worker, "worker id")
    _id(out, "container", req.container, "container id")
    _time(out, "t_cc", req.t_cc)
    _time(out, "sent_at", req.sent_at)
    return out


def _goodbye(msg: Any) -> Problems:
    out: Problems = []
    _id(out, "worker", msg.worker, "worker id")
    _time(out, "sent_at", msg.sent_at)
    return out


def _poll(msg: Any) -> Problems:
    out = _goodbye(msg)
    _range(out, "wait", msg.wait, 0.0, MAX_POLL_WAIT)
    return out


def _command(cmd: Any) -> Problems:
    out: Problems = []
    _id(out, "container", cmd.container, "container id")
    _text(out, "id", cmd.id, 512)
    if cmd.target is not None:
        _id(out, "target", cmd.target, "worker id")
    _text(out, "checkpoint", cmd.checkpoint)
    return out


def _batch(batch: Any) -> Problems:
    out: Problems = []
    _time(out, "manager_time", batch.manager_time)
    for i, cmd in enumerate(batch.commands):
        out += [(f"commands[{i}].{p}", w) for p, w in _command(cmd)]
    return out


_RULES: dict[str, Any] = {
    "Heartbeat": _heartbeat,
    "ReallocationRequest": _request,
    "Goodbye": _goodbye,
    "Poll": _poll,
    "Command": _command,
    "CommandBatch": _batch,
}
