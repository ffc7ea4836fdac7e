"""What `reslice demo` says of the surviving slice's pods (launcher/cli/demo.py `pods_line`): a
newcomer reads from it whether the pods were kept, so it must tell kept pods from recreated ones."""

from launcher.cli.demo import SURVIVOR, _slice, pods_line
from launcher.core.labels import LABEL_JOB_INDEX, LABEL_SLICE


def test_kept_pods_are_named_by_their_uids():
    line = pods_line({SURVIVOR: {"aaaaaaaa-1", "bbbbbbbb-2"}, "1": {"c", "d", "e", "f"}}, 2, "in-place")
    assert "its 2 pods kept through every segment" in line
    assert "aaaaaaaa" in line and "bbbbbbbb" in line


def test_recreated_pods_are_not_called_kept():
    seen = {SURVIVOR: {f"uid-{i}" for i in range(6)}}
    line = pods_line(seen, 2, "recreate")
    assert "kept" not in line and "6 pods over the run" in line and "recreate" in line


def test_no_pods_seen_is_not_kept():
    assert "kept" not in pods_line({}, 2, "in-place")


def test_a_recreate_pod_is_of_its_jobs_slice_and_an_in_place_pod_of_its_slice_id():
    # Recreate: one JobSet of N slices, each slice a Job (its index label); in place: one JobSet a
    # slice, every pod's Job index 0, the slice id its own label. The demo's fault picks the pools
    # under every slice but SURVIVOR by this: read wrongly, it took every pool in recreate.
    recreate = {"metadata": {"labels": {LABEL_JOB_INDEX: "1"}}}
    in_place = {"metadata": {"labels": {LABEL_JOB_INDEX: "0", LABEL_SLICE: "1"}}}
    assert _slice(recreate) == "1" and _slice(in_place) == "1"
