"""Talking to the manager from the command line (``specon status``, ``specon drain``): the
connection options, and one HTTP call with the bearer token, with errors that say what to do.

The token comes from ``--token-file`` or ``$SPECON_TOKEN`` and is sent over plain HTTP only to a
loopback manager unless ``--insecure-http``; an ``https://`` manager's certificate must chain to
``--ca-file`` (or the system trust store).
"""

from __future__ import annotations

import argparse
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from specon.daemon.cli_args import read_token
from specon.daemon.manager_url import InsecureURLError, check_manager_url
from specon.wire import protocol
from specon.wire.protocol import ErrorReply, ProtocolError

DEFAULT_MANAGER = "http://127.0.0.1:7700"
TIMEOUT = 10.0  # seconds for one request
READ_TOKEN = "its read token (the file specon-manager reads with --read-token-file)"
OPERATOR_TOKEN = "its operator token (the file specon-manager reads with --operator-token-file)"


class StatusError(Exception):
    """A call to the manager that failed; the message says why and what to do."""


def add_connection_options(p: argparse.ArgumentParser, *, token: str) -> None:
    """``--manager``, ``--token-file`` (``token``: which token, in its help), ``--ca-file``,
    ``--insecure-http``."""
    p.add_argument(
        "--manager",
        default=DEFAULT_MANAGER,
        metavar="URL",
        help=f"the manager's base URL (default {DEFAULT_MANAGER}); https:// for a manager with TLS",
    )
    p.add_argument(
        "--token-file",
        metavar="FILE",
        help=f"file holding the manager's {token}; default: $SPECON_TOKEN, else no token",
    )
    p.add_argument(
        "--ca-file",
        type=Path,
        metavar="FILE",
        help="PEM file of the CA certificate(s) an https:// manager's certificate must chain to "
        "(default: the system trust store)",
    )
    p.add_argument(
        "--insecure-http",
        action="store_true",
        help="send the token over plain http:// to a manager that is not on loopback (only on a "
        "network you trust; prefer https)",
    )


@dataclass(frozen=True, slots=True)
class Source:
    """Where the status is read and with what credential."""

    url: str  # the manager's base URL
    token: str  # "" for none
    context: ssl.SSLContext | None  # for https

    def read(self, limit: int | None, after: str | None) -> bytes:
        """The raw ``Status`` JSON of one page; ``StatusError`` saying why not."""
        query = {k: v for k, v in (("limit", limit), ("after", after)) if v is not None}
        path = protocol.STATUS_PATH + (f"?{urllib.parse.urlencode(query)}" if query else "")
        return self.call("GET", path, token=READ_TOKEN)

    def call(self, method: str, path: str, body: bytes | None = None, *, token: str) -> bytes:
        """The answer's body to ``method path`` (JSON ``body``); ``StatusError`` saying why not
        (``token``: which token the call needs, for the message of a 401 or a 403)."""
        headers = {"Accept": protocol.CONTENT_TYPE}
        if body is not None:
            headers["Content-Type"] = protocol.CONTENT_TYPE
        if self.token:
            headers[protocol.AUTH_HEADER] = f"Bearer {self.token}"
        req = urllib.request.Request(self.url.rstrip("/") + path, data=body, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT, context=self.context) as resp:
                answer: bytes = resp.read()
                return answer
        except urllib.error.HTTPError as exc:
            raise StatusError(self._refused(exc.code, exc.read(), token)) from None
        except urllib.error.URLError as exc:
            reason = exc.reason
            if isinstance(reason, ssl.SSLCertVerificationError):
                raise StatusError(
                    f"the manager at {self.url} has a certificate this host does not trust "
                    f"({reason.verify_message}): --ca-file must name the CA that signed it"
                ) from None
            raise StatusError(
                f"cannot reach the manager at {self.url}: {reason} (is specon-manager running there? "
                "--manager URL)"
            ) from None
        except (TimeoutError, OSError) as exc:
            raise StatusError(f"cannot reach the manager at {self.url}: {exc}") from None

    def _refused(self, code: int, body: bytes, token: str) -> str:
        try:
            said = protocol.decode(body, ErrorReply).error
        except ProtocolError:
            said = body[:200].decode("utf-8", "replace").strip() or "no reason given"
        if code == 401:
            what = "a token" if not self.token else "this token"
            return (
                f"the manager at {self.url} needs {what} it accepts (401: {said}): give {token} with "
                "--token-file FILE or $SPECON_TOKEN"
            )
        if code == 403:
            return f"the manager at {self.url} refused this token (403: {said}): use {token}"
        return f"the manager at {self.url} answered {code}: {said}"


def source_of(args: argparse.Namespace) -> Source:
    """The source the options name; ``StatusError`` for a URL the token must not go to or a
    token or CA file that cannot be read."""
    try:
        scheme = check_manager_url(args.manager, insecure_http=args.insecure_http)
    except InsecureURLError as exc:
        raise StatusError(str(exc)) from None
    try:
        token = read_token(args.token_file)
    except OSError as exc:
        raise StatusError(f"--token-file: cannot read {args.token_file}: {exc.strerror or exc}") from None
    context = None
    if scheme == "https":
        try:
            context = ssl.create_default_context(cafile=args.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise StatusError(f"--ca-file: cannot use {args.ca_file}: {exc}") from None
    return Source(args.manager, token, context)
