"""Mutual TLS between a cluster's nodes, under a private cluster CA.

``issue_cluster_tls(directory, regions, hosts)`` makes a CA (``ca.pem``, ``ca-key.pem``) and,
per region, a certificate and key (``<region>.pem``, ``<region>-key.pem``) signed by it, valid
for server and client authentication, with the region's name and ``hosts`` (names and IP
addresses) as subject alternative names, and the region's identity as a URI subject alternative
name (``urn:convplane:region:<region>``, ``region_of_certificate``). Keys are written 0600, the
directory 0700.

A node given ``tls_ca_file``, ``tls_cert_file`` and ``tls_key_file`` (``NodeSettings``) serves its
peer listener over TLS and requires a client certificate signed by the CA
(``server_ssl_context``), and presents its own certificate on every peer call, verifying the
peer's against the CA and its address (``client_ssl_context``): a process without a certificate
from the cluster's CA can neither probe, answer probes nor forward, and nothing between regions
(bearer keys, the peer secret) crosses in clear. A certificate speaks for one region only: the
peer listener (``services.bootstrap.listener_gates.PeerListenerGate``) takes a caller for the region its
certificate's identity names, and refuses a request that claims another; a certificate without
a region identity (``issue_certificate``'s without ``region``, a database server's) speaks
for none.

EC P-256 keys; the CA's validity is ``CA_VALIDITY_DAYS``, a node's ``NODE_VALIDITY_DAYS``.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

if TYPE_CHECKING:
    from services.config import NodeSettings

CA_VALIDITY_DAYS = 3650
#: a region certificate's identity: this prefix and the region's name, as a URI SAN
REGION_URI_PREFIX = "urn:convplane:region:"
NODE_VALIDITY_DAYS = 825
#: tolerated clock skew between the machine that issues and those that verify
NOT_BEFORE_SKEW = datetime.timedelta(minutes=5)


@dataclass(frozen=True, slots=True)
class NodeTls:
    """The files one node needs."""

    ca_file: Path
    cert_file: Path
    key_file: Path


def issue_cluster_tls(
    directory: Path,
    regions: Iterable[str],
    hosts: Iterable[str],
    *,
    cluster_name: str = "convplane",
    hosts_of: Mapping[str, Iterable[str]] | None = None,
) -> dict[str, NodeTls]:
    """A fresh CA and one certificate per region, under ``directory`` (module docstring);
    ``hosts_of``: names only one region's certificate carries (its node's host name)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    directory.chmod(0o700)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _ca_certificate(ca_key, cluster_name)
    ca_file = directory / "ca.pem"
    _write(ca_file, ca_cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
    _write(directory / "ca-key.pem", _key_pem(ca_key), mode=0o600)
    host_list = list(hosts)
    issued = {}
    for region in regions:
        key = ec.generate_private_key(ec.SECP256R1())
        names = [region, *host_list, *(hosts_of or {}).get(region, ())]
        cert = node_certificate(ca_key, ca_cert, region, names, key.public_key(), region=region)
        cert_file, key_file = directory / f"{region}.pem", directory / f"{region}-key.pem"
        _write(cert_file, cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
        _write(key_file, _key_pem(key), mode=0o600)
        issued[region] = NodeTls(ca_file, cert_file, key_file)
    return issued


def issue_certificate(
    directory: Path, name: str, hosts: Iterable[str], *, region: str | None = None
) -> NodeTls:
    """One more certificate under the CA that ``issue_cluster_tls`` made in ``directory`` (a
    database server's, say), for ``name`` and ``hosts``; ``region``: the region it speaks for
    (a region's certificate issued again for more hosts), none if None."""
    ca_cert = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((directory / "ca-key.pem").read_bytes(), None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{directory / 'ca-key.pem'} is not the EC key this module writes")
    key = ec.generate_private_key(ec.SECP256R1())
    cert = node_certificate(ca_key, ca_cert, name, [name, *hosts], key.public_key(), region=region)
    cert_file, key_file = directory / f"{name}.pem", directory / f"{name}-key.pem"
    _write(cert_file, cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
    _write(key_file, _key_pem(key), mode=0o600)
    return NodeTls(directory / "ca.pem", cert_file, key_file)


def certificate_hosts(cert_file: Path) -> set[str]:
    """The DNS names and IP addresses the certificate in ``cert_file`` is valid for."""
    cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
    try:
        alt_names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    addresses = alt_names.get_values_for_type(x509.IPAddress)
    return {*alt_names.get_values_for_type(x509.DNSName), *(str(a) for a in addresses)}


def node_certificate(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    common_name: str,
    names: Iterable[str],
    public_key: ec.EllipticCurvePublicKey,
    *,
    region: str | None = None,
) -> x509.Certificate:
    """A certificate for a node: server and client auth, ``names`` as DNS names or IPs;
    ``region``: the region it speaks for (``region_of_certificate``), none if None."""
    now = datetime.datetime.now(datetime.UTC)
    alt_names: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):
        try:
            alt_names.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt_names.append(x509.DNSName(name))
    if region is not None:
        alt_names.append(x509.UniformResourceIdentifier(REGION_URI_PREFIX + region))
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - NOT_BEFORE_SKEW)
        .not_valid_after(now + datetime.timedelta(days=NODE_VALIDITY_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(_key_usage(digital_signature=True, key_agreement=True), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False)
        .sign(ca_key, hashes.SHA256())
    )


def node_tls(settings: NodeSettings) -> NodeTls | None:
    """The node's TLS files, when its settings name them."""
    if settings.tls_ca_file is None or settings.tls_cert_file is None:
        return None
    assert settings.tls_key_file is not None  # NodeSettings checks all three or none
    return NodeTls(settings.tls_ca_file, settings.tls_cert_file, settings.tls_key_file)


def server_ssl_context(tls: NodeTls) -> ssl.SSLContext:
    """For the peer listener: present our certificate, require one from the CA."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(tls.ca_file))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def region_of_certificate(peer_certificate: Mapping[str, Any] | None) -> str | None:
    """The region a verified peer certificate (``SSLObject.getpeercert()``) speaks for: its one
    ``urn:convplane:region:`` URI name; None without exactly one."""
    alt_names = (peer_certificate or {}).get("subjectAltName", ())
    regions = [
        value.removeprefix(REGION_URI_PREFIX)
        for kind, value in alt_names
        if kind == "URI" and value.startswith(REGION_URI_PREFIX)
    ]
    return regions[0] if len(regions) == 1 and regions[0] else None


def client_ssl_context(tls: NodeTls) -> ssl.SSLContext:
    """For peer calls: verify the peer against the CA (and its address), present our own."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(tls.ca_file))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    return context


def _ca_certificate(key: ec.EllipticCurvePrivateKey, cluster_name: str) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{cluster_name} cluster CA")])
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - NOT_BEFORE_SKEW)
        .not_valid_after(now + datetime.timedelta(days=CA_VALIDITY_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            _key_usage(digital_signature=True, key_cert_sign=True, crl_sign=True), critical=True
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )


def _key_usage(**granted: bool) -> x509.KeyUsage:
    flags = dict.fromkeys(
        (
            "digital_signature",
            "content_commitment",
            "key_encipherment",
            "data_encipherment",
            "key_agreement",
            "key_cert_sign",
            "crl_sign",
            "encipher_only",
            "decipher_only",
        ),
        False,
    )
    return x509.KeyUsage(**{**flags, **granted})


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, *, mode: int) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "wb") as file:
        file.write(data)
    tmp.replace(path)
