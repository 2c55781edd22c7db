"""Throwaway certificate authorities for the local apiserver and the provider API.

Client certificates carry the user as CN and the groups as O, exactly how kube-apiserver reads them,
so tests can act as any user with any groups without restarting the apiserver.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class CertFiles:
    cert_file: Path
    key_file: Path


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    path.chmod(0o600)


def _validity(builder: x509.CertificateBuilder) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return builder.not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(
        now + datetime.timedelta(days=30)
    )


class CertificateAuthority:
    """A CA kept in memory, its certificate written to `<directory>/<name>-ca.crt`."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{name} CA")])
        usage = x509.KeyUsage(
            digital_signature=True,
            key_cert_sign=True,
            crl_sign=True,
            content_commitment=False,
            key_encipherment=False,
            data_encipherment=False,
            key_agreement=False,
            encipher_only=False,
            decipher_only=False,
        )
        self._cert = (
            _validity(x509.CertificateBuilder())
            .subject_name(self._name)
            .issuer_name(self._name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(usage, critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.ca_file = directory / f"{name}-ca.crt"
        self.ca_file.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))

    def _issue(self, stem: str, subject: x509.Name, extensions: list[tuple[x509.ExtensionType, bool]]) -> CertFiles:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            _validity(x509.CertificateBuilder())
            .subject_name(subject)
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        )
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical=critical)
        cert = builder.sign(self._key, hashes.SHA256())
        files = CertFiles(self.directory / f"{stem}.crt", self.directory / f"{stem}.key")
        files.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(files.key_file, key)
        return files

    def issue_server(
        self, stem: str, dns_names: tuple[str, ...] = ("localhost",), ip_addresses: tuple[str, ...] = ("127.0.0.1",)
    ) -> CertFiles:
        """A serving certificate for ip_addresses and dns_names."""
        sans: list[x509.GeneralName] = [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
        sans += [x509.DNSName(name) for name in dns_names]
        return self._issue(
            stem,
            x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0] if dns_names else "127.0.0.1")]),
            [
                (x509.SubjectAlternativeName(sans), False),
                (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False),
            ],
        )

    def issue_client(self, stem: str, user: str, groups: tuple[str, ...] = ()) -> CertFiles:
        """A client certificate that kube-apiserver reads as `user` in `groups`."""
        attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, group) for group in groups]
        attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, user))
        return self._issue(
            stem, x509.Name(attributes), [(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)]
        )


def make_rsa_keypair(directory: Path, name: str) -> tuple[Path, Path]:
    """An RSA key pair (private, public PEM), e.g. for signing ServiceAccount tokens."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private, public = directory / f"{name}.key", directory / f"{name}.pub"
    _write_key(private, key)
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return private, public
