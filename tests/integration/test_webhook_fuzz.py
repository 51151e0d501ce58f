"""Fuzzing the real TLS webhook with random and malformed AdmissionReviews (seeded, bounded, a few seconds).

The contract: a body that is a review (the `admission.k8s.io/v1` envelope with a request `uid`) is always
answered HTTP 200 with a well-formed review that admits the object (`allowed: true`, its uid echoed, any
patch a JSON patch that applies to the object); any other body gets a 4xx. Never a 5xx: the API server
would fail the pod's creation with a webhook error (or, under failurePolicy Ignore, wait out our timeout).

Reviews are mutated from the fixtures kube-apiserver sent (each mutation replaces, deletes or adds one
value anywhere in the document, several per review), plus random JSON documents and random bytes.
"""

from __future__ import annotations

import base64
import copy
import json
import random
from typing import Any

import jsonpatch
import orjson
import pytest

from admission import review
from tests.integration import conftest

SEED = 20261124
REVIEWS = 2500
SHAPELESS = 300
FIXTURES = sorted(p.stem for p in conftest.FIXTURES.glob("*.json") if p.stem != "cluster")
# Keys the engine reads: fuzzing them specifically finds more than fuzzing managedFields.
KEYS = ("metadata", "labels", "annotations", "name", "namespace", "spec", "containers", "resources", "limits",
        "requests", "nvidia.com/gpu", "schedulingGates", "affinity", "nodeAffinity", "priorityClassName",
        "gpu-steward.io/skip", "gpu-steward.io/gang-name", "gpu-steward.io/gang-size", "gpu-steward.io/tier",
        "gpu-steward.io/placement", "schedulingGroup", "podGroupName", "ownerReferences", "object", "kind",
        "operation", "subResource", "oldObject", "dryRun", "uid", "generateName", "preemptionPolicy")


def _scalar(rng: random.Random) -> Any:
    return rng.choice([
        None, True, False, 0, -1, 1, 2**63, -(2**70), 1.5, float("1e308"), "", "1", "4", "-2", "1_000", " 4",
        "true", "off", "critical", "strict", "\u0000", "\ud7ff" * 3, "x" * 300, "500m", "CREATE", "Pod",
    ])


def _value(rng: random.Random, depth: int = 0) -> Any:
    roll = rng.random()
    if depth > 2 or roll < 0.6:
        return _scalar(rng)
    if roll < 0.8:
        return [_value(rng, depth + 1) for _ in range(rng.randrange(3))]
    return {rng.choice(KEYS): _value(rng, depth + 1) for _ in range(rng.randrange(3))}


def _containers(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Paths of every dict and list in the document."""
    found = [path]
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        if isinstance(child, dict | list):
            found += _containers(child, (*path, key))
    return found


def _mutate(document: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    for _ in range(rng.randrange(1, 5)):
        path = rng.choice(_containers(document))
        node: Any = document
        for key in path:
            node = node[key]
        if isinstance(node, dict):
            keys = list(node)
            op = rng.random()
            if keys and op < 0.45:
                node[rng.choice(keys)] = _value(rng)
            elif keys and op < 0.6:
                del node[rng.choice(keys)]
            else:
                node[rng.choice(KEYS)] = _value(rng)
        elif node:
            node[rng.randrange(len(node))] = _value(rng)
        else:
            node.append(_value(rng))
    return document


def _is_review(document: Any) -> bool:
    """What the API server could send: the v1 envelope with a request uid (anything else inside it may vary)."""
    if not isinstance(document, dict) or not isinstance(document.get("request"), dict):
        return False
    uid = document["request"].get("uid")
    return (document.get("apiVersion") == review.API_VERSION and document.get("kind") == review.KIND
            and isinstance(uid, str) and bool(uid))


def _bodies() -> list[bytes]:
    rng = random.Random(SEED)
    originals = [conftest.review_fixture(name) for name in FIXTURES]
    bodies = [json.dumps(_mutate(copy.deepcopy(rng.choice(originals)), rng)).encode() for _ in range(REVIEWS)]
    bodies += [json.dumps(_value(rng)).encode() for _ in range(SHAPELESS // 2)]
    bodies += [rng.randbytes(rng.randrange(64)) for _ in range(SHAPELESS // 2)]
    return bodies


async def test_fuzzed_reviews_are_always_admitted_and_other_bodies_refused(webhook: conftest.Webhook) -> None:
    reviews = 0
    for body in _bodies():
        try:
            document = orjson.loads(body)
        except orjson.JSONDecodeError:
            document = None
        async with webhook.session.post(f"{webhook.url}/mutate", data=body,
                                        headers={"Content-Type": "application/json"}) as response:
            status, text = response.status, (await response.read()).decode(errors="replace")
        if not _is_review(document):
            assert 400 <= status < 500, (status, body[:500], text[:500])
            continue
        reviews += 1
        assert status == 200, (body[:2000], text[:500])
        answer = json.loads(text)
        assert (answer["apiVersion"], answer["kind"]) == (review.API_VERSION, review.KIND)
        assert answer["response"]["uid"] == document["request"]["uid"]
        assert answer["response"]["allowed"] is True
        assert all(isinstance(w, str) for w in answer["response"].get("warnings", []))
        if "patch" in answer["response"]:
            assert answer["response"]["patchType"] == "JSONPatch"
            patch = json.loads(base64.b64decode(answer["response"]["patch"]))
            jsonpatch.apply_patch(document["request"]["object"], patch)  # raises if it does not apply
    assert reviews > REVIEWS // 3  # the mutations left most envelopes intact: the engine was exercised


@pytest.mark.parametrize(
    ("field", "value"),
    [
        pytest.param("object", "a string", id="object-not-a-map"),
        pytest.param("kind", "Pod", id="kind-not-a-map"),
        pytest.param("operation", 7, id="operation-not-a-string"),
        pytest.param("oldObject", [1], id="old-object-not-a-map"),
    ],
)
async def test_a_review_with_fields_we_cannot_read_is_admitted(
    webhook: conftest.Webhook, field: str, value: Any
) -> None:
    """A review, even with request fields we cannot read (read as absent), is admitted (old code: HTTP 400)."""
    body = conftest.review_fixture("pod-create-gpu")
    body["request"][field] = value
    answer = await webhook.review(body)
    assert (answer["response"]["uid"], answer["response"]["allowed"]) == (body["request"]["uid"], True)


@pytest.mark.parametrize(
    "metadata",
    [
        pytest.param([], id="list"),
        pytest.param("pod", id="string"),
        pytest.param(7, id="number"),
    ],
)
async def test_metadata_that_is_not_a_mapping_is_admitted_unchanged(webhook: conftest.Webhook, metadata: Any) -> None:
    """Old code: the error path read `metadata.get(...)` to name the pod in its log line: HTTP 500."""
    body = conftest.review_fixture("pod-create-gpu")
    body["request"]["object"]["metadata"] = metadata
    del body["request"]["name"]
    answer = await webhook.review(body)
    assert answer["response"]["allowed"] is True and "patch" not in answer["response"]
