"""The typed client calls of a namespace: create, delete, get and list what the launcher and the
controller act on, the run records (ConfigMaps, compare-and-swap) and the Leases. The LIST and WATCH
that feed the controller's caches are launcher/adapters/listwatch.py. Called by the commands, launch, the
controller, preflight and status; with listwatch.py, the only modules that talk to the API (core/errors.py
and core/inputs.py import only the client's exception types and `parse_quantity`).

Lists come back as plain dicts exactly as the API serves them (camelCase), so core/signals/ works on
the same objects a `kubectl get -o json` shows, and table tests can use realistic objects.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from launcher.adapters.listwatch import ListWatch
from launcher.core.errors import ClusterNotReady, UserError
from launcher.core.labels import API_VERSION, LABEL_RUN
from launcher.core.record import RunRecord

GROUP, VERSION = API_VERSION.split("/")
RECORD_KEY = "record.json"


class Conflict(Exception):
    """The object changed since it was read (409): re-read and decide again. Its `status` lets
    `kubernetes.utils.retry.retry_on_conflict` (client-go's RetryOnConflict) retry on it."""

    status = 409


class Forbidden(Exception):
    """403: these credentials may not read it (RBAC)."""


class Refused(Exception):
    """The API server refused a write: 403 (quota, policy, RBAC) or 422 (invalid)."""


def record_name(run: str) -> str:
    return f"reslice-{run}"


def load_api_client(kubeconfig: str | None = None, context: str | None = None) -> client.ApiClient | None:
    """In-cluster credentials, else a kubeconfig (argument, $KUBECONFIG, ~/.kube/config), else None."""
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        cfg = client.Configuration()
        config.load_incluster_config(client_configuration=cfg)
        return client.ApiClient(cfg)
    path = kubeconfig or os.environ.get("KUBECONFIG")
    if path is None and (Path.home() / ".kube" / "config").exists():
        path = str(Path.home() / ".kube" / "config")
    if path is None:
        return None
    if not Path(path).is_file():
        raise UserError(f"kubeconfig {path} does not exist or is not a file")
    cfg = client.Configuration()
    try:
        config.load_kube_config(config_file=path, context=context, client_configuration=cfg)
    except Exception as e:  # malformed YAML, no current context, a missing certificate file...
        raise UserError(f"kubeconfig {path} cannot be used: {' '.join(str(e).split())[:200]}") from None
    return client.ApiClient(cfg)


EMBEDDED_VERSION_SUFFIX = "-reslice-embedded"  # the embedded API server's gitVersion ends so


def is_embedded(api_client: client.ApiClient) -> bool:
    """Whether the server is the embedded cluster, asked of the server itself (GET /version), however
    its kubeconfig was found. An unreachable server raises ClusterNotReady (exit 1) here, before
    any command acts; a server that hides its version is not the embedded one."""
    import urllib3

    try:
        version = client.VersionApi(api_client).get_code(_request_timeout=15)
    except urllib3.exceptions.HTTPError as e:
        reason = " ".join(str(getattr(e, "reason", None) or e).split())[:200]
        raise ClusterNotReady(
            f"the cluster at {api_client.configuration.host} is unreachable: {reason}"
        ) from None
    except ApiException:
        return False
    return str(version.git_version or "").endswith(EMBEDDED_VERSION_SUFFIX)


def record_of(cm: dict) -> tuple[RunRecord, str]:
    """A run record's ConfigMap (a plain dict, as a list or watch serves it) -> (record, version)."""
    return RunRecord.from_json(cm["data"][RECORD_KEY]), cm["metadata"]["resourceVersion"]


def _now() -> datetime:
    return datetime.now(UTC)


class Kube:
    """A namespace of one cluster, through the official client."""

    def __init__(self, api_client: client.ApiClient, namespace: str = "default") -> None:
        self.api_client = api_client
        self.namespace = namespace
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        # LIST and WATCH for the controller's caches (launcher/adapters/informer.py) and its uncached pass.
        self.lists = ListWatch(api_client, namespace)
        # Lease name -> the Lease as we last wrote it: a renewal is then one PUT, not a GET and a PUT.
        self._leases: dict[str, client.V1Lease] = {}

    # --- reads (raw dicts) ---------------------------------------------------------------------

    def _raw(self, fn: Callable, *args, **kwargs) -> dict:
        resp = fn(*args, _preload_content=False, **kwargs)
        return json.loads(resp.data)

    def jobsets(self, run: str | None = None) -> list[dict]:
        selector = f"{LABEL_RUN}={run}" if run else LABEL_RUN
        got: Any = self.custom.list_namespaced_custom_object(  # the client types custom objects `object`
            GROUP, VERSION, self.namespace, "jobsets", label_selector=selector
        )
        return got["items"]

    def pods(self, label_selector: str | None = None) -> list[dict]:
        return self._raw(self.core.list_namespaced_pod, self.namespace, label_selector=label_selector)[
            "items"
        ]

    def nodes(self) -> list[dict]:
        return self._raw(self.core.list_node)["items"]

    def events(self) -> list[dict]:
        return self._raw(self.core.list_namespaced_event, self.namespace)["items"]

    def get(self, path: str) -> dict | None:
        """GET an API path (`/apis/apps/v1/namespaces/x/deployments/y`, a discovery document, any
        path the server serves) as plain JSON; None when the server answers 404."""
        method, url, headers, body, post = self.api_client.param_serialize(
            "GET", path, header_params={"Accept": "application/json"}, auth_settings=["BearerToken"]
        )
        resp = self.api_client.call_api(method, url, headers, body, post)
        data: bytes = resp.read()
        if resp.status == 404:
            return None
        if resp.status == 403:
            raise Forbidden(f"GET {path}: {_status_message(data)}")
        if resp.status >= 400:
            raise ApiException(status=resp.status, reason=_status_message(data))
        return json.loads(data)

    def namespace_exists(self) -> bool:
        """False only when the server says the namespace is not there (a client that may not read
        namespaces finds out at its first create)."""
        try:
            return self.get(f"/api/v1/namespaces/{self.namespace}") is not None
        except Forbidden:
            return True

    # --- pods of our own (the preflight write probe) -------------------------------------------

    def create_pod(self, pod: dict) -> dict:
        """Create; a refusal raises Refused with the API server's words."""
        try:
            return self._raw(self.core.create_namespaced_pod, self.namespace, pod)
        except ApiException as e:
            if e.status in (403, 422):
                raise Refused(_message(e)) from None
            raise

    def pod(self, name: str) -> dict | None:
        try:
            return self._raw(self.core.read_namespaced_pod, name, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def pod_log(self, name: str, container: str) -> str:
        try:
            return self.core.read_namespaced_pod_log(name, self.namespace, container=container)
        except ApiException:
            return ""  # gone, or never started: the caller reports what the pod's status says

    def delete_pod(self, name: str) -> None:
        try:
            self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
        except ApiException as e:
            if e.status != 404:
                raise

    def delete_pods_now(self, label_selector: str) -> None:
        """Delete the selected pods with a zero grace period: SIGKILL, no SIGTERM save (the
        kubelet still gives a container its minimum grace period on a real node; docs/design.md)."""
        self.core.delete_collection_namespaced_pod(
            self.namespace, label_selector=label_selector, grace_period_seconds=0
        )

    # --- in-place runs: the world and who may read it ---------------------------------------

    def ensure_objects(self, objects: list[dict]) -> None:
        """Create each object (ServiceAccount, Role, RoleBinding); one that exists is left as it is
        (a create retried after a crash: idempotent)."""
        rbac = client.RbacAuthorizationV1Api(self.api_client)
        create: dict[str, Callable[..., Any]] = {
            "ServiceAccount": self.core.create_namespaced_service_account,
            "Role": rbac.create_namespaced_role,
            "RoleBinding": rbac.create_namespaced_role_binding,
        }
        for obj in objects:
            try:
                create[obj["kind"]](self.namespace, obj)
            except ApiException as e:
                if e.status != 409:
                    raise

    def world(self, name: str) -> dict | None:
        """The world ConfigMap `name` as a dict, or None."""
        try:
            return self._raw(self.core.read_namespaced_config_map, name, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def create_world(self, cm: dict) -> tuple[dict, bool]:
        """Create the (empty) world ConfigMap `cm`: (the ConfigMap as the API server has it, with its
        uid; whether this call created it). One that exists is read instead (a launch retried)."""
        try:
            return self._raw(self.core.create_namespaced_config_map, self.namespace, cm), True
        except ApiException as e:
            if e.status != 409:
                raise
        got = self.world(cm["metadata"]["name"])
        if got is None:  # deleted between the two calls: a conflict with whoever deleted it
            raise Conflict(cm["metadata"]["name"])
        return got, False

    def delete_world(self, name: str) -> bool:
        """Delete the world ConfigMap `name` (the objects it owns follow: the garbage collector).
        False if it was gone."""
        try:
            self.core.delete_namespaced_config_map(name, self.namespace)
            return True
        except ApiException as e:
            if e.status == 404:
                return False
            raise

    def publish_world(self, cm: dict, resource_version: str | None) -> None:
        """Write the whole world ConfigMap in one request: create it, or replace the version read
        (a Conflict if someone changed it since)."""
        name = cm["metadata"]["name"]
        try:
            if resource_version is None:
                self.core.create_namespaced_config_map(self.namespace, cm)  # type: ignore[arg-type]  # a dict body is sent as it is; the annotation names only the model
            else:
                body = {**cm, "metadata": {**cm["metadata"], "resourceVersion": resource_version}}
                self.core.replace_namespaced_config_map(name, self.namespace, body)  # type: ignore[arg-type]  # a dict body, as above
        except ApiException as e:
            if e.status == 409:
                raise Conflict(name) from None
            raise

    # --- JobSets -------------------------------------------------------------------------------

    def create_jobset(self, jobset: dict) -> dict | None:
        """Create; the created JobSet, or None if it already exists (a create is retried after a
        crash: idempotent)."""
        try:
            created: Any = (
                self.custom.create_namespaced_custom_object(  # the client types custom objects `object`
                    GROUP, VERSION, self.namespace, "jobsets", jobset
                )
            )
            return created
        except ApiException as e:
            if e.status == 409:
                return None
            if e.status in (400, 422):  # invalid, or a webhook that cannot decode it: retrying cannot help
                raise UserError(
                    f"the cluster rejected JobSet {jobset['metadata']['name']}: {_message(e)}"
                ) from None
            raise

    def delete_jobset(self, name: str) -> bool:
        """Delete with background propagation: pods get their grace period (the trainer saves)."""
        try:
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "jobsets", name, propagation_policy="Background"
            )
            return True
        except ApiException as e:
            if e.status == 404:
                return False
            raise

    # --- the run record (ConfigMap, compare-and-swap) --------------------------------------------

    def get_record(self, run: str) -> tuple[RunRecord, str] | None:
        try:
            cm = self.core.read_namespaced_config_map(record_name(run), self.namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        if not cm.data or RECORD_KEY not in cm.data:
            raise UserError(f"ConfigMap {record_name(run)} is not a run record: it has no {RECORD_KEY!r}")
        return RunRecord.from_json(cm.data[RECORD_KEY]), _version(cm)

    def create_record(self, rec: RunRecord) -> str:
        body = client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=record_name(rec.name), labels={LABEL_RUN: rec.name}),
            data={RECORD_KEY: rec.to_json()},
        )
        try:
            return _version(self.core.create_namespaced_config_map(self.namespace, body))
        except ApiException as e:
            if e.status == 409:
                raise UserError(f"run {rec.name!r} already exists (reslice status {rec.name})") from None
            raise

    def update_record(self, rec: RunRecord, resource_version: str) -> str:
        """Write `rec` if the record is still at `resource_version`; raise Conflict otherwise."""
        body = client.V1ConfigMap(
            metadata=client.V1ObjectMeta(
                name=record_name(rec.name), labels={LABEL_RUN: rec.name}, resource_version=resource_version
            ),
            data={RECORD_KEY: rec.to_json()},
        )
        try:
            return _version(
                self.core.replace_namespaced_config_map(record_name(rec.name), self.namespace, body)
            )
        except ApiException as e:
            if e.status == 409:
                raise Conflict(record_name(rec.name)) from None
            raise

    def records(self) -> list[RunRecord]:
        cms = self.core.list_namespaced_config_map(self.namespace, label_selector=LABEL_RUN).items
        return [RunRecord.from_json(cm.data[RECORD_KEY]) for cm in cms if cm.data and RECORD_KEY in cm.data]

    def delete_record(self, run: str) -> None:
        try:
            self.core.delete_namespaced_config_map(record_name(run), self.namespace)
        except ApiException as e:
            if e.status != 404:
                raise

    # --- leases --------------------------------------------------------------------------------

    def acquire_lease(self, name: str, holder: str, duration_s: int) -> tuple[bool, str | None]:
        """Take or renew Lease `name` for `holder`. Returns (held, previous holder if taken over).

        A lease is free when it has no holder or its last renewal is older than its duration. Every
        write is a compare-and-swap, so two candidates never both win.
        """
        now = _now()
        mine = self._leases.pop(name, None)
        if mine is not None and mine.spec is not None and mine.spec.holder_identity == holder:
            mine.spec.renew_time, mine.spec.lease_duration_seconds = now, duration_s
            try:
                self._leases[name] = self.coordination.replace_namespaced_lease(name, self.namespace, mine)
                return True, None
            except ApiException as e:
                if e.status != 409:
                    raise
                # Changed behind our back (released, taken over): read it and decide as below.
        try:
            lease = self.coordination.read_namespaced_lease(name, self.namespace)
        except ApiException as e:
            if e.status != 404:
                raise
            body = client.V1Lease(
                metadata=client.V1ObjectMeta(name=name),
                spec=client.V1LeaseSpec(
                    holder_identity=holder, lease_duration_seconds=duration_s, acquire_time=now, renew_time=now,
                    lease_transitions=0,
                ),
            )  # fmt: skip
            try:
                self._leases[name] = self.coordination.create_namespaced_lease(self.namespace, body)
                return True, None
            except ApiException as e2:
                if e2.status == 409:
                    return False, None
                raise
        # A Lease written by something else may have no spec: it is free, and this write gives it one.
        spec = lease.spec = lease.spec or client.V1LeaseSpec()
        previous = spec.holder_identity
        renewed = spec.renew_time or spec.acquire_time
        expired = renewed is None or now - renewed > timedelta(
            seconds=spec.lease_duration_seconds or duration_s
        )
        if previous not in (None, "", holder) and not expired:
            return False, None
        taken_over = previous if previous not in (None, "", holder) else None
        if previous != holder:
            spec.acquire_time = now
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        spec.holder_identity, spec.renew_time, spec.lease_duration_seconds = holder, now, duration_s
        try:
            self._leases[name] = self.coordination.replace_namespaced_lease(name, self.namespace, lease)
        except ApiException as e:
            if e.status == 409:
                return False, None
            raise
        return True, taken_over

    def lease_holder(self, name: str) -> str | None:
        """Who holds Lease `name` now (None when free, expired or absent)."""
        try:
            lease = self.coordination.read_namespaced_lease(name, self.namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return _live_holder(lease)

    def live_lease_holders(self, exclude: str | None = None) -> set[str]:
        """Holders of unexpired reslice run Leases in the namespace: the controllers running now."""
        leases = self.coordination.list_namespaced_lease(self.namespace).items
        holders = {
            _live_holder(lease)
            for lease in leases
            if (name := (lease.metadata.name if lease.metadata else None) or "").startswith("reslice-")
            and name.endswith("-controller")
        }
        return {h for h in holders if h and h != exclude}

    def release_lease(self, name: str, holder: str) -> None:
        self._leases.pop(name, None)
        try:
            lease = self.coordination.read_namespaced_lease(name, self.namespace)
            if lease.spec is not None and lease.spec.holder_identity == holder:
                lease.spec.holder_identity = None
                self.coordination.replace_namespaced_lease(name, self.namespace, lease)
        except ApiException:
            pass  # best effort: an unreleased lease simply expires


def _version(obj: client.V1ConfigMap) -> str:
    """The resourceVersion of an object the server returned: the client's models make every field
    Optional, and a server always sets this one."""
    if obj.metadata is None or not obj.metadata.resource_version:
        raise ApiException(status=500, reason="the server returned a ConfigMap without a resourceVersion")
    return obj.metadata.resource_version


def _status_message(data: bytes) -> str:
    try:
        return json.loads(data).get("message") or data.decode(errors="replace")
    except (TypeError, ValueError, AttributeError):
        return data.decode(errors="replace") if isinstance(data, bytes) else str(data)


def _message(e: ApiException) -> str:
    try:
        return json.loads(e.body or "").get("message", e.reason)
    except (TypeError, ValueError):
        return str(e.reason)


def _live_holder(lease: client.V1Lease) -> str | None:
    spec = lease.spec
    if spec is None:
        return None
    renewed = spec.renew_time or spec.acquire_time
    if not spec.holder_identity or renewed is None:
        return None
    if _now() - renewed > timedelta(seconds=spec.lease_duration_seconds or 0):
        return None
    return spec.holder_identity
