"""The no-op admission webhook the webhook benchmarks hold gpu-steward's against (a module, not a benchmark).

`webhook_latency.py` and `webhook_apiserver.py` each run it as a process of their own (`--serve-noop`).
Run as a script it does nothing: `scripts/test` runs every `benchmarks/*.py` with `--quick`.
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))  # as the benchmarks do: an installed gpu-steward wins; a bare checkout works too

import orjson  # noqa: E402
from aiohttp import web  # noqa: E402

from admission import tls  # noqa: E402
from common import settings  # noqa: E402


def serve_noop(*, port: int, cert_file: pathlib.Path, key_file: pathlib.Path, fast_json: bool = False) -> None:
    """The baseline: decode JSON, echo the uid, allow (no patch). Same TLS context as the real server.
    `fast_json`: orjson in and out, as gpu-steward does, instead of the standard library's json.

    GET /requests answers how many reviews it has allowed so far: the one sign that the API server
    calls it, since it changes nothing in the pod."""
    requests = 0
    loads = orjson.loads if fast_json else json.loads

    def dumps(answer: dict[str, Any]) -> bytes:
        return orjson.dumps(answer) if fast_json else json.dumps(answer).encode()

    async def mutate(request: web.Request) -> web.Response:
        nonlocal requests
        uid = loads(await request.read())["request"]["uid"]
        requests += 1
        answer = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                  "response": {"uid": uid, "allowed": True}}
        return web.Response(body=dumps(answer), content_type="application/json")

    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def count(request: web.Request) -> web.Response:
        return web.Response(text=f"{requests}\n")

    app = web.Application()
    app.router.add_post("/mutate", mutate)
    app.router.add_get("/readyz", healthz)
    app.router.add_get("/requests", count)
    context = tls.ssl_context(settings.Webhook(cert_file=cert_file, key_file=key_file))
    web.run_app(app, host="127.0.0.1", port=port, ssl_context=context, access_log=None, print=None)
