"""Who a request is and what it asks: the API server's `user.Info` and `authorizer.Attributes`
(kubernetes `staging/src/k8s.io/apiserver/pkg/authentication/user`, `.../authorization/authorizer`).
Pure. Made by `authn.py` (who) and `api/rest.py` (what); read by `rbac.py`."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Group(StrEnum):
    """The groups the API server gives a user itself (`user.AllAuthenticated` and its kin)."""

    MASTERS = "system:masters"  # unlimited: kube-apiserver's privileged group
    AUTHENTICATED = "system:authenticated"
    UNAUTHENTICATED = "system:unauthenticated"
    SERVICE_ACCOUNTS = "system:serviceaccounts"


SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:"


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...]


ANONYMOUS = User("system:anonymous", (Group.UNAUTHENTICATED,))
# The kubeconfig's user: the cluster's admin, as a GKE cluster's creator is through its IAM role.
ADMIN = User("reslice-admin", (Group.MASTERS, Group.AUTHENTICATED))


def service_account_user(namespace: str, name: str) -> User:
    """`system:serviceaccount:NS:NAME` in its groups (apiserver `serviceaccount.UserInfo`)."""
    return User(
        f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}",
        (Group.SERVICE_ACCOUNTS, f"{Group.SERVICE_ACCOUNTS}:{namespace}", Group.AUTHENTICATED),
    )


@dataclass(frozen=True)
class Attributes:
    """What one request asks, as RBAC matches it: a resource request (verb, API group, resource,
    subresource, namespace, name: for list and watch, the `metadata.name` field selector's name)
    or a non-resource one (verb, path)."""

    verb: str
    path: str = ""
    resource_request: bool = False
    group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
