"""The evictor: the only way the descheduler removes a pod. It owns safety and limits.

- Limits (per cycle, node, namespace, counted in decisions: `limits.Budget`) and the retry backoff are
  checked before any API call; only accepted evictions are charged, a gang once.
- Before the calls the pod is read live and its protections checked again (`protections`): the plan
  was made on a snapshot older than the utilisation query, and a pod that opted out (safe-to-evict false,
  skip, do-not-disrupt...) or started terminating since is not evicted (`protected`). A pod of another UID
  under the name is `gone` (the one judged was replaced).
- Eviction subresource: `policy/v1`, or `policy/v1beta1` when discovery shows the server lacks v1.
  The body carries the UID and the resourceVersion read live as preconditions, so neither a new pod that took
  the old one's name nor a pod changed since the check is hit.
- Answers: 201 evicted; 429 a PodDisruptionBudget blocks it (`blocked`, no backoff: the PDB is the judge;
  the loop cools the pod down and plans again without it); 404 already gone; 409 a precondition failed (the
  pod changed or was replaced since it was read: `changed`, judged again next cycle); anything else failed,
  retried on a later cycle after a doubling backoff.
- A demand is a transaction (a unit, when no demand: mode always): every victim, a gang's GPU-less companions
  included, passes its live read, its protections and a server-side dry run (`dryRun=All`: the API server judges
  budgets and preconditions as for a real eviction, and evicts nothing) before the first real eviction; any
  refusal there (429, 404, 409, 5xx, a timeout) evicts none of them: that victim's outcome says why, the others
  are `skipped` naming it. The planner's budgets came from the snapshot; a budget created or lowered since is
  caught here, whatever the victims' order.
- Then every GPU victim is re-checked from the store (`recheck`, descheduler.reclaim.recheck: its newest samples
  at the store's time), all of them in one query after the last dry run, before the first real eviction, and
  each again right before its own call once a call went since: busy, missing or stale is `not-idle`, and the
  transaction stops there.
- Real evictions go companions first, then GPU members in plan order: a refusal that comes anyway (a race after
  the dry run) never leaves a gang's workers gone without their launcher. A refusal after some victims went is
  said in its outcome (`Outcome.partial`), for the loop to count and report; the rest are skipped.
- Dry-run swaps the client (`DryRunClient`), not the logic: limits, dry runs, re-checks and outcomes are the same.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from kubernetes_asyncio import client

from common import kube, settings, snapshot
from descheduler import limits, protections, reclaim

logger = logging.getLogger(__name__)


class Result(enum.StrEnum):
    EVICTED = "evicted"
    WOULD_EVICT = "would-evict"  # dry-run
    BLOCKED = "blocked"  # 429: a PodDisruptionBudget
    GONE = "gone"  # 404, or the live pod under its name is another one (its UID differs)
    FAILED = "failed"  # other errors: retried later with backoff
    LIMITED = "limited"  # a limit refused it before any call
    BACKOFF = "backoff"  # an earlier failure's backoff has not expired
    SKIPPED = "skipped"  # another member of its gang, or another victim of its demand, was not evicted
    PROTECTED = "protected"  # the live pod is protected now (opted out, terminating...): not evicted
    CHANGED = "changed"  # 409: the pod changed or was replaced since it was read
    NOT_IDLE = "not-idle"  # the re-check right before its eviction: busy again, or its newest samples missing/stale


SUCCESS = frozenset({Result.EVICTED, Result.WOULD_EVICT})
_NAMES = settings.Names()


@dataclasses.dataclass(frozen=True)
class Outcome:
    eviction: reclaim.Eviction
    result: Result
    detail: str
    partial: tuple[str, ...] = ()  # not evicted after these victims of the same demand were: a broken transaction


class EvictionClient(Protocol):
    dry_run: bool

    async def read(self, *, namespace: str, name: str) -> Mapping[str, Any] | None:
        """The pod as the API server has it now; None when this client cannot read (no API: dry-run offline).
        Raise `kube.ApiError` (404: gone)."""
        ...

    async def evict(self, *, namespace: str, name: str, uid: str, resource_version: str | None = None,
                    dry_run: bool = False) -> None:
        """Raise `kube.ApiError` (with the HTTP status) when the server refuses. `dry_run`: the server's own dry run
        (`dryRun=All`: admission, budgets and preconditions judged, nothing evicted)."""
        ...


Recheck = Callable[[Sequence[reclaim.Eviction]], Awaitable[Sequence[str | None]]]
"""For each GPU victim, why it must not go now (its newest samples busy, missing or stale), or None: the utilisation
re-check right before their eviction, one query for all of them (the loop's, descheduler.reclaim.recheck)."""


class ApiEvictionClient:
    dry_run = False

    def __init__(self, api: client.ApiClient, *, timeout_seconds: float) -> None:
        self._api = api
        self._timeout = timeout_seconds
        self._version: str | None = None

    async def policy_version(self) -> str:
        """`v1` unless discovery of the policy group lists only v1beta1 (Kubernetes < 1.22 servers)."""
        if self._version is None:
            try:
                group = await kube.get(self._api, "/apis/policy", timeout_seconds=self._timeout)
            except kube.ApiError as exc:
                logger.warning("discovery of the policy API group failed (%s); assuming policy/v1", exc)
                return "v1"
            versions = {v.get("version") for v in group.get("versions") or []}
            self._version = "v1" if "v1" in versions or "v1beta1" not in versions else "v1beta1"
        return self._version

    async def read(self, *, namespace: str, name: str) -> Mapping[str, Any] | None:
        return await kube.get(self._api, f"/api/v1/namespaces/{namespace}/pods/{name}",
                              timeout_seconds=self._timeout)

    async def evict(self, *, namespace: str, name: str, uid: str, resource_version: str | None = None,
                    dry_run: bool = False) -> None:
        version = await self.policy_version()
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        body = {
            "apiVersion": f"policy/{version}",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": preconditions} if preconditions else {},
        }
        await kube.request(
            self._api, "POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction",
            body=body, timeout_seconds=self._timeout, query={"dryRun": "All"} if dry_run else None,
        )


class DryRunClient:
    """Accepts every eviction and does nothing: what would happen, without the eviction call. With an API client
    it reads pods live and sends the server-side dry runs like the real one (neither changes anything), so a
    dry-run shows the same re-checks and refusals."""

    dry_run = True

    def __init__(self, api: client.ApiClient | None = None, *, timeout_seconds: float = 5.0) -> None:
        self._api = api
        self._timeout = timeout_seconds

    async def read(self, *, namespace: str, name: str) -> Mapping[str, Any] | None:
        if self._api is None:
            return None
        return await kube.get(self._api, f"/api/v1/namespaces/{namespace}/pods/{name}",
                              timeout_seconds=self._timeout)

    async def evict(self, *, namespace: str, name: str, uid: str, resource_version: str | None = None,
                    dry_run: bool = False) -> None:
        if self._api is None or not dry_run:
            return None
        await ApiEvictionClient(self._api, timeout_seconds=self._timeout).evict(
            namespace=namespace, name=name, uid=uid, resource_version=resource_version, dry_run=True)


class Evictor:
    def __init__(self, evictions: EvictionClient, *, config: settings.Reclaim,
                 names: settings.Names = _NAMES, recheck: Recheck | None = None) -> None:
        """`recheck`: the utilisation re-check of each GPU victim right before its eviction (None: none)."""
        self._client = evictions
        self._recheck = recheck
        self._config = config
        self._names = names
        self._failures: dict[str, tuple[int, float]] = {}  # pod uid or key -> (failures, retry not before)

    @property
    def dry_run(self) -> bool:
        return self._client.dry_run

    async def evict_plan(
        self,
        evictions: Iterable[reclaim.Eviction],
        *,
        now: float,
        record: Callable[[Outcome], Awaitable[None]] | None = None,
        budget: limits.Budget | None = None,
    ) -> list[Outcome]:
        """Evict in plan order under `budget` (default: a fresh one), one transaction at a time: a demand's
        victims together (`preemptor`), else a unit's members. `record` is awaited after each outcome, before the
        next call (the caller's bookkeeping)."""
        budget = budget if budget is not None else limits.Budget(self._config.limits)
        transactions: dict[tuple[str, str], list[reclaim.Eviction]] = {}
        for eviction in evictions:
            key = ("demand", eviction.preemptor) if eviction.preemptor is not None else ("unit", eviction.unit)
            transactions.setdefault(key, []).append(eviction)
        outcomes: list[Outcome] = []

        async def told(outcome: Outcome) -> None:
            outcomes.append(outcome)
            if record is not None:
                await record(outcome)

        for victims in transactions.values():
            await self._transaction(victims, budget=budget, now=now, told=told)
        return outcomes

    async def _transaction(self, victims: Sequence[reclaim.Eviction], *, budget: limits.Budget, now: float,
                           told: Callable[[Outcome], Awaitable[None]]) -> None:
        """All or none: limits and backoffs, then each victim's live read, protections and server-side dry run,
        then the utilisation re-check of every GPU victim, before the first real eviction; companions (no GPU)
        go first, so that a late refusal never leaves a gang's workers gone without their launcher."""
        slots = [(e.unit, e.namespace, e.node) for e in victims]
        refused = budget.refuse(slots)
        if refused:
            for eviction in victims:
                await told(Outcome(eviction, Result.LIMITED, refused))
            return
        versions: dict[str, str | None] = {}
        for i, eviction in enumerate(victims):
            checked = await self._prepare(eviction, now=now)
            if isinstance(checked, Outcome):
                await self._abort(victims, checked, told=told, passed=victims[:i])
                return
            versions[eviction.pod] = checked
        ordered = sorted(victims, key=lambda e: e.utilization is not None)  # companions first, else plan order
        busy = await self._still_idle([e for e in ordered if e.utilization is not None])
        if busy is not None:
            await self._abort(victims, busy, told=told, passed=[e for e in victims if e is not busy.eviction])
            return
        done: list[str] = []
        for i, eviction in enumerate(ordered):
            outcome = None
            if i and eviction.utilization is not None:  # a call went since the re-check above: read it again
                outcome = await self._still_idle([eviction])
            if outcome is None:
                outcome = await self._call(eviction, version=versions[eviction.pod], dry_run=False, now=now)
            if outcome.result in SUCCESS or outcome.result is Result.GONE:
                budget.charge([(eviction.unit, eviction.namespace, eviction.node)])
                done.append(eviction.pod)
                await told(outcome)
                continue
            if done:
                outcome = dataclasses.replace(outcome, partial=tuple(done), detail=(
                    f"{outcome.detail}; {len(done)} victim(s) of {self._name(eviction)} already evicted "
                    f"({', '.join(done)}): it is served in part"))
            await told(outcome)
            for rest in ordered[i + 1:]:
                await told(Outcome(rest, Result.SKIPPED, self._skipped(rest, eviction)))
            return

    @staticmethod
    def _name(eviction: reclaim.Eviction) -> str:
        return eviction.preemptor or f"gang {eviction.unit.removeprefix(reclaim.GANG)}"

    @staticmethod
    def _skipped(eviction: reclaim.Eviction, cause: reclaim.Eviction) -> str:
        if eviction.unit == cause.unit and eviction.unit != eviction.pod:
            return f"gang member {cause.pod} was not evicted"
        return f"victim {cause.pod} of the same demand {eviction.preemptor} was not evicted"

    async def _abort(self, victims: Sequence[reclaim.Eviction], cause: Outcome, *, passed: Sequence[reclaim.Eviction],
                     told: Callable[[Outcome], Awaitable[None]]) -> None:
        """None of `victims` is evicted: `cause` is why; those that `passed` their checks were not called."""
        for eviction in victims:
            if eviction is cause.eviction:
                await told(cause)
            else:
                why = self._skipped(eviction, cause.eviction)
                checked = " (its own checks passed)" if eviction in passed else ""
                await told(Outcome(eviction, Result.SKIPPED, f"{why}{checked}: none of its victims evicted"))

    async def _still_idle(self, victims: Sequence[reclaim.Eviction]) -> Outcome | None:
        """The first of `victims` whose re-check (`recheck`) says it must not go now, as its outcome, or None."""
        if self._recheck is None or not victims:
            return None
        found = await self._recheck(victims)
        for eviction, why in zip(victims, found, strict=True):
            if why is not None:
                return Outcome(eviction, Result.NOT_IDLE, f"not idle right before its eviction: {why}")
        return None

    async def _prepare(self, eviction: reclaim.Eviction, *, now: float) -> Outcome | str | None:
        """The live pod's resourceVersion (the real eviction's precondition) once its backoff, protections and a
        server-side dry run let it go, else its outcome."""
        identity = eviction.uid or eviction.pod
        failures, not_before = self._failures.get(identity, (0, 0.0))
        if now < not_before:
            return Outcome(eviction, Result.BACKOFF,
                           f"{failures} failed attempt(s); next try in {not_before - now:.0f}s")
        namespace, _, name = eviction.pod.partition("/")
        try:
            live = await self._client.read(namespace=namespace, name=name)
        except kube.ApiError as exc:
            return self._refused(eviction, exc, now=now)
        except (OSError, TimeoutError) as exc:
            return self._failed(eviction, now, f"{type(exc).__name__}: {exc}")
        checked = self._recheck_live(eviction, live)
        if isinstance(checked, Outcome):
            return checked
        outcome = await self._call(eviction, version=checked, dry_run=True, now=now)
        return checked if outcome.result in SUCCESS else outcome

    async def _call(self, eviction: reclaim.Eviction, *, version: str | None, dry_run: bool, now: float) -> Outcome:
        namespace, _, name = eviction.pod.partition("/")
        try:
            await self._client.evict(namespace=namespace, name=name, uid=eviction.uid, resource_version=version,
                                     dry_run=dry_run)
        except kube.ApiError as exc:
            return self._refused(eviction, exc, now=now, dry_run=dry_run)
        except (OSError, TimeoutError) as exc:
            said = "dry run: " if dry_run else ""
            return self._failed(eviction, now, f"{said}{type(exc).__name__}: {exc}")
        if dry_run:
            return Outcome(eviction, Result.WOULD_EVICT, "passed the server-side dry run")
        self._failures.pop(eviction.uid or eviction.pod, None)
        return Outcome(eviction, Result.WOULD_EVICT if self.dry_run else Result.EVICTED, eviction.reason)

    def _refused(self, eviction: reclaim.Eviction, exc: kube.ApiError, *, now: float, dry_run: bool = False) -> Outcome:
        said = "in the server-side dry run, " if dry_run else ""
        if exc.status == 429:
            return Outcome(eviction, Result.BLOCKED, f"{said}a PodDisruptionBudget blocks the eviction: {exc}")
        if exc.status == 404:
            return Outcome(eviction, Result.GONE, f"{said}already gone")
        if exc.status == 409:
            return Outcome(eviction, Result.CHANGED,
                           f"{said}the pod changed or was replaced since it was read (precondition failed): {exc}")
        return self._failed(eviction, now, f"{said}{exc}")

    def _recheck_live(self, eviction: reclaim.Eviction, live: Mapping[str, Any] | None) -> Outcome | str | None:
        """The live pod's resourceVersion (the eviction's precondition) if it may still go, else the outcome.
        None: no live object to check (a dry-run without API), evicted on the plan's word."""
        if live is None:
            return None
        meta = live.get("metadata") or {}
        if eviction.uid and meta.get("uid") != eviction.uid:
            return Outcome(eviction, Result.GONE, f"the pod was replaced (UID {meta.get('uid')}, judged "
                                                  f"{eviction.uid})")
        why = protections.why_protected(snapshot.parse_pod(live), node=None, names=self._names,
                                        conventions=self._config.conventions)
        if why:
            return Outcome(eviction, Result.PROTECTED, f"protected on the live pod: {why}")
        return str(meta.get("resourceVersion") or "") or None

    def _failed(self, eviction: reclaim.Eviction, now: float, error: str) -> Outcome:
        identity = eviction.uid or eviction.pod
        failures, _ = self._failures.get(identity, (0, 0.0))
        delay = min(self._config.retry_backoff_max_seconds,
                    self._config.retry_backoff_initial_seconds * 2 ** failures)
        self._failures[identity] = (failures + 1, now + delay)
        return Outcome(eviction, Result.FAILED, f"{error}; retried after {delay:.0f}s")
