"""A throwaway certificate authority for tests: a CA, and server certificates it signs.

    ca = TestCA.create(tmp_path / "ca")
    cert, key = ca.issue(tmp_path / "server", names=["127.0.0.1", "localhost"])
    expired = ca.issue(tmp_path / "old", names=["127.0.0.1"], not_after=datetime.now(UTC) - timedelta(days=1))
    ... specon-manager --tls-cert cert --tls-key key;  specon-agent --ca-file ca.cert_path

Keys are ECDSA P-256 (fast to make) and written mode 0600; certificates carry what a strict
verifier asks for (subject and authority key identifiers, key usages, serverAuth). A name
that parses as an IP address goes into the subjectAltName as one, anything else as a DNS name.
Needs ``cryptography`` (the dev extra).
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from specon.embedded.cluster import TlsFiles

# Backdated a little: the verifying side's clock may be a moment behind the issuing side's.
_SKEW = timedelta(minutes=5)
_LIFETIME = timedelta(days=2)


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path``, readable by its owner only from the first byte."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
        os.write(fd, data)
    finally:
        os.close(fd)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _san(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


@dataclass(frozen=True)
class TestCA:
    """A CA whose certificate is ``cert_path`` (PEM; what a client's ``--ca-file`` names)."""

    __test__ = False  # not a pytest test class, whatever its name

    cert_path: Path
    key_path: Path
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @classmethod
    def create(cls, directory: Path, *, name: str = "specon test CA") -> TestCA:
        """A new CA valid from a few minutes ago for two days: ``directory``/ca.crt and ca.key."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.now(UTC)
        ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _SKEW)
            .not_valid_after(now + _LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=False,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(ski, critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False
            )
            .sign(key, hashes.SHA256())
        )
        directory.mkdir(parents=True, exist_ok=True)
        cert_path, key_path = directory / "ca.crt", directory / "ca.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_private(key_path, _key_pem(key))
        return cls(cert_path=cert_path, key_path=key_path, cert=cert, key=key)

    def issue(
        self,
        directory: Path,
        names: Sequence[str],
        *,
        not_before: datetime | None = None,
        not_after: datetime | None = None,
        stem: str = "server",
    ) -> tuple[Path, Path]:
        """A server certificate for ``names`` (IP addresses and DNS names; the first is also the
        common name), valid from ``not_before`` (default: a few minutes ago) to ``not_after``
        (default: two days on; a past one makes an expired certificate). Written as
        ``directory``/<stem>.crt and <stem>.key (0600); returns those two paths."""
        if not names:
            raise ValueError("a server certificate needs at least one name")
        now = datetime.now(UTC)
        start = not_before or now - _SKEW
        end = not_after or now + _LIFETIME
        if end <= start:  # an expired certificate still starts before it ends
            start = end - _LIFETIME
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName([_san(n) for n in names]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False
            )
            .sign(self.key, hashes.SHA256())
        )
        directory.mkdir(parents=True, exist_ok=True)
        cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_private(key_path, _key_pem(key))
        return cert_path, key_path


def manager_tls(root: Path, address: str) -> TlsFiles:
    """A CA made for this one run and the manager's certificate for ``address``: what the
    embedded cluster needs to run its manager over HTTPS (``EmbeddedCluster(tls=...)``)."""
    ca = TestCA.create(root / "ca")
    cert, key = ca.issue(root / "manager-tls", names=[address])
    return TlsFiles(ca=ca.cert_path, cert=cert, key=key)
