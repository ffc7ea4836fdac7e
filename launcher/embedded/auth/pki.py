"""The outside-mode cluster's keys and certificates, as a cluster's control plane has them: a CA
(what its kubeconfig's `certificate-authority-data` and every pod's `ca.crt` trust), the API
server's serving certificate signed by it (for 127.0.0.1, localhost and the `kubernetes` Service's
DNS names), the service-account signing key, and the admin's bearer token. EC P-256 keys, made with
the cryptography package the first time a cluster starts in a folder and read back after (a
cluster with a state dir keeps its CA, so its kubeconfig stays good).

Called by `cluster.EmbeddedCluster` in outside mode.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import secrets
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from launcher.embedded.auth.tokens import Signer

_VALID = dt.timedelta(days=365)
# The names a pod may dial the API server by (the `kubernetes` Service's), as kube-apiserver's
# serving certificate carries them; the address is the one this machine's pods reach it at.
_DNS_NAMES = (
    "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)  # fmt: skip
_FILES = ("ca.crt", "apiserver.crt", "apiserver.key", "sa.key", "admin.token")


@dataclass(frozen=True)
class Pki:
    directory: Path

    @property
    def ca_file(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_pem(self) -> bytes:
        return self.ca_file.read_bytes()

    @property
    def admin_token(self) -> str:
        return (self.directory / "admin.token").read_text().strip()

    def signer(self) -> Signer:
        key = serialization.load_pem_private_key((self.directory / "sa.key").read_bytes(), None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        return Signer(key)

    def server_context(self) -> ssl.SSLContext:
        """TLS for the API server's listener (clients present no certificate: they send a token)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.directory / "apiserver.crt", self.directory / "apiserver.key")
        return context


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _certificate(
    subject: str, key: ec.EllipticCurvePrivateKey, issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None
) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    issuer_name, issuer_key = issuer or (name, key)
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALID)
    )
    if issuer is None:  # the CA
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
    else:
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in _DNS_NAMES]
        sans.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False).add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
    return builder.sign(issuer_key, hashes.SHA256())


def load_or_make(directory: Path) -> Pki:
    """The cluster's PKI in `directory`, made there first when it is not all there."""
    directory.mkdir(parents=True, exist_ok=True)
    if all((directory / f).exists() for f in _FILES):
        return Pki(directory)
    ca_key, server_key, sa_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca = _certificate("reslice-embedded-ca", ca_key, None)
    server = _certificate("kube-apiserver", server_key, (ca.subject, ca_key))
    files = {
        "ca.crt": ca.public_bytes(serialization.Encoding.PEM),
        "apiserver.crt": server.public_bytes(serialization.Encoding.PEM),
        "apiserver.key": _key_pem(server_key),
        "sa.key": _key_pem(sa_key),
        "admin.token": secrets.token_urlsafe(32).encode(),
    }
    for name, data in files.items():
        path = directory / name
        path.write_bytes(data)
        path.chmod(0o600 if name.endswith((".key", ".token")) else 0o644)
    return Pki(directory)
