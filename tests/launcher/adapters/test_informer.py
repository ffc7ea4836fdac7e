"""launcher/adapters/informer.py's Cache, fed by hand: the index and the one-tuple-per-change rule that let
a pass read 20,000 pods of other workloads as one set."""

from launcher.adapters.informer import DEPARTED_MAX, Cache, Source


def foreign(name: str, node: str, rv: str) -> dict:
    return {
        "metadata": {"name": name, "namespace": "default", "resourceVersion": rv},
        "spec": {"nodeName": node},
    }


def cache() -> Cache:
    return Cache(Source("pods", index=lambda p: p["spec"]["nodeName"]))


def test_the_index_follows_adds_moves_and_deletes():
    c = cache()
    c.replace([([foreign("a", "n1", "1"), foreign("b", "n1", "2")], "2"), ([foreign("c", "n2", "3")], "3")])
    assert c.indexed() == {"n1", "n2"} and c.resource_version == "3"
    c.apply("DELETED", foreign("a", "n1", "4"))
    assert c.indexed() == {"n1", "n2"}  # b is still on n1
    c.apply("DELETED", foreign("b", "n1", "5"))
    assert c.indexed() == {"n2"}
    c.apply("MODIFIED", foreign("c", "n3", "6"))  # the stored object's value is the one taken away
    c.apply("ADDED", foreign("d", "n3", "7"))
    assert c.indexed() == {"n3"}
    c.apply("DELETED", foreign("c", "n3", "8"))
    assert c.indexed() == {"n3"} and [p["metadata"]["name"] for p in c.items()] == ["d"]
    c.replace([([], "9")])  # a relist starts the index over
    assert c.indexed() == frozenset() and c.items() == ()


def test_items_are_one_tuple_until_the_cache_changes():
    c = cache()
    c.replace([([foreign("a", "n1", "1")], "1")])
    first, keys = c.items(), c.indexed()
    assert c.items() is first and c.indexed() is keys
    assert not c.apply("BOOKMARK", {"metadata": {"resourceVersion": "2"}})
    assert c.items() is first and c.resource_version == "2"
    c.apply("MODIFIED", foreign("a", "n1", "3"))
    assert c.items() is not first and c.items()[0]["metadata"]["resourceVersion"] == "3"
    assert c.indexed() is keys  # the same set of nodes: no new one


def test_a_departed_objects_last_state_is_handed_to_one_pass():
    # PodGC fails a pod and deletes it at once: both events may arrive between two passes, and the
    # cache then holds nothing of it. A source that asks keeps the last state until it is taken.
    c = Cache(Source("pods", keep=lambda p: {**p, "kept": True}, departed=True))
    c.replace([([foreign("a", "n1", "1"), foreign("b", "n1", "2")], "2")])
    failed = {**foreign("a", "n1", "3"), "status": {"phase": "Failed"}}
    c.apply("MODIFIED", failed)
    c.apply("DELETED", {**failed, "metadata": {**failed["metadata"], "resourceVersion": "4"}})
    (gone,) = c.take_departed()
    assert (
        gone["status"] == {"phase": "Failed"} and gone["kept"] and gone["metadata"]["resourceVersion"] == "4"
    )
    assert c.take_departed() == () and [p["metadata"]["name"] for p in c.items()] == ["b"]
    for i in range(DEPARTED_MAX + 5):  # nobody takes them: at most DEPARTED_MAX, the newest
        c.apply("DELETED", foreign(f"p{i}", "n1", str(10 + i)))
    kept = c.take_departed()
    assert len(kept) == DEPARTED_MAX and kept[-1]["metadata"]["name"] == f"p{DEPARTED_MAX + 4}"
    plain = cache()  # a source that does not ask keeps nothing
    plain.replace([([foreign("a", "n1", "1")], "1")])
    plain.apply("DELETED", foreign("a", "n1", "2"))
    assert plain.take_departed() == ()
