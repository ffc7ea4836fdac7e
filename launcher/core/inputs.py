"""Pure validators for what a user types, applied at the command-line boundary before anything acts.

Each returns the value (or a normalised one) or raises UserError with one line that names the flag,
what it got and what it takes. No I/O beyond looking at the local paths a command would write.
Where a bound is not the platform's own, the comment says why it is there.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from launcher.core import podfit
from launcher.core.errors import UserError

# Kubernetes name rules (k8s.io/apimachinery/pkg/util/validation/validation.go).
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # namespaces, max 63
DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)  # max 253
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")  # max 63
# Bucket names: https://cloud.google.com/storage/docs/buckets#naming (3-63 characters per dotted
# component, up to 222 in all, lowercase letters, digits, '-', '_' and '.', start and end alphanumeric).
GCS_BUCKET = re.compile(r"^[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9]$")

# Not platform limits: bounds on the planner's work (one rung per slice count, a divisor search per
# micro-batch size), each far above any run GKE can hold, so a typo cannot hang the command.
MAX_SLICES = 1024
MAX_GLOBAL_BATCH = 1 << 24
MAX_MICRO_BATCH = 1 << 16
MAX_STEPS = 1 << 40
MAX_SECONDS = 7 * 24 * 3600.0  # a grace, window or backoff longer than a week is a typo


def integer(flag: str, value: int | None, *, low: int = 1, high: int | None = None) -> int | None:
    """`value` in [low, high] (None passes: the option was not given)."""
    if value is None:
        return None
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise UserError(f"{flag} {value}: expected an integer {bound}")
    return value


def seconds(
    flag: str, value: float | None, *, positive: bool = False, high: float = MAX_SECONDS
) -> float | None:
    """A finite duration: >= 0 (or > 0 with `positive`), at most `high`."""
    if value is None:
        return None
    if not math.isfinite(value) or value < 0 or (positive and value == 0) or value > high:
        low = "more than 0" if positive else "at least 0"
        raise UserError(f"{flag} {value:g}: expected a finite number of seconds, {low} and at most {high:g}")
    return value


def fraction(flag: str, value: float) -> float:
    if not math.isfinite(value) or not 0 <= value <= 1:
        raise UserError(f"{flag} {value:g}: expected a fraction between 0 and 1")
    return value


def image(value: str) -> str:
    """A container image reference: non-empty, no whitespace (the kubelet cannot pull either)."""
    if not value.strip() or any(c.isspace() for c in value):
        raise UserError(f"--image {value!r}: expected an image reference such as REGISTRY/NAME:TAG")
    return value


def label_value(flag: str, value: str | None) -> str | None:
    """A Kubernetes label value: Kueue reads the queue from a label, so the queue name must be one."""
    if value is not None and (len(value) > 63 or not value or not LABEL_VALUE.match(value)):
        raise UserError(
            f"{flag} {value!r}: expected a label value (at most 63 letters, digits, '-', '_' or '.', "
            "starting and ending with a letter or digit)"
        )
    return value


def tas(topology: str | None, preferred: bool, queue: str | None) -> None:
    """`--tas-topology LEVEL` (and `--tas-preferred`): a Kueue topology level, which is a node label
    key (kueue apis/kueue/v1beta2/topology_types.go), asked of Kueue, so only with `--queue`."""
    if preferred and topology is None:
        raise UserError("--tas-preferred needs --tas-topology LEVEL")
    if topology is None:
        return
    if queue is None:
        raise UserError(
            "--tas-topology needs --queue: topology-aware scheduling is Kueue's, for the JobSets of a queue"
        )
    # A label key: an optional DNS-1123 subdomain prefix and "/", then a name as a label value's.
    prefix, slash, name = topology.rpartition("/")
    good_name = 0 < len(name) <= 63 and LABEL_VALUE.match(name)
    good_prefix = not slash or (0 < len(prefix) <= 253 and DNS1123_SUBDOMAIN.match(prefix))
    if not (good_name and good_prefix):
        raise UserError(
            f"--tas-topology {topology!r}: expected a node label key such as cloud.google.com/gke-nodepool"
            " (a level of the cluster's Kueue Topology)"
        )


def object_name(flag: str, value: str | None) -> str | None:
    """A DNS-1123 subdomain (priority classes, service accounts)."""
    if value is not None and (len(value) > 253 or not DNS1123_SUBDOMAIN.match(value)):
        raise UserError(
            f"{flag} {value!r}: expected a DNS-1123 name (lowercase letters, digits, '-' and '.')"
        )
    return value


def namespace(value: str) -> str:
    if len(value) > 63 or not DNS1123_LABEL.match(value):
        raise UserError(f"--namespace {value!r}: expected a DNS-1123 label (lowercase letters, digits, '-')")
    return value


def run_dir(flag: str, value: str, *, here: bool = True) -> str:
    """A gs://BUCKET/PREFIX with a valid bucket name, or a local path that is not a file (`here`:
    a path of this machine; preflight's is the pods', which its write probe checks from a pod)."""
    if value.startswith("gs://"):
        bucket = value.removeprefix("gs://").split("/", 1)[0]
        if not GCS_BUCKET.match(bucket) or ".." in bucket or any(len(p) > 63 for p in bucket.split(".")):
            raise UserError(f"{flag} {value!r}: {bucket!r} is not a valid Cloud Storage bucket name")
        return value
    if "://" in value:
        raise UserError(f"{flag} {value!r}: expected a local path or gs://BUCKET/PREFIX")
    if not value.strip():
        raise UserError(f"{flag}: expected a path, got an empty string")
    if here:
        directory(flag, Path(value))
    return value


def directory(flag: str, path: Path) -> Path:
    """A directory the command may create: neither it nor an ancestor is a file."""
    for p in (path, *path.parents):
        if p.exists() and not p.is_dir():
            raise UserError(f"{flag} {path}: {p} is a file, not a directory")
    return path


def output_file(flag: str, path: Path) -> Path:
    """A file the command may write: not a directory, and no ancestor is a file."""
    if path.is_dir():
        raise UserError(f"{flag} {path}: is a directory, expected a file path")
    directory(flag, path.parent)
    return path


def overrides(values: list[str] | None) -> tuple[str, ...]:
    for kv in values or []:
        if "=" not in kv or not kv.split("=", 1)[0].strip():
            raise UserError(f"--set {kv!r}: expected key=value")
    return tuple(values or ())


def shape_options(
    slices: int | None, global_batch: int | None, max_micro_batch: int, max_grad_accum: int | None
) -> None:
    """The options every planning command shares (plan, preflight, render, launch, sweep)."""
    integer("--slices", slices, high=MAX_SLICES)
    integer("--global-batch", global_batch, high=MAX_GLOBAL_BATCH)
    integer("--max-micro-batch", max_micro_batch, high=MAX_MICRO_BATCH)
    integer("--max-grad-accum", max_grad_accum, high=MAX_GLOBAL_BATCH)


def spec_options(
    *,
    image_ref: str,
    ns: str,
    grace_period: int | None = None,
    max_restarts: int | None = None,
    init_timeout: int | None = None,
    queue: str | None = None,
    priority_class: str | None = None,
    service_account: str | None = None,
    cpu_request: str | None = None,
    memory_request: str | None = None,
    tas_topology: str | None = None,
    tas_preferred: bool = False,
) -> None:
    """The options of a run's spec that render, launch, preflight and sweep share."""
    image(image_ref)
    namespace(ns)
    integer("--grace-period", grace_period, low=0, high=int(MAX_SECONDS))
    integer("--max-restarts", max_restarts, low=0, high=10_000)
    integer("--init-timeout", init_timeout, high=int(MAX_SECONDS))
    label_value("--queue", queue)
    tas(tas_topology, tas_preferred, queue)
    object_name("--priority-class", priority_class)
    object_name("--service-account", service_account)
    quantity("--cpu-request", cpu_request)
    quantity("--memory-request", memory_request)


def quantity(flag: str, value: str | None) -> str | None:
    """A positive Kubernetes quantity (what the API server accepts as a request)."""
    if value is None:
        return None
    try:
        ok = podfit.quantity(value) > 0  # 'Infinity', 'NaN': Decimal takes them, the API server does not
    except ValueError:
        ok = False
    if not ok:
        raise UserError(f"{flag} {value!r} is not a positive Kubernetes quantity (e.g. 56, 500m, 240Gi)")
    return value
