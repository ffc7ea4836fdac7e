"""Service-account tokens as kube-apiserver issues and checks them: JWTs signed by the cluster's
service-account key (ES256 here), with the bound claims of kubernetes `pkg/serviceaccount/claims.go`
(`sub` system:serviceaccount:NS:NAME, `aud`, `iat`/`nbf`/`exp`, and `kubernetes.io` naming the
namespace, the service account and the pod the token is bound to, with their UIDs).

`claims_for` and `check_times` are pure; `Signer` signs and verifies with the cryptography package.
The kubelet asks for a pod's token (`kubelet/volumes.py`, what TokenRequest answers upstream);
`authn.py` checks one on every request that carries it.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature, encode_dss_signature

# The issuer and audience of a cluster whose API server runs with its defaults
# (`--service-account-issuer`, `--api-audiences` default to the issuer): a token for any other
# audience is not one the API server takes.
ISSUER = "https://kubernetes.default.svc.cluster.local"
# go-jose's jwt.DefaultLeeway, which `claims.go` validates `exp` and `nbf` with.
LEEWAY_S = 60
_P256_BYTES = 32


class InvalidToken(Exception):
    """Not a token this cluster issued, or one that no longer holds (the reason, for the log)."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def claims_for(
    namespace: str,
    account: Mapping[str, Any],
    pod: Mapping[str, Any] | None,
    now: float,
    expiration_s: int,
    audiences: tuple[str, ...] = (ISSUER,),
) -> dict[str, Any]:
    """The claims of a token for `account` (a ServiceAccount as stored), bound to `pod` when given."""
    sa_meta = account["metadata"]
    private: dict[str, Any] = {
        "namespace": namespace,
        "serviceaccount": {"name": sa_meta["name"], "uid": sa_meta["uid"]},
    }
    if pod is not None:
        private["pod"] = {"name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
    issued = int(now)
    return {
        "aud": list(audiences),
        "exp": issued + expiration_s,
        "iat": issued,
        "iss": ISSUER,
        "nbf": issued,
        "sub": f"system:serviceaccount:{namespace}:{sa_meta['name']}",
        "kubernetes.io": private,
    }


def check_times(claims: Mapping[str, Any], now: float) -> None:
    """`exp` and `nbf` within the leeway, the issuer ours, our audience among the token's."""
    if claims.get("iss") != ISSUER:
        raise InvalidToken(f"issuer {claims.get('iss')!r} is not this cluster's")
    audiences = claims.get("aud")
    if ISSUER not in (audiences if isinstance(audiences, list) else [audiences]):
        raise InvalidToken("token audiences do not include this API server's")
    exp, nbf = claims.get("exp"), claims.get("nbf")
    if not isinstance(exp, int | float) or now > exp + LEEWAY_S:
        raise InvalidToken("service account token has expired")
    if isinstance(nbf, int | float) and now < nbf - LEEWAY_S:
        raise InvalidToken("service account token is not valid yet")


class Signer:
    """The cluster's service-account signing key (the API server's `--service-account-signing-key-file`)."""

    def __init__(self, key: ec.EllipticCurvePrivateKey) -> None:
        self.key = key
        public = key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        # As upstream derives it: the key's SHA-256, unpadded base64url (`keyIDFromPublicKey`).
        self.kid = _b64(hashlib.sha256(public).digest())

    def sign(self, claims: Mapping[str, Any]) -> str:
        header = {"alg": "ES256", "kid": self.kid}
        signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
        r, s = decode_dss_signature(self.key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
        raw = r.to_bytes(_P256_BYTES, "big") + s.to_bytes(_P256_BYTES, "big")
        return f"{signing_input}.{_b64(raw)}"

    def verify(self, token: str) -> dict[str, Any]:
        """The claims of a token this key signed; InvalidToken for anything else."""
        try:
            head, body, sig = token.split(".")
            header = json.loads(_unb64(head))
            raw = _unb64(sig)
        except ValueError:
            raise InvalidToken("not a JWT") from None
        if header.get("alg") != "ES256" or header.get("kid") != self.kid or len(raw) != 2 * _P256_BYTES:
            raise InvalidToken("not signed by this cluster's key")
        signature = encode_dss_signature(
            int.from_bytes(raw[:_P256_BYTES], "big"), int.from_bytes(raw[_P256_BYTES:], "big")
        )
        try:
            self.key.public_key().verify(signature, f"{head}.{body}".encode(), ec.ECDSA(hashes.SHA256()))
            claims = json.loads(_unb64(body))
        except (InvalidSignature, ValueError):
            raise InvalidToken("not signed by this cluster's key") from None
        if not isinstance(claims, dict):
            raise InvalidToken("not a JWT")
        return claims
