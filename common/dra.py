"""GPUs that are DRA devices (`resource.k8s.io/v1`): which nodes have them, which are taken, what a pod asks.

Read in Kubernetes 1.37.2 (`k8s.io/api/resource/v1/types.go`) and NVIDIA's DRA driver for GPUs:
- a ResourceSlice publishes devices of one `spec.driver` in one `spec.pool` (`name`, `generation`,
  `resourceSliceCount`); node-local slices name their node (`spec.nodeName`). A pool may span several slices;
  consumers use only the highest generation, and only once they see all `resourceSliceCount` slices of it;
- a device is `<driver>/<pool>/<device name>`; its `attributes` map qualified names (an unqualified name is in
  the driver's domain) to one of `int`, `bool`, `string`, `version`; its `taints` (and DeviceTaintRules, matched by
  `deviceSelector` driver/pool/device) with effect `NoSchedule` or `NoExecute` keep it from new claims that do not
  tolerate them (`None` and unknown effects are informational);
- a DeviceClass selects devices by CEL (`spec.selectors[].cel.expression`); NVIDIA's `gpu.nvidia.com` is
  `device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'`. Its
  `extendedResourceName` (else the implicit `deviceclass.resource.kubernetes.io/<class>`) lets pods ask the class
  as an extended resource on nodes whose allocatable lacks that name: kube-scheduler then writes a claim for the
  pod (`status.extendedResourceClaimStatus.resourceClaimName`);
- a ResourceClaim's `spec.devices.requests[]` is `exactly` (`deviceClassName`, `allocationMode` ExactCount
  with `count`, default 1, or All; `adminAccess`) or `firstAvailable` (sub-requests, the first that can be
  allocated wins); once allocated, `status.allocation.devices.results[]` name each device (`driver`, `pool`,
  `device`) and `status.reservedFor[]` the pods using the claim (`resource: pods`, `name`, `uid`). A
  ResourceClaimTemplate's `spec.spec` is the spec of each claim made from it, one per pod
  (`status.resourceClaimStatuses[].resourceClaimName`).

Which classes are GPUs is configured (`settings.Dra.gpu_device_classes`). The model understands the CEL of those
classes only as a conjunction (`&&`) of `device.driver == '<d>'` and `device.attributes['<domain>'].<name> ==
<literal>`; a class whose selector says anything else is reported and its devices are not counted (a guess could
count devices the scheduler never gives).

Pure: plain dicts in, frozen dataclasses out; no I/O, no clock.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from common import gpu

IMPLICIT_PREFIX = "deviceclass.resource.kubernetes.io/"
BLOCKING_TAINTS = frozenset({"NoSchedule", "NoExecute"})
EXACT_COUNT = "ExactCount"
ALL = "All"

_TERM = re.compile(
    r"""^\s*device\.(?:driver|attributes\[\s*(['"])([^'"]+)\1\s*\]\.([A-Za-z_][A-Za-z0-9_]*))\s*==\s*"""
    r"""(?:(['"])([^'"]*)\4|(-?[0-9]+)|(true|false))\s*$"""
)


@dataclasses.dataclass(frozen=True, order=True)
class DeviceId:
    driver: str
    pool: str
    device: str

    def describe(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


@dataclasses.dataclass(frozen=True)
class Device:
    id: DeviceId
    index: int | None  # the driver's `index` attribute (NVIDIA: the GPU's index on its node), if published
    blocked: str | None = None  # why no new claim can get it (a NoSchedule/NoExecute taint), None: it can
    profile: str | None = None  # a MIG device's profile (its `profile` attribute, e.g. `1g.10gb`); None: a whole GPU


@dataclasses.dataclass(frozen=True)
class GpuClass:
    name: str
    extended_resource: str  # `spec.extendedResourceName`, else the implicit name
    matches: tuple[tuple[str, object], ...] | None  # (qualified attribute or "driver", value); None: unreadable
    problem: str | None = None

    @property
    def mig(self) -> bool:
        """Its devices are MIG instances: its selector pins a `type` of `mig` or a `profile` (NVIDIA's
        `mig.nvidia.com`: `device.attributes['gpu.nvidia.com'].type == 'mig'`)."""
        return any((key.endswith("/type") and value == "mig") or key.endswith("/profile")
                   for key, value in self.matches or ())

    @property
    def profile(self) -> str | None:
        """The one MIG profile its selector pins, if it pins one."""
        return next((v for k, v in self.matches or () if k.endswith("/profile") and isinstance(v, str)), None)

    def selects(self, driver: str, attributes: Mapping[str, Any]) -> bool:
        if self.matches is None:
            return False
        for key, value in self.matches:
            got = driver if key == "driver" else attributes.get(key)
            if got != value or isinstance(got, bool) != isinstance(value, bool):
                return False
        return True


@dataclasses.dataclass(frozen=True)
class Claim:
    namespace: str
    name: str
    devices: tuple[DeviceId, ...]  # allocated GPU devices (admin access results excluded: they hold nothing)
    reserved_for: tuple[str, ...]  # uids of the pods it is reserved for
    extended: bool  # made by kube-scheduler for a pod's extended-resource request
    mig: tuple[DeviceId, ...] = ()  # allocated MIG devices (as `devices`)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclasses.dataclass(frozen=True)
class Record:
    """A pod's claim of its own (`common.domain_claim`), in our pod annotation `settings.Names.domain_claim`: the
    webhook rewrote claim entry `entry` from template `template` to the pod-specific claim `claim`, which whatever
    lifts our gate creates."""

    entry: str
    claim: str
    template: str

    def text(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True, separators=(",", ":"))


def recorded(pod: Mapping[str, Any], *, annotation: str) -> Record | None:
    """The pod's `Record`, if it carries one that reads under `annotation`, our configured key
    (`settings.Names.domain_claim`): another product's `<its prefix>domain-claim` is not ours."""
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(annotation)
    if not isinstance(value, str):
        return None
    try:
        raw = json.loads(value)
    except ValueError:
        return None
    fields = ("entry", "claim", "template")
    if isinstance(raw, Mapping) and all(isinstance(raw.get(f), str) and raw.get(f) for f in fields):
        return Record(raw["entry"], raw["claim"], raw["template"])
    return None


@dataclasses.dataclass(frozen=True)
class PodGpus:
    """A pod's GPUs through its resource claims: `count` asked of GPU classes (exact counts; extended-resource
    requests are counted from the pod's resources, `extended_gpus`); `devices` the GPU devices allocated to its
    claims, the scheduler-made extended-resource claim included; `left` why the model cannot evaluate what it asks
    (then kube-scheduler places it alone, and reclaim never evicts it), None when it can."""

    count: int = 0
    devices: tuple[DeviceId, ...] = ()
    left: str | None = None
    mig: Mapping[str, int] = dataclasses.field(default_factory=dict)  # MIG devices asked, by profile
    mig_devices: tuple[DeviceId, ...] = ()  # MIG devices allocated to its claims
    claims: tuple[str, ...] = ()  # namespace/name of its claims holding GPU devices
    asks_gpus: bool = False  # some claim asks a GPU class (counted or not): a GPU pod for tiers and gangs
    # Its claim of its own (`Record`) is still to be made, or asks one NVLink domain first: its devices are where
    # the claim says, not the allocator's first fit.
    domain_claim: bool = False

    @property
    def any(self) -> bool:
        return self.count > 0 or self.asks_gpus or bool(self.devices) or bool(self.mig) or bool(self.mig_devices)


NONE = PodGpus()


@dataclasses.dataclass(frozen=True)
class Inventory:
    """The cluster's DRA GPUs: per node its GPU devices (index order), which are taken and by which claim."""

    classes: Mapping[str, GpuClass] = dataclasses.field(default_factory=dict)  # configured GPU classes present
    devices: Mapping[str, tuple[Device, ...]] = dataclasses.field(default_factory=dict)  # node -> GPU devices
    mig: Mapping[str, tuple[Device, ...]] = dataclasses.field(default_factory=dict)  # node -> MIG devices
    claims: Mapping[str, Claim] = dataclasses.field(default_factory=dict)  # ns/name -> claims holding GPUs
    specs: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)  # ns/name -> claim spec
    owners: Mapping[str, frozenset[str]] = dataclasses.field(default_factory=dict)  # ns/name -> owner pods' uids
    templates: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)  # ns/name -> claim spec
    problems: tuple[str, ...] = ()
    served: bool = False  # the cluster serves resource.k8s.io/v1 (else nothing here is known)
    # node -> GPU indices in the order kube-scheduler's allocator tries them (first fit: the order they are listed
    # in the node's one ResourceSlice); absent where not known: GPUs in several slices (the allocator walks the
    # pools and slices in an order of its cache), or a GPU without an `index`.
    order: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)

    @property
    def extended(self) -> Mapping[str, str]:
        """Extended resource name -> the whole-GPU class serving it."""
        return {c.extended_resource: c.name for c in self.classes.values() if c.matches is not None and not c.mig}

    @property
    def extended_mig(self) -> Mapping[str, str]:
        """Extended resource name -> the MIG profile of the MIG class serving it, for classes that pin one profile
        (a class of several profiles lets the allocator pick any: such requests are not counted)."""
        return {c.extended_resource: c.profile for c in self.classes.values() if c.mig and c.profile is not None}

    def taken(self) -> Mapping[DeviceId, Claim]:
        return {d: c for c in self.claims.values() for d in (*c.devices, *c.mig)}

    def profiles(self, node: str) -> dict[str, int]:
        """The node's MIG devices by profile."""
        out: dict[str, int] = {}
        for device in self.mig.get(node, ()):
            out[str(device.profile)] = out.get(str(device.profile), 0) + 1
        return out


EMPTY = Inventory()


def gpu_class(raw: Mapping[str, Any]) -> GpuClass:
    meta, spec = raw.get("metadata") or {}, raw.get("spec") or {}
    name = str(meta.get("name") or "")
    extended = str(spec.get("extendedResourceName") or IMPLICIT_PREFIX + name)
    matches: list[tuple[str, object]] = []
    for selector in spec.get("selectors") or ():
        expression = ((selector or {}).get("cel") or {}).get("expression") if isinstance(selector, Mapping) else None
        if not isinstance(expression, str):
            return GpuClass(name, extended, None, f"DeviceClass {name}: a selector that is no CEL expression")
        for term in expression.split("&&"):
            parsed = _term(term)
            if parsed is None:
                return GpuClass(name, extended, None, f"DeviceClass {name}: selector {expression!r} not understood "
                                                      "(only `device.driver ==` and `device.attributes[..].x ==` "
                                                      "joined by &&); its devices are not counted")
            matches.append(parsed)
    return GpuClass(name, extended, tuple(matches))


def _term(text: str) -> tuple[str, object] | None:
    match = _TERM.match(text.strip().strip("()") if text.count("(") == text.count(")") else text)
    if not match:
        return None
    _, domain, attribute, _, string, number, flag = match.groups()
    value: object = string if string is not None else int(number) if number is not None else flag == "true"
    return ("driver" if domain is None else f"{domain}/{attribute}"), value


def _attributes(driver: str, raw: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if not isinstance(raw, Mapping):
        return out
    for name, value in raw.items():
        if not isinstance(value, Mapping):
            continue
        key = str(name) if "/" in str(name) else f"{driver}/{name}"
        for kind in ("int", "bool", "string", "version"):
            if kind in value:
                out[key] = value[kind]
                break
    return out


def _blocking(taints: Any) -> str | None:
    for taint in taints or ():
        if isinstance(taint, Mapping) and taint.get("effect") in BLOCKING_TAINTS:
            return f"tainted {taint.get('key')}={taint.get('value', '')}:{taint.get('effect')}"
    return None


def _rule_taints(rules: Iterable[Mapping[str, Any]]) -> list[tuple[Mapping[str, Any], str]]:
    """(deviceSelector, why) of each DeviceTaintRule whose taint blocks new claims; no selector matches nothing."""
    out = []
    for rule in rules:
        spec = rule.get("spec") or {}
        selector = spec.get("deviceSelector")
        why = _blocking([spec.get("taint")])
        if isinstance(selector, Mapping) and why:
            name = (rule.get("metadata") or {}).get("name")
            out.append((selector, f"{why} (DeviceTaintRule {name})"))
    return out


def _newest_complete(slices: Iterable[Mapping[str, Any]], problems: list[str]) -> list[Mapping[str, Any]]:
    """The slices of each pool's highest generation, where all `resourceSliceCount` of them are seen."""
    pools: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for raw in slices:
        spec = raw.get("spec") or {}
        pool = spec.get("pool") or {}
        pools.setdefault((str(spec.get("driver") or ""), str(pool.get("name") or "")), []).append(raw)
    kept: list[Mapping[str, Any]] = []
    for (driver, pool), members in sorted(pools.items()):
        newest = max(int(((m.get("spec") or {}).get("pool") or {}).get("generation") or 0) for m in members)
        current = [m for m in members if int(((m.get("spec") or {}).get("pool") or {}).get("generation") or 0)
                   == newest]
        expected = max(int(((m.get("spec") or {}).get("pool") or {}).get("resourceSliceCount") or 1)
                       for m in current)
        if len(current) < expected:
            problems.append(f"pool {driver}/{pool} generation {newest}: {len(current)} of {expected} slices seen; "
                            "its devices are not counted until all are")
            continue
        kept += current
    return kept


@dataclasses.dataclass(frozen=True)
class _Devices:
    """The half of an inventory read from DeviceClasses, ResourceSlices and DeviceTaintRules."""

    classes: Mapping[str, GpuClass]
    devices: Mapping[str, tuple[Device, ...]]
    mig: Mapping[str, tuple[Device, ...]]
    order: Mapping[str, tuple[int, ...]]
    gpu_ids: frozenset[DeviceId]
    mig_ids: frozenset[DeviceId]
    problems: tuple[str, ...]


_ClaimReading = tuple[Claim, Mapping[str, Any], frozenset[str]]  # the claim, its spec's devices, its owner pods


@dataclasses.dataclass
class Memo:
    """What `build` reuses from the last build given the same memo: the device half while the DeviceClasses,
    ResourceSlices and DeviceTaintRules are the same objects (and in the same order), and a claim's reading while
    its object and the device half are. On a DRA cluster every pod kube-scheduler binds writes a claim: the rest
    is read once."""

    devices: tuple[tuple[tuple[Any, ...], ...], _Devices] | None = None  # the objects read, and what they gave
    claims: dict[str, tuple[Mapping[str, Any], _ClaimReading]] = dataclasses.field(default_factory=dict)


def build(
    *,
    device_classes: Iterable[Mapping[str, Any]],
    slices: Iterable[Mapping[str, Any]],
    claims: Iterable[Mapping[str, Any]],
    templates: Iterable[Mapping[str, Any]] = (),
    taint_rules: Iterable[Mapping[str, Any]] = (),
    gpu_classes: Sequence[str],
    served: bool = True,
    memo: Memo | None = None,
) -> Inventory:
    """The inventory from raw API objects. `gpu_classes`: the DeviceClass names whose devices are GPUs. `memo`:
    reuse what an earlier build with it read of the same objects (the result is the same)."""
    memo = memo if memo is not None else Memo()
    inputs = (tuple(device_classes), tuple(slices), tuple(taint_rules), tuple(gpu_classes))
    if memo.devices is not None and all(map(_same_objects, inputs, memo.devices[0])):
        part = memo.devices[1]
    else:
        part = _devices(device_classes=inputs[0], slices=inputs[1], taint_rules=inputs[2], gpu_classes=inputs[3])
        memo.devices, memo.claims = (inputs, part), {}
    held: dict[str, Claim] = {}
    specs: dict[str, Mapping[str, Any]] = {}
    owners: dict[str, frozenset[str]] = {}
    readings: dict[str, tuple[Mapping[str, Any], _ClaimReading]] = {}
    for raw in claims:
        key = _key(raw)
        kept = memo.claims.get(key)
        reading = kept[1] if kept is not None and kept[0] is raw else _claim_reading(raw, part)
        readings[key] = (raw, reading)
        claim, specs[claim.key], owners[claim.key] = reading
        if claim.devices or claim.mig:
            held[claim.key] = claim
    memo.claims = readings
    return Inventory(
        classes=part.classes,
        devices=part.devices,
        mig=part.mig,
        order=part.order,
        claims=held,
        specs=specs,
        owners=owners,
        templates={_key(t): ((t.get("spec") or {}).get("spec") or {}).get("devices") or {} for t in templates},
        problems=part.problems,
        served=served,
    )


def _same_objects(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def _claim_reading(raw: Mapping[str, Any], part: _Devices) -> _ClaimReading:
    return (_claim(raw, part.gpu_ids, part.mig_ids), (raw.get("spec") or {}).get("devices") or {},
            frozenset(str(o.get("uid")) for o in (raw.get("metadata") or {}).get("ownerReferences") or ()
                      if isinstance(o, Mapping) and o.get("kind") == "Pod"))


def _devices(*, device_classes: Iterable[Mapping[str, Any]], slices: Iterable[Mapping[str, Any]],
             taint_rules: Iterable[Mapping[str, Any]], gpu_classes: Sequence[str]) -> _Devices:
    problems: list[str] = []
    wanted = set(gpu_classes)
    classes = {c.name: c for c in map(gpu_class, device_classes) if c.name in wanted}
    problems += [c.problem for c in classes.values() if c.problem]
    rules = _rule_taints(taint_rules)
    by_node: dict[str, list[Device]] = {}
    mig: dict[str, list[Device]] = {}
    listed: dict[str, list[tuple[str, int | None]]] = {}  # node -> (slice name, index) in listing order
    for raw in _newest_complete(slices, problems):
        spec = raw.get("spec") or {}
        node, driver = spec.get("nodeName"), str(spec.get("driver") or "")
        pool = str((spec.get("pool") or {}).get("name") or "")
        for item in spec.get("devices") or ():
            if not isinstance(item, Mapping):
                continue
            attributes = _attributes(driver, item.get("attributes"))
            chosen = [c for c in classes.values() if c.selects(driver, attributes)]
            if not chosen:
                continue
            where = f"device {driver}/{pool}/{item.get('name')}"
            if not node:  # network-attached or per-device node selection: not a node's own GPU
                problems.append(f"{where}: no spec.nodeName; not counted")
                continue
            device_id = DeviceId(driver, pool, str(item.get("name") or ""))
            blocked = _blocking(item.get("taints")) or next(
                (why for selector, why in rules if _selects(selector, device_id)), None)
            if any(c.mig for c in chosen):
                profile = attributes.get(f"{driver}/profile")
                if item.get("consumesCounters"):  # partitionable: its slices overlap, counting them would overcount
                    problems.append(f"{where}: a MIG device that consumes counters (partitionable); not counted")
                elif not isinstance(profile, str) or not profile:
                    problems.append(f"{where}: a MIG device without a `profile` attribute; not counted")
                else:
                    mig.setdefault(str(node), []).append(Device(device_id, None, blocked, profile))
                continue
            index = attributes.get(f"{driver}/index")
            index = index if isinstance(index, int) and not isinstance(index, bool) else None
            by_node.setdefault(str(node), []).append(Device(device_id, index, blocked))
            listed.setdefault(str(node), []).append((str((raw.get("metadata") or {}).get("name") or ""), index))
    devices = {node: tuple(sorted(found, key=lambda d: (d.index is None, d.index or 0, d.id)))
               for node, found in by_node.items()}
    gpu_ids = {d.id for found in devices.values() for d in found}
    mig_ids = {d.id for found in mig.values() for d in found}
    return _Devices(
        classes=classes, devices=devices,
        mig={node: tuple(sorted(found, key=lambda d: d.id)) for node, found in mig.items()},
        order={node: tuple(i for _, i in found if i is not None) for node, found in listed.items()
               if len({name for name, _ in found}) == 1 and all(i is not None for _, i in found)},
        gpu_ids=frozenset(gpu_ids), mig_ids=frozenset(mig_ids), problems=tuple(problems))


def _selects(selector: Mapping[str, Any], device: DeviceId) -> bool:
    return all(selector.get(field) in (None, getattr(device, field)) for field in ("driver", "pool", "device"))


def _key(raw: Mapping[str, Any]) -> str:
    meta = raw.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name') or ''}"


def _claim(raw: Mapping[str, Any], gpu_ids: frozenset[DeviceId], mig_ids: frozenset[DeviceId]) -> Claim:
    meta, status = raw.get("metadata") or {}, raw.get("status") or {}
    results = (((status.get("allocation") or {}).get("devices") or {}).get("results")) or ()
    allocated = [DeviceId(str(r.get("driver") or ""), str(r.get("pool") or ""), str(r.get("device") or ""))
                 for r in results if isinstance(r, Mapping) and not r.get("adminAccess")]
    devices = tuple(sorted(d for d in allocated if d in gpu_ids))
    reserved = tuple(str(c.get("uid") or "") for c in status.get("reservedFor") or ()
                     if isinstance(c, Mapping) and c.get("resource") == "pods")
    annotations = meta.get("annotations") or {}
    return Claim(str(meta.get("namespace") or "default"), str(meta.get("name") or ""), devices, reserved,
                 annotations.get("resource.kubernetes.io/extended-resource-claim") == "true",
                 tuple(sorted(d for d in allocated if d in mig_ids)))


@dataclasses.dataclass(frozen=True)
class Asked:
    """What a claim spec asks of GPU classes: whole GPUs, MIG devices by profile (sorted pairs), or why it cannot
    be told (a GPU class is concerned)."""

    count: int = 0
    mig: tuple[tuple[str, int], ...] = ()
    why: str | None = None

    @property
    def any(self) -> bool:
        return self.count > 0 or bool(self.mig) or self.why is not None


def _plus(a: Asked, b: Asked) -> Asked:
    mig = dict(a.mig)
    for profile, n in b.mig:
        mig[profile] = mig.get(profile, 0) + n
    return Asked(a.count + b.count, tuple(sorted(mig.items())), a.why or b.why)


def asked(devices: Mapping[str, Any], classes: Mapping[str, GpuClass], where: str, *, own: bool = False) -> Asked:
    """What a claim spec asks (exact counts of GPU classes; a MIG class's by the one profile its selector or the
    request's selectors pin), or why it cannot be told. `own`: a pod's claim of its own (`Record`), whose
    `firstAvailable` alternatives all ask the same."""
    total = Asked()
    for request in devices.get("requests") or ():
        if not isinstance(request, Mapping):
            return Asked(why=f"{where}: a request that is no object")
        name = request.get("name")
        if own and request.get("firstAvailable"):
            answers = {asked({"requests": [{"name": name, "exactly": s}]}, classes, where)
                       for s in request["firstAvailable"]
                       if isinstance(s, Mapping)}
            if len(answers) == 1:
                total = _plus(total, answers.pop())
                if total.why:
                    return Asked(why=total.why)
                continue
        if request.get("firstAvailable"):
            if any(isinstance(s, Mapping) and s.get("deviceClassName") in classes
                   for s in request["firstAvailable"]):
                return Asked(why=f"{where} request {name}: firstAvailable (the scheduler picks the alternative)")
            continue
        exactly = request.get("exactly") or {}
        cls = classes.get(str(exactly.get("deviceClassName")))
        if cls is None:
            continue
        if exactly.get("adminAccess"):
            return Asked(why=f"{where} request {name}: adminAccess")
        mode = exactly.get("allocationMode") or EXACT_COUNT
        if mode != EXACT_COUNT:
            return Asked(why=f"{where} request {name}: allocationMode {mode}")
        count = int(exactly.get("count") or 1)
        if not cls.mig:
            total = _plus(total, Asked(count=count))
            continue
        profiles = {cls.profile} - {None} | _profiles(exactly.get("selectors"))
        if len(profiles) != 1:
            return Asked(why=f"{where} request {name}: MIG class {cls.name} with "
                             f"{'profiles ' + ', '.join(sorted(map(str, profiles))) if profiles else 'no profile'} "
                             "pinned (the allocator picks any: not counted)")
        total = _plus(total, Asked(mig=((str(profiles.pop()), count),)))
    return total


def _profiles(selectors: Any) -> set[str | None]:
    """The MIG profiles a request's CEL selectors pin (`device.attributes['<d>'].profile == '<p>'`, in a
    conjunction); an expression with `||` pins none we can tell."""
    found: set[str | None] = set()
    for selector in selectors or ():
        expression = ((selector or {}).get("cel") or {}).get("expression") if isinstance(selector, Mapping) else None
        if not isinstance(expression, str) or "||" in expression:
            continue
        for term in expression.split("&&"):
            parsed = _term(term)
            if parsed is not None and parsed[0].endswith("/profile") and isinstance(parsed[1], str):
                found.add(parsed[1])
    return found


def pod_gpus(pod: Mapping[str, Any], inventory: Inventory, *, annotation: str) -> PodGpus:
    """What the pod asks of DRA GPUs and holds (see `PodGpus`). Pure; reads the pod's claims in the inventory, and
    its claim of its own in `annotation` (`recorded`)."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    entries = [e for e in spec.get("resourceClaims") or () if isinstance(e, Mapping)]
    if not entries and not status.get("extendedResourceClaimStatus"):
        return NONE
    if entries and not inventory.served:
        return PodGpus(left="spec.resourceClaims, and resource.k8s.io/v1 not read (not served, or not granted)")
    generated = {s.get("name"): s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or ()
                 if isinstance(s, Mapping)}
    total, left, names, asks, pending = Asked(), None, [], False, False
    record = recorded(pod, annotation=annotation)
    uid = str(meta.get("uid") or "")
    for entry in entries:
        own = entry.get("name")
        if record is not None and (own, entry.get("resourceClaimName")) == (record.entry, record.claim):
            key = f"{namespace}/{record.claim}"
            mine = key in inventory.specs and uid in inventory.owners.get(key, frozenset())
            if mine or key not in inventory.specs:
                where = f"claim {key}" if mine else f"claim template {namespace}/{record.template} (of claim {key})"
                devices = inventory.specs[key] if mine else inventory.templates.get(f"{namespace}/{record.template}")
                if devices is None:
                    left = left or f"claim template {namespace}/{record.template} not found (for claim {key})"
                    continue
                got = asked(devices, inventory.classes, where, own=True)
                left, total, asks = left or got.why, _plus(total, got), True
                pending = pending or not mine or any(isinstance(r, Mapping) and r.get("firstAvailable")
                                                     for r in devices.get("requests") or ())
                names.append(key)
                continue
        if entry.get("resourceClaimName"):
            key = f"{namespace}/{entry['resourceClaimName']}"
            devices = inventory.specs.get(key)
            if devices is None:
                left = left or f"claim {key} not found"
                continue
            got = asked(devices, inventory.classes, f"claim {key}")
            if got.any:
                # A claim made by hand may be shared by several pods: its devices free only when all are gone.
                left = left or got.why or f"claim {key} is a ResourceClaim of its own (it may be shared)"
                asks = True
            names.append(key)
            continue
        template = entry.get("resourceClaimTemplateName")
        made = generated.get(own)
        key = f"{namespace}/{template}"
        devices = inventory.templates.get(key) if template else None
        if devices is None and made:
            devices = inventory.specs.get(f"{namespace}/{made}")
        if devices is None:
            left = left or f"claim template {key} not found"
            continue
        got = asked(devices, inventory.classes, f"claim template {key}")
        left = left or got.why
        total = _plus(total, got)
        asks = asks or got.any
        if made:
            names.append(f"{namespace}/{made}")
    extended = (status.get("extendedResourceClaimStatus") or {}).get("resourceClaimName")
    if extended:
        names.append(f"{namespace}/{extended}")
    claims = [inventory.claims[n] for n in names if n in inventory.claims]
    held = tuple(sorted(d for c in claims for d in c.devices))
    held_mig = tuple(sorted(d for c in claims for d in c.mig))
    return PodGpus(count=total.count, devices=held, left=left, mig=dict(total.mig), mig_devices=held_mig,
                   claims=tuple(c.key for c in claims), asks_gpus=asks or bool(held) or bool(held_mig),
                   domain_claim=pending)




def extended_gpus(requests: Mapping[str, int], inventory: Inventory) -> dict[str, int]:
    """Of a pod's request vector (`resources.pod_requests`), the extended resources a GPU class serves under a
    name other than the device plugin's `nvidia.com/gpu` (e.g. the implicit `deviceclass.resource.kubernetes.io/
    gpu.nvidia.com`): these are GPUs too."""
    return {name: requests[name] for name in inventory.extended if name != gpu.FULL_GPU and requests.get(name)}


def extended_mig(requests: Mapping[str, int], inventory: Inventory) -> dict[str, tuple[str, int]]:
    """Of a pod's request vector, the extended resources a one-profile MIG class serves under a name other than
    the device plugin's `nvidia.com/mig-<profile>`: name -> (profile, count)."""
    return {name: (profile, requests[name]) for name, profile in inventory.extended_mig.items()
            if name != gpu.MIG_PREFIX + profile and requests.get(name)}
