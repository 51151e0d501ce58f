"""The re-check right before an eviction (descheduler.reclaim.recheck): a victim's newest samples, judged at the
store's time. Rows are the answer to `utilisation_promql.newest` as Prometheus gives it (checked against the real
one in tests/integration/test_evictor.py)."""

from __future__ import annotations

from typing import Any

import pytest

from common import dcgm, settings_loader, snapshot
from descheduler.reclaim import recheck, utilisation_promql
from tests import builders

NOW = 1_800_000_000.0
CONFIG = settings_loader.load()  # max_sample_age_seconds 180
TAG = utilisation_promql.RECHECK


def victim(*, gpus: int = 2, mig: dict[str, int] | None = None, node: str = "n1") -> snapshot.Pod:
    return snapshot.parse_pod(builders.pod("p", namespace="team-a", gpus=gpus, mig=mig, node=node, phase="Running"))


def now(at: float = NOW) -> dict[str, Any]:
    return {"metric": {TAG: "now"}, "value": [at, repr(at)]}


def gpu(index: str, value: float, *, age: float = 10.0, kind: str = "gpu", host: str = "n1", pod: str = "p",
        namespace: str = "team-a", **labels: str) -> list[dict[str, Any]]:
    """The value and last-sample rows of one device (its newest sample `age` seconds before NOW)."""
    metric = {"namespace": namespace, "pod": pod, "Hostname": host, "gpu": index, "UUID": f"GPU-{host}-{index}",
              **labels}
    metric = {k: v for k, v in metric.items() if v}  # a label given as "" is absent (a relabelled scrape path)
    return [{"metric": {**metric, TAG: f"{kind}_value"}, "value": [NOW, repr(value)]},
            {"metric": {**metric, TAG: f"{kind}_last"}, "value": [NOW, repr(NOW - age)]}]


@pytest.mark.parametrize(
    ("pod", "rows", "idle", "reason"),
    [
        # Adversarial rows first: what the issue saw, and what a store answers in odd clusters.
        pytest.param(victim(), [now(), *gpu("0", 1.0), *gpu("1", 95.0)], False,
                     "re-check: busy again, device GPU-n1-1 reads 95.0% >= 5% at its newest sample",
                     id="why-second-gpu-turned-busy-after-the-measurement"),
        pytest.param(victim(), [now(), *gpu("0", 1.0, age=200), *gpu("1", 1.0)], False,
                     "re-check: a device's newest sample is 200s old at the store's time, more than "
                     "max_sample_age_seconds 180 (stale)", id="one-device-stale"),
        pytest.param(victim(), [now(), *gpu("0", 1.0)], False,
                     "re-check: only 1 of its 2 device(s) report a newest sample on n1 (missing)",
                     id="one-device-missing"),
        pytest.param(victim(), [now(), *gpu("0", 1.0, host="n9"), *gpu("1", 1.0, host="n9")], False,
                     "re-check: only 0 of its 2 device(s) report a newest sample on n1 (samples from n9, not its "
                     "node) (missing)", id="samples-from-another-node-are-not-its-own"),
        pytest.param(victim(), [now(), *gpu("0", 1.0), *gpu("1", 1.0, namespace="team-b")], False,
                     "re-check: only 1 of its 2 device(s) report a newest sample on n1 (missing)",
                     id="same-pod-name-in-another-namespace-is-not-it"),
        pytest.param(victim(), [now(), *gpu("0", 1.0), *gpu("1", 1.0, pod="dcgm-exporter-x", exported_pod="q")],
                     False, "re-check: only 1 of its 2 device(s) report a newest sample on n1 (missing)",
                     id="exported-pod-names-another-pod-so-not-it"),
        pytest.param(victim(), [now(), *gpu("0", 1.0), *gpu("1", 1.0, pod="dcgm-exporter-x", exported_pod="p")],
                     True, "re-check: still idle (2 device(s) at most 1.0%, newest samples at most 10s old) < 5%",
                     id="exported-pod-spelling-is-it"),
        pytest.param(victim(), [*gpu("0", 1.0), *gpu("1", 1.0)], False,
                     "re-check: the store's answer carries no time", id="no-store-time"),
        pytest.param(victim(), [now(), *gpu("0", float("nan")), *gpu("1", 1.0)], False,
                     "re-check: a device reads NaN at its newest sample", id="nan"),
        pytest.param(victim(), [now(), *gpu("0", 1.0), *gpu("", 1.0, UUID="GPU-n1-0"), *gpu("0", 1.0, UUID="")],
                     False, "re-check: only 1 of its 2 device(s) report a newest sample on n1 (missing)",
                     id="why-three-scrape-paths-of-one-gpu-are-one-device"),
        pytest.param(victim(), [now(), *gpu("0", 1.0), *gpu("1", 1.0)[1:]], False,
                     "re-check: only 1 of its 2 device(s) report a newest sample on n1 (missing)",
                     id="a-time-without-a-value-is-not-a-sample"),
        pytest.param(victim(), [now(), *gpu("0", 1.0), *gpu("", 60.0, UUID="GPU-n1-0"), *gpu("1", 1.0)],
                     False, "re-check: busy again, device GPU-n1-0 reads 60.0% >= 5% at its newest sample",
                     id="the-busiest-copy-of-a-device-wins"),
        pytest.param(victim(), [now(), *gpu("0", 1.0, namespace="team-b"), *gpu("0", 1.0, host="n9"), *gpu("0", 1.0),
                                *gpu("1", 1.0)], True,
                     "re-check: still idle (2 device(s) at most 1.0%, newest samples at most 10s old) < 5%",
                     id="others-series-listed-first-do-not-end-the-reading"),
        pytest.param(victim(), [now(), *gpu("0", 1.0, host="n8"), *gpu("1", 1.0, host="n9")], False,
                     "re-check: only 0 of its 2 device(s) report a newest sample on n1 (samples from n8, n9, not its "
                     "node) (missing)", id="samples-from-two-other-nodes-both-said"),
        # A series without a host label is the pod's, as the measurement reads it (utilisation_parts.same_host).
        pytest.param(victim(), [now(), *gpu("0", 1.0, host=""), *gpu("1", 1.0)], True,
                     "re-check: still idle (2 device(s) at most 1.0%, newest samples at most 10s old) < 5%",
                     id="a-series-without-host-label-is-the-pods"),
        pytest.param(victim(), [now(), *gpu("0", 1.0, host="n1.example"), *gpu("1", 1.0)], False,
                     "re-check: only 1 of its 2 device(s) report a newest sample on n1 (samples from n1.example, not "
                     "its node) (missing)", id="a-host-compared-as-a-whole-name-by-default"),
        pytest.param(victim(), [now(), *gpu("0", 1.0, UUID=""), *gpu("1", 1.0, UUID="")], True,
                     "re-check: still idle (2 device(s) at most 1.0%, newest samples at most 10s old) < 5%",
                     id="gpus-without-uuid-are-told-apart-by-index"),
        pytest.param(victim(), [now(), *gpu("0", 60.0, UUID=""), *gpu("0", 1.0), *gpu("1", 1.0)], False,
                     "re-check: busy again, device GPU-n1-0 reads 60.0% >= 5% at its newest sample",
                     id="the-busiest-copy-wins-whichever-comes-first"),
        pytest.param(victim(), [now(), *gpu("0", 1.0), gpu("1", 1.0)[0]], False,
                     "re-check: only 1 of its 2 device(s) report a newest sample on n1 (missing)",
                     id="a-value-without-its-time-is-not-a-sample"),
        pytest.param(victim(gpus=1), [now(), {**gpu("0", 1.0)[0], "value": [NOW, "x"]}, gpu("0", 1.0)[1]], False,
                     "re-check: a device reads NaN at its newest sample", id="an-unreadable-value-is-nan"),
        pytest.param(victim(gpus=0, mig={"1g.10gb": 2}),
                     [now(), *gpu("0", 2.0, kind="mig", GPU_I_ID="3"), *gpu("0", 2.0, kind="mig", GPU_I_ID="4")], True,
                     "re-check: still idle (2 device(s) at most 2.0%, newest samples at most 10s old) < 5%",
                     id="two-mig-instances-of-one-gpu-are-two-devices"),
        pytest.param(victim(gpus=0, mig={"1g.10gb": 2}),
                     [now(), *gpu("0", 2.0, kind="mig", GPU_I_ID="3"),
                      *gpu("0", 2.0, kind="mig", GPU_I_ID="3", UUID="")],
                     False, "re-check: only 1 of its 2 device(s) report a newest sample on n1 (missing)",
                     id="a-second-scrape-path-of-one-mig-instance-is-not-a-second-instance"),
        pytest.param(victim(gpus=0, mig={"1g.10gb": 1}), [now(), *gpu("0", 40.0, kind="mig", GPU_I_ID="3")], False,
                     "re-check: busy again, device GPU-n1-0/3 reads 40.0% >= 5% at its newest sample",
                     id="a-busy-mig-instance-is-named-with-its-instance"),
        pytest.param(victim(gpus=1, mig={"1g.10gb": 1}), [now(), *gpu("0", 2.0, kind="mig", GPU_I_ID="3")], False,
                     "re-check: only 0 of its 1 device(s) report a newest sample on n1 (missing)",
                     id="a-whole-gpu-beside-a-mig-request-is-not-read-on-mig-series"),
        pytest.param(victim(gpus=1, mig={"1g.10gb": 1}),
                     [now(), *gpu("0", 2.0), *gpu("1", 3.0, kind="mig", GPU_I_ID="3")], True,
                     "re-check: still idle (1 device(s) at most 2.0%, newest samples at most 10s old; 1 device(s) at "
                     "most 3.0%, newest samples at most 10s old) < 5%", id="whole-gpu-and-mig-both-said"),
        # Busy needs no freshness: not idle is the safe answer whatever the age.
        pytest.param(victim(), [now(), *gpu("0", 50.0, age=900)], False,
                     "re-check: busy again, device GPU-n1-0 reads 50.0% >= 5% at its newest sample",
                     id="busy-but-stale-is-busy"),
        # Matches, and the boundaries.
        pytest.param(victim(), [now(), *gpu("0", 1.0), *gpu("1", 4.9)], True,
                     "re-check: still idle (2 device(s) at most 4.9%, newest samples at most 10s old) < 5%",
                     id="still-idle"),
        pytest.param(victim(), [now(), *gpu("0", 1.0), *gpu("1", 5.0)], False,
                     "re-check: busy again, device GPU-n1-1 reads 5.0% >= 5% at its newest sample",
                     id="boundary-at-the-threshold-is-busy"),
        pytest.param(victim(), [now(), *gpu("0", 1.0, age=180), *gpu("1", 1.0)], True,
                     "re-check: still idle (2 device(s) at most 1.0%, newest samples at most 180s old) < 5%",
                     id="boundary-exactly-max-sample-age-is-fresh"),
        pytest.param(victim(), [now(), *gpu("0", 1.0, age=181), *gpu("1", 1.0)], False,
                     "re-check: a device's newest sample is 181s old at the store's time, more than "
                     "max_sample_age_seconds 180 (stale)", id="boundary-a-second-past-max-sample-age-is-stale"),
        pytest.param(victim(gpus=1), [now(NOW + 3600), *gpu("0", 1.0)], False,
                     "re-check: a device's newest sample is 3610s old at the store's time, more than "
                     "max_sample_age_seconds 180 (stale)", id="judged-at-the-stores-time-not-the-samples"),
        # MIG: instances on the MIG metric; a whole-GPU request with only MIG-instance series (strategy single).
        pytest.param(victim(gpus=0, mig={"1g.10gb": 1}), [now(), *gpu("0", 2.0, kind="mig", GPU_I_ID="3")], True,
                     "re-check: still idle (1 device(s) at most 2.0%, newest samples at most 10s old) < 5%",
                     id="mig-instance"),
        pytest.param(victim(gpus=1), [now(), *gpu("0", 2.0, kind="mig", GPU_I_ID="3")], True,
                     "re-check: still idle (1 device(s) at most 2.0%, newest samples at most 10s old) < 5%",
                     id="mig-single-strategy"),
        pytest.param(victim(gpus=1), [now(), *gpu("0", 2.0), *gpu("0", 90.0, kind="mig", GPU_I_ID="3")], True,
                     "re-check: still idle (1 device(s) at most 2.0%, newest samples at most 10s old) < 5%",
                     id="whole-gpu-series-win-over-mig-ones-for-a-whole-gpu-request"),
        pytest.param(victim(gpus=0, mig={"1g.10gb": 1}), [now(), *gpu("0", 2.0)], False,
                     "re-check: only 0 of its 1 device(s) report a newest sample on n1 (missing)",
                     id="mig-request-is-not-read-on-whole-gpu-series"),
    ],
)
def test_judge(pod: snapshot.Pod, rows: list[dict[str, Any]], idle: bool, reason: str) -> None:
    assert recheck.judge(pod, rows, threshold_percent=5.0, config=CONFIG) == recheck.Verdict(idle, reason)


def test_newest_query_is_one_small_query_scoped_to_the_pod() -> None:
    query = utilisation_promql.newest(["p"], config=CONFIG.prometheus, kinds=("gpu",))
    assert query == (
        'label_replace(vector(time()), "gpu_steward_recheck", "now", "", "") or '
        'label_replace(DCGM_FI_DEV_GPU_UTIL{GPU_I_PROFILE="",pod="p"}, "gpu_steward_recheck", "gpu_value", "", "") or '
        'label_replace(timestamp(DCGM_FI_DEV_GPU_UTIL{GPU_I_PROFILE="",pod="p"}), "gpu_steward_recheck", "gpu_last", '
        '"", "") or '
        'label_replace(DCGM_FI_DEV_GPU_UTIL{GPU_I_PROFILE="",exported_pod="p"}, "gpu_steward_recheck", "gpu_value", '
        '"", "") or '
        'label_replace(timestamp(DCGM_FI_DEV_GPU_UTIL{GPU_I_PROFILE="",exported_pod="p"}), "gpu_steward_recheck", '
        '"gpu_last", "", "")')


def test_judge_compares_short_host_names_when_told() -> None:
    config = settings_loader.load(overrides={"prometheus": {"hostname_match": "short-name"}})
    rows = [now(), *gpu("0", 1.0, host="n1.example"), *gpu("1", 1.0)]
    assert recheck.judge(victim(), rows, threshold_percent=5.0, config=config) == recheck.Verdict(
        True, "re-check: still idle (2 device(s) at most 1.0%, newest samples at most 10s old) < 5%")


@pytest.mark.parametrize(
    ("pods", "matcher"),
    [
        # Adversarial first: a name's `.` is a regex wildcard unless escaped (`a.x` must not read pod `aXx`).
        pytest.param(["web-0.x", "b"], r'pod=~"b|web-0\\.x"', id="several-names-one-regex-dot-escaped"),
        pytest.param(["b", "a", "b"], 'pod=~"a|b"', id="several-names-sorted-once-each"),
        pytest.param(["p", "p"], 'pod="p"', id="one-name-is-matched-exactly"),
    ],
)
def test_newest_query_reads_a_demands_victims_in_one_query(pods: list[str], matcher: str) -> None:
    """One re-check query for all of a transaction's victims (each judged on the rows of its own namespace, name
    and node); the real Prometheus' answer to the regex is in tests/integration/test_evictor.py."""
    query = utilisation_promql.newest(pods, config=CONFIG.prometheus, kinds=("gpu",))
    assert query.count(f'DCGM_FI_DEV_GPU_UTIL{{GPU_I_PROFILE="",{matcher}}}') == 2
    assert query.count(f'DCGM_FI_DEV_GPU_UTIL{{GPU_I_PROFILE="",exported_{matcher}}}') == 2


def test_newest_query_carries_the_scope_matchers() -> None:
    """A shared store: the re-check reads only this cluster's series, and the client's scope check passes it."""
    config = settings_loader.load(overrides={"prometheus": {"scope_matchers": ['cluster="a"']}}).prometheus
    query = utilisation_promql.newest(["p", "q"], config=config, kinds=("gpu",))
    assert query.count('DCGM_FI_DEV_GPU_UTIL{cluster="a",GPU_I_PROFILE="",') == 4
    assert not dcgm.unscoped(query, config=config)


def test_newest_query_of_mig_instances_alone_reads_the_ratio_metric_in_percent() -> None:
    """A MIG victim's re-check asks only for MIG instances, and DCGM's ratio metric scaled to percent (as the
    measurement reads it: a 0.5 ratio must not look idle under a 5 % threshold)."""
    query = utilisation_promql.newest(["p"], config=CONFIG.prometheus, kinds=("mig",))
    assert query == (
        'label_replace(vector(time()), "gpu_steward_recheck", "now", "", "") or '
        'label_replace(DCGM_FI_PROF_GR_ENGINE_ACTIVE{GPU_I_PROFILE!="",pod="p"} * 100, "gpu_steward_recheck", '
        '"mig_value", "", "") or '
        'label_replace(timestamp(DCGM_FI_PROF_GR_ENGINE_ACTIVE{GPU_I_PROFILE!="",pod="p"}), "gpu_steward_recheck", '
        '"mig_last", "", "") or '
        'label_replace(DCGM_FI_PROF_GR_ENGINE_ACTIVE{GPU_I_PROFILE!="",exported_pod="p"} * 100, "gpu_steward_recheck", '
        '"mig_value", "", "") or '
        'label_replace(timestamp(DCGM_FI_PROF_GR_ENGINE_ACTIVE{GPU_I_PROFILE!="",exported_pod="p"}), '
        '"gpu_steward_recheck", "mig_last", "", "")')
