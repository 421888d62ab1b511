"""Browser sessions of the status page: random ids mapped to who logged in, for a bounded time.

A login (``specon_manager.login``) trades the read token for a session id, which is all the
browser's cookie holds: the token itself is never stored or sent back. Sessions live in this
process's memory only (a restarted manager asks everyone to log in again), each for ``ttl``
seconds from its login, at most ``capacity`` at once: a new one evicts the oldest, so a flood
of logins costs bounded memory and only ends the oldest sessions early.

No I/O here; the clock and the id source are injectable, so the rules are unit-tested as is.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from specon_manager.auth import Identity

#: Sessions kept at once (a login beyond it ends the oldest).
DEFAULT_CAPACITY = 1000
#: Random bytes in a session id (base64url: 43 characters).
ID_BYTES = 32
#: A cookie value longer than any id this store makes is not looked up at all.
MAX_ID_LENGTH = 64


@dataclass(frozen=True, slots=True)
class Session:
    id: str
    identity: Identity
    expires: float  # on the store's clock


def new_id() -> str:
    return secrets.token_urlsafe(ID_BYTES)


class SessionStore:
    """Open, find and close sessions; an expired one is gone as if closed."""

    def __init__(
        self,
        ttl: float,
        *,
        capacity: int = DEFAULT_CAPACITY,
        clock: Callable[[], float] = time.monotonic,
        make_id: Callable[[], str] = new_id,
    ) -> None:
        if ttl <= 0 or capacity < 1:
            raise ValueError(f"sessions need ttl > 0 and capacity >= 1, got {ttl}, {capacity}")
        self.ttl = ttl
        self.capacity = capacity
        self._clock = clock
        self._make_id = make_id
        # Oldest first: every session lasts ttl, so the oldest also expires first.
        self._by_id: OrderedDict[str, Session] = OrderedDict()

    def __len__(self) -> int:
        self._expire()
        return len(self._by_id)

    def open(self, who: Identity) -> tuple[Session, int]:
        """A new session for ``who``, and how many live sessions it evicted (0 below capacity)."""
        self._expire()
        evicted = 0
        while len(self._by_id) >= self.capacity:
            self._by_id.popitem(last=False)
            evicted += 1
        sid = self._make_id()
        while sid in self._by_id:  # never with random ids; a fixed test id must not merge two
            sid = self._make_id()
        session = Session(sid, who, self._clock() + self.ttl)
        self._by_id[sid] = session
        return session, evicted

    def get(self, sid: str) -> Session | None:
        """The live session ``sid`` names, or None (unknown, closed, evicted or expired)."""
        if not sid or len(sid) > MAX_ID_LENGTH:
            return None
        session = self._by_id.get(sid)
        if session is None:
            return None
        if session.expires <= self._clock():
            del self._by_id[sid]
            return None
        return session

    def close(self, sid: str) -> bool:
        """End session ``sid``; whether it was live."""
        session = self._by_id.pop(sid, None)
        return session is not None and session.expires > self._clock()

    def _expire(self) -> None:
        now = self._clock()
        while self._by_id:
            oldest = next(iter(self._by_id.values()))
            if oldest.expires > now:
                return
            self._by_id.popitem(last=False)
