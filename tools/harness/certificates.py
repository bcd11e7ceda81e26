"""Throwaway certificates for TLS tests: a CA, a KV server's certificate and a
client's signed by it, and another CA that signed neither.

Made with ``cryptography`` (a test dependency, pyproject.toml) in the
test's own directory, valid for a day; the keys are P-256, unencrypted, and
readable by the owner only, as a KV server wants its key.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID = datetime.timedelta(days=1)


@dataclass(frozen=True)
class Certificates:
    ca: Path  # the CA's certificate: the tier's tls_ca_file, the KV server's tls-ca-cert-file
    server_cert: Path  # the KV server's, for 127.0.0.1 and localhost
    server_key: Path
    client_cert: Path  # a client's, for a KV server that asks for one
    client_key: Path
    other_ca: Path  # a CA that signed nothing here: a wrong tls_ca_file


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write(directory: Path, stem: str, cert: x509.Certificate, key) -> tuple[Path, Path]:
    cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    os.chmod(key_path, 0o600)
    return cert_path, key_path


def _certificate(subject: str, key, issuer: x509.Name, issuer_key, extensions) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + VALID)
    )
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(issuer_key, hashes.SHA256())


def _ca(directory: Path, stem: str, common_name: str):
    key = ec.generate_private_key(ec.SECP256R1())
    is_ca = [
        (x509.BasicConstraints(ca=True, path_length=None), True),
        (
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            True,
        ),
        (x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False),
    ]  # fmt: skip
    cert = _certificate(common_name, key, _name(common_name), key, is_ca)
    path, _ = _write(directory, stem, cert, key)
    return path, cert, key


def _leaf(directory: Path, stem: str, ca_cert, ca_key, usage, names=None) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    extensions = [
        (x509.BasicConstraints(ca=False, path_length=None), True),
        (x509.ExtendedKeyUsage([usage]), False),
        (x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False),
    ]
    if names:
        extensions.append((x509.SubjectAlternativeName(names), False))
    cert = _certificate(stem, key, ca_cert.subject, ca_key, extensions)
    return _write(directory, stem, cert, key)


def make_certificates(directory: Path) -> Certificates:
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_cert, ca_key = _ca(directory, "ca", "vllm-uma test CA")
    other_ca, _, _ = _ca(directory, "other-ca", "another test CA")
    names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
    server = _leaf(directory, "kv-server", ca_cert, ca_key, ExtendedKeyUsageOID.SERVER_AUTH, names)
    client = _leaf(directory, "client", ca_cert, ca_key, ExtendedKeyUsageOID.CLIENT_AUTH)
    return Certificates(ca, *server, *client, other_ca)
