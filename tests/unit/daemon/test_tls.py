"""``specon.daemon.tls``: the contexts both daemons build, tried in real handshakes (in
memory, no socket) against certificates of a throwaway CA; what a failed handshake says;
the manager's certificate re-read when its files change."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import ssl
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from prometheus_client import CollectorRegistry, generate_latest
from structlog.testing import capture_logs

from specon.daemon.tls import (
    MIN_VERSION,
    ReloadCollector,
    ServerCertificate,
    TLSConfigError,
    client_context,
    failure_hint,
    failure_reason,
    server_context,
)
from specon.testing.certs import TestCA

DOCS = Path(__file__).resolve().parents[3] / "docs" / "tls.md"


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA.create(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def pair(ca: TestCA, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return ca.issue(tmp_path_factory.mktemp("good"), names=["127.0.0.1", "localhost"])


@dataclass
class Handshake:
    client: ssl.SSLObject
    server: ssl.SSLObject
    errors: dict[str, ssl.SSLError]

    def served_serial(self) -> int:
        der = self.client.getpeercert(binary_form=True)
        assert der is not None
        return x509.load_der_x509_certificate(der).serial_number


def handshake(server_ctx: ssl.SSLContext, client_ctx: ssl.SSLContext, name: str = "127.0.0.1") -> Handshake:
    """A TLS handshake between the two contexts through memory buffers."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname=name)
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    errors: dict[str, ssl.SSLError] = {}
    done: set[str] = set()
    for _ in range(10):
        for side, obj in (("client", client), ("server", server)):
            if side in done or side in errors:
                continue
            try:
                obj.do_handshake()
                done.add(side)
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLError as exc:
                errors[side] = exc
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if len(done) + len(errors) == 2:
            break
    return Handshake(client, server, errors)


def serial(cert: Path) -> int:
    return x509.load_pem_x509_certificate(cert.read_bytes()).serial_number


# -- building the contexts ----------------------------------------------------------------


def test_a_good_pair_serves_and_a_client_trusting_its_ca_verifies_it(
    ca: TestCA, pair: tuple[Path, Path]
) -> None:
    server, client = server_context(*pair), client_context(ca.cert_path)
    assert server.minimum_version == client.minimum_version == MIN_VERSION == ssl.TLSVersion.TLSv1_2
    assert client.check_hostname and client.verify_mode == ssl.CERT_REQUIRED
    for name in ("127.0.0.1", "localhost"):
        hs = handshake(server, client, name)
        assert hs.errors == {}
        assert hs.served_serial() == serial(pair[0])
        assert hs.client.version() in ("TLSv1.2", "TLSv1.3")


def test_the_system_store_does_not_trust_a_private_ca(pair: tuple[Path, Path]) -> None:
    hs = handshake(server_context(*pair), client_context(None))
    assert failure_reason(hs.errors["client"]) == (
        "certificate verify failed: unable to get local issuer certificate"
    )


@pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1_1 is deprecated:DeprecationWarning")
def test_a_client_below_tls_1_2_is_refused(ca: TestCA, pair: tuple[Path, Path]) -> None:
    old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    old.load_verify_locations(ca.cert_path)
    old.set_ciphers("DEFAULT:@SECLEVEL=0")  # or OpenSSL 3 would not even offer TLS 1.1
    old.minimum_version = old.maximum_version = ssl.TLSVersion.TLSv1_1
    hs = handshake(server_context(*pair), old)
    assert hs.errors["server"].reason == "UNSUPPORTED_PROTOCOL"


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("missing cert", "cannot read the certificate {dir}/absent.crt: No such file or directory"),
        ("missing key", "cannot read the private key {dir}/absent.key: No such file or directory"),
        ("key as cert", "the certificate file {key} holds no PEM certificate"),
        ("cert as key", "the key file {cert} holds no PEM private key"),
        ("mismatched", "the private key {other_key} does not belong to the certificate {cert}"),
        (
            "encrypted",
            "the private key {dir}/enc.key is encrypted and a daemon cannot ask for its passphrase",
        ),
    ],
)
def test_an_unusable_pair_says_which_file_and_why(
    ca: TestCA, pair: tuple[Path, Path], tmp_path: Path, case: str, says: str
) -> None:
    cert, key = pair
    _, other_key = ca.issue(tmp_path / "other", names=["127.0.0.1"])
    loaded = serialization.load_pem_private_key(key.read_bytes(), None)
    (tmp_path / "enc.key").write_bytes(
        loaded.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    args = {
        "missing cert": (tmp_path / "absent.crt", key),
        "missing key": (cert, tmp_path / "absent.key"),
        "key as cert": (key, key),
        "cert as key": (cert, cert),
        "mismatched": (cert, other_key),
        "encrypted": (cert, tmp_path / "enc.key"),
    }[case]
    with pytest.raises(TLSConfigError) as err:
        server_context(*args)
    assert str(err.value).startswith(says.format(dir=tmp_path, key=key, cert=cert, other_key=other_key))


def test_an_unusable_ca_file_says_why(pair: tuple[Path, Path], tmp_path: Path) -> None:
    with pytest.raises(TLSConfigError, match=r"cannot read the CA file .*No such file"):
        client_context(tmp_path / "absent.crt")
    with pytest.raises(TLSConfigError, match="holds no PEM certificate"):
        client_context(pair[1])  # a key, not a certificate


# -- what a failed handshake says ----------------------------------------------------------


def test_each_failure_reads_as_one_line_with_a_hint(
    ca: TestCA, pair: tuple[Path, Path], tmp_path: Path
) -> None:
    other = TestCA.create(tmp_path / "other-ca", name="another CA")
    expired = ca.issue(
        tmp_path / "old", names=["127.0.0.1"], not_after=datetime.now(UTC) - timedelta(hours=1)
    )
    future = ca.issue(tmp_path / "new", names=["127.0.0.1"], not_before=datetime.now(UTC) + timedelta(days=1))
    trusting = client_context(ca.cert_path)
    cases = [
        (server_context(*pair), client_context(other.cert_path), "127.0.0.1", "unable to get local issuer"),
        (server_context(*expired), trusting, "127.0.0.1", "certificate has expired"),
        (server_context(*future), trusting, "127.0.0.1", "certificate is not yet valid"),
        (
            server_context(*pair),
            trusting,
            "127.0.0.2",
            "IP address mismatch, certificate is not valid for '127.0.0.2'.",
        ),
        (server_context(*pair), trusting, "manager.example", "Hostname mismatch"),
    ]
    for server, client, name, reason in cases:
        exc = handshake(server, client, name).errors["client"]
        assert failure_reason(exc).startswith(f"certificate verify failed: {reason}"), failure_reason(exc)
        assert failure_hint(exc), reason
    expired_exc = handshake(server_context(*expired), trusting).errors["client"]
    assert failure_reason(expired_exc) == "certificate verify failed: certificate has expired"
    assert "has expired: issue a new one" in (failure_hint(expired_exc) or "")


def test_a_plain_http_answer_reads_as_no_tls_on_that_port(ca: TestCA) -> None:
    c_in, c_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    client = client_context(ca.cert_path).wrap_bio(c_in, c_out, server_hostname="127.0.0.1")
    with pytest.raises(ssl.SSLWantReadError):
        client.do_handshake()
    c_in.write(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
    with pytest.raises(ssl.SSLError) as err:
        client.do_handshake()
    assert failure_reason(err.value) == "TLS handshake failed: wrong version number"
    assert "does not speak TLS" in (failure_hint(err.value) or "")


# -- the manager's certificate, re-read -------------------------------------------------------

_mtime = iter(range(1, 10**6))


def install(src: tuple[Path, Path], live: tuple[Path, Path], *, which: str = "both") -> None:
    """Put ``src``'s files in place of ``live``'s as a rotation does: a new file renamed over
    the old (each with a distinct mtime, so no coarse clock hides the change)."""
    for s, d, part in ((src[0], live[0], "cert"), (src[1], live[1], "key")):
        if which in ("both", part):
            tmp = d.with_suffix(".new")
            shutil.copyfile(s, tmp)
            stamp = 1_700_000_000_000_000_000 + next(_mtime) * 1_000_000
            os.utime(tmp, ns=(stamp, stamp))
            os.replace(tmp, d)


def test_a_changed_pair_serves_new_handshakes_and_a_half_rotated_one_is_skipped(
    ca: TestCA, tmp_path: Path
) -> None:
    a = ca.issue(tmp_path / "a", names=["127.0.0.1"])
    b = ca.issue(tmp_path / "b", names=["127.0.0.1"])
    c = ca.issue(tmp_path / "c", names=["127.0.0.1"])
    live = (tmp_path / "live.crt", tmp_path / "live.key")
    install(a, live)
    cert = ServerCertificate(*live)
    client = client_context(ca.cert_path)
    assert handshake(cert.context, client).served_serial() == serial(a[0])
    assert cert.reload_if_changed() is False  # nothing changed

    install(b, live)
    with capture_logs() as logs:
        assert cert.reload_if_changed() is True
    assert [e["event"] for e in logs] == ["specon.manager.tls_reloaded"]
    assert handshake(cert.context, client).served_serial() == serial(b[0])

    # The new certificate lands before its key: refused, the old pair keeps serving.
    install(c, live, which="cert")
    with capture_logs() as logs:
        assert cert.reload_if_changed() is False
        install(c, live, which="cert")  # touched again, the same error: not logged again
        assert cert.reload_if_changed() is False
    assert [(e["event"], e["log_level"]) for e in logs] == [("specon.manager.tls_reload_failed", "error")]
    assert "does not belong to the certificate" in logs[0]["error"]
    assert cert.failures == 2
    assert handshake(cert.context, client).served_serial() == serial(b[0])

    install(c, live, which="key")
    assert cert.reload_if_changed() is True
    assert handshake(cert.context, client).served_serial() == serial(c[0])

    registry = CollectorRegistry()
    registry.register(ReloadCollector(cert))
    text = generate_latest(registry).decode()
    assert 'specon_manager_tls_reloads_total{result="ok"} 2.0' in text
    assert 'specon_manager_tls_reloads_total{result="failed"} 2.0' in text


async def test_watch_picks_up_a_renewed_certificate(ca: TestCA, tmp_path: Path) -> None:
    a = ca.issue(tmp_path / "a", names=["127.0.0.1"])
    b = ca.issue(tmp_path / "b", names=["127.0.0.1"])
    live = (tmp_path / "live.crt", tmp_path / "live.key")
    install(a, live)
    cert = ServerCertificate(*live)
    task = asyncio.create_task(cert.watch(0.01))
    try:
        install(b, live)
        for _ in range(500):
            if cert.reloads:
                break
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
    assert cert.reloads == 1
    assert handshake(cert.context, client_context(ca.cert_path)).served_serial() == serial(b[0])


def test_a_removed_file_is_reported_and_the_pair_keeps_serving(ca: TestCA, tmp_path: Path) -> None:
    a = ca.issue(tmp_path / "a", names=["127.0.0.1"])
    live = (tmp_path / "live.crt", tmp_path / "live.key")
    install(a, live)
    cert = ServerCertificate(*live)
    live[1].unlink()
    with capture_logs() as logs:
        assert cert.reload_if_changed() is False
    assert "cannot read the private key" in logs[0]["error"]
    assert handshake(cert.context, client_context(ca.cert_path)).errors == {}


# -- the lab CA of docs/tls.md ---------------------------------------------------------------


def test_the_openssl_recipe_in_the_docs_makes_a_pair_the_daemons_accept(tmp_path: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed")
    text = DOCS.read_text()
    section = text[text.index("## A lab CA") :]
    script = re.search(r"```sh\n(.*?)```", section, re.S)
    assert script, "no sh block in the lab CA section"
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script.group(1)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "manager.key").stat().st_mode & 0o077 == 0
    server = server_context(tmp_path / "manager.crt", tmp_path / "manager.key")
    client = client_context(tmp_path / "ca.crt")
    for name in ("10.0.0.1", "manager.lab"):
        assert handshake(server, client, name).errors == {}, name
    refused = handshake(server, client, "10.0.0.2").errors["client"]
    assert "IP address mismatch" in failure_reason(refused)
