"""Instant PromQL queries, off the event loop, with one error type for every way they fail.

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
import pathlib
from typing import Any

import orjson
import requests
import requests.auth
from prometheus_api_client import prometheus_connect
from urllib3.util import retry

from common import settings

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
        # prometheus-api-client sets the session up for this URL (its retry policy: none, see above; proxies).
        # Its `custom_query` cannot serve us: it drops the answer's `warnings` (partial data must fail closed)
        # and sends the query in the URL (the reclaim queries run to KB), so queries are POSTed on the session.
        prometheus_connect.PrometheusConnect(url=self._url, session=session,
                                             retry=retry.Retry(total=0, raise_on_status=False), method="POST")
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

    async def _ask(self, endpoint: str, form: dict[str, str]) -> Answer:
        """POST `form` to /api/v1/<endpoint> in a worker thread, bounded by the timeout; every failure is a
        PrometheusError naming the server, never the query."""
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
