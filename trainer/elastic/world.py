"""The world of an in-place run: which slices train, in what order, and with what batch plan. Pure.

The controller publishes each world (one segment, its index the document's *epoch*) as a small
JSON document (docs/contract.md, "World (in-place restarts)"); every pod's
``trainer.elastic.follower`` follows it (``trainer.elastic.world_source`` delivers the documents) and
starts its trainer child with ``child_env(world, me, base_env)``. The
pod itself never changes: it knows its stable slice id and its host index within the slice, and its
process id is compacted over the world's slices in their published order:
``process_id = position(my slice) × hosts_per_slice + host index``.

Called by ``trainer.elastic.follower`` (``parse``, ``me_from_env``, ``child_env``, ``restart_mode``) and
the tests. No JAX, nothing heavy: it runs in the supervisor before its first fork.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from contract import envvars
from contract import world as world_doc
from contract.words import RestartMode

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# What a world's `env` may set in every trainer child: the trainer's overrides and the runtime's tuning
# (JAX, XLA, libtpu). Nothing else: whoever can write the world ConfigMap must not be able to point
# every trainer's RESLICE_RUN_DIR (or its coordinator, its identity) elsewhere (docs/contract.md).
ENV_ALLOWED = (envvars.SET,)
ENV_ALLOWED_PREFIXES = ("JAX_", "XLA_", "LIBTPU_")
# The pod's own environment may widen it (comma-separated names or prefixes ending in `_`): the pod
# template is the launcher's, and whoever writes it could set any variable there anyway
# (envvars.WORLD_ENV_ALLOW).
# A supervisor whose child exited 43 waits RESLICE_PEER_LOST_WAIT_S for a newer world; longer while
# the controller's heartbeat in the world says it is still at work on this one (a slice being
# recreated can take minutes), but never past RESLICE_PEER_LOST_MAX_WAIT_S: a controller that is gone
# stops beating, and one that beats for good must not hold the pods for good either.
HEARTBEAT_FRESH_S = 60.0  # a beat this recent is fresh (the controller's period: core/world.py HEARTBEAT_S)
PEER_LOST_MAX_WAIT_S = 3600.0


class WorldError(ValueError):
    """A world document or a pod identity that cannot be used: the supervisor exits 2 with it."""


@dataclass(frozen=True)
class Me:
    """This pod: its stable slice id (``RESLICE_SLICE_ID``, else ``RESLICE_SLICE_INDEX``), its
    host index in the slice (``JOB_COMPLETION_INDEX``) and its slice's restart attempt
    (``RESLICE_RESTART_ATTEMPT``; None where the pod has none)."""

    slice_id: str
    host: int
    attempt: int | None = None


@dataclass(frozen=True)
class World:
    run: str
    epoch: int
    slices: tuple[str, ...]
    hosts_per_slice: int
    coordinator: str
    global_batch: int
    micro_batch: int
    grad_accum: int
    megascale: Mapping[str, str] = field(default_factory=dict)
    segment: int | None = None  # RESLICE_SEGMENT of the child; the epoch when absent
    published: float | None = None  # the controller's unix time of publication, for the log
    env: Mapping[str, str] = field(default_factory=dict)  # more variables for the child
    # Slices of the previous world whose hosts are gone: a trainer whose world has one of them can
    # never finish a step (its collectives wait for their processes), so it is killed, not asked
    # to save (docs/contract.md "What the supervisor does").
    lost: tuple[str, ...] = ()
    # The controller's unix time of its latest beat while this world waits for slices being
    # recreated (docs/contract.md "The document"): a change of it says the controller is alive.
    heartbeat: float | None = None
    # Per slice, the restart attempt of its JobSet whose pods the world was decided for. A pod of
    # another attempt is not one of them: its slice was restarted after the world was decided (a
    # rebooted host's slice, whose new pods start while the old world is still published), and a
    # trainer it started there would wait for a coordination service that never takes it in.
    attempts: Mapping[str, int] = field(default_factory=dict)

    def position(self, me: Me) -> int | None:
        """Where this pod's slice is in the world, or None when it takes no part."""
        try:
            return self.slices.index(me.slice_id)
        except ValueError:
            return None

    def other_attempt(self, me: Me) -> int | None:
        """The attempt of this pod's slice the world was decided for, when it is not this pod's own
        (the world is not this pod's to join); None when it is, or when either is not known."""
        formed = self.attempts.get(me.slice_id)
        return formed if formed is not None and me.attempt is not None and formed != me.attempt else None

    @property
    def num_processes(self) -> int:
        return len(self.slices) * self.hosts_per_slice


def restart_mode(env: Mapping[str, str]) -> RestartMode:
    raw = env.get(envvars.RESTART_MODE, "") or RestartMode.RECREATE.value
    try:
        return RestartMode(raw)
    except ValueError:
        allowed = ", ".join(m.value for m in RestartMode)
        raise WorldError(f"{envvars.RESTART_MODE}={raw!r} is not one of {allowed}") from None


def _int(doc: Mapping[str, Any], key: str, low: int) -> int:
    v = doc.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise WorldError(f"world: {key!r} must be an integer >= {low}, not {v!r}")
    return v


def _strings(doc: Mapping[str, Any], key: str) -> dict[str, str]:
    v = doc.get(key) or {}
    if not isinstance(v, dict):
        raise WorldError(f"world: {key!r} must be an object of names to values")
    out = {}
    for k, x in v.items():
        if not isinstance(k, str) or not _NAME.match(k) or isinstance(x, (dict, list)) or x is None:
            raise WorldError(f"world: {key}.{k} must be a name with a string or number value")
        out[k] = str(x)
    return out


def _slice_ids(doc: Mapping[str, Any], key: str) -> tuple[str, ...]:
    """A list of distinct slice ids (strings; integers are read as their decimal string)."""
    raw = doc.get(key, [])
    if not isinstance(raw, list):
        raise WorldError(f"world: {key!r} must be a list of slice ids, not {raw!r}")
    if any(isinstance(s, bool) or not isinstance(s, (str, int)) or s == "" for s in raw):
        raise WorldError(f"world: every slice id must be a non-empty string or an integer: {raw!r}")
    ids = tuple(str(s) for s in raw)
    if len(set(ids)) != len(ids):
        raise WorldError(f"world: {key!r} lists a slice twice: {raw!r}")
    return ids


def _attempts(doc: Mapping[str, Any], slices: tuple[str, ...]) -> dict[str, int]:
    raw = doc.get(world_doc.ATTEMPTS) or {}
    if not isinstance(raw, dict):
        raise WorldError(f"world: 'attempts' must be an object of slice ids to attempts, not {raw!r}")
    for k, v in raw.items():
        if k not in slices or isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise WorldError(f"world: attempts.{k} must be an integer >= 0 of one of its slices, not {v!r}")
    return dict(raw)


def keep_waiting(waited_s: float, patience_s: float, beat_age_s: float | None, bound_s: float) -> bool:
    """Whether a supervisor whose child exited 43 (or 42 for a peer's preemption) `waited_s` ago
    waits on for a newer world. Within `patience_s` (RESLICE_PEER_LOST_WAIT_S) always: that is the
    bound when nothing says the controller is at work. Past it, while the controller's heartbeat
    changed within HEARTBEAT_FRESH_S (`beat_age_s`, measured on this pod's own clock from when it
    saw the change, so the two clocks need not agree; None: never seen one), up to `bound_s`."""
    if waited_s < patience_s:
        return True
    fresh = beat_age_s is not None and beat_age_s < HEARTBEAT_FRESH_S
    return fresh and waited_s < bound_s


def env_allowed(pod_env: Mapping[str, str]) -> tuple[str, ...]:
    """The names and prefixes a world's `env` may set: ENV_ALLOWED and ENV_ALLOWED_PREFIXES, and
    what the pod's own RESLICE_WORLD_ENV_ALLOW adds."""
    extra = tuple(x.strip() for x in (pod_env.get(envvars.WORLD_ENV_ALLOW) or "").split(",") if x.strip())
    return (*ENV_ALLOWED, *ENV_ALLOWED_PREFIXES, *extra)


def _env(doc: Mapping[str, Any], allowed: tuple[str, ...]) -> dict[str, str]:
    out = _strings(doc, world_doc.ENV)
    for k in out:
        if not any(k == a or (a.endswith("_") and k.startswith(a)) for a in allowed):
            words = ", ".join(f"{a}*" if a.endswith("_") else a for a in allowed)
            raise WorldError(f"world: env.{k} is not one a world may set ({words})")
    return out


def parse(text: str | bytes, env_allow: tuple[str, ...] = (*ENV_ALLOWED, *ENV_ALLOWED_PREFIXES)) -> World:
    """The world of a published document; WorldError names the first thing wrong with it.
    `env_allow`: what its `env` may set (env_allowed of the pod's environment)."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise WorldError(f"world: not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise WorldError("world: the document must be a JSON object")
    run = doc.get(world_doc.RUN)
    if not isinstance(run, str) or not run:
        raise WorldError(f"world: 'run' must be a non-empty string, not {run!r}")
    slices = _slice_ids(doc, world_doc.SLICES)
    if not slices:
        raise WorldError(
            f"world: 'slices' must be a non-empty list of slice ids, not {doc[world_doc.SLICES]!r}"
        )
    coordinator = doc.get(world_doc.COORDINATOR)
    host, _, port = str(coordinator or "").rpartition(":")
    if not isinstance(coordinator, str) or not host or not port.isdigit():
        raise WorldError(f"world: 'coordinator' must be 'host:port', not {coordinator!r}")
    segment = doc.get(world_doc.SEGMENT)
    if segment is not None:
        segment = _int(doc, world_doc.SEGMENT, 0)
    published = doc.get(world_doc.PUBLISHED)
    if published is not None and (isinstance(published, bool) or not isinstance(published, (int, float))):
        raise WorldError(f"world: 'published' must be unix seconds, not {published!r}")
    heartbeat = doc.get(world_doc.HEARTBEAT)
    if heartbeat is not None and (isinstance(heartbeat, bool) or not isinstance(heartbeat, (int, float))):
        raise WorldError(f"world: 'heartbeat' must be unix seconds, not {heartbeat!r}")
    world = World(
        run=run,
        epoch=_int(doc, world_doc.EPOCH, 0),
        slices=slices,
        hosts_per_slice=_int(doc, world_doc.HOSTS_PER_SLICE, 1),
        coordinator=coordinator,
        global_batch=_int(doc, world_doc.GLOBAL_BATCH, 1),
        micro_batch=_int(doc, world_doc.MICRO_BATCH, 1),
        grad_accum=_int(doc, world_doc.GRAD_ACCUM, 1),
        megascale=_strings(doc, world_doc.MEGASCALE),
        segment=segment,
        published=float(published) if published is not None else None,
        env=_env(doc, env_allow),
        lost=_slice_ids(doc, world_doc.LOST),
        heartbeat=float(heartbeat) if heartbeat is not None else None,
        attempts=_attempts(doc, slices),
    )
    if len(slices) > 1 and world_doc.MEGASCALE_ADDRESS not in world.megascale:
        raise WorldError("world: a world of several slices needs megascale.coordinator_address")
    return world


def me_from_env(env: Mapping[str, str]) -> Me:
    """This pod's identity from its own environment (docs/contract.md)."""
    slice_id = env.get(envvars.SLICE_ID) or env.get(envvars.SLICE_INDEX) or ""
    if not slice_id:
        raise WorldError(
            f"in-place mode needs {envvars.SLICE_ID} (or {envvars.SLICE_INDEX}): this pod's slice"
        )
    raw = env.get(envvars.JOB_COMPLETION_INDEX) or "0"
    if not raw.isdigit():
        raise WorldError(f"{envvars.JOB_COMPLETION_INDEX}={raw!r} is not a host index")
    attempt = env.get(envvars.RESTART_ATTEMPT) or ""
    if attempt and not attempt.isdigit():
        raise WorldError(f"{envvars.RESTART_ATTEMPT}={attempt!r} is not a restart attempt")
    return Me(slice_id, int(raw), int(attempt) if attempt else None)


def child_env(world: World, me: Me, base_env: Mapping[str, str]) -> dict[str, str]:
    """The trainer child's environment in ``world``: the pod's own, the world's ``env``, then what
    the world decides (process id and count, coordinator, slices, batch plan, ``MEGASCALE_*``).
    WorldError when this pod takes no part in it."""
    position = world.position(me)
    if position is None:
        raise WorldError(f"slice {me.slice_id!r} is not in world epoch {world.epoch} ({list(world.slices)})")
    if me.host >= world.hosts_per_slice:
        raise WorldError(
            f"host index {me.host} is outside the world's {world.hosts_per_slice} hosts per slice"
        )
    if base_env.get(envvars.RUN) not in (None, "", world.run):
        raise WorldError(f"world of run {world.run!r}, but this pod is of run {base_env[envvars.RUN]!r}")
    # The keys the world decides for the child: stale values from the pod's own environment never
    # reach it.
    env = {k: v for k, v in base_env.items() if k not in envvars.MEGASCALE}
    env.update(world.env)
    n = len(world.slices)
    env.update(
        {
            envvars.RUN: world.run,
            envvars.SEGMENT: str(world.epoch if world.segment is None else world.segment),
            envvars.COORDINATOR: world.coordinator,
            envvars.NUM_PROCESSES: str(world.num_processes),
            envvars.NUM_SLICES: str(n),
            envvars.HOSTS_PER_SLICE: str(world.hosts_per_slice),
            envvars.SLICE_INDEX: str(position),
            envvars.JOB_COMPLETION_INDEX: str(me.host),
            envvars.GLOBAL_BATCH: str(world.global_batch),
            envvars.MICRO_BATCH: str(world.micro_batch),
            envvars.GRAD_ACCUM: str(world.grad_accum),
            # One value for every process of the world: the start barrier's id is the segment's
            # and this (trainer.elastic.distributed.start_barrier_id). The pod's own, its slice
            # JobSet's attempt, differs between slices once one of them was restarted, and a
            # barrier of several ids never meets. The segment alone tells worlds apart: none is
            # published twice.
            envvars.RESTART_ATTEMPT: "0",
            envvars.WORLD_EPOCH: str(world.epoch),
        }
    )
    if n > 1:  # multislice: the slice id is the compacted position, as the process id is
        env.update(
            {
                envvars.MEGASCALE_COORDINATOR_ADDRESS: world.megascale[world_doc.MEGASCALE_ADDRESS],
                envvars.MEGASCALE_NUM_SLICES: str(n),
                envvars.MEGASCALE_SLICE_ID: str(position),
            }
        )
        if world_doc.MEGASCALE_PORT in world.megascale:
            env[envvars.MEGASCALE_PORT] = world.megascale[world_doc.MEGASCALE_PORT]
    return env
