"""common.gangs: which gang a pod belongs to, under each convention, and who enforces it."""

from __future__ import annotations

from typing import Any

import pytest

from common import gangs, settings
from tests import builders

NAMES = settings.Names()
NAME = NAMES.gang_name
SIZE = NAMES.gang_size


def _spec(**fields: Any) -> builders.Mutator:
    def mutate(body: dict[str, Any]) -> None:
        body["spec"].update(fields)

    return mutate


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        pytest.param(builders.pod("p", gpus=1), None, id="no-gang"),
        pytest.param(builders.pod("p", namespace="ml", labels={NAME: "llama", SIZE: "4"}),
                     gangs.Gang("ml", "llama", 4, "gpu-steward", None), id="ours-labels"),
        pytest.param(builders.pod("p", namespace="ml", annotations={NAME: "llama", SIZE: "4"}),
                     gangs.Gang("ml", "llama", 4, "gpu-steward", None), id="ours-annotations"),
        pytest.param(builders.pod("p", labels={NAME: "llama"}, annotations={SIZE: "8"}),
                     gangs.Gang("default", "llama", 8, "gpu-steward", None), id="ours-name-label-size-annotation"),
        pytest.param(builders.pod("p", labels={NAME: "llama", SIZE: "4", "kueue.x-k8s.io/pod-group-name": "k"},
                                  annotations={"kueue.x-k8s.io/pod-group-total-count": "2"}),
                     gangs.Gang("default", "llama", 4, "gpu-steward", None), id="ours-wins-over-kueue"),
        pytest.param(builders.pod("p", labels={"kueue.x-k8s.io/pod-group-name": "grp"},
                                  annotations={"kueue.x-k8s.io/pod-group-total-count": "3"}),
                     gangs.Gang("default", "grp", 3, "kueue", None), id="kueue"),
        pytest.param(builders.pod("p", labels={"scheduling.x-k8s.io/pod-group": "pg"}),
                     gangs.Gang("default", "pg", None, "scheduler-plugins", None), id="scheduler-plugins"),
        pytest.param(builders.pod("p", labels={"scheduling.x-k8s.io/pod-group": "pg"},
                                  mutate=_spec(schedulerName="scheduler-plugins-scheduler")),
                     gangs.Gang("default", "pg", None, "scheduler-plugins",
                                "scheduler scheduler-plugins-scheduler places the gang"),
                     id="scheduler-plugins-own-scheduler"),
        pytest.param(builders.pod("p", annotations={"scheduling.k8s.io/group-name": "vj"}),
                     gangs.Gang("default", "vj", None, "volcano", None), id="volcano-default-scheduler"),
        pytest.param(builders.pod("p", annotations={"scheduling.k8s.io/group-name": "vj"},
                                  mutate=_spec(schedulerName="volcano")),
                     gangs.Gang("default", "vj", None, "volcano", "scheduler volcano places the gang"),
                     id="volcano-scheduler"),
        pytest.param(builders.pod("p", mutate=_spec(schedulingGroup={"podGroupName": "native"})),
                     gangs.Gang("default", "native", None, "kubernetes-podgroup",
                                "PodGroup native not known here; taken as a native gang"),
                     id="native-scheduling-group-unknown-policy"),
        pytest.param(builders.pod("p", mutate=_spec(schedulingGroup={"podGroupName": "native"},
                                                    schedulerName="custom")),
                     gangs.Gang("default", "native", None, "kubernetes-podgroup", "scheduler custom places the gang"),
                     id="native-with-own-scheduler"),
        pytest.param(builders.pod("p", mutate=_spec(schedulingGroup={})), None, id="native-without-group-name"),
        pytest.param(builders.pod("p", labels={NAME: "llama", SIZE: "2"}, mutate=_spec(schedulerName="kai")),
                     gangs.Gang("default", "llama", 2, "gpu-steward", "scheduler kai places the gang"),
                     id="ours-non-default-scheduler"),
        pytest.param(builders.pod("p", labels={NAME: "llama", SIZE: "2"},
                                  mutate=_spec(schedulerName="default-scheduler")),
                     gangs.Gang("default", "llama", 2, "gpu-steward", None), id="explicit-default-scheduler"),
        pytest.param(builders.pod("p", labels={NAME: ""}), None, id="empty-gang-name"),
        pytest.param(builders.pod("p", labels={"kueue.x-k8s.io/pod-group-name": ""}), None, id="empty-kueue-name"),
    ],
)
def test_identify(pod: dict[str, Any], expected: gangs.Gang | None) -> None:
    assert gangs.identify(pod, names=NAMES) == expected


def _pod_group(name: str, policy: dict[str, Any], namespace: str = "ml") -> dict[str, Any]:
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"schedulingPolicy": policy}}


POD_GROUPS = gangs.PodGroups({g.key: g for g in map(gangs.pod_group, [
    _pod_group("gang-pg", {"gang": {"minCount": 4}}),
    _pod_group("basic-pg", {"basic": {}}),
    _pod_group("elsewhere", {"gang": {"minCount": 2}}, namespace="other"),
    _pod_group("gpu-steward-ours", {"gang": {"minCount": 2}}),
])})
NOT_SERVED = gangs.PodGroups(version=None)
NOT_SERVED_REASON = ("no PodGroup API served to us (scheduling.k8s.io/v1beta1, scheduling.k8s.io/v1alpha3, "
                     "scheduling.k8s.io/v1alpha2); taken as a native gang")


@pytest.mark.parametrize(
    ("group", "labels", "known", "expected"),
    [
        pytest.param("basic-pg", {}, NOT_SERVED, gangs.Gang("ml", "basic-pg", None, "kubernetes-podgroup",
                                                            f"PodGroup basic-pg: {NOT_SERVED_REASON}"),
                     id="api-not-served-is-a-native-gang"),
        pytest.param("basic-pg", {NAME: "ours", SIZE: "2"}, NOT_SERVED,
                     gangs.Gang("ml", "basic-pg", None, "kubernetes-podgroup",
                                f"PodGroup basic-pg: {NOT_SERVED_REASON}"),
                     id="api-not-served-wins-over-our-labels"),
        # Our gang's own PodGroup (descheduler.gangs.native_binding): still our gang, whatever is known of it.
        pytest.param("gpu-steward-ours", {NAME: "ours", SIZE: "2"}, POD_GROUPS,
                     gangs.Gang("ml", "ours", 2, "gpu-steward", None), id="own-pod-group-with-gang-policy-is-ours"),
        pytest.param("gpu-steward-ours", {NAME: "ours", SIZE: "2"}, NOT_SERVED,
                     gangs.Gang("ml", "ours", 2, "gpu-steward", None), id="own-pod-group-api-not-served-is-ours"),
        pytest.param("gpu-steward-ours", {NAME: "ours", SIZE: "2"}, None,
                     gangs.Gang("ml", "ours", 2, "gpu-steward", None), id="own-pod-group-not-read-yet-is-ours"),
        pytest.param("gpu-steward-ours", {NAME: "other", SIZE: "2"}, POD_GROUPS,
                     gangs.Gang("ml", "gpu-steward-ours", 2, "kubernetes-podgroup",
                                "PodGroup gpu-steward-ours has a gang policy (minCount 2) kube-scheduler enforces"),
                     id="another-gangs-own-pod-group-is-a-native-gang"),
        pytest.param("gpu-steward-ours", {}, POD_GROUPS,
                     gangs.Gang("ml", "gpu-steward-ours", 2, "kubernetes-podgroup",
                                "PodGroup gpu-steward-ours has a gang policy (minCount 2) kube-scheduler enforces"),
                     id="own-pod-group-name-without-our-labels-is-a-native-gang"),
        pytest.param("late", {}, None, gangs.Gang("ml", "late", None, "kubernetes-podgroup",
                                                  "PodGroup late not known here; taken as a native gang"),
                     id="nothing-read-yet"),
        pytest.param("late", {}, POD_GROUPS, gangs.Gang("ml", "late", None, "kubernetes-podgroup",
                                                        "PodGroup late not known here; taken as a native gang"),
                     id="pod-group-not-seen-yet"),
        pytest.param("gang-pg", {}, POD_GROUPS, gangs.Gang("ml", "gang-pg", 4, "kubernetes-podgroup",
                                               "PodGroup gang-pg has a gang policy (minCount 4) kube-scheduler "
                                               "enforces"), id="gang-policy"),
        pytest.param("gang-pg", {NAME: "ours", SIZE: "4"}, POD_GROUPS,
                     gangs.Gang("ml", "gang-pg", 4, "kubernetes-podgroup",
                                "PodGroup gang-pg has a gang policy (minCount 4) kube-scheduler enforces"),
                     id="gang-policy-wins-over-our-labels"),
        pytest.param("basic-pg", {}, POD_GROUPS, None, id="basic-policy-is-no-gang"),
        pytest.param("basic-pg", {NAME: "ours", SIZE: "2"}, POD_GROUPS,
                     gangs.Gang("ml", "ours", 2, "gpu-steward", None),
                     id="basic-policy-with-our-labels-is-ours"),
        pytest.param("elsewhere", {}, POD_GROUPS, gangs.Gang("ml", "elsewhere", None, "kubernetes-podgroup",
                                                 "PodGroup elsewhere not known here; taken as a native gang"),
                     id="same-name-other-namespace-is-unknown"),
    ],
)
def test_identify_native_pod_group(group: str, labels: dict[str, str], known: gangs.PodGroups | None,
                                   expected: gangs.Gang | None) -> None:
    """Kubernetes 1.37 PodGroups: only a gang policy is a gang kube-scheduler holds together (old code: every
    podGroupName was "enforced by kube-scheduler", so a basic PodGroup's pods lost our gangs and gates). Where
    the PodGroup is not known (not seen yet, or no PodGroup API served to us) the pod is taken as a native gang
    (no gate of ours), and the reason says which."""
    pod = builders.pod("p", namespace="ml", labels=labels, mutate=_spec(schedulingGroup={"podGroupName": group}))
    assert gangs.identify(pod, names=NAMES, pod_groups=known) == expected


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param({"schedulingPolicy": {"gang": {}}}, gangs.PodGroup("ml", "g", 1),
                     id="gang-without-min-count-still-a-gang"),
        pytest.param({"schedulingPolicy": {"gang": {"minCount": True}}}, gangs.PodGroup("ml", "g", 1),
                     id="gang-min-count-bool"),
        pytest.param({"schedulingPolicy": {"gang": {"minCount": 0}}}, gangs.PodGroup("ml", "g", 1),
                     id="gang-min-count-zero"),
        pytest.param({"schedulingPolicy": {"gang": {"minCount": 3}}, "disruptionMode": "PodGroup"},
                     gangs.PodGroup("ml", "g", 3, "all"), id="v1alpha2-disruption-pod-group"),
        pytest.param({"schedulingPolicy": {"basic": {}}, "disruptionMode": "Pod"},
                     gangs.PodGroup("ml", "g", None, "single"), id="v1alpha2-disruption-pod"),
        pytest.param({"schedulingPolicy": {"basic": {}}, "disruptionMode": "Everything"},
                     gangs.PodGroup("ml", "g", None, None), id="unknown-disruption-string"),
        pytest.param({"schedulingPolicy": {"gang": {"minCount": 2}}, "disruptionMode": {"all": {}}},
                     gangs.PodGroup("ml", "g", 2, "all"), id="v1beta1-disruption-all"),
        pytest.param({"schedulingPolicy": {"basic": {}}, "disruptionMode": {"single": {}}},
                     gangs.PodGroup("ml", "g", None, "single"), id="v1beta1-disruption-single"),
        pytest.param({"schedulingPolicy": {"basic": {}}, "disruptionMode": {}}, gangs.PodGroup("ml", "g", None, None),
                     id="empty-disruption-object"),
        pytest.param({"schedulingPolicy": {"basic": {}}, "disruptionMode": ["all"]},
                     gangs.PodGroup("ml", "g", None, None), id="disruption-list-is-none"),
        pytest.param({"schedulingPolicy": {"basic": {}}}, gangs.PodGroup("ml", "g", None, None), id="basic"),
        pytest.param({}, gangs.PodGroup("ml", "g", None, None), id="no-policy"),
    ],
)
def test_pod_group(spec: dict[str, Any], expected: gangs.PodGroup) -> None:
    """Both shapes of `spec.disruptionMode`: a string in 1.36's v1alpha2 (`Pod`, `PodGroup`), a one-of object
    in 1.37's v1alpha3 and v1beta1 (`single`, `all`); the policy's fields are the same in all three."""
    raw = {"metadata": {"name": "g", "namespace": "ml"}, "spec": spec}
    assert gangs.pod_group(raw) == expected


@pytest.mark.parametrize(
    ("labels", "annotations", "problem"),
    [
        pytest.param({NAME: "g"}, {}, f"{SIZE} is missing", id="ours-missing"),
        pytest.param({NAME: "g", SIZE: "0"}, {}, f"{SIZE}='0' is not a positive integer", id="ours-zero"),
        pytest.param({NAME: "g", SIZE: "-2"}, {}, f"{SIZE}='-2' is not a positive integer", id="ours-negative"),
        pytest.param({NAME: "g", SIZE: "four"}, {}, f"{SIZE}='four' is not a positive integer", id="ours-word"),
        pytest.param({NAME: "g", SIZE: "2.5"}, {}, f"{SIZE}='2.5' is not a positive integer", id="ours-fraction"),
        pytest.param({NAME: "g", SIZE: "1_000"}, {}, f"{SIZE}='1_000' is not a positive integer",
                     id="ours-underscore"),
        pytest.param({NAME: "g", SIZE: " 4"}, {}, f"{SIZE}=' 4' is not a positive integer", id="ours-blank"),
        pytest.param({"kueue.x-k8s.io/pod-group-name": "g"}, {},
                     "kueue.x-k8s.io/pod-group-total-count is missing", id="kueue-missing"),
        pytest.param({"kueue.x-k8s.io/pod-group-name": "g"}, {"kueue.x-k8s.io/pod-group-total-count": "x"},
                     "kueue.x-k8s.io/pod-group-total-count='x' is not a positive integer", id="kueue-bad"),
    ],
)
def test_bad_or_missing_size(labels: dict[str, str], annotations: dict[str, str], problem: str) -> None:
    gang = gangs.identify(builders.pod("p", labels=labels, annotations=annotations), names=NAMES)
    assert gang is not None
    assert (gang.name, gang.size, gang.problem) == ("g", None, problem)


def test_custom_prefix_and_key() -> None:
    names = settings.Names(prefix="gpus.example.com/")
    labels = {"gpus.example.com/gang-name": "g", "gpus.example.com/gang-size": "2", NAME: "someone-else"}
    pod = builders.pod("p", namespace="ml", labels=labels)
    gang = gangs.identify(pod, names=names)
    assert gang is not None
    assert (gang.key, gang.size, gang.convention) == ("ml/g", 2, "gpu-steward")


@pytest.mark.parametrize(
    ("pod", "involved"),
    [
        pytest.param(builders.pod("web"), False, id="plain-pod"),
        pytest.param(builders.pod("launcher", labels={NAME: "j", SIZE: "5"}), True, id="declares-a-gang"),
        pytest.param(builders.pod("launcher", labels={NAME: "j", SIZE: "five"}), True, id="declares-a-bad-gang"),
        pytest.param(builders.pod("p", mutate=_spec(schedulingGroup={"podGroupName": "native"})), True,
                     id="native-group"),
        pytest.param(builders.pod("p", mutate=_spec(schedulingGates=[{"name": NAMES.gate}])), True,
                     id="our-gate-without-gang-labels"),
        pytest.param(builders.pod("p", mutate=_spec(schedulingGates=[{"name": "kueue.x-k8s.io/admission"}])), False,
                     id="another-controllers-gate"),
    ],
)
def test_involved(pod: dict[str, Any], involved: bool) -> None:
    """What the gang controller must see of pods without GPUs (the feeder and the snapshot keep these)."""
    assert gangs.involved(pod, names=NAMES) is involved


def test_a_pod_group_and_a_pod_without_namespace_are_in_default() -> None:
    """Objects read without a namespace (e.g. from a file) are in `default`, the pod and its PodGroup alike."""
    group = gangs.pod_group({"metadata": {"name": "g"}, "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}}})
    assert group == gangs.PodGroup("default", "g", 2)
    pod = builders.pod("p", mutate=_spec(schedulingGroup={"podGroupName": "g"}))
    del pod["metadata"]["namespace"]
    assert gangs.identify(pod, names=NAMES, pod_groups=gangs.PodGroups({group.key: group})) == gangs.Gang(
        "default", "g", 2, "kubernetes-podgroup", "PodGroup g has a gang policy (minCount 2) kube-scheduler enforces")


def test_a_pod_group_without_name_has_an_empty_one() -> None:
    assert gangs.pod_group({"metadata": {"namespace": "ml"}, "spec": {}}).name == ""


@pytest.mark.parametrize(
    ("gang_name", "priority_class", "expected"),
    [
        pytest.param("Llama_7B", None, None, id="not-a-dns-label"),
        pytest.param("x" * 52, None, None, id="one-over-63-characters"),
        pytest.param("x" * 51, None, "gpu-steward-" + "x" * 51, id="exactly-63-characters"),
        pytest.param("x" * 41, "gpu-normal", None, id="with-its-class-over-63-characters"),
        pytest.param("llama", "gpu-normal", "gpu-steward-llama-gpu-normal", id="one-per-priority-class"),
        pytest.param("llama-7b", None, "gpu-steward-llama-7b", id="no-priority-class"),
    ],
)
def test_own_pod_group(gang_name: str, priority_class: str | None, expected: str | None) -> None:
    assert gangs.own_pod_group(gang_name, priority_class) == expected


GROUP = "gpu-steward-llama-gpu-normal"


def _member(name: str, *, group: str | None = GROUP, gang: str = "llama", priority_class: str | None = "gpu-normal",
            namespace: str = "ml") -> dict[str, Any]:
    fields: dict[str, Any] = {"priorityClassName": priority_class} if priority_class else {}
    if group:
        fields["schedulingGroup"] = {"podGroupName": group}
    pod = builders.pod(name, namespace=namespace, annotations={NAME: gang, SIZE: "3"}, mutate=_spec(**fields))
    pod["metadata"]["uid"] = f"uid-{name}"
    return pod


def _body(min_count: int, owners: list[str], *, name: str = GROUP,
          priority_class: str | None = "gpu-normal") -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulingPolicy": {"gang": {"minCount": min_count}}}
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": "ml",
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": n, "uid": f"uid-{n}"}
                                             for n in owners],
                         "labels": {"app.kubernetes.io/managed-by": "gpu-steward"}},
            "spec": spec}


@pytest.mark.parametrize(
    ("members", "expected"),
    [
        pytest.param([_member("a", group=None)], [], id="names-no-pod-group-none"),
        pytest.param([_member("a", group="gpu-steward-other-gpu-normal")], [], id="names-another-gangs-none"),
        pytest.param([_member("a", gang="other")], [], id="pod-group-of-another-gang-none"),
        pytest.param([_member("a", group="gpu-steward-llama")], [], id="pod-group-of-another-class-none"),
        # An incomplete gang released at its bound must not wait in kube-scheduler for members never created.
        pytest.param([_member("b"), _member("a")], [_body(2, ["b", "a"])],
                     id="min-count-is-the-members-there-are"),
        pytest.param([_member("a"), _member("b"), _member("c")], [_body(3, ["a", "b", "c"])],
                     id="complete-gang-min-count-is-its-members"),
        # An MPI launcher without GPUs gets no tier: kube-scheduler would refuse it in the workers' group.
        pytest.param([_member("launcher", group="gpu-steward-llama", priority_class=None), _member("w0"),
                      _member("w1")],
                     [_body(1, ["launcher"], name="gpu-steward-llama", priority_class=None), _body(2, ["w0", "w1"])],
                     id="one-pod-group-per-priority-class"),
    ],
)
def test_pod_group_bodies(members: list[dict[str, Any]], expected: list[dict[str, Any]]) -> None:
    assert gangs.pod_group_bodies(members, names=NAMES) == expected


def test_same_pod_group_is_the_pods_naming_it_in_its_namespace() -> None:
    a, b = _member("a"), _member("b")
    elsewhere = _member("c", namespace="other")
    other_class = _member("d", group="gpu-steward-llama", priority_class=None)
    none = _member("e", group=None)
    pods = [a, b, elsewhere, other_class, none]
    assert gangs.same_pod_group(pods, like=a, names=NAMES) == [a, b]
    assert gangs.same_pod_group(pods, like=other_class, names=NAMES) == [other_class]
    assert gangs.same_pod_group(pods, like=none, names=NAMES) == []


@pytest.mark.parametrize(
    ("group", "expected"),
    [
        pytest.param("gpu-steward-llama-gpu-normal", gangs.Gang("ml", "llama", 3, "gpu-steward", None),
                     id="its-own-class-pod-group-is-ours"),
        pytest.param("gpu-steward-llama",
                     gangs.Gang("ml", "gpu-steward-llama", None, "kubernetes-podgroup",
                                "PodGroup gpu-steward-llama not known here; taken as a native gang"),
                     id="the-class-less-pod-group-is-not-its-own"),
    ],
)
def test_identify_own_pod_group_per_priority_class(group: str, expected: gangs.Gang) -> None:
    """A member names its gang's own PodGroup of its own PriorityClass: any other is not ours (a member of
    another class, or someone else's PodGroup)."""
    assert gangs.identify(_member("a", group=group), names=NAMES, pod_groups=POD_GROUPS) == expected


def test_pod_group_body_of_members_read_without_a_namespace_is_in_default() -> None:
    pod = _member("a")
    del pod["metadata"]["namespace"]
    (body,) = gangs.pod_group_bodies([pod], names=NAMES)
    assert body["metadata"]["namespace"] == "default"
