"""The agent's HTTP client for the manager: bearer auth, protocol encode/decode, clear errors."""

from __future__ import annotations

import aiohttp

from specon import protocol
from specon.protocol import CommandBatch, ErrorReply, ProtocolError


class ManagerUnavailable(Exception):  # noqa: N818 - reads as a condition, like ConnectionRefused
    """The manager could not be reached or answered with a server error: retry later."""


class ManagerRejected(Exception):  # noqa: N818
    """The manager refused the message (401/400/413): a configuration or protocol bug."""

    def __init__(self, status: int, reply: str) -> None:
        super().__init__(f"manager answered {status}: {reply}")
        self.status = status


class ManagerClient:
    def __init__(self, base_url: str, token: str, *, source_address: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {protocol.AUTH_HEADER: f"Bearer {token}", "Content-Type": protocol.CONTENT_TYPE}
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
            async with self._sess().post(
                self.base_url + path,
                data=protocol.encode(msg),
                headers=self._headers,
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
