"""What the parts of `Store` share: the tables, lock and queues that `Store.__init__` sets up, and
the methods one part calls on another. `Writes`, `Deletion`, `WatchFanout` and `Persistence` each
derive from `Tables`, so each is checked against what `Store` really holds (mypy, `dev.py test`),
and `Store` derives from all four (launcher/embedded/store/store.py)."""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from launcher.embedded.store.journal import Journal
from launcher.embedded.store.selectors import Matcher
from launcher.embedded.store.stored import Change, Rec
from launcher.embedded.store.watch import Subscriber, Watch
from launcher.embedded.types.resources import Resource

Validator = Callable[[dict[str, Any] | None, dict[str, Any]], None]


class Tables:
    """Declarations only: `Store.__init__` assigns every attribute, `Store` and its parts define
    every method (the `TYPE_CHECKING` block exists for the checker, not at run time)."""

    _lock: threading.RLock
    default_toleration_s: int
    service_account_tokens: bool
    _rv: int
    _objs: dict[str, dict[str, dict[str, Rec]]]
    _uids: dict[str, tuple[Resource, str, str]]
    _labels: dict[str, dict[tuple[str, str], set[tuple[str, str]]]]
    _fields: dict[str, dict[str, set[tuple[str, str]]]]
    _dependents: dict[str, set[tuple[Resource, str, str]]]
    _history: deque[Change]
    _floor: int
    _watchers: dict[str, set[Watch]]
    _validators: dict[tuple[str, bool], list[Validator]]
    _subscribers: list[Subscriber]
    _dispatch: queue.SimpleQueue[tuple[str, Resource, str] | None]
    _dispatcher: threading.Thread | None
    _progress: threading.Condition
    _enqueued: int
    _delivered: int
    watch_queue: int
    bookmark_interval: float
    _journal: Journal | None

    if TYPE_CHECKING:
        # store.py
        def _find(self, res: Resource, ns: str, name: str) -> Rec | None: ...
        def _commit(self, res: Resource, etype: str, obj: dict[str, Any], prev: Rec | None) -> Rec: ...
        def _index(
            self, res: Resource, ns: str, name: str, old: dict[str, Any] | None, new: dict[str, Any] | None
        ) -> None: ...
        def _select(
            self,
            res: Resource,
            namespace: str | None,
            matcher: Matcher | None,
            after: tuple[str, str] | None = None,
            candidates: set[tuple[str, str]] | None = None,
        ) -> list[Rec]: ...

        # deletion.py
        def _delete(self, res: Resource, rec: Rec, propagation: str, grace: int | None) -> Rec: ...
        def _remove(self, res: Resource, rec: Rec, content: dict[str, Any] | None = None) -> Rec: ...

        # watches.py
        def compact(self) -> None: ...
