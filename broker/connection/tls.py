"""TLS for the amqps listener and the management API: the server's SSL context from the [tls] keys (as RabbitMQ's
ssl_options), the contexts of the links between a cluster's nodes, and when the certificates it serves expire."""

from __future__ import annotations

import datetime
import ssl
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from broker.config import Config


class TlsError(Exception):
    """A certificate, key or CA file that cannot be used; the message names the file and says why."""


def server_context(config: "Config") -> ssl.SSLContext:
    """TLS 1.2 and 1.3 (RabbitMQ's defaults), the certificate chain and its key, and with verify_peer the client
    certificates checked against the CA file (required with fail_if_no_peer_cert, else only checked when sent)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_certificate(context, config)
    if config.tls_cacertfile:
        _load_ca(context, config)
    if config.tls_verify == "verify_peer":
        context.verify_mode = ssl.CERT_REQUIRED if config.tls_fail_if_no_peer_cert else ssl.CERT_OPTIONAL
    return context


def node_contexts(config: "Config") -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """The TLS of the links between the nodes of a cluster ([cluster] tls): (the accepting side's, the connecting
    side's), each with this node's certificate and checking the other's against the CA file, not its name (nodes are
    reached at their advertised addresses). TlsError naming a file that cannot be used."""
    accepting = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    connecting = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    connecting.check_hostname = False
    for context in (accepting, connecting):
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.verify_mode = ssl.CERT_REQUIRED
        _load_certificate(context, config)
        _load_ca(context, config)
    return accepting, connecting


def _load_certificate(context: ssl.SSLContext, config: "Config") -> None:
    try:
        context.load_cert_chain(config.tls_certfile, config.tls_keyfile)
    except OSError as error:  # ssl.SSLError is one too
        raise TlsError(f"cannot use TLS certificate {config.tls_certfile} with key {config.tls_keyfile}: "
                       f"{_reason(error)}") from error


def _load_ca(context: ssl.SSLContext, config: "Config") -> None:
    try:
        context.load_verify_locations(config.tls_cacertfile)
    except OSError as error:
        raise TlsError(f"cannot use TLS CA certificates {config.tls_cacertfile}: {_reason(error)}") from error


def _reason(error: OSError) -> str:
    if isinstance(error, ssl.SSLError):
        return error.reason or str(error)
    return error.strerror or str(error)


def expiring(paths: list[str], within: datetime.timedelta) -> list[dict]:
    """The certificates in these PEM files that expire within the given time from now, as RabbitMQ's
    certificate-expiration check lists them (a file that cannot be read is listed with the reason)."""
    from cryptography import x509  # (here: 20 ms of every process's start, for a health check only some ask)
    deadline = datetime.datetime.now(datetime.timezone.utc) + within
    found = []
    for path in paths:
        try:
            with open(path, "rb") as file:
                certificates = x509.load_pem_x509_certificates(file.read())
        except (OSError, ValueError) as error:
            found.append({"certfile": path, "error": str(error)})
            continue
        for certificate in certificates:
            if certificate.not_valid_after_utc <= deadline:
                found.append({"certfile": path, "subject": certificate.subject.rfc4514_string(),
                              "expires": certificate.not_valid_after_utc.isoformat()})
    return found
