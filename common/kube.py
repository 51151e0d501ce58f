"""The one place that loads Kubernetes client configuration, and raw-JSON calls over it.

We work on plain dicts, never on kubernetes_asyncio's generated models: they cost ~10x more to
build (measured: see `tests/integration/test_feeder.py::test_raw_list_is_cheaper_than_models`) and
drop fields they do not know. JSON is decoded by `jsontext.loads` (orjson's speed, the standard library's
result). Every call goes through `ApiClient.call_api` with
`_preload_content=False` (auth, TLS and host come from the loaded configuration) and carries a timeout.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import aiohttp
import yaml
from kubernetes_asyncio import client, config

from common import jsontext, settings

QueryValue = str | int | bool
DEFAULT_KUBECONFIG = "~/.kube/config"
Json = dict[str, Any]


class ApiError(Exception):
    """The API server answered with a non-2xx status (`status`) or an unreadable body (status 0)."""

    def __init__(self, status: int, message: str, *, body: Any = None) -> None:
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status
        self.body = body


async def api_client(cfg: settings.Kubernetes) -> client.ApiClient:
    """A client for `cfg.kubeconfig` if set, else the in-cluster service account, else $KUBECONFIG or
    ~/.kube/config. No usable configuration raises `settings.SettingsError` saying which one and why."""
    configuration = client.Configuration()
    if cfg.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except config.ConfigException as exc:
            raise settings.SettingsError(f"in-cluster Kubernetes configuration: {exc}") from exc
        return client.ApiClient(configuration)
    where, files = _kubeconfig(cfg)
    try:
        await config.load_kube_config(config_file=files, context=cfg.context, client_configuration=configuration)
    except (config.ConfigException, OSError, yaml.YAMLError) as exc:
        raise settings.SettingsError(f"invalid {where}: {' '.join(str(exc).split())}") from exc
    except (TypeError, AttributeError, KeyError, ValueError) as exc:
        # The loader indexes the document without checking its shape (a YAML list, a string...).
        raise settings.SettingsError(f"invalid {where}: not a kubeconfig ({type(exc).__name__}: {exc})") from exc
    return client.ApiClient(configuration)


def _kubeconfig(cfg: settings.Kubernetes) -> tuple[str, str]:
    """(how messages name it, the files to load joined by the path separator); SettingsError if none exists."""
    if cfg.kubeconfig is not None:
        where, names = f"kubeconfig {cfg.kubeconfig} (kubernetes.kubeconfig)", str(cfg.kubeconfig)
    else:
        # Read now: the library's own default location was fixed when it was imported.
        variable = os.environ.get("KUBECONFIG")
        where = f"kubeconfig {variable} ($KUBECONFIG)" if variable else f"kubeconfig {DEFAULT_KUBECONFIG}"
        names = variable or DEFAULT_KUBECONFIG
    files = [os.path.expanduser(name) for name in names.split(os.pathsep) if name]
    if any(os.path.exists(name) for name in files):
        return where, os.pathsep.join(files)
    if cfg.kubeconfig is not None:
        raise settings.SettingsError(f"{where} does not exist")
    raise settings.SettingsError(
        f"no Kubernetes configuration: {where} does not exist, and this is not a pod in a cluster "
        "(KUBERNETES_SERVICE_HOST is unset); set KUBECONFIG, or the setting kubernetes.kubeconfig (--kubeconfig)"
    )


def _query(params: Mapping[str, QueryValue] | None) -> list[tuple[str, str]]:
    out = []
    for key, value in (params or {}).items():
        out.append((key, ("true" if value else "false") if isinstance(value, bool) else str(value)))
    return out


async def _send(
    api: client.ApiClient,
    method: str,
    path: str,
    *,
    query: Mapping[str, QueryValue] | None,
    body: Any,
    content_type: str,
    bounds: aiohttp.ClientTimeout,
) -> aiohttp.ClientResponse:
    headers = {"Accept": "application/json"}
    if method != "GET":
        headers["Content-Type"] = content_type
    response: aiohttp.ClientResponse = await api.call_api(
        path,
        method,
        query_params=_query(query),
        header_params=headers,
        body=body,
        auth_settings=["BearerToken"],
        _preload_content=False,
        _request_timeout=bounds,
    )
    return response


async def _error(response: aiohttp.ClientResponse) -> ApiError:
    text = await response.text()
    try:
        status: Any = jsontext.loads(text)
    except ValueError:
        return ApiError(response.status, text[:500] or str(response.reason))
    message = status.get("message") if isinstance(status, dict) else None
    return ApiError(response.status, str(message or response.reason), body=status)


async def request(
    api: client.ApiClient,
    method: str,
    path: str,
    *,
    timeout_seconds: float,
    query: Mapping[str, QueryValue] | None = None,
    body: Any = None,
    content_type: str = "application/json",
) -> Json:
    """One API call, decoded as a JSON object. Non-2xx raises `ApiError` carrying the status."""
    async with await _send(
        api,
        method,
        path,
        query=query,
        body=body,
        content_type=content_type,
        bounds=aiohttp.ClientTimeout(total=timeout_seconds),
    ) as response:
        if not 200 <= response.status <= 299:
            raise await _error(response)
        raw = await response.read()
    try:
        decoded = jsontext.loads(raw)
    except ValueError as exc:
        raise ApiError(0, f"{method} {path}: response is not JSON: {exc}") from exc
    if not isinstance(decoded, dict):
        raise ApiError(0, f"{method} {path}: response is not a JSON object")
    return decoded


async def get(
    api: client.ApiClient, path: str, *, timeout_seconds: float, query: Mapping[str, QueryValue] | None = None
) -> Json:
    return await request(api, "GET", path, timeout_seconds=timeout_seconds, query=query)


async def watch(
    api: client.ApiClient,
    path: str,
    *,
    resource_version: str,
    server_timeout_seconds: int,
    timeout_seconds: float,
    query: Mapping[str, QueryValue] | None = None,
    on_connect: Callable[[], None] | None = None,
) -> AsyncIterator[Json]:
    """Watch events (`{"type": ..., "object": ...}`) from `resource_version` until the server ends the stream.

    The server closes the stream after `server_timeout_seconds`; `timeout_seconds` is added on top
    as the client's bound, so a silently dead connection ends too. ERROR events are yielded, not
    raised: the caller decides (410 Gone means relist). `on_connect` is called once the server has
    accepted the watch (a quiet stream yields nothing for minutes, yet proves the connection
    alive). Lines are split by hand: aiohttp's line reader refuses lines over 128 KiB, and a Node
    with many images is bigger.
    """
    params: dict[str, QueryValue] = {
        **(query or {}),
        "watch": True,
        "resourceVersion": resource_version,
        "allowWatchBookmarks": True,
        "timeoutSeconds": server_timeout_seconds,
    }
    async with await _send(
        api,
        "GET",
        path,
        query=params,
        body=None,
        content_type="application/json",
        bounds=aiohttp.ClientTimeout(total=server_timeout_seconds + timeout_seconds, sock_connect=timeout_seconds),
    ) as response:
        if not 200 <= response.status <= 299:
            raise await _error(response)
        if on_connect is not None:
            on_connect()
        pending = b""
        async for chunk in response.content.iter_any():
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.strip():
                    yield _event(line)
        if pending.strip():
            yield _event(pending)


def _event(line: bytes) -> Json:
    try:
        event = jsontext.loads(line)
    except ValueError as exc:  # invalid UTF-8 included
        raise ApiError(0, f"watch event is not JSON: {exc}: {line[:200]!r}") from exc
    if not isinstance(event, dict) or not isinstance(event.get("object"), dict):
        raise ApiError(0, f"watch event without an object: {line[:200]!r}")
    return event
