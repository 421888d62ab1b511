"""One rule for every id that crosses a boundary, the Kubernetes name rules, and range checks
for numbers on the wire.

Worker and container ids name directories on the shared volume, cgroups, Kubernetes
objects, log fields and metric labels. One alphabet serves all of them: 1-253 characters
of ``[A-Za-z0-9._-]``, starting alphanumeric (253: a Kubernetes node name), matched in
full, so a trailing newline, a lone surrogate or a path separator never passes. The
expression (``ID_REGEX``) and its wording (``ID_RULE``) are written here only: the manager's
OpenAPI document quotes both.

Kubernetes names, used with ``fullmatch``: ``DNS_LABEL`` (RFC 1123; a namespace) and
``LABEL_VALUE`` (a label's value, possibly empty).
"""

from __future__ import annotations

import math
import re

from specon.model import ContainerId

MAX_ID_LENGTH = 253
_ID_FIRST, _ID_REST = "A-Za-z0-9", "A-Za-z0-9._-"
# Valid as a Python and an ECMA-262 expression alike (the OpenAPI document anchors it).
ID_REGEX = rf"[{_ID_FIRST}][{_ID_REST}]{{0,{MAX_ID_LENGTH - 1}}}"
ID_RULE = f"1-{MAX_ID_LENGTH} of [{_ID_REST}], starting alphanumeric"
_ID = re.compile(ID_REGEX)
# Largest time or duration a message may carry: year ~2255 in Unix seconds. Keeps
# arithmetic on times finite (1.7e308 - now overflows nothing, but renders as nonsense).
MAX_SECONDS = 9e9
# At most 63 of [a-z0-9-], alphanumeric at both ends.
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
# At most 63 of [A-Za-z0-9._-], alphanumeric at both ends, or empty.
LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


class InvalidIdError(ValueError):
    """An id outside the one rule; the message quotes it safely and states the rule."""


def valid_id(value: object, *, what: str = "id") -> ContainerId:
    """``value`` if it is a valid id (returned typed as a ContainerId; WorkerId is the
    same str), else ``InvalidIdError``."""
    if not isinstance(value, str) or _ID.fullmatch(value) is None or value in {".", ".."}:
        shown = ascii(value)[:80]
        raise InvalidIdError(f"invalid {what} {shown}: use {ID_RULE}")
    return ContainerId(value)


def is_valid_id(value: object) -> bool:
    return isinstance(value, str) and _ID.fullmatch(value) is not None and value not in {".", ".."}


def bounded_seconds(value: float) -> bool:
    """A time or duration that is finite and within ``MAX_SECONDS`` of zero."""
    return math.isfinite(value) and -MAX_SECONDS <= value <= MAX_SECONDS
