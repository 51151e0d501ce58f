"""The admission webhook over real TLS: the wire contract with kube-apiserver, fail-safe answers,
health/readiness, metrics, certificate rotation, and the `gpu-steward webhook` process itself.

What the engine decides (tiers, affinity, gates) is tested in the unit tests of `admission.*`;
here the engine's answers only need to reach the wire intact.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import logging
import os
import pathlib
import ssl
from typing import Any

import aiohttp
import jsonpatch
import pytest
from prometheus_client import parser

from admission import gating, mutation, review, tls
from common import buildinfo, settings, snapshot, source
from gpu_steward import cli
from gpu_steward_lab import certs
from tests.integration import conftest
from tests.support import processes
from tests.support.prometheus import free_port

DECISION = "gpu-steward.io/decision"
GATE = "gpu-steward.io/gang"


def metric(text: str, name: str, **labels: str) -> float:
    """One sample of a /metrics page (0 when the series is absent)."""
    for family in parser.text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return float(sample.value)
    return 0.0


def decoded_patch(answer: dict[str, Any]) -> list[dict[str, Any]]:
    response = answer["response"]
    if "patch" not in response:
        return []
    assert response["patchType"] == "JSONPatch"
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(response["patch"]))
    return ops


class Engine:
    """A stand-in engine that records its calls and answers what it is told to."""

    def __init__(self, outcome: mutation.Outcome | None = None, *, error: Exception | None = None) -> None:
        self.outcome = outcome
        self.error = error
        self.calls: list[dict[str, Any]] = []
        self.on_call: list[Any] = []

    def __call__(self, **kwargs: Any) -> mutation.Outcome:
        self.calls.append(kwargs)
        for hook in self.on_call:
            hook()
        if self.error is not None:
            raise self.error
        assert self.outcome is not None
        return self.outcome


class Timer:
    """A manual perf counter: the stand-in engine advances it to look slow without being slow."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- the wire contract ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "result", "why"),
    [
        pytest.param("pod-create-gpu", "mutated", None, id="gpu-pod-create"),
        pytest.param("pod-create-generate-name", "mutated", None, id="generate-name-pod"),
        pytest.param("pod-create-mig", "mutated", None, id="mig-pod"),
        pytest.param("pod-create-gang-member", "mutated", None, id="gang-member"),
        pytest.param("pod-create-gang-launcher", "mutated", None, id="gang-member-without-gpus"),
        pytest.param("pod-create-cpu", "skipped", "GPU", id="non-gpu-pod"),
        pytest.param("pod-update", "skipped", "UPDATE", id="update"),
        pytest.param("pod-delete", "skipped", "no pod object (DELETE)", id="delete-object-null"),
        pytest.param("deployment-create", "skipped", "not a pod (Deployment)", id="deployment-kind"),
        pytest.param("pod-create-mirror", "skipped", "mirror", id="mirror-pod"),
        pytest.param("pod-create-skip", "skipped", "gpu-steward.io/skip", id="skip-label"),
        pytest.param("pod-create-excluded-namespace", "skipped", "kube-system", id="excluded-namespace"),
    ],
)
async def test_every_review_is_allowed_and_echoes_its_uid(
    webhook: conftest.Webhook, caplog: pytest.LogCaptureFixture, fixture: str, result: str, why: str | None
) -> None:
    body = conftest.review_fixture(fixture)
    caplog.set_level(logging.DEBUG, logger="admission.server")
    before = (await webhook.get("/metrics"))[1]

    answer = await webhook.review(body)

    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == body["request"]["uid"]
    assert answer["response"]["allowed"] is True
    assert "warnings" not in answer["response"]
    assert bool(decoded_patch(answer)) == (result == "mutated")
    after = (await webhook.get("/metrics"))[1]
    name = "gpu_steward_admission_requests_total"
    assert metric(after, name, result=result) == metric(before, name, result=result) + 1
    (record,) = [r for r in caplog.records if body["request"]["uid"] in r.getMessage()]
    assert f"result={result}" in record.getMessage()
    assert record.levelno == logging.DEBUG  # no warning: the decision annotation and metrics are the record
    if why is not None:
        assert why in record.getMessage()


@pytest.mark.parametrize(
    ("fixture", "pod_ref"),
    [
        pytest.param("pod-create-gpu", "ml-team/llm-finetune", id="named"),
        pytest.param("pod-create-generate-name", "ml-team/bert-train-*", id="generate-name"),
    ],
)
async def test_the_log_line_names_the_pod(
    webhook: conftest.Webhook, caplog: pytest.LogCaptureFixture, fixture: str, pod_ref: str
) -> None:
    caplog.set_level(logging.DEBUG, logger="admission.server")
    body = conftest.review_fixture(fixture)
    await webhook.review(body)
    (line,) = [r.getMessage() for r in caplog.records if body["request"]["uid"] in r.getMessage()]
    assert f"pod={pod_ref} " in line
    assert "op=CREATE" in line and "duration_ms=" in line and "changes=" in line


@pytest.mark.parametrize(
    ("fixture", "gated"),
    [
        pytest.param("pod-create-gpu", True, id="gpu-pod"),  # placed at release (the descheduler is alive)
        pytest.param("pod-create-generate-name", True, id="generate-name-pod"),
        pytest.param("pod-create-gang-member", True, id="gang-member"),
        pytest.param("pod-create-gang-launcher", True, id="gang-member-without-gpus"),
    ],
)
async def test_the_patch_applies_to_the_request_object_and_is_idempotent(
    webhook: conftest.Webhook, fixture: str, gated: bool
) -> None:
    body = conftest.review_fixture(fixture)
    pod = body["request"]["object"]

    mutated = jsonpatch.apply_patch(pod, decoded_patch(await webhook.review(body)))

    assert DECISION in mutated["metadata"]["annotations"]
    assert mutated["metadata"]["labels"] == pod["metadata"]["labels"]  # the user's map kept, key by key
    assert mutated["spec"]["containers"] == pod["spec"]["containers"]
    assert mutated["spec"]["tolerations"] == pod["spec"]["tolerations"]
    assert ({"name": GATE} in mutated["spec"].get("schedulingGates", [])) == gated
    # Reinvocation (reinvocationPolicy: IfNeeded) or a retry sends the mutated pod again.
    again = copy.deepcopy(body)
    again["request"]["object"] = mutated
    assert decoded_patch(await webhook.review(again)) == []


async def test_the_engine_gets_the_request_and_its_answer_reaches_the_wire(
    start_webhook: conftest.StartWebhook, cluster: source.StaticSource, caplog: pytest.LogCaptureFixture
) -> None:
    patch = [{"op": "add", "path": "/metadata/labels/example.com~1team", "value": "a~b"}]
    engine = Engine(
        mutation.Outcome(
            patch=patch,
            changes=("tier", "decision"),
            record="r",
            warnings=("first warning", "x" * 1000),
            skipped=None,
        )
    )
    body = conftest.review_fixture("pod-create-generate-name")
    caplog.set_level(logging.DEBUG, logger="admission.server")

    async with start_webhook(decide=engine, clock=lambda: 1234.5) as hook:
        answer = await hook.review(body)
        page = (await hook.get("/metrics"))[1]

    (call,) = engine.calls
    assert call["operation"] == "CREATE"
    assert call["namespace"] == "ml-team"
    assert call["pod"] == body["request"]["object"]
    assert call["now"] == 1234.5
    assert call["cluster"].nodes is cluster.snapshot.nodes  # the source's snapshot (restamped copy)
    response = answer["response"]
    assert response["uid"] == body["request"]["uid"]
    assert response["patchType"] == "JSONPatch"
    assert decoded_patch(answer) == patch
    assert response["warnings"] == ["first warning", "x" * review.MAX_WARNING_CHARS]
    assert metric(page, "gpu_steward_admission_mutations_total", kind="tier") == 1
    assert metric(page, "gpu_steward_admission_warnings_total") == 2
    # An answer that warned the user is logged at INFO, unlike quiet ones.
    (record,) = [r for r in caplog.records if body["request"]["uid"] in r.getMessage()]
    assert record.levelno == logging.INFO and "result=mutated" in record.getMessage()


@pytest.mark.parametrize(("seen_at", "age", "release"), [
    pytest.param(1200.0, 34.5, gating.Release.GATED, id="alive"),
    pytest.param(None, -1.0, gating.Release.CONTROLLER_DOWN, id="not-seen"),
])
async def test_controller_liveness_reaches_the_engine_and_the_metrics(
    start_webhook: conftest.StartWebhook, seen_at: float | None, age: float, release: gating.Release
) -> None:
    engine = Engine(mutation.Outcome(patch=[], changes=(), record="r", warnings=(), skipped=None, release=release))

    async with start_webhook(decide=engine, clock=lambda: 1234.5, controller=lambda: seen_at) as hook:
        await hook.review(conftest.review_fixture("pod-create-gpu"))
        page = (await hook.get("/metrics"))[1]

    assert engine.calls[0]["controller_seen_at"] == seen_at
    assert metric(page, "gpu_steward_admission_controller_lease_age_seconds") == age
    assert metric(page, "gpu_steward_admission_release_decisions_total", decision=release.value) == 1
    others = [d for d in gating.Release if d is not release]
    assert [metric(page, "gpu_steward_admission_release_decisions_total", decision=d.value) for d in others] == [0]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(b"this is not json", "body is not JSON", id="not-json"),
        pytest.param(b"\xff\xfe{", "body is not JSON", id="not-utf8"),
        pytest.param(b"", "body is not JSON", id="empty"),
        pytest.param(b"[1, 2]", "not an admission.k8s.io/v1 AdmissionReview", id="json-array"),
        pytest.param(
            json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}).encode(),
            "request: Field required",
            id="a-pod-not-a-review",
        ),
        pytest.param(
            json.dumps(
                {"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {"uid": "u"}}
            ).encode(),
            "apiVersion",
            id="v1beta1",
        ),
        pytest.param(
            json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}).encode(),
            "request.uid: Field required",
            id="no-uid",
        ),
    ],
)
async def test_a_body_that_is_not_a_review_gets_400(webhook: conftest.Webhook, body: bytes, message: str) -> None:
    response = await webhook.post(body)

    assert response.status == 400
    assert message in await response.text()
    page = (await webhook.get("/metrics"))[1]
    assert metric(page, "gpu_steward_admission_requests_total", result="bad_request") == 1


def _raising() -> tuple[Engine, Timer, str]:
    return Engine(error=KeyError("spec")), Timer(), "KeyError"


def _over_budget() -> tuple[Engine, Timer, str]:
    timer = Timer()
    engine = Engine(
        mutation.Outcome(
            patch=[{"op": "add", "path": "/x", "value": 1}], changes=("tier",), record="late", warnings=(), skipped=None
        )
    )
    budget = settings.Webhook().request_timeout_seconds

    def slow() -> None:
        timer.now += budget + 0.5

    engine.on_call.append(slow)
    return engine, timer, "over the"


def _unencodable() -> tuple[Engine, Timer, str]:
    # JSON has no integers past 64 bits for orjson; whatever the engine hands back, the answer must encode.
    outcome = mutation.Outcome(patch=[{"op": "add", "path": "/x", "value": 2**70}], changes=("tier",), record="r",
                               warnings=(), skipped=None)
    return Engine(outcome), Timer(), "Integer exceeds 64-bit range"


@pytest.mark.parametrize(
    "make",
    [pytest.param(_raising, id="engine-raises"), pytest.param(_over_budget, id="over-budget"),
     pytest.param(_unencodable, id="patch-cannot-be-encoded")],
)
async def test_an_engine_failure_admits_the_pod_unchanged_with_a_warning(
    start_webhook: conftest.StartWebhook, caplog: pytest.LogCaptureFixture, make: Any
) -> None:
    engine, timer, why = make()
    body = conftest.review_fixture("pod-create-gpu")

    async with start_webhook(decide=engine, timer=timer) as hook:
        answer = await hook.review(body)
        page = (await hook.get("/metrics"))[1]
        health = await hook.get("/healthz")

    response = answer["response"]
    assert response["allowed"] is True
    assert response["uid"] == body["request"]["uid"]
    assert "patch" not in response
    (warning,) = response["warnings"]
    assert "admitted unchanged" in warning and why in warning
    assert metric(page, "gpu_steward_admission_requests_total", result="error") == 1
    assert metric(page, "gpu_steward_admission_warnings_total") == 1
    assert metric(page, "gpu_steward_admission_mutations_total", kind="tier") == 0
    assert any(why in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)
    assert health == (200, "ok\n")  # still serving


# --- health, readiness, metrics -------------------------------------------------------------------


class Syncing:
    """A source that has not synced yet, until told."""

    def __init__(self) -> None:
        self.synced = False
        self.snapshot = snapshot.EMPTY


async def test_readyz_waits_for_the_first_sync(start_webhook: conftest.StartWebhook) -> None:
    feed = Syncing()
    async with start_webhook(source=feed) as hook:
        not_ready = await hook.get("/readyz")
        alive = await hook.get("/healthz")
        age_before = metric((await hook.get("/metrics"))[1], "gpu_steward_admission_snapshot_age_seconds")
        feed.synced = True
        ready = await hook.get("/readyz")

    assert not_ready[0] == 503 and "not synced" in not_ready[1]
    assert alive == (200, "ok\n")
    assert age_before == -1
    assert ready == (200, "ok\n")


async def test_metrics_say_which_build_runs(webhook: conftest.Webhook) -> None:
    page = (await webhook.get("/metrics"))[1]
    assert metric(page, "gpu_steward_build_info", version=buildinfo.VERSION, python=buildinfo.PYTHON) == 1
    assert buildinfo.VERSION != "unknown"


async def test_metrics_count_requests_mutations_and_latency(
    start_webhook: conftest.StartWebhook, cluster: source.StaticSource
) -> None:
    taken_at = cluster.snapshot.taken_at
    assert taken_at is not None
    async with start_webhook(clock=lambda: taken_at + 42) as hook:
        before = (await hook.get("/metrics"))[1]
        await hook.review(conftest.review_fixture("pod-create-gpu"))
        await hook.review(conftest.review_fixture("pod-create-cpu"))
        await hook.review(conftest.review_fixture("pod-create-gang-member"))
        status, after = await hook.get("/metrics")

    assert status == 200
    name = "gpu_steward_admission_requests_total"
    assert [metric(before, name, result=r) for r in ("mutated", "skipped", "error")] == [0, 0, 0]
    assert [metric(after, name, result=r) for r in ("mutated", "skipped", "error")] == [2, 1, 0]
    assert metric(after, "gpu_steward_admission_mutations_total", kind="decision") == 2
    assert metric(after, "gpu_steward_admission_mutations_total", kind="gate") == 1
    assert metric(after, "gpu_steward_admission_request_duration_seconds_count") == 3
    assert metric(after, "gpu_steward_admission_snapshot_age_seconds") == 42


# --- TLS ------------------------------------------------------------------------------------------


async def _served_cert(port: int) -> bytes:
    """The DER certificate a fresh connection to 127.0.0.1 is served (no SNI, as the API server sends)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    _, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port, ssl=context), timeout=10)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        assert isinstance(der, bytes)
        return der
    finally:
        writer.close()
        await writer.wait_closed()


def _der(path: pathlib.Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(path.read_text())


@pytest.mark.parametrize(
    ("replaced", "rotates"),
    [
        pytest.param(("key_file", "cert_file"), True, id="cert-and-key-replaced"),
        pytest.param(("cert_file",), False, id="half-rotated-keeps-the-old-pair"),
    ],
)
async def test_new_connections_follow_certificate_rotation(
    start_webhook: conftest.StartWebhook,
    webhook_config: settings.Settings,
    serving_cert: certs.ServingCert,
    tmp_path: pathlib.Path,
    replaced: tuple[str, ...],
    rotates: bool,
) -> None:
    clock = Timer()
    context = tls.ssl_context(webhook_config.webhook, clock=clock)
    first = _der(serving_cert.cert_file)
    async with start_webhook(ssl_context=context) as hook:
        port = int(hook.url.rsplit(":", 1)[1])
        before = await _served_cert(port)
        rotated = certs.generate(tmp_path / "rotated", common_name="rotated")
        for name in replaced:  # as a Secret volume does: each file replaced at once, never half-written
            os.replace(getattr(rotated, name), getattr(serving_cert, name))
        too_soon = await _served_cert(port)
        clock.now += webhook_config.webhook.cert_check_seconds
        after = await _served_cert(port)

    assert before == too_soon == first  # the files are looked at no more than every cert_check_seconds
    assert after == (_der(serving_cert.cert_file) if rotates else first)
    assert (after != first) == rotates


# --- the process ----------------------------------------------------------------------------------


async def _spawn_webhook(*flags: str) -> asyncio.subprocess.Process:
    """`python -m gpu_steward webhook --cluster <fixture> FLAGS...`."""
    return await processes.spawn("webhook", "--cluster", str(conftest.CLUSTER_STATE), *flags)


async def test_the_webhook_process_serves_and_stops_on_sigterm(serving_cert: certs.ServingCert) -> None:
    port = free_port()
    process = await _spawn_webhook(
        "--cert-file", str(serving_cert.cert_file),
        "--key-file", str(serving_cert.key_file),
        "--host", "127.0.0.1",
        "--port", str(port),
    )  # fmt: skip
    with processes.reaped(process):
        url = f"https://127.0.0.1:{port}"
        connector = aiohttp.TCPConnector(ssl=conftest.client_context(serving_cert))
        async with aiohttp.ClientSession(connector=connector) as session:
            await processes.wait_until_ok(session, f"{url}/readyz", process)
            body = conftest.review_fixture("pod-create-gpu")
            async with session.post(f"{url}/mutate", json=body, timeout=aiohttp.ClientTimeout(total=10)) as response:
                answer = await response.json()
        _, log = await processes.terminate(process)

    assert answer["response"]["uid"] == body["request"]["uid"]
    assert answer["response"]["allowed"] is True
    assert process.returncode == 0
    assert f"webhook serving on https://127.0.0.1:{port}/mutate" in log
    assert "webhook stopped on SIGTERM" in log


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        pytest.param(["--port", "70000"], "webhook.port", id="port-out-of-range"),
        pytest.param([], "webhook.cert_file and webhook.key_file are required", id="no-certificate"),
        pytest.param(
            ["--cert-file", "/nonexistent.crt", "--key-file", "/nonexistent.key"],
            "No such file",
            id="missing-certificate",
        ),
    ],
)
async def test_a_bad_setting_exits_2_naming_it(flags: list[str], message: str) -> None:
    process = await _spawn_webhook(*flags)
    with processes.reaped(process):
        _, stderr = await asyncio.wait_for(process.communicate(), timeout=60)

    assert process.returncode == 2
    assert message in stderr.decode()


async def test_check_command_passes_against_a_ready_webhook_that_sees_a_leader(
    webhook: conftest.Webhook, serving_cert: certs.ServingCert, capsys: pytest.CaptureFixture[str]
) -> None:
    """The chart's helm test: `gpu-steward check` over real TLS (run in a thread: it blocks, the server is here)."""
    argv = ["check", "--webhook", webhook.url, "--ca-file", str(serving_cert.ca_file)]
    assert await asyncio.to_thread(cli.main, argv) == 0
    ready, leads = capsys.readouterr().out.splitlines()
    assert ready == f"ok   webhook {webhook.url} ready (HTTP 200)"
    assert leads.startswith("ok   a descheduler leads (its Lease renewed ")


async def test_check_command_fails_on_an_untrusted_certificate(
    webhook: conftest.Webhook, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = certs.generate(tmp_path / "other")
    assert await asyncio.to_thread(cli.main, ["check", "--webhook", webhook.url, "--ca-file",
                                               str(other.ca_file)]) == 1
    [line] = capsys.readouterr().out.splitlines()
    assert line.startswith(f"FAIL webhook {webhook.url} unreachable:") and "CERTIFICATE_VERIFY_FAILED" in line
