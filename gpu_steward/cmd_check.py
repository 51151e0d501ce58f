"""`gpu-steward check --webhook URL` / `--prometheus URL`: is the installation working? The chart's `helm test`
runs it.

Each check is one line (`ok` or `FAIL`, and why). `--webhook`: the webhook answers `/readyz` over TLS (its cluster
snapshot synced), and, unless `--no-descheduler`, the webhook has seen the descheduler's leader Lease renewed within
`admission.controller_stale_seconds` (its metric `gpu_steward_admission_controller_lease_age_seconds`): some
descheduler replica leads, so gated pods will be released. `--prometheus`: the store reclaim reads (the settings'
`prometheus` group, its URL replaced) has series of `prometheus.gpu_util_metric` under `prometheus.scope_matchers`,
each configured metric with series carries a per-GPU identity (`UUID` or `gpu`: not a recording rule), and its
retention is at least `--window` (the longest idle window; the descheduler checks the same at start against its
PriorityClasses). Exit 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import ssl
import sys
import urllib.error
import urllib.request

from common import dcgm, prometheus, settings
from gpu_steward import cmdline

LEASE_AGE = "gpu_steward_admission_controller_lease_age_seconds"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = cmdline.command(sub, "check", run=run,
                             help="check that the webhook answers and sees a descheduler leading, and that the metrics "
                                  "store serves "
                                  "reclaim (the chart's helm test)",
                             description=__doc__)
    parser.add_argument("--webhook", metavar="URL",
                        help="the webhook's base URL, e.g. https://gs-gpu-steward-webhook.gpu-steward.svc:443")
    parser.add_argument("--prometheus", metavar="URL",
                        help="check the metrics store reclaim reads, e.g. http://prometheus.monitoring.svc:9090")
    parser.add_argument("--window", type=float, metavar="SECONDS",
                        help="with --prometheus: the longest idle window the store's retention must cover")
    parser.add_argument("--ca-file", type=pathlib.Path, help="PEM CA that signs the webhook's certificate")
    parser.add_argument("--no-descheduler", action="store_true", help="skip the leader check (no descheduler)")
    parser.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS", help="per request")
    cmdline.add_config(parser)


def lease_check(metrics: str, *, stale_after: float) -> tuple[bool, str]:
    """From the webhook's /metrics text: whether it saw the leader Lease renewed recently, and why."""
    ages = [float(line.rsplit(" ", 1)[1]) for line in metrics.splitlines() if line.startswith(LEASE_AGE + " ")]
    if not ages:
        return False, f"{LEASE_AGE} missing from the webhook's /metrics"
    age = ages[0]
    if age < 0:
        return False, "the webhook has not seen the descheduler's leader Lease held (is a descheduler running?)"
    if age >= stale_after:
        return False, (f"the descheduler's leader Lease was last seen renewed {age:.0f}s ago "
                       f"(admission.controller_stale_seconds {stale_after:g}): no descheduler leads")
    return True, f"a descheduler leads (its Lease renewed {age:.0f}s ago)"


def run(args: argparse.Namespace) -> int:
    if not args.webhook and not args.prometheus:
        print("gpu-steward check: give --webhook URL, --prometheus URL or both", file=sys.stderr)
        return 2
    config = cmdline.load_settings(args)
    results: list[tuple[bool, str]] = []
    if args.webhook:
        results.extend(_webhook(args, config=config))
    if args.prometheus:
        results.extend(asyncio.run(_prometheus(config.prometheus.model_copy(update={"url": args.prometheus}),
                                               window=args.window)))
    for ok, why in results:
        print(f"{'ok  ' if ok else 'FAIL'} {why}")
    return 0 if all(ok for ok, _ in results) else 1


async def _prometheus(config: settings.Prometheus, *, window: float | None) -> list[tuple[bool, str]]:
    client = prometheus.Client(config)
    try:
        facts = await client.store_facts()
    except prometheus.PrometheusError as exc:
        return [(False, str(exc))]
    finally:
        client.close()
    return dcgm.store_checks(facts, config=config, longest_window=window)


def _webhook(args: argparse.Namespace, *, config: settings.Settings) -> list[tuple[bool, str]]:
    context = ssl.create_default_context(cafile=str(args.ca_file) if args.ca_file else None)
    base = args.webhook.rstrip("/")
    results: list[tuple[bool, str]] = []
    try:
        with urllib.request.urlopen(f"{base}/readyz", context=context, timeout=args.timeout) as answer:
            results.append((True, f"webhook {base} ready (HTTP {answer.status})"))
        if not args.no_descheduler:
            with urllib.request.urlopen(f"{base}/metrics", context=context, timeout=args.timeout) as answer:
                metrics = answer.read().decode()
            results.append(lease_check(metrics, stale_after=config.admission.controller_stale_seconds))
    except urllib.error.HTTPError as exc:
        results.append((False, f"webhook {base}: HTTP {exc.code} on {exc.url}"))
    except (urllib.error.URLError, OSError, ssl.SSLError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        results.append((False, f"webhook {base} unreachable: {reason}"))
    return results
