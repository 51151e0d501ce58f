"""Instant PromQL queries, off the event loop, with one error type for every way they fail.

prometheus-api-client is synchronous (requests), so each query runs in a worker thread bounded twice:
by `asyncio.timeout` (the caller never waits longer) and by the requests timeout (the thread ends too).
The client never retries by itself: its default would retry 3 times with backoff and turn a dead
Prometheus into a 7-second wait; our loops retry on their next cycle instead.
"""

from __future__ import annotations

import asyncio
import datetime
import pathlib
from collections.abc import Callable
from typing import Any

import requests
import requests.auth
from prometheus_api_client import exceptions, prometheus_connect
from urllib3.util import retry

from common import settings

# {"metric": {...}, "value": [t, "v"]}, or "values": [[t, "v"], ...] for a range selector
Series = dict[str, Any]


class PrometheusError(Exception):
    """HTTP error, timeout, connection failure or a malformed answer."""


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
        session = requests.Session()
        session.verify = False if config.insecure_skip_verify else str(config.ca_file) if config.ca_file else True
        self._connect = prometheus_connect.PrometheusConnect(
            url=config.url.rstrip("/"),
            headers=dict(config.headers),
            session=session,
            retry=retry.Retry(total=0, raise_on_status=False),
            # requests takes any AuthBase and float timeouts; the library's annotations are narrower
            auth=_BearerFile(config.bearer_token_file) if config.bearer_token_file else None,  # type: ignore[arg-type]
            timeout=config.timeout_seconds,  # type: ignore[arg-type]
        )

    @property
    def url(self) -> str:
        return str(self._connect.url)

    def close(self) -> None:
        self._connect.close()

    async def query(self, promql: str, *, time: float | None = None) -> list[Series]:
        """The `result` list of an instant query (a vector, or a matrix for range selectors)."""
        params = {} if time is None else {"time": f"{time:.3f}"}
        return await self._ask(promql, lambda: self._connect.custom_query(promql, params=params))

    async def query_range(self, promql: str, *, start: float, end: float, step: float) -> list[Series]:
        """The `result` matrix of a range query: `values` [[t, "v"], ...] per series, every `step` seconds."""
        utc = datetime.UTC
        return await self._ask(promql, lambda: self._connect.custom_query_range(
            promql, start_time=datetime.datetime.fromtimestamp(start, utc),
            end_time=datetime.datetime.fromtimestamp(end, utc), step=f"{step:g}s"))

    async def _ask(self, promql: str, call: Callable[[], Any]) -> list[Series]:
        """`call` in a worker thread, bounded by the timeout; every failure is a PrometheusError."""
        try:
            async with asyncio.timeout(self._config.timeout_seconds):
                result = await asyncio.to_thread(call)
        except TimeoutError as exc:
            raise PrometheusError(
                f"query timed out after {self._config.timeout_seconds}s at {self.url}: {promql}"
            ) from exc
        except exceptions.PrometheusApiClientException as exc:
            raise PrometheusError(f"query failed at {self.url}: {exc}: {promql}") from exc
        except requests.JSONDecodeError as exc:  # before RequestException: it is one too
            raise PrometheusError(f"malformed answer from {self.url}: not JSON: {exc}") from exc
        except requests.RequestException as exc:
            raise PrometheusError(f"cannot reach {self.url}: {exc}") from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise PrometheusError(f"malformed answer from {self.url}: {exc!r}") from exc
        return _checked(result, url=self.url)


def _checked(result: Any, *, url: str) -> list[Series]:
    if not isinstance(result, list) or not all(
        isinstance(s, dict) and isinstance(s.get("metric"), dict) for s in result
    ):
        raise PrometheusError(f"malformed answer from {url}: expected a list of series, got {result!r:.200}")
    return result
