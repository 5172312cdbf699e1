"""Throwaway certificates for the TLS tests: a CA, a server certificate for 127.0.0.1 and a client certificate it
signed, an expired server certificate, and a CA nobody trusts."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DAY = datetime.timedelta(days=1)


@dataclass
class Issued:
    key: ec.EllipticCurvePrivateKey
    certificate: x509.Certificate


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _certificate(subject: str, key, issuer: Issued | None, *, ca: bool, usage=None,
                 valid_from: datetime.datetime, valid_to: datetime.datetime) -> x509.Certificate:
    builder = (x509.CertificateBuilder().subject_name(_name(subject))
               .issuer_name(issuer.certificate.subject if issuer else _name(subject))
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(valid_from).not_valid_after(valid_to)
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage(usage if isinstance(usage, list) else [usage]),
                                        critical=False)
        builder = builder.add_extension(x509.SubjectAlternativeName([
            x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False)
    return builder.sign(issuer.key if issuer else key, hashes.SHA256())


def issue(subject: str, issuer: Issued | None = None, *, ca: bool = False, usage=None,
          expired: bool = False) -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    valid_from, valid_to = (now - 30 * DAY, now - DAY) if expired else (now - DAY, now + 365 * DAY)
    return Issued(key, _certificate(subject, key, issuer, ca=ca, usage=usage, valid_from=valid_from,
                                    valid_to=valid_to))


@dataclass
class Certificates:
    directory: Path

    def path(self, name: str) -> str:
        return str(self.directory / name)


def write(directory: Path, name: str, issued: Issued) -> None:
    (directory / f"{name}.pem").write_bytes(issued.certificate.public_bytes(serialization.Encoding.PEM))
    (directory / f"{name}.key").write_bytes(issued.key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))


def make_certificates(directory: Path) -> Certificates:
    """ca.pem, server.pem/.key, client.pem/.key (signed by ca), expired.pem/.key (signed by ca, expired
    yesterday), other-ca.pem and stranger.pem/.key (a client certificate that other CA signed); node.pem/.key, a
    cluster node's (a server's and a client's, signed by ca), and stranger-node.pem/.key (the same, other CA's)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = issue("Warren test CA", ca=True)
    other_ca = issue("Another CA", ca=True)
    write(directory, "ca", ca)
    write(directory, "other-ca", other_ca)
    write(directory, "server", issue("localhost", ca, usage=ExtendedKeyUsageOID.SERVER_AUTH))
    write(directory, "expired", issue("localhost", ca, usage=ExtendedKeyUsageOID.SERVER_AUTH, expired=True))
    write(directory, "client", issue("app", ca, usage=ExtendedKeyUsageOID.CLIENT_AUTH))
    write(directory, "stranger", issue("stranger", other_ca, usage=ExtendedKeyUsageOID.CLIENT_AUTH))
    both = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
    write(directory, "node", issue("node", ca, usage=both))
    write(directory, "stranger-node", issue("stranger-node", other_ca, usage=both))
    return Certificates(directory)
