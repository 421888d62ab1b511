"""Equality-based label selectors, as the runtime applies them again to what the API
server returns (a server that ignores selectors, an emulator or a proxy, cannot hand the
runtime foreign pods)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from specon.runtime.kubernetes.nodes import PodError


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "exists", "!exists"
    value: str = ""


def parse_selector(selector: str) -> tuple[Requirement, ...]:
    """Equality-based label selectors (``a=b,c!=d,e,!f``); ``PodError`` for anything else.

    The API server applies the selector; the runtime applies it again so a server that
    ignores selectors (an emulator, a proxy) cannot hand it foreign pods.
    """
    out = []
    for raw in (p.strip() for p in selector.split(",")):
        if not raw:
            continue
        if " in " in raw or " notin " in raw or "(" in raw:
            raise PodError(f"set-based selector {raw!r} is not supported; use k=v, k!=v, k or !k")
        if "!=" in raw:
            k, v = raw.split("!=", 1)
            out.append(Requirement(k.strip(), "!=", v.strip()))
        elif "=" in raw:
            k, v = raw.split("==", 1) if "==" in raw else raw.split("=", 1)
            out.append(Requirement(k.strip(), "=", v.strip()))
        elif raw.startswith("!"):
            out.append(Requirement(raw[1:].strip(), "!exists"))
        else:
            out.append(Requirement(raw, "exists"))
    for r in out:
        if not r.key:
            raise PodError(f"bad label selector {selector!r}: empty key")
    return tuple(out)


def matches(labels: Mapping[str, str], selector: Iterable[Requirement]) -> bool:
    for r in selector:
        present = r.key in labels
        if r.op == "=" and labels.get(r.key) != r.value:
            return False
        if r.op == "!=" and labels.get(r.key) == r.value:
            return False
        if r.op == "exists" and not present:
            return False
        if r.op == "!exists" and present:
            return False
    return True
