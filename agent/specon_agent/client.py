"""The agent's HTTP client for the manager: bearer auth, protocol encode/decode, clear errors.

The bearer token is a string, or a ``TokenSource`` asked before every request: ``FileToken``
re-reads its file whenever the file changes, for tokens that rotate (on Kubernetes the
kubelet replaces the agent's projected ServiceAccount token well before it expires).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import aiohttp
import structlog

from specon.wire import protocol
from specon.wire.protocol import CommandBatch, ErrorReply, ProtocolError

log = structlog.get_logger()

# Returns the token to send now; raises OSError or ValueError when there is none.
TokenSource = Callable[[], str]


class ManagerUnavailable(Exception):  # noqa: N818 - reads as a condition, like ConnectionRefused
    """The manager could not be reached or answered with a server error: retry later."""


class ManagerRejected(Exception):  # noqa: N818
    """The manager refused the message (401/400/413): a configuration or protocol bug."""

    def __init__(self, status: int, reply: str) -> None:
        super().__init__(f"manager answered {status}: {reply}")
        self.status = status


class FileToken:
    """A token kept in a file, re-read when the file changes (its mtime, inode or size; the
    path may be a symlink the kubelet swaps atomically). A file that cannot be read or is
    empty keeps the last good token, if any. ``check`` vets each new token (e.g.
    ``specon.daemon.cli_args.check_token_strength``) and raises ``ValueError`` to refuse it."""

    def __init__(self, path: str | os.PathLike[str], *, check: Callable[[str], str] | None = None) -> None:
        self.path = Path(path)
        self._check = check
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int, int] | None = None
        self._token: str | None = None
        self._failing: str | None = None
        self.reads = 0

    def __call__(self) -> str:
        with self._lock:
            try:
                st = self.path.stat()
                seen = (st.st_mtime_ns, st.st_ino, st.st_dev, st.st_size)
                if seen != self._seen or self._token is None:
                    text = self.path.read_text(encoding="utf-8").strip()
                    self.reads += 1
                    if not text:
                        raise ValueError(f"{self.path} is empty")
                    self._token = self._check(text) if self._check is not None else text
                    self._seen = seen
                self._failing = None
            except (OSError, ValueError, UnicodeDecodeError) as exc:
                if self._token is None:
                    raise
                if str(exc) != self._failing:  # once per distinct failure, not per request
                    self._failing = str(exc)
                    log.warning("specon.agent.token_unreadable", path=str(self.path), error=str(exc))
            return self._token


class ManagerClient:
    def __init__(self, base_url: str, token: str | TokenSource, *, source_address: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._token: TokenSource = (lambda: token) if isinstance(token, str) else token
        self._source = source_address
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> ManagerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _sess(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(local_addr=(self._source, 0) if self._source else None, limit=8)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def send(self, path: str, msg: protocol.Message, *, timeout: float = 10.0) -> CommandBatch:
        """POST ``msg`` and return the manager's ``CommandBatch``."""
        try:
            token = self._token()
        except (OSError, ValueError) as exc:  # no token yet: like an unreachable manager, retry
            raise ManagerUnavailable(f"no token to send: {exc}") from exc
        headers = {protocol.AUTH_HEADER: f"Bearer {token}", "Content-Type": protocol.CONTENT_TYPE}
        try:
            async with self._sess().post(
                self.base_url + path,
                data=protocol.encode(msg),
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as resp:
                body = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ManagerUnavailable(f"{self.base_url}{path}: {type(exc).__name__}: {exc}") from exc
        if status >= 500:
            raise ManagerUnavailable(f"{self.base_url}{path}: HTTP {status}")
        if status != 200:
            try:
                err = protocol.decode(body, ErrorReply).error
            except ProtocolError:
                err = body[:200].decode(errors="replace")
            raise ManagerRejected(status, err)
        try:
            return protocol.decode(body, CommandBatch)
        except ProtocolError as exc:
            raise ManagerUnavailable(f"{self.base_url}{path}: unreadable reply: {exc}") from exc
