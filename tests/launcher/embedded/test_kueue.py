"""Kueue's part on the embedded cluster (launcher/embedded/kueue.py), as upstream plays it through
the API: a queued JobSet is created suspended and runs no pod until admitted (unsuspended); evicted
(suspended again), the JobSet controller suspends its Jobs and the Job controller deletes their
pods, without counting a failure or a restart; admitted again, the pods are created anew.
Simulate mode: the pods run no process."""

import threading

from kubernetes.utils.retry import retry_on_conflict

from launcher.embedded.kueue import Kueue
from tests.launcher.embedded.cluster_helpers import (
    GROUP,
    HOSTS,
    VERSION,
    condition,
    rendered,
    running,
    wait_for,
)


def live_pods(kube) -> list:
    return [p for p in kube.pods() if not p.metadata.deletion_timestamp]


def test_a_queued_jobset_waits_for_admission_is_evicted_and_admitted_again():
    with running("tpu7x-2x2x2:2", mode="simulate") as kube:
        js = rendered("kq", "unused")
        js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "q"
        js["spec"]["suspend"] = True  # as Kueue's webhook, and reslice's renderer with --queue
        kueue = Kueue(kube.cluster.api_client(), held={"kq-0"})
        kube.create_jobset(js)
        wait_for(lambda: len(kube.batch.list_namespaced_job("default").items) == 2, what="suspended Jobs")
        assert kueue.reconcile() == [] and kube.pods() == []  # held: no quota yet

        kueue.release("kq-0")  # quota, or its admission check Ready
        assert kueue.reconcile() == ["kq-0"]
        wait_for(
            lambda: sum(p.status.phase == "Running" for p in live_pods(kube)) == 2 * HOSTS, what="admitted"
        )
        first = {p.metadata.uid for p in live_pods(kube)}

        kueue.evict("kq-0")  # preempted by a higher priority Workload
        wait_for(lambda: not kube.pods(), what="the evicted JobSet's pods deleted")
        got = kube.jobset("kq-0")
        assert condition(got, "Suspended")["status"] == "True"
        assert condition(got, "Failed") is None and got["status"].get("restarts", 0) == 0
        assert all(j.spec.suspend for j in kube.batch.list_namespaced_job("default").items)

        stop = threading.Event()
        loop = threading.Thread(target=kueue.run, args=(stop,), daemon=True)
        loop.start()
        try:
            kueue.release("kq-0")  # requeued and admitted again
            wait_for(
                lambda: sum(p.status.phase == "Running" for p in live_pods(kube)) == 2 * HOSTS,
                what="pods again after the second admission",
            )
        finally:
            stop.set()
            loop.join(5)
        again = {p.metadata.uid for p in live_pods(kube)}
        assert again and not again & first  # new pods
        got = kube.jobset("kq-0")
        assert condition(got, "Suspended")["status"] == "False" and got["status"].get("restarts", 0) == 0
        assert kueue.admitted == ["kq-0", "kq-0"]


def test_an_admission_places_the_pods_and_a_readmission_moves_them_as_jobset_resumes_its_jobs():
    """Kueue's admission merges the admitted placement into the JobSet's pod template while it is
    suspended; JobSet copies it into the Jobs it resumes (upstream resumeJob), so the new pods land
    there: on one node pool first, on the other after an eviction and a new admission."""
    with running("tpu7x-2x2x2:2", mode="simulate") as kube:
        js = rendered("kp", "unused", slices=1)
        js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "q"
        js["spec"]["suspend"] = True
        pool = "cloud.google.com/gke-nodepool"
        kueue = Kueue(kube.cluster.api_client(), placement={"kp-0": {pool: "tpu7x-2x2x2-np-1"}})
        kube.create_jobset(js)
        wait_for(lambda: kube.batch.list_namespaced_job("default").items, what="the suspended Job")
        kueue.reconcile()

        def pools() -> set:
            pods = live_pods(kube)
            if len(pods) < HOSTS or any(not p.spec.node_name for p in pods):
                return set()
            return {kube.cluster.node_pool_of[p.spec.node_name] for p in pods}

        assert wait_for(pools, what="placed pods") == {"tpu7x-2x2x2-np-1"}
        kueue.evict("kp-0")
        wait_for(lambda: not kube.pods(), what="evicted")
        template = kube.jobset("kp-0")["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
        assert pool not in template["spec"]["nodeSelector"]  # restored as it was
        kueue.placement["kp-0"] = {pool: "tpu7x-2x2x2-np-0"}
        kueue.release("kp-0")
        kueue.reconcile()
        assert wait_for(pools, what="pods placed again") == {"tpu7x-2x2x2-np-0"}
        job = kube.batch.list_namespaced_job("default").items[0]
        assert job.spec.template.spec.node_selector[pool] == "tpu7x-2x2x2-np-0"


def test_an_admission_that_loses_a_race_with_another_writer_is_made_again_on_the_newer_object():
    """The JobSet controller writes the JobSet while Kueue admits it (its status, as it creates the
    Jobs): Kueue's Update then gets 409 Conflict, and its reconcile is requeued and reads it again
    (controller-runtime). The embedded Kueue does the same, keeping the other writer's change."""
    with running("tpu7x-2x2x2:2", mode="simulate") as kube:
        js = rendered("kc", "unused", slices=1)
        js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "q"
        js["spec"]["suspend"] = True
        kueue = Kueue(kube.cluster.api_client())
        kube.create_jobset(js)
        objects = kueue._objects()
        reads = []

        def read_then_another_writer(*args):
            got = objects.get_namespaced_custom_object(*args)
            if not reads:  # only the first read goes stale
                objects.patch_namespaced_custom_object(
                    *args, {"metadata": {"annotations": {"other": "writer"}}}
                )
            reads.append(got["metadata"]["resourceVersion"])
            return got

        racing = type("Racing", (), {"__getattr__": lambda _, n: getattr(objects, n)})()
        racing.get_namespaced_custom_object = read_then_another_writer
        kueue._objects = lambda: racing
        assert kueue.reconcile() == ["kc-0"]
        got = kube.jobset("kc-0")
        # Read again after the conflict, each time a newer object. The JobSet controller may write
        # the new JobSet's status between the second read and the Update: a third read, as upstream.
        assert len(reads) >= 2 and len(set(reads)) == len(reads), reads
        assert got["spec"]["suspend"] is False and got["metadata"]["annotations"]["other"] == "writer"


def test_an_admission_of_a_jobset_whose_pod_template_had_no_metadata_is_accepted():
    """Kueue's admission (RunWithPodSetsInfo) in one Update: a suspended JobSet whose pod template
    was created without `metadata` gains the podset label, a node selector and a toleration, and is
    resumed. Upstream's webhook compares typed structs (ValidateImmutableField), where a template
    without metadata and one left with `metadata: {}` once the labels are set aside are equal: the
    update is accepted (it was refused here, 422 "field is immutable"), and the Jobs JobSet resumes
    and their pods carry what the admission wrote."""
    with running("tpu7x-2x2x2:2", mode="simulate") as kube:
        js = rendered("km", "unused", slices=1)
        del js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"]
        js["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "q"
        js["spec"]["suspend"] = True
        kube.create_jobset(js)
        wait_for(lambda: kube.batch.list_namespaced_job("default").items, what="the suspended Job")
        pool, toleration = (
            "tpu7x-2x2x2-np-1",
            {"key": "kueue.x-k8s.io/test", "operator": "Exists", "effect": "NoSchedule"},
        )

        def admit() -> None:
            """Read, write the admission, resume: again on a conflict (the JobSet controller may
            write its status between the read and the update), as Kueue's reconciler does."""
            got = kube.jobset("km-0")
            template = got["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
            assert "metadata" not in template
            template["metadata"] = {"labels": {"kueue.x-k8s.io/podset": "workers"}}
            template["spec"]["nodeSelector"] = {
                **template["spec"]["nodeSelector"],
                "cloud.google.com/gke-nodepool": pool,
            }
            template["spec"]["tolerations"] = [*template["spec"]["tolerations"], toleration]
            got["spec"]["suspend"] = False
            kube.custom.replace_namespaced_custom_object(GROUP, VERSION, "default", "jobsets", "km-0", got)

        retry_on_conflict(admit)

        def placed() -> list:
            pods = live_pods(kube)
            return pods if len(pods) == HOSTS and all(p.spec.node_name for p in pods) else []

        pods = wait_for(placed, what="the admitted JobSet's pods")
        job = kube.batch.list_namespaced_job("default").items[0]
        for spec, labels in [(job.spec.template.spec, job.spec.template.metadata.labels)] + [
            (p.spec, p.metadata.labels) for p in pods
        ]:
            assert labels["kueue.x-k8s.io/podset"] == "workers"
            assert spec.node_selector["cloud.google.com/gke-nodepool"] == pool
            assert toleration in [
                {"key": t.key, "operator": t.operator, "effect": t.effect} for t in spec.tolerations
            ]
        assert {kube.cluster.node_pool_of[p.spec.node_name] for p in pods} == {pool}
