"""TLS material for the local cluster (``geopubsub up --tls auto``), made with ``cryptography``.

``local_tls(directory, hosts)`` keeps a private CA and a server certificate for ``hosts`` under
``directory`` (``<data_dir>/tls/``): ``ca.pem`` (give it to clients: ``--ca``), ``ca.key``,
``server.pem``, ``server.key``; the keys are mode 0600. The CA is made once and kept, so a
client's copy of ``ca.pem`` stays valid across restarts; the server certificate is made again
when the hosts it must name change. ``client_certificate`` issues a certificate for mutual TLS.
Keys are ECDSA P-256; certificates are valid for ``VALID_DAYS``.

A hand-written call of openssl would be more code to get right (SANs, key usage, permissions);
``cryptography`` is the library gRPC's own examples and pyca maintain for exactly this.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 3650
"""Lifetime of the certificates ``local_tls`` makes (ten years: a local cluster's own CA)."""


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    cert: Path
    key: Path


def _write(path: Path, data: bytes, private: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as f:
        if private:
            os.fchmod(f.fileno(), 0o600)
        f.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "geopubsub local cluster"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _builder(subject: x509.Name, issuer: x509.Name, public_key) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
    )


def _subject_names(hosts: list[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for h in dict.fromkeys(hosts):
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            out.append(x509.DNSName(h))
    return out


def default_hosts(bind: str) -> list[str]:
    """What a server certificate for a coordinator bound to ``bind`` names: loopback, this
    machine's name, and ``bind`` itself unless it is a wildcard."""
    hosts = ["localhost", "127.0.0.1", "::1", socket.gethostname()]
    if bind not in ("", "0.0.0.0", "::"):
        hosts.append(bind)
    return hosts


def _load_ca(directory: Path):
    cert = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
    key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
    return cert, key


def local_tls(directory: str | Path, hosts: list[str]) -> TlsFiles:
    """The CA and server certificate under ``directory`` (made if missing, the server's made
    again if it does not name exactly ``hosts``)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    if not (d / "ca.pem").exists() or not (d / "ca.key").exists():
        key = ec.generate_private_key(ec.SECP256R1())
        name = _name("geopubsub local CA")
        cert = (
            _builder(name, name, key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
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
            .sign(key, hashes.SHA256())
        )
        _write(d / "ca.key", _key_pem(key), private=True)
        _write(d / "ca.pem", cert.public_bytes(serialization.Encoding.PEM), private=False)
        (d / "server.pem").unlink(missing_ok=True)
    files = TlsFiles(d / "ca.pem", d / "server.pem", d / "server.key")
    wanted = _subject_names(hosts)
    if files.cert.exists() and files.key.exists():
        current = x509.load_pem_x509_certificate(files.cert.read_bytes())
        try:
            names = current.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            if list(names) == wanted:
                return files
        except x509.ExtensionNotFound:
            pass
    _issue(d, files.cert, files.key, hosts[0], wanted, ExtendedKeyUsageOID.SERVER_AUTH)
    return files


def certificate_names(path: str | Path) -> list[str]:
    """The DNS names and IP addresses a PEM certificate is for (its subject alternative names);
    [] when it has none or the file is not a certificate."""
    try:
        cert = x509.load_pem_x509_certificate(Path(path).read_bytes())
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound):
        return []
    return [str(n.value) for n in names if isinstance(n, x509.DNSName | x509.IPAddress)]


def client_certificate(directory: str | Path, name: str) -> tuple[Path, Path]:
    """A client certificate for mutual TLS, issued by the CA under ``directory`` (``local_tls``
    made it): ``(<name>.pem, <name>.key)`` there."""
    d = Path(directory)
    cert, key = d / f"{name}.pem", d / f"{name}.key"
    _issue(d, cert, key, name, [], ExtendedKeyUsageOID.CLIENT_AUTH)
    return cert, key


def _issue(d: Path, cert_path: Path, key_path: Path, cn: str, sans, usage) -> None:
    ca_cert, ca_key = _load_ca(d)
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        _builder(_name(cn), ca_cert.subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    _write(key_path, _key_pem(key), private=True)
    _write(cert_path, cert.public_bytes(serialization.Encoding.PEM), private=False)
