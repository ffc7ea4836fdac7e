"""RBAC as kube-apiserver authorizes with it (kubernetes `plugin/pkg/auth/authorizer/rbac/rbac.go`
and `pkg/apis/rbac/v1/evaluation_helpers.go`; the rule resolver, `pkg/registry/rbac/validation/rule.go`),
over the Roles, ClusterRoles and their bindings in the store, and the 403 a refusal answers
(`staging/src/k8s.io/apiserver/pkg/endpoints/handlers/responsewriters/errors.go` forbiddenMessage,
apimachinery `errors.NewForbidden`).

`decide` is pure: a request's attributes against the rules that apply to its user; `Authorizer`
reads those rules from the store for each request. Called by `api/rest.py` in outside mode.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from launcher.embedded.auth.identity import SERVICE_ACCOUNT_PREFIX, Attributes, Group, User
from launcher.embedded.types.errors import ApiError

RBAC_GROUP = "rbac.authorization.k8s.io"
ALL = "*"


class Kind(StrEnum):
    """What a binding's subject or roleRef names."""

    USER = "User"
    GROUP = "Group"
    SERVICE_ACCOUNT = "ServiceAccount"
    ROLE = "Role"
    CLUSTER_ROLE = "ClusterRole"


Rule = Mapping[str, Any]

# The bootstrap policy's non-resource rules every cluster has (kubernetes
# `plugin/pkg/auth/authorizer/rbac/bootstrappolicy/policy.go`): `system:public-info-viewer` for
# everyone, `system:discovery` for the authenticated. Built in rather than stored objects.
_PUBLIC_INFO = {
    "verbs": ["get"],
    "nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"],
}
_DISCOVERY = {
    "verbs": ["get"],
    "nonResourceURLs": [
        "/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*",
        "/readyz", "/version", "/version/",
    ],
}  # fmt: skip
_BOOTSTRAP: dict[str, tuple[Rule, ...]] = {
    Group.UNAUTHENTICATED: (_PUBLIC_INFO,),
    Group.AUTHENTICATED: (_PUBLIC_INFO, _DISCOVERY),
}


def _matches(values: Iterable[str], wanted: str) -> bool:
    return any(v in (ALL, wanted) for v in values)


def _resource_matches(rule: Rule, resource: str, subresource: str) -> bool:
    """ResourceMatches: the resource (with `/subresource`), `*`, or `*/subresource`."""
    combined = f"{resource}/{subresource}" if subresource else resource
    for r in rule.get("resources") or []:
        if r in (ALL, combined) or (subresource and r == f"*/{subresource}"):
            return True
    return False


def _url_matches(rule: Rule, path: str) -> bool:
    """NonResourceURLMatches: exact, `*`, or a prefix ending in `*`."""
    return any(
        u in (ALL, path) or (u.endswith("*") and path.startswith(u.rstrip("*")))
        for u in rule.get("nonResourceURLs") or []
    )


def rule_allows(attrs: Attributes, rule: Rule) -> bool:
    """RuleAllows: verb, API group, resource and resource name (an empty `resourceNames` allows
    every name; a request without a name, a create or a list without the name's field selector,
    matches no named rule), or for a non-resource request verb and path."""
    if not _matches(rule.get("verbs") or [], attrs.verb):
        return False
    if not attrs.resource_request:
        return _url_matches(rule, attrs.path)
    names = rule.get("resourceNames") or []
    return (
        _matches(rule.get("apiGroups") or [], attrs.group)
        and _resource_matches(rule, attrs.resource, attrs.subresource)
        and (not names or attrs.name in names)
    )


def applies_to(subject: Mapping[str, Any], user: User, binding_namespace: str) -> bool:
    """appliesTo (rule.go): a User by name, a Group by membership, a ServiceAccount by its user
    name (its namespace defaulting to the binding's)."""
    kind, name = subject.get("kind"), subject.get("name", "")
    if kind == Kind.USER:
        return user.name == name
    if kind == Kind.GROUP:
        return name in user.groups
    if kind == Kind.SERVICE_ACCOUNT:
        namespace = subject.get("namespace") or binding_namespace
        return user.name == f"{SERVICE_ACCOUNT_PREFIX}{namespace}:{name}"
    return False


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    reason: str = ""  # a refusal's: the role a binding names that is not there ("RBAC: ...")


# (Kind.ROLE or Kind.CLUSTER_ROLE, namespace or "", name) -> the role's rules, or None when absent.
RoleLookup = Callable[[str, str, str], "list[Rule] | None"]


def decide(
    user: User,
    attrs: Attributes,
    cluster_bindings: Iterable[Mapping[str, Any]],
    bindings: Iterable[Mapping[str, Any]],
    role_rules: RoleLookup,
) -> Verdict:
    """The RBAC authorizer's answer: allowed once any rule of a role bound to the user allows the
    request (ClusterRoleBindings everywhere, the request namespace's RoleBindings there), with the
    bootstrap policy's and the privileged group's; otherwise no, and the roles that bindings name
    but that are not there, as upstream's reason lists them."""
    if Group.MASTERS in user.groups:
        return Verdict(True)
    for group in user.groups:
        if any(rule_allows(attrs, r) for r in _BOOTSTRAP.get(group, ())):
            return Verdict(True)
    missing: list[str] = []
    scoped = [(b, "") for b in cluster_bindings]
    if attrs.namespace:
        scoped += [(b, attrs.namespace) for b in bindings]
    for binding, namespace in scoped:
        if not any(applies_to(s, user, namespace) for s in binding.get("subjects") or []):
            continue
        ref = binding.get("roleRef") or {}
        kind, name = ref.get("kind", ""), ref.get("name", "")
        rules = role_rules(kind, namespace if kind == Kind.ROLE else "", name)
        if rules is None:
            missing.append(f'{kind.lower()}.{RBAC_GROUP} "{name}" not found')
        elif any(rule_allows(attrs, r) for r in rules):
            return Verdict(True)
    if not missing:
        return Verdict(False)
    listed = missing[0] if len(missing) == 1 else "[" + ", ".join(missing) + "]"
    return Verdict(False, f"RBAC: {listed}")


def forbidden(user: User, attrs: Attributes, reason: str = "") -> ApiError:
    """403 Forbidden, as upstream's authorization filter writes it: `configmaps "w" is forbidden:
    User "system:serviceaccount:ns:sa" cannot watch resource "configmaps" in API group "" in the
    namespace "ns"`, the name left out when the request has none; for a path, `forbidden: User
    "system:anonymous" cannot get path "/api"`."""
    if not attrs.resource_request:
        why = f'User "{user.name}" cannot {attrs.verb} path "{attrs.path}"'
        return ApiError(403, "Forbidden", f"forbidden: {why}" + (f": {reason}" if reason else ""), details={})
    resource = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    scope = f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
    why = f'User "{user.name}" cannot {attrs.verb} resource "{resource}" in API group "{attrs.group}" {scope}'
    if reason:
        why = f"{why}: {reason}"
    qualified = f"{attrs.resource}.{attrs.group}" if attrs.group else attrs.resource
    target = f'{qualified} "{attrs.name}"' if attrs.name else qualified
    details = {"name": attrs.name, "group": attrs.group, "kind": attrs.resource}
    return ApiError(
        403, "Forbidden", f"{target} is forbidden: {why}", details={k: v for k, v in details.items() if v}
    )


class Authorizer:
    """`decide` over the store's RBAC objects, read at each request (outside mode only: the
    embedded cluster's own mode authorizes everything)."""

    def __init__(self, store: Any) -> None:
        from launcher.embedded.types.resources import RESOURCES

        self.store = store
        self.res = {k: RESOURCES[k] for k in ("roles", "rolebindings", "clusterroles", "clusterrolebindings")}

    def _rules(self, kind: str, namespace: str, name: str) -> list[Rule] | None:
        res = self.res["roles" if kind == Kind.ROLE else "clusterroles"]
        try:
            role = self.store.get(res, namespace or None, name)
        except ApiError as e:
            if e.code == 404:
                return None
            raise
        return list(role.get("rules") or [])

    def authorize(self, user: User, attrs: Attributes) -> None:
        """Return when allowed; raise the 403 otherwise."""
        if Group.MASTERS in user.groups:
            return
        cluster_bindings, _ = self.store.list(self.res["clusterrolebindings"])
        bindings = self.store.list(self.res["rolebindings"], attrs.namespace)[0] if attrs.namespace else []
        decision = decide(user, attrs, cluster_bindings, bindings, self._rules)
        if not decision.allowed:
            raise forbidden(user, attrs, decision.reason)
