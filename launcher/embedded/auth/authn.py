"""Authentication in outside mode: who a request's `Authorization: Bearer` header says it is, as
kube-apiserver's authenticators answer (a token they do not take is 401 `Unauthorized`, whatever
the reason, which only the server's log says; no header is the anonymous user).

The admin's static token is the kubeconfig's (the API server's `--token-auth-file`); a
service-account token must be one this cluster signed (`tokens.Signer`), in its time and for its
audience, and what it is bound to must still be there: its ServiceAccount and pod, with the UIDs
the token names, neither deleted more than the leeway ago (kubernetes `pkg/serviceaccount/claims.go`
`Validate`). Called by `api/apiserver.py` for every request.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from launcher.core import rfc3339
from launcher.embedded.auth.identity import ADMIN, ANONYMOUS, User, service_account_user
from launcher.embedded.auth.tokens import LEEWAY_S, InvalidToken, Signer, check_times, claims_for
from launcher.embedded.types.errors import ApiError
from launcher.embedded.types.resources import RESOURCES

log = logging.getLogger(__name__)


def unauthorized() -> ApiError:
    """apimachinery `errors.NewUnauthorized("Unauthorized")`, what the authentication filter sends."""
    return ApiError(401, "Unauthorized", "Unauthorized")


def _deleted_long_ago(obj: Mapping[str, Any], now: float) -> bool:
    """Deleted (a deletionTimestamp) more than the leeway before now: its tokens no longer hold."""
    stamp = (obj.get("metadata") or {}).get("deletionTimestamp")
    when = rfc3339.parse(stamp) if stamp else None
    return when is not None and when.timestamp() < now - LEEWAY_S


class Authenticator:
    def __init__(
        self, store: Any, signer: Signer, admin_token: str, clock: Callable[[], float] = time.time
    ) -> None:
        self.store, self.signer, self.admin_token, self.clock = store, signer, admin_token, clock

    def authenticate(self, header: str | None) -> User:
        """The request's user; raises the 401 for a token this cluster does not take."""
        if not header:
            return ANONYMOUS
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise unauthorized()
        if hmac.compare_digest(token.encode(), self.admin_token.encode()):
            return ADMIN
        try:
            return self._service_account(token)
        except InvalidToken as e:
            log.info("refused a bearer token: %s", e)  # the client sees "Unauthorized" only
            raise unauthorized() from None

    def _service_account(self, token: str) -> User:
        claims = self.signer.verify(token)
        now = self.clock()
        check_times(claims, now)
        private = claims.get("kubernetes.io") or {}
        namespace, account = private.get("namespace", ""), private.get("serviceaccount") or {}
        sa = self._get("serviceaccounts", namespace, account.get("name", ""))
        if sa is None or _deleted_long_ago(sa, now):
            raise InvalidToken(f"service account {namespace}/{account.get('name')} has been deleted")
        if sa["metadata"]["uid"] != account.get("uid"):
            raise InvalidToken("service account UID does not match the token's")
        if (bound := private.get("pod")) is not None:
            pod = self._get("pods", namespace, bound.get("name", ""))
            if pod is None or _deleted_long_ago(pod, now) or pod["metadata"]["uid"] != bound.get("uid"):
                raise InvalidToken("service account token has been invalidated (its pod is gone)")
        return service_account_user(namespace, sa["metadata"]["name"])

    def _get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        if not namespace or not name:
            return None
        try:
            return self.store.get(RESOURCES[plural], namespace, name)
        except ApiError as e:
            if e.code == 404:
                return None
            raise


class TokenIssuer:
    """What the `serviceaccounts/token` subresource (TokenRequest) answers a kubelet: a token for
    a pod's ServiceAccount, bound to the pod. Here the kubelet calls it in process."""

    def __init__(self, store: Any, signer: Signer, clock: Callable[[], float] = time.time) -> None:
        self.store, self.signer, self.clock = store, signer, clock

    def issue(self, namespace: str, account: str, pod: Mapping[str, Any], expiration_s: int) -> str:
        """LookupError (the API's words) when the ServiceAccount is not there."""
        try:
            sa = self.store.get(RESOURCES["serviceaccounts"], namespace, account)
        except ApiError as e:
            if e.code == 404:
                raise LookupError(e.message) from None
            raise
        return self.signer.sign(claims_for(namespace, sa, pod, self.clock(), expiration_s))
