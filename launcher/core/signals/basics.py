"""What the signals modules (nodes.py, pods.py, observation.py) share: reading an
object's conditions, and the two memos that spare a pass the objects that did not change."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def conditions(obj: dict) -> dict[str, dict]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


def true_condition(obj: dict, ctype: str) -> dict | None:
    cond = conditions(obj).get(ctype)
    return cond if cond and cond.get("status") == "True" else None


class ByVersion:
    """What a function made of an object, by the object's uid and resourceVersion: the API never
    serves two different objects under one pair, so a pass at 3,072 pods re-reads only those that
    changed since the last (as client-go's indexers spare the reconcilers). One entry per object,
    its latest version's, and `retain` forgets the objects no longer in view: a controller that
    runs for weeks holds what it sees, not every version of every pod it ever saw. Objects without
    a version (tables in tests) are computed every time."""

    def __init__(self, fn) -> None:
        self._fn = fn
        self._got: dict[Any, Any] = {}

    def __call__(self, obj: dict):
        meta = obj["metadata"]
        version = meta.get("resourceVersion")
        if version is None:
            return self._fn(obj)
        ident = meta.get("uid") or meta["name"]
        got = self._got.get(ident)
        if got is None or got[0] != version:
            got = self._got[ident] = (version, self._fn(obj))
        return got[1]

    def retain(self, objs: Iterable[dict]) -> None:
        """Forget every object not among `objs` (all those in view, deleted ones gone)."""
        live = {o["metadata"].get("uid") or o["metadata"]["name"] for o in objs}
        if not live.issuperset(self._got):
            self._got = {k: v for k, v in self._got.items() if k in live}

    def __len__(self) -> int:
        return len(self._got)


class SameInputs:
    """The last few results of `fn`, by its arguments: `small` (a tuple) compared by equality and
    the big ones (the caches' tuples of objects) by identity. The controller's caches hand out
    the same tuple until they change (launcher/adapters/informer.py), so a pass after an event on the nodes
    does not walk 3,072 pods again, and a pass over unchanged caches walks nothing. Lists (tables
    in tests, a pass that read the API) are computed every time. One entry by default: each holds
    a generation of the caches' objects alive (with two, the controller's peak RSS grew:
    docs/measurements.md)."""

    def __init__(self, fn, most: int = 1) -> None:
        self._fn, self._most = fn, most
        self._got: list[Any] = []

    def __call__(self, small: tuple, *big):
        if not all(isinstance(b, tuple | frozenset) for b in big):  # a list may change in place
            return self._fn(*small, *big)
        for held_small, held_big, result in self._got:
            if held_small == small and all(a is b for a, b in zip(held_big, big, strict=True)):
                return result
        result = self._fn(*small, *big)
        self._got = [(small, big, result), *self._got[: self._most - 1]]
        return result
