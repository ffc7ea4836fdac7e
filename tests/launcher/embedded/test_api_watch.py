"""Watch through `kubernetes.watch.Watch`: replay from a resourceVersion, initial events,
selectors, bookmarks, timeoutSeconds, 410 Gone, and what an API server restart does to watches."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
from kubernetes import watch
from kubernetes.client import ApiException

from tests.launcher.embedded.conftest import BOOKMARK_INTERVAL_S, Api, pod, start_api, stop_api
from tests.support.wait import wait_for


def _events(
    api: Api, count: int, then: Callable[[int], object] = lambda seen: None, **kwargs: object
) -> list[tuple[str, str | None, str]]:
    """The first `count` events of a pod watch as (type, name, resourceVersion); `then(n)` runs
    once the stream has delivered n of them."""
    w = watch.Watch()
    out = []
    for ev in w.stream(api.core.list_namespaced_pod, "default", timeout_seconds=5, **kwargs):
        meta = ev["raw_object"].get("metadata", {})
        out.append((ev["type"], meta.get("name"), meta.get("resourceVersion")))
        then(len(out))
        if len(out) == count:
            w.stop()
    return out


def test_watch_replays_changes_after_a_resource_version(api: Api) -> None:
    api.core.create_namespaced_pod("default", pod("a"))
    start = api.core.list_namespaced_pod("default").metadata.resource_version
    api.core.patch_namespaced_pod("a", "default", {"metadata": {"labels": {"x": "1"}}})
    api.core.create_namespaced_config_map("default", {"metadata": {"name": "other-kind"}})
    api.core.create_namespaced_pod("default", pod("b"))
    api.core.delete_namespaced_pod("a", "default")
    events = _events(api, 3, resource_version=start)
    assert [(t, n) for t, n, _ in events] == [("MODIFIED", "a"), ("ADDED", "b"), ("DELETED", "a")]
    versions = [int(rv) for _, _, rv in events]
    assert versions == sorted(versions) and versions[0] > int(start)


def test_watch_without_version_starts_with_the_current_objects(api: Api) -> None:
    for name in ("a", "b"):
        api.core.create_namespaced_pod("default", pod(name))

    def later(seen: int) -> None:  # c is created while the watch is open, after the initial events
        if seen == 2:
            api.core.create_namespaced_pod("default", pod("c"))

    events = _events(api, 3, then=later)
    assert [(t, n) for t, n, _ in events] == [("ADDED", "a"), ("ADDED", "b"), ("ADDED", "c")]


def test_watch_through_a_selector_sees_objects_enter_and_leave(api: Api) -> None:
    api.core.create_namespaced_pod("default", pod("p", {"app": "trainer"}))
    start = api.core.list_namespaced_pod("default").metadata.resource_version
    api.core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"app": "eval"}}})
    api.core.patch_namespaced_pod("p", "default", {"metadata": {"labels": {"app": "trainer"}}})
    api.core.create_namespaced_pod("default", pod("q", {"app": "eval"}))
    events = _events(api, 2, resource_version=start, label_selector="app=trainer")
    assert [(t, n) for t, n, _ in events] == [("DELETED", "p"), ("ADDED", "p")]


def test_bookmarks_carry_the_current_version(api: Api) -> None:
    api.core.create_namespaced_pod("default", pod("a"))
    current = api.core.list_namespaced_pod("default").metadata.resource_version
    events = _events(api, 3, resource_version=current, allow_watch_bookmarks=True)
    assert [t for t, _, _ in events] == ["BOOKMARK"] * 3
    assert {rv for _, _, rv in events} == {current}


def test_no_bookmarks_unless_asked_and_timeout_ends_the_stream(api: Api) -> None:
    """Two watches side by side over the same second, one asking for bookmarks. Once that one has
    had two (the window is well under way), a pod is created: the other, quiet until then, is still
    open and sees it — and no bookmark. Both then end on their own (timeoutSeconds)."""
    current = api.core.list_namespaced_pod("default").metadata.resource_version
    got: dict[bool, list[str]] = {}

    def stream(bookmarks: bool) -> None:
        seen = got.setdefault(bookmarks, [])
        for ev in watch.Watch().stream(
            api.core.list_namespaced_pod,
            "default",
            resource_version=current,
            timeout_seconds=1,
            allow_watch_bookmarks=bookmarks,
        ):
            seen.append(ev["type"])
            if ev["type"] == "BOOKMARK" and seen.count("BOOKMARK") == 2:
                api.core.create_namespaced_pod("default", pod("late"))

    threads = [threading.Thread(target=stream, args=(b,), daemon=True) for b in (False, True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)  # a safety net: a stream that ignores timeoutSeconds would never end
    assert not any(t.is_alive() for t in threads), "a watch did not end at its timeoutSeconds"
    assert got[False] == ["ADDED"]
    assert got[True].count("ADDED") == 1 and set(got[True]) == {"ADDED", "BOOKMARK"}, got[True]
    # 1 s is 1 / BOOKMARK_INTERVAL_S intervals; the two before the pod, and maybe more after it.
    assert 2 <= got[True].count("BOOKMARK") <= int(1 / BOOKMARK_INTERVAL_S) + 1, got[True]


def test_too_old_resource_version_is_410_gone() -> None:
    api = start_api(history=5)
    try:
        for i in range(10):
            api.core.create_namespaced_config_map("default", {"metadata": {"name": f"c{i}"}})
        with pytest.raises(ApiException) as err:
            list(
                watch.Watch().stream(
                    api.core.list_namespaced_config_map, "default", resource_version="2", timeout_seconds=2
                )
            )
        assert err.value.status == 410 and "too old resource version" in err.value.reason
        # Within the history a replay still works.
        recent = str(int(api.store.resource_version) - 2)
        w = watch.Watch()
        names = []
        for ev in w.stream(
            api.core.list_namespaced_config_map, "default", resource_version=recent, timeout_seconds=2
        ):
            names.append(ev["object"].metadata.name)
            if len(names) == 2:
                w.stop()
        assert names == ["c8", "c9"]
    finally:
        stop_api(api)


def _watch_in_thread(api: Api, **kwargs: object) -> tuple[threading.Thread, list[str], list[BaseException]]:
    seen: list[str] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            stream: Iterator[dict] = watch.Watch().stream(api.core.list_namespaced_pod, "default", **kwargs)
            for ev in stream:
                seen.append(ev["type"])
        except Exception as e:  # the connection dropping is one way a watch ends on restart
            errors.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, seen, errors


def test_restart_ends_open_watches_and_expires_old_versions(api: Api) -> None:
    api.core.create_namespaced_pod("default", pod("a"))
    old = api.core.list_namespaced_pod("default").metadata.resource_version
    thread, seen, _ = _watch_in_thread(api, resource_version=old, timeout_seconds=30)
    api.core.create_namespaced_pod("default", pod("b"))
    wait_for(lambda: seen == ["ADDED"], timeout=10, what="pod b on the open watch", interval=0.01)
    port = api.server.port
    api.server.restart(downtime_s=0.2)
    thread.join(timeout=5)  # the restart ended the watch, long before its 30 s timeout
    assert not thread.is_alive()
    assert seen == ["ADDED"]  # pod b, before the restart
    assert api.server.port == port
    assert [p.metadata.name for p in api.core.list_namespaced_pod("default").items] == ["a", "b"]
    with pytest.raises(ApiException) as err:
        list(
            watch.Watch().stream(
                api.core.list_namespaced_pod, "default", resource_version=old, timeout_seconds=2
            )
        )
    assert err.value.status == 410


def test_watch_list_initial_events_end_with_an_annotated_bookmark(api: Api) -> None:
    for name in ("a", "b"):
        api.core.create_namespaced_pod("default", pod(name))
    w = watch.Watch()
    seen = []
    for ev in w.stream(
        api.core.list_namespaced_pod,
        "default",
        send_initial_events=True,
        resource_version_match="NotOlderThan",
        allow_watch_bookmarks=True,
        timeout_seconds=5,
    ):
        meta = ev["raw_object"]["metadata"]
        seen.append(
            (ev["type"], meta.get("name"), (meta.get("annotations") or {}).get("k8s.io/initial-events-end"))
        )
        if ev["type"] == "BOOKMARK":
            w.stop()
    assert seen == [("ADDED", "a", None), ("ADDED", "b", None), ("BOOKMARK", None, "true")]


def test_subscribers_see_every_commit_in_order_and_may_write_back(api: Api) -> None:
    """In-process controllers: called in commit order, off the store lock, so a subscriber can
    write to the store from its callback (here: an Event for every pod) without deadlocking."""
    from launcher.embedded.types.resources import RESOURCES

    seen: list[tuple[str, str, int]] = []

    def controller(etype: str, res: object, obj: dict) -> None:
        seen.append((etype, obj["kind"], int(obj["metadata"]["resourceVersion"])))
        if obj["kind"] == "Pod" and etype == "ADDED":
            event = {
                "metadata": {"name": f"{obj['metadata']['name']}.seen"},
                "involvedObject": {"kind": "Pod"},
            }
            api.store.create(RESOURCES["events"], event, "default")

    unsubscribe = api.store.subscribe(controller)
    for name in ("a", "b", "c"):
        api.core.create_namespaced_pod("default", pod(name))
    api.core.delete_namespaced_pod("a", "default")
    assert api.store.flush(timeout=5)
    unsubscribe()
    versions = [rv for _, _, rv in seen]
    assert versions == sorted(versions) and len(set(versions)) == len(versions)
    assert [(t, k) for t, k, _ in seen if k == "Pod"] == [("ADDED", "Pod")] * 3 + [("DELETED", "Pod")]
    assert len(api.core.list_namespaced_event("default").items) == 3
    api.core.create_namespaced_pod("default", pod("after"))
    assert api.store.flush(timeout=5) and len(seen) == 7  # unsubscribed: nothing more
