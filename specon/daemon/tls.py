"""TLS between agents and manager: the ssl contexts both daemons build, what a failed
handshake means in words, and the manager's certificate re-read when its files change.

- ``server_context(cert, key)``: the manager's context (TLS 1.2 at least), or
  ``TLSConfigError`` saying which file is unreadable, not PEM, encrypted or mismatched;
- ``client_context(ca_file)``: the agent's context: verifies the manager's certificate
  against ``ca_file`` (the system trust store when None) and its host name;
- ``failure_reason(exc)`` / ``failure_hint(exc)``: a failed handshake as one line
  ("certificate verify failed: certificate has expired") and what to do about it;
- ``ServerCertificate``: the listening context, whose handshakes use the last good pair of
  files: ``reload_if_changed`` loads a changed pair into a fresh context and switches to it
  only if it loads (a half-rotated pair, the new certificate beside the old key, is refused
  and the old pair kept); ``watch`` does that every few seconds.
"""

from __future__ import annotations

import asyncio
import os
import re
import ssl
from collections.abc import Iterator
from pathlib import Path

import structlog
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

log = structlog.get_logger()

MIN_VERSION = ssl.TLSVersion.TLSv1_2
_PEM_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----")
_PEM_KEY = re.compile(rb"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----")
_ENCRYPTED_KEY = re.compile(rb"-----BEGIN ENCRYPTED PRIVATE KEY-----|Proc-Type: 4,ENCRYPTED")

# OpenSSL's X509_V_ERR_* codes a misconfigured link produces, and what to do about each.
_VERIFY_HINTS = {
    9: "the manager's certificate is not valid yet: check both hosts' clocks",
    10: "the manager's certificate has expired: issue a new one (the manager re-reads --tls-cert "
    "and --tls-key when they change)",
    18: "the manager's certificate is self-signed: sign it with a CA and give the agent that CA "
    "with --ca-file",
    19: "the agent does not trust the CA that signed the manager's certificate: --ca-file must name it",
    20: "the agent does not trust the CA that signed the manager's certificate: --ca-file must name it",
    62: "the manager's certificate does not name the host in --manager: add it to the "
    "certificate's subjectAltName, or use a name it holds",
    64: "the manager's certificate does not name the IP address in --manager: add it to the "
    "certificate's subjectAltName (IP:...), or use a name it holds",
}
_REASON_HINTS = {
    "WRONG_VERSION_NUMBER": "the manager does not speak TLS on that port (is it started without "
    "--tls-cert?), or use an http:// URL for a loopback manager",
}


class TLSConfigError(ValueError):
    """A certificate, key or CA file the daemon cannot use; the message names it and says why."""


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TLSConfigError(f"cannot read the {what} {path}: {exc.strerror or exc}") from exc


def _no_passphrase() -> str:
    # Called by OpenSSL for an encrypted key: a daemon has nobody to ask.
    raise TLSConfigError("the private key is encrypted and a daemon cannot ask for its passphrase")


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    """A server context serving the certificate chain in ``cert`` (PEM, the server's own
    certificate first) with the private key in ``key`` (PEM, unencrypted)."""
    cert_pem, key_pem = _read(cert, "certificate"), _read(key, "private key")
    if not _PEM_CERT.search(cert_pem):
        raise TLSConfigError(f"the certificate file {cert} holds no PEM certificate (BEGIN CERTIFICATE)")
    if _ENCRYPTED_KEY.search(key_pem):
        raise TLSConfigError(
            f"the private key {key} is encrypted and a daemon cannot ask for its passphrase: store it "
            f"decrypted, readable by the manager only (openssl pkey -in {key} -out NEW; chmod 600 NEW)"
        )
    if not _PEM_KEY.search(key_pem):
        raise TLSConfigError(f"the key file {key} holds no PEM private key (BEGIN PRIVATE KEY)")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = MIN_VERSION
    try:
        ctx.load_cert_chain(cert, key, password=_no_passphrase)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise TLSConfigError(f"the private key {key} does not belong to the certificate {cert}") from exc
        raise TLSConfigError(f"cannot use the certificate {cert} with the key {key}: {exc}") from exc
    except OSError as exc:  # replaced or removed since it was read
        raise TLSConfigError(f"cannot read {exc.filename or cert}: {exc.strerror or exc}") from exc
    return ctx


def client_context(ca_file: Path | None = None) -> ssl.SSLContext:
    """A client context that verifies the server's certificate chain and host name: against
    the CA certificates in ``ca_file`` (PEM) only, or the system trust store when None."""
    if ca_file is not None and not _PEM_CERT.search(_read(ca_file, "CA file")):
        raise TLSConfigError(f"the CA file {ca_file} holds no PEM certificate (BEGIN CERTIFICATE)")
    try:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    except ssl.SSLError as exc:
        raise TLSConfigError(f"cannot use the CA file {ca_file}: {exc}") from exc
    except OSError as exc:
        raise TLSConfigError(f"cannot read the CA file {ca_file}: {exc.strerror or exc}") from exc
    ctx.minimum_version = MIN_VERSION
    # Already the defaults of a SERVER_AUTH context; stated because the link depends on them.
    ctx.check_hostname = True
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def failure_reason(exc: ssl.SSLError) -> str:
    """A failed handshake in one line, e.g. "certificate verify failed: certificate has expired"."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"certificate verify failed: {exc.verify_message or exc.reason}"
    reason = exc.reason or (exc.strerror or str(exc))
    return f"TLS handshake failed: {reason.lower().replace('_', ' ')}"


def failure_hint(exc: ssl.SSLError) -> str | None:
    """What to do about a failed handshake, when it is a usual misconfiguration."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return _VERIFY_HINTS.get(exc.verify_code)
    return _REASON_HINTS.get(exc.reason or "")


Signature = tuple[tuple[int, ...] | str, ...]


class ServerCertificate:
    """The manager's certificate and key files, re-read when they change.

    ``context`` is what the server listens with; each handshake switches to the context of
    the last pair that loaded (an SNI callback, which OpenSSL calls for every ClientHello,
    with or without a server name), so a renewed certificate serves new connections without
    a restart and established ones keep theirs."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.cert, self.key = cert, key
        self._tried = self._signature()  # before loading: a change meanwhile is seen next time
        self.context = server_context(cert, key)
        self.current = self.context
        self.context.sni_callback = self._select
        self.reloads = 0
        self.failures = 0
        self._failing: str | None = None

    def _signature(self) -> Signature:
        """What changes when a file is rewritten or replaced (a Kubernetes Secret volume swaps
        a symlink): each file's mtime, inode, device and size, or why it cannot be seen."""
        out: list[tuple[int, ...] | str] = []
        for path in (self.cert, self.key):
            try:
                st = os.stat(path)
                out.append((st.st_mtime_ns, st.st_ino, st.st_dev, st.st_size))
            except OSError as exc:
                out.append(exc.strerror or str(exc))
        return tuple(out)

    def _select(self, conn: ssl.SSLObject, _server_name: str | None, ctx: ssl.SSLContext) -> None:
        if ctx is not self.current:
            conn.context = self.current

    def reload_if_changed(self) -> bool:
        """Load the files again if they changed since the last try; True when a new pair now
        serves. A pair that does not load is logged (once per distinct error) and skipped:
        the last good one keeps serving, and the files are tried again when they change."""
        seen = self._signature()
        if seen == self._tried:
            return False
        self._tried = seen
        try:
            fresh = server_context(self.cert, self.key)
        except TLSConfigError as exc:
            self.failures += 1
            if str(exc) != self._failing:
                self._failing = str(exc)
                log.error(
                    "specon.manager.tls_reload_failed", error=str(exc), serving="the previous certificate"
                )
            return False
        self.current, self._failing = fresh, None
        self.reloads += 1
        log.info("specon.manager.tls_reloaded", cert=str(self.cert), key=str(self.key))
        return True

    async def watch(self, interval: float) -> None:
        """``reload_if_changed`` every ``interval`` seconds, until cancelled."""
        while True:
            await asyncio.sleep(interval)
            self.reload_if_changed()


class ReloadCollector(Collector):
    """``specon_manager_tls_reloads_total{result}``, read from a ``ServerCertificate``."""

    def __init__(self, cert: ServerCertificate) -> None:
        self.cert = cert

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "specon_manager_tls_reloads",
            "Changed --tls-cert/--tls-key files loaded (ok) or refused, the old pair kept (failed)",
            labels=["result"],
        )
        family.add_metric(["ok"], self.cert.reloads)
        family.add_metric(["failed"], self.cert.failures)
        yield family
