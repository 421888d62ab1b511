"""Who is calling: bearer tokens mapped to identities, and what each identity may do.

Three kinds of credential (docs/safety.md, "Security model"):

* a per-agent token (``--agent-tokens FILE``, a YAML mapping ``worker id: token``, or on
  Kubernetes the agent pod's projected ServiceAccount token checked by TokenReview) speaks
  for exactly one worker;
* the shared token (``--token-file``) speaks for every worker: single-tenant setups only;
* the read token (``--read-token-file``) may read status and the page, nothing else;
* the operator token (``--operator-token-file``) may read them and drain and uncordon workers
  (``specon drain``), nothing else: no agent message.

Tokens are compared in constant time. With thousands of per-agent tokens, comparing the
given one against each would cost every heartbeat thousands of comparisons: tokens are found
instead by their MAC (keyed BLAKE2b) under a key drawn at start-up (a lookup that tells an attacker nothing
about any token's bytes) and then compared in constant time. An ``Authenticator`` is async so
one backed by the Kubernetes API (TokenReview) fits the same slot as the file-backed one.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from specon.config.yaml12 import YamlError, load_yaml
from specon.daemon.cli_args import WeakTokenError, check_token_strength
from specon.model import WorkerId
from specon.wire.validate import InvalidIdError, valid_id


@dataclass(frozen=True, slots=True)
class Identity:
    """An authenticated caller.

    ``worker`` is the one worker it speaks for; None with ``agent`` set means every worker
    (the shared token). ``agent`` False means no agent message: read-only, or an ``operator``.
    """

    name: str
    worker: WorkerId | None = None
    agent: bool = True
    operator: bool = False

    def may_speak_for(self, worker: str) -> bool:
        return self.agent and (self.worker is None or self.worker == worker)


SHARED = "shared-token"
READER = "read-token"
OPERATOR = "operator-token"


class Authenticator(Protocol):
    async def authenticate(self, token: str) -> Identity | None:
        """The identity ``token`` proves, or None."""
        ...


class StaticTokens:
    """Tokens known up front: per-agent, shared, read-only and operator, each optional."""

    def __init__(
        self,
        *,
        agents: Mapping[str, str] | None = None,
        shared: str | None = None,
        read: str | None = None,
        operator: str | None = None,
    ) -> None:
        self._key = secrets.token_bytes(32)
        # MAC of a token -> (the token, its identity).
        self._by_digest: dict[bytes, tuple[bytes, Identity]] = {}
        for worker, token in (agents or {}).items():
            self._add(token, Identity(f"agent:{worker}", WorkerId(worker)))
        if shared:
            self._add(shared, Identity(SHARED))
        if read:
            self._add(read, Identity(READER, agent=False))
        if operator:
            self._add(operator, Identity(OPERATOR, agent=False, operator=True))

    def _add(self, token: str, who: Identity) -> None:
        key = token.encode()
        digest = self._digest(key)
        if digest in self._by_digest:
            raise ValueError(f"{who.name} reuses the token of {self._by_digest[digest][1].name}")
        self._by_digest[digest] = (key, who)

    def _digest(self, token: bytes) -> bytes:
        return hashlib.blake2b(token, key=self._key, digest_size=16).digest()  # keyed: a MAC

    def __bool__(self) -> bool:
        return bool(self._by_digest)

    async def authenticate(self, token: str) -> Identity | None:
        given = token.encode("utf-8", "surrogateescape")
        hit = self._by_digest.get(self._digest(given))
        # The digest only finds the candidate; the token itself is what is compared.
        if hit is None or not hmac.compare_digest(given, hit[0]):
            return None
        return hit[1]


class Chain:
    """The first authenticator that knows the token wins."""

    def __init__(self, *parts: Authenticator) -> None:
        self.parts = parts

    async def authenticate(self, token: str) -> Identity | None:
        for part in self.parts:
            who = await part.authenticate(token)
            if who is not None:
                return who
        return None


def load_agent_tokens(path: Path) -> dict[str, str]:
    """``--agent-tokens FILE``: a YAML mapping ``worker id: token``; ValueError saying what
    is wrong (bad id, weak or repeated token, not a mapping)."""
    try:
        raw = load_yaml(path.read_text())
    except YamlError as exc:  # the one YAML loader: a repeated worker is an error, not the last wins
        raise ValueError(f"{path}: not YAML: {exc}") from exc
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"{path}: expected a non-empty mapping of worker id to token")
    out: dict[str, str] = {}
    seen: dict[str, str] = {}
    for worker, token in raw.items():
        try:
            wid = valid_id(str(worker))
        except InvalidIdError as exc:
            raise ValueError(f"{path}: {exc}") from exc
        if not isinstance(token, str):
            raise ValueError(f"{path}: token of {wid}: expected a string")
        try:
            check_token_strength(token, what=f"token of {wid}")
        except WeakTokenError as exc:
            raise ValueError(f"{path}: {exc}") from exc
        if token in seen:
            raise ValueError(f"{path}: {wid} and {seen[token]} share a token")
        seen[token] = wid
        out[wid] = token
    return out
