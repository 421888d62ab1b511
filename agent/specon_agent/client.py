"""The agent's HTTP client for the manager: bearer auth, protocol encode/decode, clear errors.

The bearer token is a string, or a ``TokenSource`` asked before every request: ``FileToken``
re-reads its file whenever the file changes, for tokens that rotate (on Kubernetes the
kubelet replaces the agent's projected ServiceAccount token well before it expires).

The token never travels in clear text off this host: the client refuses an ``http://``
manager that is not on loopback unless told the network is trusted (``insecure_http``; the
rule is ``specon.daemon.manager_url``), verifies an ``https://`` manager's certificate and
host name, and follows no redirect. A failed handshake (an expired certificate, an unknown
CA, a wrong host name) is logged once per distinct reason (``specon.agent.tls_error``) and
retried like an unreachable manager: the manager may get a good certificate.
"""

from __future__ import annotations

import os
import ssl
import threading
from collections.abc import Callable
from pathlib import Path

import aiohttp
import structlog

from specon.daemon.manager_url import check_manager_url
from specon.daemon.tls import client_context, failure_hint, failure_reason
from specon.wire import protocol
from specon.wire.pod_writes import POD_WRITES_PATH, PodWriteReply, PodWriteRequest
from specon.wire.protocol import CommandBatch, ErrorReply, ProtocolError

log = structlog.get_logger()

# Returns the token to send now; raises OSError or ValueError when there is none.
TokenSource = Callable[[], str]


class ManagerUnavailable(Exception):  # noqa: N818 - reads as a condition, like ConnectionRefused
    """The manager could not be reached or answered with a server error: retry later."""


class ManagerTLSError(ManagerUnavailable):
    """The TLS handshake with the manager failed (its certificate, our CA, the host name)."""


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


def _ssl_cause(exc: BaseException) -> ssl.SSLError | None:
    """The ``ssl.SSLError`` behind a failed request (aiohttp wraps it), if TLS is what failed."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        for inner in (getattr(cur, "certificate_error", None), getattr(cur, "os_error", None)):
            if isinstance(inner, ssl.SSLError):
                return inner
        if isinstance(cur, ssl.SSLError) and not isinstance(cur, aiohttp.ClientError):
            return cur
        cur = cur.__cause__ or cur.__context__
    return None


class ManagerClient:
    """Sends the protocol's messages to the manager at ``base_url``.

    ``InsecureURLError`` (a ``ValueError``) at construction, before any connection, for a
    URL the token must not go to: plain HTTP off loopback without ``insecure_http``.
    ``ssl_context``: how an ``https://`` manager is verified (default: the system trust
    store, host name checked); it must verify. ``source_address``: bind requests to it."""

    def __init__(
        self,
        base_url: str,
        token: str | TokenSource,
        *,
        source_address: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        insecure_http: bool = False,
    ) -> None:
        scheme = check_manager_url(base_url, insecure_http=insecure_http)
        if ssl_context is not None and not (
            ssl_context.verify_mode == ssl.CERT_REQUIRED and ssl_context.check_hostname
        ):
            raise ValueError("the manager's certificate and host name must be verified")
        self._base_url = base_url.rstrip("/")
        self._token: TokenSource = (lambda: token) if isinstance(token, str) else token
        self._source = source_address
        self._ssl = (ssl_context or client_context()) if scheme == "https" else None
        self._session: aiohttp.ClientSession | None = None
        self._tls_failing: str | None = None
        self.tls_errors = 0

    @property
    def base_url(self) -> str:
        return self._base_url

    async def __aenter__(self) -> ManagerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _sess(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                local_addr=(self._source, 0) if self._source else None,
                limit=8,
                ssl=self._ssl if self._ssl is not None else True,
            )
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    def _tls_failed(self, exc: ssl.SSLError) -> str:
        reason = failure_reason(exc)
        self.tls_errors += 1
        if reason != self._tls_failing:  # once per distinct failure, not per request
            self._tls_failing = reason
            log.error("specon.agent.tls_error", manager=self._base_url, reason=reason, hint=failure_hint(exc))
        return reason

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def send(self, path: str, msg: protocol.Message, *, timeout: float = 10.0) -> CommandBatch:
        """POST ``msg`` and return the manager's ``CommandBatch``."""
        body = await self._post(path, protocol.encode(msg), timeout)
        try:
            return protocol.decode(body, CommandBatch)
        except ProtocolError as exc:
            raise ManagerUnavailable(f"{self._base_url}{path}: unreadable reply: {exc}") from exc

    async def pod_write(self, req: PodWriteRequest, *, timeout: float = 60.0) -> PodWriteReply:
        """Ask the manager's pod broker for a write on this node's pods (Kubernetes)."""
        body = await self._post(POD_WRITES_PATH, req.to_json(), timeout)
        try:
            return PodWriteReply.from_json(body)
        except ValueError as exc:
            raise ManagerUnavailable(f"{self._base_url}{POD_WRITES_PATH}: unreadable reply: {exc}") from exc

    async def _post(self, path: str, data: bytes, timeout: float) -> bytes:
        """POST ``data``; the body of a 200 reply (``ManagerUnavailable``, ``ManagerRejected``)."""
        try:
            token = self._token()
        except (OSError, ValueError) as exc:  # no token yet: like an unreachable manager, retry
            raise ManagerUnavailable(f"no token to send: {exc}") from exc
        headers = {protocol.AUTH_HEADER: f"Bearer {token}", "Content-Type": protocol.CONTENT_TYPE}
        url = self._base_url + path
        try:
            async with self._sess().post(
                url,
                data=data,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout),
                allow_redirects=False,  # the token goes to the configured manager only
            ) as resp:
                body = await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            cause = _ssl_cause(exc)
            if cause is not None:
                raise ManagerTLSError(f"{url}: {self._tls_failed(cause)}") from exc
            raise ManagerUnavailable(f"{url}: {type(exc).__name__}: {exc}") from exc
        if self._tls_failing is not None:
            log.info("specon.agent.tls_ok", manager=self._base_url, after=self._tls_failing)
            self._tls_failing = None
        if status >= 500:
            raise ManagerUnavailable(f"{url}: HTTP {status}")
        if status != 200:
            try:
                err = protocol.decode(body, ErrorReply).error
            except ProtocolError:
                err = body[:200].decode(errors="replace")
            raise ManagerRejected(status, err)
        return body
