"""PromQL queries and the store's start-up checks, off the event loop, with one error type for every way they fail.

Two clients over one requests session, divided by what each does best:
- the hot path (every reclaim cycle, the occupancy refresh, the history reads) POSTs its queries itself
  (`instant`, `query_range`): prometheus-api-client's `custom_query` drops the answer's `warnings` (partial data
  must fail closed), sends the query in the URL (the reclaim queries run to KB) and decodes with json, 2-3x
  slower than orjson on tens of MB at 10,000 GPUs;
- prometheus-api-client (`PrometheusConnect`) does the start-up and `gpu-steward check --prometheus` checks
  (`store_facts`): a few small answers, where its `custom_query` and `get_label_names` (the `/api/v1/labels`
  API with `match[]`) say what each configured metric's series carry; the retention comes from
  `/api/v1/status/runtimeinfo` (Prometheus), else `/api/v1/status/flags`, on the same session. common.dcgm
  judges the facts (`store_checks`).

requests is synchronous, so each query runs in a worker thread bounded twice: by `asyncio.timeout` (the
caller never waits longer) and by the requests timeout (the thread ends too). No retries: a dead
Prometheus must not turn into a multi-second wait; our loops retry on their next cycle instead.

Queries go as a form-encoded POST (`/api/v1/query` accepts it on Prometheus, Thanos, Mimir and
VictoriaMetrics): the reclaim query is several KB, past what proxies in front of a store accept in a URL.
An answer keeps its `warnings` (Thanos' partial responses, a store that skipped data): the caller decides
what a partial answer is worth. Error messages name the server and the failure, never the query (it is
long, and a failed cycle is told once, not once per pod).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import pathlib
from typing import Any

import orjson
import requests
import requests.auth
from prometheus_api_client import exceptions, prometheus_connect
from urllib3.util import retry

from common import dcgm, settings

CHECK_REQUESTS = 6  # `store_facts`: a count and the label names of each of two metrics, two status endpoints
# {"metric": {...}, "value": [t, "v"]}, or "values": [[t, "v"], ...] for a range selector
Series = dict[str, Any]


class PrometheusError(Exception):
    """HTTP error, timeout, connection failure or a malformed answer."""


@dataclasses.dataclass(frozen=True)
class Answer:
    series: list[Series]
    warnings: tuple[str, ...] = ()  # the store says the answer may be incomplete


class _BearerFile(requests.auth.AuthBase):
    """Reads the token file on every request: projected service-account tokens rotate."""

    def __init__(self, path: pathlib.Path) -> None:
        self._path = path

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        try:
            token = self._path.read_text().strip()
        except OSError as exc:
            raise PrometheusError(f"bearer token file {self._path}: {exc}") from exc
        request.headers["Authorization"] = f"Bearer {token}"
        return request


class Client:
    def __init__(self, config: settings.Prometheus) -> None:
        if not config.url:
            raise ValueError("prometheus.url is not set")
        self._config = config
        self._url = config.url.rstrip("/")
        session = requests.Session()
        session.verify = False if config.insecure_skip_verify else str(config.ca_file) if config.ca_file else True
        session.headers.update(config.headers)
        if config.bearer_token_file:
            session.auth = _BearerFile(pathlib.Path(config.bearer_token_file))
        # prometheus-api-client sets the session up for this URL (its retry policy: none, see above) and serves the
        # start-up checks (`store_facts`); the hot path's queries are POSTed on the session (module docstring).
        self._api = prometheus_connect.PrometheusConnect(
            url=self._url, session=session, retry=retry.Retry(total=0, raise_on_status=False), method="POST",
            timeout=math.ceil(config.timeout_seconds))  # its type says whole seconds
        self._session = session

    @property
    def url(self) -> str:
        return self._url

    def close(self) -> None:
        self._session.close()

    async def query(self, promql: str, *, time: float | None = None) -> list[Series]:
        """The `result` list of an instant query (a vector, or a matrix for range selectors)."""
        return (await self.instant(promql, time=time)).series

    async def instant(self, promql: str, *, time: float | None = None) -> Answer:
        """An instant query at `time`, or at the store's own "now" when None (the store's clock decides
        what "the last hour" is: see descheduler.reclaim.measurement)."""
        form = {"query": promql} if time is None else {"query": promql, "time": f"{time:.3f}"}
        return await self._ask("query", form)

    async def query_range(self, promql: str, *, start: float, end: float, step: float) -> list[Series]:
        """The `result` matrix of a range query: `values` [[t, "v"], ...] per series, every `step` seconds. An
        answer with `warnings` is refused (PrometheusError): a history with holes the store admits is not used."""
        answer = await self._ask("query_range", {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}",
                                                 "step": f"{step:g}"})
        if answer.warnings:
            raise PrometheusError(f"partial answer from {self.url}: {'; '.join(answer.warnings):.300}")
        return answer.series

    async def store_facts(self) -> dcgm.StoreFacts:
        """What the store says of the configured metrics under the scope matchers, and its retention, read with
        prometheus-api-client in a worker thread (at most `CHECK_REQUESTS` requests, each bounded by
        `timeout_seconds`)."""
        try:
            async with asyncio.timeout(self._config.timeout_seconds * CHECK_REQUESTS):
                return await asyncio.to_thread(self._store_facts)
        except TimeoutError as exc:
            raise PrometheusError(f"store checks timed out at {self.url}") from exc
        except (requests.RequestException, exceptions.PrometheusApiClientException, ValueError, KeyError,
                TypeError) as exc:
            raise PrometheusError(f"store checks failed at {self.url}: {exc!s:.300}") from exc

    def _store_facts(self) -> dcgm.StoreFacts:
        metrics = {}
        for metric in dict.fromkeys([self._config.gpu_util_metric, self._config.mig_activity_metric]):
            selector = dcgm.selector(metric, config=self._config)
            counted = self._api.custom_query(f"count({selector})")
            series = int(float(counted[0]["value"][1])) if counted else 0
            names = self._api.get_label_names(params={"match[]": selector}) if series else []
            metrics[metric] = dcgm.MetricFacts(series, frozenset(names))
        retention, source = None, "the store reports no retention (Thanos, Mimir: check the object store's)"
        for endpoint, key in (("runtimeinfo", "storageRetention"), ("flags", "storage.tsdb.retention.time")):
            response = self._session.get(f"{self._url}/api/v1/status/{endpoint}",
                                         timeout=self._config.timeout_seconds)
            if response.status_code != 200:
                continue
            value = (orjson.loads(response.content).get("data") or {}).get(key)
            if isinstance(value, str) and value not in ("", "0s"):
                retention, source = value, f"/api/v1/status/{endpoint} {key}"
                break
        return dcgm.StoreFacts(metrics, retention, source)

    async def _ask(self, endpoint: str, form: dict[str, str]) -> Answer:
        """POST `form` to /api/v1/<endpoint> in a worker thread, bounded by the timeout; every failure is a
        PrometheusError naming the server, never the query. A query with a selector not scoped by
        `prometheus.scope_matchers` is refused unsent (common.dcgm.selector writes scoped ones)."""
        if dcgm.unscoped(form["query"], config=self._config):
            raise PrometheusError(f"refused a query with a selector not scoped by prometheus.scope_matchers "
                                  f"{self._config.scope_matchers}: {form['query']:.200}")
        try:
            async with asyncio.timeout(self._config.timeout_seconds):
                body = await asyncio.to_thread(self._post, endpoint, form)
        except TimeoutError as exc:
            raise PrometheusError(f"query timed out after {self._config.timeout_seconds}s at {self.url}") from exc
        except orjson.JSONDecodeError as exc:
            raise PrometheusError(f"malformed answer from {self.url}: not JSON: {exc}") from exc
        except requests.RequestException as exc:
            raise PrometheusError(f"cannot reach {self.url}: {exc}") from exc
        return _checked(body, url=self.url)

    def _post(self, endpoint: str, form: dict[str, str]) -> Any:
        response = self._session.post(f"{self._url}/api/v1/{endpoint}", data=form,
                                      timeout=self._config.timeout_seconds)
        if response.status_code != 200:
            raise PrometheusError(
                f"query failed at {self.url}: HTTP Status Code {response.status_code} ({response.content[:300]!r})")
        return orjson.loads(response.content)  # answers run to tens of MB at 10,000 GPUs: 2-3x json's speed


def _checked(body: Any, *, url: str) -> Answer:
    try:
        result = body["data"]["result"]
        warnings = body.get("warnings") or []
    except (KeyError, TypeError, AttributeError) as exc:
        raise PrometheusError(f"malformed answer from {url}: {exc!r}") from exc
    if not isinstance(result, list) or not all(
        isinstance(s, dict) and isinstance(s.get("metric"), dict) for s in result
    ):
        raise PrometheusError(f"malformed answer from {url}: expected a list of series, got {result!r:.200}")
    if not isinstance(warnings, list):
        raise PrometheusError(f"malformed answer from {url}: warnings {warnings!r:.200} is not a list")
    return Answer(series=result, warnings=tuple(str(w) for w in warnings))
