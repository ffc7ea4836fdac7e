"""A container's environment and argv, as the kubelet computes them — plus the embedded cluster's two
local rewrites (docs/contract.md): JAX on CPU with the devices of the pod's chips, and pod hostnames
of the same JobSet resolved on loopback: `host:port` to 127.0.0.1 on a port chosen per (JobSet uid,
restart attempt, port), a bare `host` to that pod's own loopback address (`AddressMap`).

Pure apart from `PortMap`, which asks the OS for free ports, and `AddressMap`, which draws addresses.
"""

from __future__ import annotations

import ipaddress
import random
import re
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from launcher.embedded.types import objects

LOOPBACK = "127.0.0.1"
_FIELD = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.\-]*)\)")


def expand(s: str, env: Mapping[str, str]) -> str:
    """Kubernetes $(VAR) expansion: defined names are replaced, undefined ones left as written,
    and $$ escapes a dollar."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env[name] if name in env else m.group(0)

    return _VAR.sub(sub, s)


def field_value(pod: Mapping[str, Any], path: str, pod_ip: str = LOOPBACK) -> str:
    """Downward API fieldRef (`pod_ip`: the address `AddressMap` gave the pod)."""
    m = objects.meta(pod)
    simple = {
        "metadata.name": m.get("name"),
        "metadata.namespace": m.get("namespace"),
        "metadata.uid": m.get("uid"),
        "spec.nodeName": (pod.get("spec") or {}).get("nodeName"),
        "spec.serviceAccountName": (pod.get("spec") or {}).get("serviceAccountName"),
        "status.hostIP": "127.0.0.1",
        "status.hostIPs": "127.0.0.1",
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
    }
    if path in simple:
        return str(simple[path] or "")
    fm = _FIELD.match(path)
    if fm:
        src = objects.labels(pod) if fm.group(1) == "labels" else objects.annotations(pod)
        return str(src.get(fm.group(2), ""))
    raise ValueError(f"unsupported fieldRef {path!r}")


def resource_value(container: Mapping[str, Any], node: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    """Downward API resourceFieldRef (limits.x / requests.x; an unset limit is the node's allocatable)."""
    from launcher.core.podfit import quantity

    kind, _, res = (ref.get("resource") or "").partition(".")
    r = container.get("resources") or {}
    v = (r.get(kind) or {}).get(res)
    if v is None:
        v = ((node.get("status") or {}).get("allocatable") or {}).get(res, 0)
    div = quantity(ref.get("divisor") or 1)
    q = quantity(v) / div
    return str(int(q) if q == int(q) else int(q) + 1)


class ContainerConfigError(Exception):
    """CreateContainerConfigError: the pod stays Pending with this message (`reason`: the waiting
    reason the kubelet reports, e.g. ErrImageNeverPull for an image not there to run)."""

    def __init__(self, message: str, reason: str = "CreateContainerConfigError") -> None:
        super().__init__(message)
        self.reason = reason


def _env_name(name: str) -> str:
    """envvars.go makeEnvVariableName: upper case, `.` and `-` as `_`, a leading digit prefixed."""
    out = name.upper().replace(".", "_").replace("-", "_")
    return f"_{out}" if out[:1].isdigit() else out


def _service_vars(svc: Mapping[str, Any]) -> dict[str, str]:
    """One Service's variables (envvars.go FromServices and makeLinkVariables)."""
    prefix, spec = _env_name(objects.meta(svc)["name"]), svc.get("spec") or {}
    ip, ports = spec["clusterIP"], spec.get("ports") or []
    host = f"[{ip}]" if ":" in ip else ip  # net.JoinHostPort
    env = {f"{prefix}_SERVICE_HOST": ip}
    for i, p in enumerate(ports):
        proto = str(p.get("protocol") or "TCP")
        port, url = str(p["port"]), f"{proto.lower()}://{host}:{p['port']}"
        if i == 0:
            env[f"{prefix}_SERVICE_PORT"] = port
            env[f"{prefix}_PORT"] = url
        if p.get("name"):
            env[f"{prefix}_SERVICE_PORT_{_env_name(p['name'])}"] = port
        each = f"{prefix}_PORT_{port}_{proto.upper()}"
        env.update({each: url, f"{each}_PROTO": proto.lower(), f"{each}_PORT": port, f"{each}_ADDR": ip})
    return env


def service_env(services: Iterable[Mapping[str, Any]], namespace: str, links: bool) -> dict[str, str]:
    """The Service variables the kubelet gives every container (pkg/kubelet/kubelet_pods.go
    getServiceEnvVarMap): the `kubernetes` Service of `default` always (KUBERNETES_SERVICE_HOST,
    KUBERNETES_SERVICE_PORT, the KUBERNETES_PORT family), and with `enableServiceLinks` every
    Service of the pod's namespace; those without a cluster IP (headless) give none."""
    chosen: dict[str, Mapping[str, Any]] = {}
    for svc in services:
        meta, ip = objects.meta(svc), (svc.get("spec") or {}).get("clusterIP")
        if not ip or ip == "None" or not (svc.get("spec") or {}).get("ports"):
            continue
        if meta.get("namespace") == "default" and meta["name"] == "kubernetes":
            chosen.setdefault(meta["name"], svc)
        elif meta.get("namespace") == namespace and links:
            chosen[meta["name"]] = svc
    env: dict[str, str] = {}
    for svc in chosen.values():
        env.update(_service_vars(svc))
    return env


def container_env(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    node: Mapping[str, Any],
    configmap: Callable[[str, str], Mapping[str, Any] | None],
    pod_ip: str = LOOPBACK,
    services: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The variables the pod spec defines for one container (envFrom, then env), expanded, then the
    `services` variables it does not define (`service_env`), which `$(VAR)` may name too
    (kubelet_pods.go makeEnvironmentVariables)."""
    ns = objects.meta(pod).get("namespace") or "default"
    services = services or {}
    env: dict[str, str] = {}
    for src in container.get("envFrom") or []:
        ref = src.get("configMapRef")
        if ref is None:
            continue
        cm = configmap(ns, ref["name"])
        if cm is None:
            if ref.get("optional"):
                continue
            raise ContainerConfigError(f'configmap "{ref["name"]}" not found')
        for k, v in (cm.get("data") or {}).items():
            env[(src.get("prefix") or "") + k] = v
    for e in container.get("env") or []:
        name = e["name"]
        if "valueFrom" not in e:
            env[name] = expand(str(e.get("value") or ""), {**services, **env} if services else env)
            continue
        vf = e["valueFrom"]
        if "fieldRef" in vf:
            env[name] = field_value(pod, vf["fieldRef"]["fieldPath"], pod_ip)
        elif "resourceFieldRef" in vf:
            env[name] = resource_value(container, node, vf["resourceFieldRef"])
        elif "configMapKeyRef" in vf:
            ref = vf["configMapKeyRef"]
            cm = configmap(ns, ref["name"])
            data = (cm or {}).get("data") or {}
            if ref["key"] in data:
                env[name] = data[ref["key"]]
            elif not ref.get("optional"):
                what = (
                    f'configmap "{ref["name"]}" not found'
                    if cm is None
                    else (f"couldn't find key {ref['key']} in ConfigMap {ns}/{ref['name']}")
                )
                raise ContainerConfigError(what)
        else:
            raise ContainerConfigError(f"unsupported env source for {name}: {sorted(vf)}")
    for k, v in services.items():
        env.setdefault(k, v)
    return env


def command_args(container: Mapping[str, Any], env: Mapping[str, str]) -> tuple[list[str], list[str]]:
    """The container's command and args, each with $(VAR) expansion."""
    return (
        [expand(str(a), env) for a in container.get("command") or []],
        [expand(str(a), env) for a in container.get("args") or []],
    )


def argv(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """command + args with $(VAR) expansion (no image to take either from)."""
    command, args = command_args(container, env)
    return [*command, *args]


class _Distinct:
    """One value per key, never the same for two keys, stable while the cluster runs; `draw`
    proposes a value and is asked again while it is taken."""

    def __init__(self, draw: Callable[[], Any]) -> None:
        self._lock = threading.Lock()
        self._draw = draw
        self._values: dict[tuple, Any] = {}

    def _get(self, key: tuple) -> Any:
        with self._lock:
            if key not in self._values:
                used = set(self._values.values())
                while (value := self._draw()) in used:
                    pass
                self._values[key] = value
            return self._values[key]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PortMap(_Distinct):
    """A free loopback port per (JobSet uid, restart attempt, port), stable while the cluster runs."""

    def __init__(self) -> None:
        super().__init__(_free_port)

    def get(self, jobset_uid: str, attempt: str, port: int) -> int:
        return self._get((jobset_uid, attempt, port))


class AddressMap(_Distinct):
    """A loopback address of its own per JobSet pod, keyed by (JobSet uid, restart attempt, pod
    hostname) so that every pod of the JobSet knows it before that pod starts: what the pod's DNS
    name resolves to and its status.podIP, as every pod (every TPU host: one pod per node) has its
    own IP on GKE. So a server on a fixed port (MaxText's JAX coordinator: 1234) bound to its pod's
    address never meets another JobSet's, nor a restart's predecessor still exiting. All of
    127.0.0.0/8 is loopback on Linux (bindable without set-up); drawn at random, so that two
    embedded clusters on one machine (pytest-xdist workers) do not draw the same."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()
        super().__init__(self._address)

    def _address(self) -> str:
        while True:
            # 127.1.0.0 - 127.253.255.255: clear of 127.0.0.x, where localhost and services listen.
            a = str(ipaddress.IPv4Address((127 << 24) + self._rng.randrange(1 << 16, 254 << 16)))
            if not a.endswith((".0", ".255")):
                return a

    def get(self, jobset_uid: str, attempt: str, host: str) -> str:
        return self._get((jobset_uid, attempt, host))


def hostname_pattern(jobset: Mapping[str, Any]) -> re.Pattern[str]:
    """Pod hostnames of a JobSet, `<js>-<rjob>-<j>-<p>[.<subdomain>[.more]][:port]`: groups `host`
    (the pod's hostname) and `port`."""
    m = objects.meta(jobset)
    rjobs = [r["name"] for r in (jobset.get("spec") or {}).get("replicatedJobs") or []] or ["[a-z0-9-]+"]
    net = (jobset.get("spec") or {}).get("network") or {}
    sub = net.get("subdomain") or m["name"]
    host = rf"{re.escape(m['name'])}-(?:{'|'.join(re.escape(r) for r in rjobs)})-\d+-\d+"
    return re.compile(
        rf"(?<![A-Za-z0-9.-])(?P<host>{host})(?:\.{re.escape(sub)}(?:\.[A-Za-z0-9-]+)*)?"
        r"(?::(?P<port>\d+))?(?![A-Za-z0-9-])"
    )


def rewrite_hosts(
    value: str,
    pattern: re.Pattern[str],
    port_for: Callable[[int], int],
    address_for: Callable[[str], str] = lambda _host: LOOPBACK,
) -> str:
    """`host:port` → 127.0.0.1 on the port `port_for` gives (a client of a server the trainer binds
    on all interfaces); a bare `host` → `address_for(host)`, that pod's own address."""

    def sub(m: re.Match[str]) -> str:
        port = m.group("port")
        return f"{LOOPBACK}:{port_for(int(port))}" if port else address_for(m.group("host"))

    return pattern.sub(sub, value)


# What a simulated host's XLA:CPU does differently, flag by flag (a flag the user sets is kept):
# - its dots run on Eigen, not YNNPACK, which builds each fused dot's runtime the first time it
#   runs: a share of a trainer's start-up here; the steps take as long;
# - its fusions come from the classic IR emitters and LLVM optimises at -O1, not the MLIR fusion
#   emitters at -O2: compiling `tiny`'s train step takes markedly less CPU, and its steps take as
#   long (docs/platform.md §5; the figures: docs/measurements.md, "Figures behind the code's
#   constants"). A simulated TPU's compile is this machine's
#   cost, not the user's, and most of what the tests and a shrink on the embedded cluster wait for.
SIMULATED_XLA_FLAGS = (
    ("xla_cpu_experimental_ynn_fusion_type", ""),
    ("xla_cpu_use_fusion_emitters", "false"),
    ("xla_backend_optimization_level", "1"),
)


def simulated_xla_flags(flags: str) -> str:
    """``flags`` with each of SIMULATED_XLA_FLAGS appended that it does not set itself."""
    for name, value in SIMULATED_XLA_FLAGS:
        if f"--{name}=" not in flags:
            flags = f"{flags} --{name}={value}".strip()
    return flags


def simulated_host(env: Mapping[str, str]) -> dict[str, str]:
    """The settings of a simulated TPU host's processes, over ``env``: JAX on CPU, XLA:CPU set to
    compile quickly (SIMULATED_XLA_FLAGS, a flag of the user's kept), numpy's BLAS on one thread
    (its idle threads spin at import, on the cores the trainers start on). The kubelet sets them;
    the tests and the benchmarks set them on themselves too, so that their own JAX and their
    trainers compile alike (XLA_FLAGS is part of every compile cache key)."""
    flags = simulated_xla_flags(env.get("XLA_FLAGS", ""))
    blas_threads = env.get("OPENBLAS_NUM_THREADS", "1")
    return {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags, "OPENBLAS_NUM_THREADS": blas_threads}


def local_env(
    pod_env: Mapping[str, str],
    base: Mapping[str, str],
    chips: int,
    devices_per_chip: int,
    hostname: str,
    rewrite: Callable[[str], str] | None,
) -> dict[str, str]:
    """The process environment: the parent's (PATH, caches...), then the pod's (hosts rewritten),
    then the kubelet's own: JAX on CPU with chips × devices-per-chip devices."""
    env = dict(base)
    for k, v in pod_env.items():
        env[k] = rewrite(v) if rewrite else v
    env["HOSTNAME"] = hostname
    env.update(simulated_host(env))
    if chips > 0:
        env["JAX_NUM_CPU_DEVICES"] = str(chips * devices_per_chip)
    return env
