"""The one settings model of gpu-steward (pure: building a `Settings` reads nothing).

Every component reads the same `Settings`; the Helm chart renders its values into a YAML file of
exactly this shape (`charts/gpu-steward/values.yaml` mirrors it key for key). `common.settings_loader.load`
is the only place that reads the YAML file (`--config` / `GPU_STEWARD_CONFIG`) and the environment
(`GPU_STEWARD_<GROUP>__<FIELD>`, e.g. `GPU_STEWARD_WEBHOOK__PORT=9443`), so a test that builds
`Settings(...)` sees exactly what it wrote. Unknown keys and bad values fail with a message that names the key.
"""

from __future__ import annotations

import enum
import re
from typing import Annotated, Any, Literal

import pydantic

ENV_PREFIX = "GPU_STEWARD_"
CONFIG_ENV = "GPU_STEWARD_CONFIG"


class Model(pydantic.BaseModel):
    """Our own configuration: unknown keys are errors, values are immutable once loaded."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)


class Tier(enum.StrEnum):
    CRITICAL = "critical"
    NORMAL = "normal"
    SCAVENGER = "scavenger"


class Placement(enum.StrEnum):
    STRICT = "strict"  # gated and placed at release while the controller lives, else preferred node terms
    PREFER = "prefer"  # preferred node terms only, never a gate
    OFF = "off"  # no affinity changes


Percent = Annotated[float, pydantic.Field(ge=0, le=100)]
Fraction = Annotated[float, pydantic.Field(ge=0, le=1)]
Seconds = Annotated[float, pydantic.Field(gt=0)]
Points = float
# A file's path, as text: the model names files, the shell opens them (pathlib.Path values are accepted).
FilePath = Annotated[str, pydantic.BeforeValidator(lambda value: str(value) if value is not None else value)]


class Names(Model):
    """Label, annotation and gate names. Only the prefix is meant to change."""

    prefix: str = pydantic.Field(
        default="gpu-steward.io/",
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/$",
        description="DNS prefix (with the trailing '/') of every label, annotation and gate we own.",
    )

    @property
    def tier(self) -> str:
        return f"{self.prefix}tier"

    @property
    def gang_name(self) -> str:
        return f"{self.prefix}gang-name"

    @property
    def gang_size(self) -> str:
        return f"{self.prefix}gang-size"

    @property
    def placement(self) -> str:
        return f"{self.prefix}placement"

    @property
    def skip(self) -> str:
        return f"{self.prefix}skip"

    @property
    def gate(self) -> str:
        return f"{self.prefix}gang"

    @property
    def decision(self) -> str:
        return f"{self.prefix}decision"

    @property
    def release(self) -> str:
        """Annotation the release controller writes in the patch that places a single pod: where and why."""
        return f"{self.prefix}release"

    @property
    def domain_claim(self) -> str:
        """Pod annotation: the claim entry the webhook rewrote to a claim of the pod's own (`common.domain_claim`);
        read under this key alone (`dra.recorded`): another product's `<its prefix>domain-claim` is not ours."""
        return f"{self.prefix}domain-claim"

    @property
    def nvlink_domains(self) -> str:
        return f"{self.prefix}nvlink-domains"

    @property
    def nvlink_domain_size(self) -> str:
        return f"{self.prefix}nvlink-domain-size"

    @property
    def nvlink_topology(self) -> str:
        return f"{self.prefix}nvlink-topology"

    @property
    def cooldown(self) -> str:
        return f"{self.prefix}reclaim-cooldown-until"

    @property
    def learned_idle_window(self) -> str:
        """PriorityClass annotation: "true" turns on idle windows learned per workload for that tier."""
        return f"{self.prefix}learned-idle-window"


class Scoring(Model):
    """Constants of the NVLink-aware node score (points unless stated). See docs/scoring.md."""

    base: Points = pydantic.Field(default=50, description="Every candidate node starts here.")
    fits_one_domain: Points = pydantic.Field(default=50, description="The pod fits in one NVLink domain.")
    exact_domain_fit: Points = pydantic.Field(
        default=30, description="The pod takes a whole empty domain of exactly its size."
    )
    extra_domain_penalty: Points = pydantic.Field(
        default=20, ge=0, description="Subtracted per additional domain a pod must span."
    )
    domain_completion: Points = pydantic.Field(
        default=40, description="The pod takes every free GPU of a partly used domain."
    )
    small_pod_max_gpus: int = pydantic.Field(default=2, ge=1, description="Pods of up to this many GPUs are small.")
    large_pod_min_gpus: int = pydantic.Field(default=5, ge=2, description="Pods of at least this many GPUs are large.")
    small_node_max_gpus: int = pydantic.Field(
        default=4, ge=1, description="Nodes with up to this many GPUs are small NVLink nodes."
    )
    large_node_min_gpus: int = pydantic.Field(
        default=8, ge=2, description="Nodes with at least this many GPUs are large NVLink nodes."
    )
    small_on_small_min: Points = pydantic.Field(default=60, description="Small pod on the largest small node.")
    small_on_small_max: Points = pydantic.Field(
        default=80, description="Small pod on a node no bigger than the small-pod class."
    )
    small_on_oversized: Points = pydantic.Field(default=-40, description="Small pod on a node that is not small.")
    large_on_large_min: Points = pydantic.Field(
        default=80, description="Large pod of the smallest large size on a large node."
    )
    large_on_large_max: Points = pydantic.Field(default=100, description="Large pod that fills a large node.")
    large_on_undersized: Points = pydantic.Field(default=-80, description="Large pod on a node that is not large.")
    high_utilisation_above: Fraction = pydantic.Field(
        default=0.70, description="Node GPU utilisation after placement above this earns the efficiency bonus."
    )
    high_utilisation_min: Points = pydantic.Field(default=20, description="Bonus just above the high mark.")
    high_utilisation_max: Points = pydantic.Field(default=30, description="Bonus at 100 % node utilisation.")
    low_utilisation_below: Fraction = pydantic.Field(
        default=0.30, description="Node GPU utilisation after placement below this is penalised."
    )
    low_utilisation_penalty: Points = pydantic.Field(default=-20, description="The low-utilisation penalty.")
    normalisation_max_domains: int = pydantic.Field(
        default=4,
        ge=1,
        description="Domains spanned assumed at the bottom of the 1..100 weight map; scores below it map to 1.",
    )

    @pydantic.model_validator(mode="after")
    def _check_classes(self) -> Scoring:
        if self.large_pod_min_gpus <= self.small_pod_max_gpus:
            raise ValueError("large_pod_min_gpus must be greater than small_pod_max_gpus")
        if self.small_node_max_gpus >= self.large_node_min_gpus:
            raise ValueError("small_node_max_gpus must be smaller than large_node_min_gpus")
        if self.low_utilisation_below > self.high_utilisation_above:
            raise ValueError("low_utilisation_below must not exceed high_utilisation_above")
        return self


class TierClass(Model):
    """The PriorityClass a tier maps to (the chart creates it with these values)."""

    name: str = pydantic.Field(min_length=1, description="PriorityClass name.")
    value: int = pydantic.Field(ge=-2_147_483_648, le=1_000_000_000, description="PriorityClass value.")
    preemption_policy: Literal["PreemptLowerPriority", "Never"] = pydantic.Field(
        default="PreemptLowerPriority",
        description="PreemptLowerPriority or Never, set on the pod with the class (Never: it never preempts).",
    )


class TierRule(Model):
    """First matching rule picks the tier; every criterion given must match."""

    name: str = pydantic.Field(min_length=1, description="Shown in the decision record.")
    tier: Tier
    namespace_labels: dict[str, str] = pydantic.Field(default_factory=dict)
    pod_labels: dict[str, str] = pydantic.Field(default_factory=dict)
    owner_kinds: list[str] = pydantic.Field(default_factory=list, description="e.g. Job, StatefulSet.")
    namespaces: list[str] = pydantic.Field(default_factory=list)

    @pydantic.model_validator(mode="after")
    def _not_empty(self) -> TierRule:
        if not (self.namespace_labels or self.pod_labels or self.owner_kinds or self.namespaces):
            raise ValueError(f"tier rule {self.name!r} has no criterion and would match every pod")
        return self


class LabelClaim(Model):
    """Where pods may raise their tier with the tier label: every criterion given must match the namespace."""

    name: str = pydantic.Field(min_length=1, description="Shown in the decision record.")
    tier: Tier = pydantic.Field(description="The highest tier a label may claim where this matches.")
    namespaces: list[str] = pydantic.Field(default_factory=list, description="Empty: any namespace name.")
    namespace_labels: dict[str, str] = pydantic.Field(
        default_factory=dict, description="Labels the namespace must carry (all of them)."
    )


class Tiers(Model):
    critical: TierClass = TierClass(name="gpu-steward-critical", value=100_000)
    normal: TierClass = TierClass(name="gpu-steward-normal", value=10_000)
    scavenger: TierClass = TierClass(name="gpu-steward-scavenger", value=100, preemption_policy="Never")
    default: Tier = pydantic.Field(default=Tier.NORMAL, description="Tier of a GPU pod no label or rule places.")
    rules: list[TierRule] = pydantic.Field(
        default_factory=list,
        description="Tier rules, first match wins: "
        "[{name, tier, namespace_labels, pod_labels, owner_kinds, namespaces}].",
    )
    override_explicit_class: bool = pydantic.Field(
        default=False,
        description="Replace a priorityClassName the user set (default: keep it). The cluster's globalDefault "
        "class is never the user's choice: the API server writes it into pods that named none.",
    )
    label_claims: list[LabelClaim] = pydantic.Field(
        default_factory=list,
        description="Where the tier label may raise a pod above the tier the rules (or default) give: "
        "[{name, tier, namespaces, namespace_labels}]; a claim of tier T also allows lower ones. A label may "
        "always lower the tier. Empty (default): no pod can promote itself; a refused claim is a warning.",
    )

    def for_tier(self, tier: Tier) -> TierClass:
        return {Tier.CRITICAL: self.critical, Tier.NORMAL: self.normal, Tier.SCAVENGER: self.scavenger}[tier]

    def tier_of_class(self, class_name: str) -> Tier | None:
        for tier in Tier:
            if self.for_tier(tier).name == class_name:
                return tier
        return None


class Admission(Model):
    default_placement: Placement = pydantic.Field(
        default=Placement.STRICT,
        description="strict | prefer | off: NVLink placement of pods without the placement label. strict: gated and "
        "placed at release while the descheduler is seen alive, else preferred terms; prefer: preferred terms only, "
        "never a gate; off: none.",
    )
    preferred_terms: int = pydantic.Field(
        default=10,
        ge=0,
        le=20,
        description="How many best-scored nodes get a preferred affinity term. Keep it well above 1: the "
        "scheduler scores only a sample of the feasible nodes (percentageOfNodesToScore) and pods admitted "
        "together see the same best nodes (docs/scoring.md).",
    )
    excluded_namespaces: list[str] = pydantic.Field(
        default_factory=lambda: ["kube-system"],
        description="Pods here are never mutated (the chart adds its own namespace).",
    )
    max_snapshot_age_seconds: Seconds = pydantic.Field(
        default=120,
        description="Older snapshot => no preferred terms (tiers and gates are still safe to add).",
    )
    release_enabled: bool = pydantic.Field(
        default=True,
        description="Gate governed pods (strict placement, at least release_min_gpus whole GPUs) at creation so "
        "that the descheduler places them at release. Off: they get preferred terms only, as without a live "
        "controller. Gang members are gated for their gang either way.",
    )
    release_min_gpus: int = pydantic.Field(
        default=2,
        ge=1,
        description="Fewest whole GPUs (nvidia.com/gpu) a pod requests for its placement to be governed at "
        "release; smaller pods and MIG-only pods get preferred terms only. 2 by default: a 1-GPU pod always fits "
        "one NVLink domain, and on the openb trace placing it at release cost more pods never scheduled (their "
        "create-to-bound wait grows) than its packing gained (benchmarks/RESULTS.md).",
    )
    controller_stale_seconds: Seconds = pydantic.Field(
        default=30,
        description="Seconds since this webhook last saw the descheduler's leader Lease renewed (its renewTime or "
        "holder change, timed on the webhook's own clock) after which the controller counts as down and no pod is "
        "gated for release. Default: the Lease duration (15 s) plus 15 s for watch delay. Must exceed "
        "descheduler.leader_election.retry_period_seconds, the renewal interval.",
    )


class ManagedTls(Model):
    """The webhook keeps its own CA and serving certificate in a Secret and writes the CA into its
    MutatingWebhookConfiguration (admission/certmanager.py); cert_file/key_file are where it writes the pair."""

    enabled: bool = pydantic.Field(
        default=False,
        description="Manage the serving certificate (off: cert_file/key_file come from elsewhere, e.g. cert-manager).",
    )
    secret_name: str = pydantic.Field(
        default="gpu-steward-webhook-tls", min_length=1, description="Secret holding the CA and the serving pair."
    )
    secret_namespace: str = pydantic.Field(
        default="gpu-steward",
        min_length=1,
        description="Namespace of that Secret (the chart sets the release namespace).",
    )
    webhook_configuration: str = pydantic.Field(
        default="gpu-steward",
        min_length=1,
        description="MutatingWebhookConfiguration whose webhooks get the CA as caBundle.",
    )
    dns_names: list[str] = pydantic.Field(
        default_factory=list, description="DNS names of the serving certificate (the chart sets the Service's names)."
    )
    ip_addresses: list[str] = pydantic.Field(
        default_factory=list,
        description="IP addresses of the serving certificate (a webhook registered by URL, e.g. 127.0.0.1).",
    )
    ca_validity_days: int = pydantic.Field(default=3650, ge=2, description="Validity of a new CA (days).")
    cert_validity_days: int = pydantic.Field(
        default=365, ge=2, description="Validity of a new serving certificate (days)."
    )
    renew_before_days: int = pydantic.Field(
        default=30,
        ge=1,
        description="Renew the CA or the serving certificate this many days before it expires; a replaced CA "
        "stays in the caBundle until it expires.",
    )
    check_seconds: Seconds = pydantic.Field(
        default=60,
        description="How often the Secret and the caBundle are re-checked (and repaired, e.g. after a re-apply "
        "dropped the caBundle).",
    )


class Webhook(Model):
    host: str = pydantic.Field(default="0.0.0.0", description="Listen address of the webhook server.")
    port: int = pydantic.Field(
        default=8443, ge=1, le=65535, description="Listen port (HTTPS); the Service's targetPort."
    )
    cert_file: FilePath | None = pydantic.Field(default=None, description="PEM serving certificate.")
    key_file: FilePath | None = pydantic.Field(default=None, description="PEM private key.")
    cert_check_seconds: Seconds = pydantic.Field(
        default=10, description="How often the cert files are checked for rotation."
    )
    request_timeout_seconds: Seconds = pydantic.Field(
        default=2.0, description="Budget of one /mutate answer; keep below the webhook timeoutSeconds."
    )
    managed_tls: ManagedTls = ManagedTls()


class Kubernetes(Model):
    kubeconfig: FilePath | None = pydantic.Field(
        default=None, description="Unset: in-cluster config, else ~/.kube/config."
    )
    request_timeout_seconds: Seconds = pydantic.Field(default=10, description="Bound of one API call (a list page).")
    watch_timeout_seconds: int = pydantic.Field(default=300, ge=10, description="Server-side watch timeout.")
    backoff_initial_seconds: Seconds = pydantic.Field(
        default=0.5, description="First wait after a failed list/watch; doubles per failure, jittered."
    )
    backoff_max_seconds: Seconds = pydantic.Field(default=30, description="Longest wait between retries.")
    list_page_size: int = pydantic.Field(
        default=500, ge=1, description="Objects per list page (`limit`); bounds each response's size."
    )
    rebuild_interval_seconds: Seconds = pydantic.Field(
        default=0.25, le=5, description="Snapshot rebuilds are batched: at most one per this interval (the first "
        "change after a quiet spell is rebuilt at once; those during the pause after a rebuild wait for its end)."
    )
    context: str | None = pydantic.Field(
        default=None, description="Context of the kubeconfig to use; unset: its current context (not in-cluster)."
    )


class PrometheusLabels(Model):
    """DCGM label names. In each list a later non-empty label overrides an earlier one: with the defaults
    `exported_pod` beats `pod`, because Prometheus writes `exported_*` only when the scrape target's own
    `pod`/`namespace` (the dcgm-exporter pod's) clashed with the workload's."""

    pod: list[str] = pydantic.Field(
        default_factory=lambda: ["pod", "exported_pod"],
        description="DCGM labels naming the pod; a later non-empty one wins (exported_pod after a rename).",
    )
    namespace: list[str] = pydantic.Field(
        default_factory=lambda: ["namespace", "exported_namespace"],
        description="DCGM labels naming the pod's namespace; a later non-empty one wins.",
    )
    hostname: list[str] = pydantic.Field(
        default_factory=lambda: ["Hostname", "hostname"],
        description="DCGM labels naming the node (older dcgm-exporter: Hostname).",
    )
    gpu: str = pydantic.Field(default="gpu", description="DCGM label with the GPU index.")
    mig_profile: str = pydantic.Field(
        default="GPU_I_PROFILE", description="DCGM label with the MIG profile (e.g. 1g.10gb)."
    )
    mig_instance: str = pydantic.Field(default="GPU_I_ID", description="DCGM label with the MIG GPU instance id.")
    uuid: str = pydantic.Field(
        default="UUID", description="DCGM label with the GPU's UUID: what identifies a GPU first (the host and "
        "index only for series without it)."
    )


# One PromQL label matcher: label, operator, a double-quoted value (backslash escapes).
MATCHER = re.compile(r'^\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*$')


class Prometheus(Model):
    url: str | None = pydantic.Field(default=None, description="Unset: no DCGM data (no idle reclaim).")
    headers: dict[str, str] = pydantic.Field(default_factory=dict, description="Extra HTTP headers.")
    bearer_token_file: FilePath | None = pydantic.Field(
        default=None, description="File with a bearer token for Prometheus (re-read on every query)."
    )
    ca_file: FilePath | None = pydantic.Field(
        default=None, description="PEM CA bundle that signs Prometheus' certificate."
    )
    insecure_skip_verify: bool = pydantic.Field(
        default=False, description="Do not verify Prometheus' TLS certificate (testing only)."
    )
    timeout_seconds: Seconds = pydantic.Field(default=5, description="Bound of one PromQL query (seconds).")
    occupancy_refresh_seconds: Seconds = pydantic.Field(
        default=30, description="How often GPU-index occupancy is re-read from DCGM series."
    )
    occupancy_max_age_seconds: Seconds = pydantic.Field(
        default=120,
        description="A DCGM series with no sample this recent no longer says which pod holds a GPU.",
    )
    gpu_util_metric: str = pydantic.Field(
        default="DCGM_FI_DEV_GPU_UTIL",
        pattern=r"^[a-zA-Z_:][a-zA-Z0-9_:]*$",
        description="DCGM metric of whole-GPU utilisation (percent, or a ratio: see gpu_util_unit).",
    )
    mig_activity_metric: str = pydantic.Field(
        default="DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        pattern=r"^[a-zA-Z_:][a-zA-Z0-9_:]*$",
        description="DCGM metric of MIG instance activity (ratio 0-1).",
    )
    labels: PrometheusLabels = PrometheusLabels()
    scope_matchers: list[str] = pydantic.Field(
        default_factory=list,
        description="PromQL label matchers added to every selector gpu-steward sends (utilisation, occupancy, "
        "history, re-checks), e.g. ['cluster=\"prod-a\"'] where one store (Thanos, Mimir, a federated "
        "Prometheus) holds several clusters told apart by an external label. Each is label, operator (=, !=, "
        "=~, !~) and a double-quoted value. Checked at start: no series of gpu_util_metric under them is an "
        "error naming this key. Empty: every series of the store is this cluster's; a pod whose series then "
        "show more distinct GPUs than it holds is not idle.",
    )
    hostname_match: Literal["exact", "short-name"] = pydantic.Field(
        default="exact",
        description="How a series' host label is compared with the pod's node name. exact: whole names "
        "(gpu-01.a.example is not gpu-01.b.example); short-name: up to the first dot (gpu-01 is "
        "gpu-01.a.example), for exporters that report the short host name of FQDN-named nodes.",
    )
    gpu_util_unit: Literal["auto", "percent", "ratio"] = pydantic.Field(
        default="auto",
        description="Unit of gpu_util_metric. auto: ratio (0-1, read x100) for DCGM_FI_PROF_* metrics, else "
        "percent. A reading above 100 % after scaling means the unit is wrong: that pod is not idle, and the "
        "reason says which setting to change.",
    )
    mig_activity_unit: Literal["auto", "percent", "ratio"] = pydantic.Field(
        default="auto", description="Unit of mig_activity_metric, as gpu_util_unit (auto: ratio for DCGM_FI_PROF_*)."
    )
    max_concurrent_queries: int = pydantic.Field(
        default=2,
        ge=1,
        le=32,
        description="Reclaim asks each idle window as a few small queries (one per statistic, all at one store "
        "time): at most this many in flight at once.",
    )

    @pydantic.field_validator("scope_matchers")
    @classmethod
    def _check_matchers(cls, matchers: list[str]) -> list[str]:
        for matcher in matchers:
            if not MATCHER.match(matcher):
                raise ValueError(f"{matcher!r} is not a PromQL label matcher such as cluster=\"prod-a\" "
                                 "(label, one of = != =~ !~, a double-quoted value)")
        return [matcher.strip() for matcher in matchers]


class Cooldowns(Model):
    preemptor_seconds: float = pydantic.Field(
        default=180,
        ge=0,
        description="No new reclaim for the same pending pod or gang (seconds). It must outlast one reclaim "
        "cycle (60 s) plus the victims' termination grace period (Kubernetes' default 30 s; checkpointing "
        "jobs often take longer) plus the scheduler binding the pod: 180 s. Victims still terminating count "
        "as freeing their GPUs for the pod they were evicted for in any case, so a longer grace period alone "
        "causes no second eviction.",
    )
    node_seconds: float = pydantic.Field(default=300, ge=0, description="No new reclaim on the same node.")
    workload_seconds: float = pydantic.Field(default=900, ge=0, description="Owner (Job/ReplicaSet) spared.")


class EvictionLimits(Model):
    """Limits count decisions: a single pod, or a whole gang (evicted together or not at all: splitting a gang
    to fit a limit is the one outcome worse than either). A gang counts once in the cycle, once on each node
    and in each namespace it has members in."""

    per_cycle: int = pydantic.Field(default=10, ge=0, description="Most eviction decisions in one cycle.")
    per_node: int = pydantic.Field(default=2, ge=0, description="Most eviction decisions touching one node in a cycle.")
    per_namespace: int = pydantic.Field(
        default=5, ge=0, description="Most eviction decisions touching one namespace in a cycle."
    )


class Conventions(Model):
    """Eviction conventions operators rely on (kubernetes-sigs/descheduler's DefaultEvictor, Cluster Autoscaler,
    Karpenter). A pod annotated `cluster-autoscaler.kubernetes.io/safe-to-evict: "true"` or carrying
    `descheduler.alpha.kubernetes.io/evict` is exempt from the bare-pod and local-storage protections, as in
    those tools."""

    evict_bare_pods: bool = pydantic.Field(
        default=False,
        description="Evict pods with no controller owner. Off: nothing would recreate them, so eviction is deletion.",
    )
    evict_local_storage_pods: bool = pydantic.Field(
        default=False,
        description="Evict pods with hostPath or emptyDir volumes (their data is lost with the pod).",
    )
    memory_emptydir_is_local_storage: bool = pydantic.Field(
        default=False,
        description="Count emptyDir volumes with medium Memory as local storage (the descheduler does). Off: "
        "GPU pods mount one as /dev/shm for data loaders almost always; it holds no data worth keeping.",
    )
    honour_safe_to_evict: bool = pydantic.Field(
        default=True, description='Never evict pods annotated cluster-autoscaler.kubernetes.io/safe-to-evict: "false".'
    )
    honour_do_not_disrupt: bool = pydantic.Field(
        default=True, description='Never evict pods annotated karpenter.sh/do-not-disrupt: "true".'
    )


class LeaderElection(Model):
    enabled: bool = pydantic.Field(
        default=True, description="Only the Lease holder acts; off: run exactly one replica."
    )
    lease_name: str = pydantic.Field(default="gpu-steward-descheduler", description="Name of the leader Lease.")
    lease_namespace: str = pydantic.Field(
        default="gpu-steward", description="Namespace of the Lease (the chart sets the release namespace)."
    )
    lease_duration_seconds: Seconds = pydantic.Field(
        default=15, description="How long a Lease is valid without renewal (seconds)."
    )
    renew_deadline_seconds: Seconds = pydantic.Field(
        default=10, description="The leader steps down if it cannot renew within this (seconds)."
    )
    retry_period_seconds: Seconds = pydantic.Field(
        default=2, description="How often Lease acquisition/renewal is tried (seconds)."
    )
    identity: str | None = pydantic.Field(
        default=None, description="This replica's holder identity in the Lease; unset: hostname + random suffix."
    )

    @pydantic.model_validator(mode="after")
    def _check_timing(self) -> LeaderElection:
        # client-go's rules: a leader must give up before another replica may take over, and must get
        # more than one try at renewing before it does.
        if self.renew_deadline_seconds >= self.lease_duration_seconds:
            raise ValueError(f"renew_deadline_seconds ({self.renew_deadline_seconds:g}) must be less than "
                             f"lease_duration_seconds ({self.lease_duration_seconds:g})")
        if self.retry_period_seconds * 1.2 >= self.renew_deadline_seconds:
            raise ValueError(f"retry_period_seconds ({self.retry_period_seconds:g}) times 1.2 must be less than "
                             f"renew_deadline_seconds ({self.renew_deadline_seconds:g})")
        return self


class LearnedWindow(Model):
    """Idle windows learned per workload from its own history (descheduler/reclaim/idle_learning.py), for tiers whose
    PriorityClass says `<prefix>learned-idle-window: "true"`: a pod is reclaimable once idle for its workload's
    learned window, the shortest idle time (from the floor, below the tier window) at which an idle stretch that long
    is estimated to end in work soon with a probability below resume_probability."""

    resume_probability: float = pydantic.Field(
        default=0.05, gt=0, lt=1,
        description="A pod is reclaimed once an idle stretch as long as its own is estimated to end in work within "
        "resume_horizon_seconds with a probability below this (0.05: the regret goal, at most 5 % of evictions "
        "followed by work within 10 min). Estimated from the idle stretches of every pod in the look-back, each "
        "measured against its pod's longest earlier one, at the workload's longest.",
    )
    resume_horizon_seconds: Seconds = pydantic.Field(
        default=600,
        description="How soon after an eviction work would make it a regret (seconds; 600: the reclaim benchmarks' "
        "regret). The probability above is of work within this long.",
    )
    min_at_risk: int = pydantic.Field(
        default=20, ge=1,
        description="A probability is only taken from at least this many pooled idle stretches that lasted as long "
        "(relative to their pod's longest) and were followed to work or to the horizon's end (a run still idle short "
        "of it tells nothing of it); fewer, and that idle time is not learned. 20 = 1 / 0.05: a single stretch that "
        "ended in work then weighs 5 %.",
    )
    floor_seconds: Seconds = pydantic.Field(
        default=1800, description="No learned window is shorter than this (seconds), however short the stretches."
    )
    min_stretches: int = pydantic.Field(
        default=6, ge=1,
        description="A workload with fewer idle stretches that ended in work in the look-back keeps the tier's "
        "window: too little history to learn from. Likewise a pod's stretch joins the pool of all pods' stretches "
        "only once this many of that pod's ended before it.",
    )
    lookback_seconds: Seconds = pydantic.Field(
        default=7 * 86400,
        description="History learned from (seconds; 7 d). Bounded in fact by what Prometheus retains: older "
        "data is simply absent, so a short retention means fewer stretches, not a wrong window.",
    )
    step_seconds: Seconds = pydantic.Field(
        default=300,
        description="Resolution of the history (seconds): the peak of each step of a pod's GPUs, read by one "
        "range query. Idle stretches are measured in whole steps; a step with no sample is a gap, never idle.",
    )
    refresh_seconds: Seconds = pydantic.Field(
        default=1800,
        description="Read the new history this often (seconds): it changes slowly, and between reads each pod is "
        "still judged idle over its window by the normal fail-closed query every cycle.",
    )
    chunk_seconds: Seconds = pydantic.Field(
        default=1800,
        description="At start the look-back is read in range queries of this much history each, one per cycle, "
        "so that no query grows with the look-back (seconds). Until the whole look-back is read (7 d, 30 min a "
        "cycle while its end moves on: 347 cycles, 5.8 h at 60 s cycles, after a start or on a new leader) every pod "
        "keeps its tier's window; `descheduler --once` reads it all in its one cycle. A query's cost grows with "
        "GPUs x this (measured: benchmarks/RESULTS.md, Learned idle windows).",
    )
    bucket_seconds: Seconds = pydantic.Field(
        default=600,
        description="Learned windows are rounded up to a multiple of this (seconds): each distinct window is "
        "judged every cycle from the kept utilisation parts (no query of its own), so few distinct windows keep "
        "that work bounded.",
    )


class Reclaim(Model):
    enabled: bool = pydantic.Field(default=True, description="Run the idle-GPU reclaim loop.")
    interval_seconds: Seconds = pydantic.Field(default=60, description="Seconds between reclaim cycles.")
    mode: Literal["on-demand", "always"] = pydantic.Field(
        default="on-demand",
        description="on-demand: reclaim only for pending GPU pods that need it; always: any idle pod.",
    )
    dry_run: bool = pydantic.Field(
        default=False, description="Decide, log and emit 'would evict' Events, but evict nothing."
    )
    idle_statistic: Literal["peak", "average"] = pydantic.Field(
        default="peak",
        description="How a pod's samples over its idle window are judged. peak: idle only if no sample "
        "reaches the threshold (the busiest moment decides); average: the window's mean below it (the "
        "ReclaimIdleResource plugin's rule). On bursty serving pods the average evicts many pods that are busy "
        "again within minutes (benchmarks/RESULTS.md, Reclaim quality); peak is the safer default.",
    )
    max_gap_intervals: float = pydantic.Field(
        default=2.0,
        gt=0,
        description="Coverage by time: a pod is idle only if no device has a stretch of its idle window without "
        "a sample longer than this many of its own observed scrape intervals (the shortest mean spacing of its "
        "samples over the parts of the window, see part_seconds), counting from the window's start; and only "
        "if its newest sample is at most this many intervals old at the store's time. The interval is read from "
        "the data, so one value holds at 10 s, 15 s, 30 s or 60 s scrapes; 2 forgives one missed scrape.",
    )
    max_scrape_interval_seconds: Seconds = pydantic.Field(
        default=60,
        description="Coverage by time: the longest scrape interval believed (seconds). A device's observed "
        "interval is read from the spacing of its samples, so a few samples spread over a window would otherwise "
        "pass for a slow scrape and excuse long gaps; sparser data is judged against this interval instead.",
    )
    max_sample_age_seconds: Seconds = pydantic.Field(
        default=180,
        description="A pod whose newest DCGM sample is older than this (seconds, at the store's time) is not idle, "
        "whatever its scrape interval; the tighter bound is max_gap_intervals observed scrape intervals.",
    )
    default_idle_threshold_percent: Percent = pydantic.Field(
        default=5.0,
        description="Idle threshold (GPU utilisation %) of a reclaimable PriorityClass that names none.",
    )
    cooldowns: Cooldowns = Cooldowns()
    cooldown_lease_name: str = pydantic.Field(
        default="gpu-steward-reclaim-cooldowns",
        description="Lease (in leader_election.lease_namespace) whose annotation holds the cooldowns.",
    )
    limits: EvictionLimits = EvictionLimits()
    conventions: Conventions = Conventions()
    retry_backoff_initial_seconds: Seconds = pydantic.Field(
        default=60, description="After a failed eviction (not 429/404) the pod waits this long, doubling."
    )
    retry_backoff_max_seconds: Seconds = pydantic.Field(
        default=900, description="Longest wait before retrying a failed eviction (seconds)."
    )
    part_seconds: int = pydantic.Field(
        default=300,
        ge=30,
        le=300,
        description="Utilisation is read in parts of this many seconds of the store's time, aligned to multiples "
        "of it; each part's per-device peak, sample count and last sample time are kept (their memory: "
        "benchmarks/RESULTS.md, Descheduler cost against a real Prometheus) and every idle window is judged from "
        "the parts it overlaps plus the part being written, so each "
        "cycle reads only the newest minutes. A window starting inside a part takes the whole part (up to this "
        "much longer: stricter, never laxer). At most the store's lookback delta (Prometheus' default 5 min): "
        "each part's last sample is looked up at its end.",
    )
    settle_seconds: Seconds = pydantic.Field(
        default=120,
        description="A part is kept only once its end is this old at the store's time (seconds; 2x the longest "
        "scrape interval believed): until then it is read again every cycle with the part being written. Raise it "
        "for stores whose samples arrive late (remote write, agents).",
    )
    late_seconds: Seconds = pydantic.Field(
        default=600,
        description="A kept part in which a device that reports later has fewer samples than its own scrape "
        "interval implies (a sample possibly still on its way) is read again every cycle until it is complete or "
        "its end is this old (seconds); after that its missing samples are gaps, which the coverage rule judges.",
    )
    rebuild_parts_per_cycle: int = pydantic.Field(
        default=12,
        ge=1,
        le=1000,
        description="After a start or leader change the kept parts are empty: they are read back from the store, "
        "newest first, at most this many parts per cycle (12 x 300 s: an hour of history, in range queries of 4 "
        "parts). Until all the parts of a window are read its pods are not idle (the reason says so).",
    )
    max_clock_skew_seconds: Seconds = pydantic.Field(
        default=10,
        description="Windows are evaluated at the Prometheus store's own time. When that differs from the "
        "descheduler's clock by more than this (seconds, after the query's round trip), nothing measured by "
        "that query is idle (fail closed), and the skew is logged and exported as a metric.",
    )
    learned_window: LearnedWindow = LearnedWindow()


class Gangs(Model):
    """Gang release (see descheduler/release/planning.py for the rules)."""

    enabled: bool = pydantic.Field(default=True, description="Run the gang-release loop (off: gated pods stay gated).")
    resync_seconds: Seconds = pydantic.Field(
        default=30, description="Full re-plan at least this often, so a missed pod event never strands a gang."
    )
    timeout_seconds: Seconds = pydantic.Field(
        default=600,
        description="An incomplete gang older than this (from its first member's creation) gets a "
        "GangIncomplete warning; it stays gated.",
    )
    backfill: bool = pydantic.Field(
        default=False,
        description="Let a later gang use nodes an earlier, blocked gang could use. On: better utilisation, "
        "but a large gang may starve behind a stream of small ones. Off: they start only on other nodes.",
    )
    max_snapshot_age_seconds: Seconds = pydantic.Field(
        default=120, description="No release is planned on a cluster snapshot older than this (seconds)."
    )
    early_rebuilds: bool = pydantic.Field(
        default=True,
        description="A pod newly gated for release ends the pause after the descheduler's last snapshot rebuild "
        "once it has lasted as long as that rebuild took (kubernetes.rebuild_interval_seconds otherwise): under "
        "churn a gated pod is then planned about one rebuild after it arrives, for up to one rebuild more per "
        "gated pod (rebuilding stays within half of a core). Off: gated pods wait for the interval like any change.",
    )
    max_concurrent_patches: int = pydantic.Field(
        default=16, ge=1, le=256,
        description="Release calls (per pod: its nomination, then the removal of our gate) in flight at once; "
        "release Events are posted beside them, with as many slots of their own.",
    )
    max_wait_seconds: Seconds = pydantic.Field(
        default=300,
        description="A single pod gated for placement at release that cannot be placed within this long (from "
        "its creation) is released without a nomination with a ReleasedUnplaced warning: kube-scheduler's "
        "preemption and cluster autoscalers ignore gated pods, so no pod may wait on us longer (seconds).",
    )
    gang_max_wait_seconds: Seconds = pydantic.Field(
        default=1800,
        description="The same bound for a complete gang of several pods, from when it was first seen complete: "
        "waiting for GPUs that reclaim frees is its normal path, so it is longer (seconds).",
    )
    reservation_seconds: Seconds = pydantic.Field(
        default=120,
        description="With backfill off, a waiting gang keeps the nodes it could use from the gangs behind it for "
        "at most this long (from when it was ready), so a gang that fits nowhere soon does not stall the "
        "queue; a gang that can never fit as the cluster stands reserves nothing (seconds).",
    )
    bind_bound_seconds: Seconds = pydantic.Field(
        default=120,
        description="A released pod not bound this long after its release is reported (Warning NotBoundInTime, a "
        "gang: GangNotBoundInTime on every member; metric gpu_steward_release_outcomes_total; `gpu-steward gangs`), "
        "never deleted: kube-scheduler's own backoff (10 s at most) and the default 30 s grace of preemption "
        "victims fit well within it (seconds).",
    )
    native_binding: bool = pydantic.Field(
        default=True,
        description="Where the API server serves scheduling.k8s.io/v1beta1 PodGroups (Kubernetes 1.37 with "
        "GenericWorkload), the webhook names a gpu-steward gang's own PodGroup (gpu-steward-<gang name>) in each "
        "member's spec.schedulingGroup at creation, and whatever lifts our gate creates it first (gang policy, "
        "minCount = the gang's size): kube-scheduler then binds the released gang all-or-nothing. Off: never.",
    )
    incomplete_event_grace_seconds: Seconds = pydantic.Field(
        default=10,
        description="An incomplete gang gets its GangWaiting Event only once it has stayed incomplete this long "
        "(from its first member's creation): members created in a burst are not told they wait for each other "
        "(seconds).",
    )


class Descheduler(Model):
    leader_election: LeaderElection = LeaderElection()
    reclaim: Reclaim = Reclaim()
    gangs: Gangs = Gangs()
    loop_restart_initial_seconds: Seconds = pydantic.Field(
        default=1, description="Wait before restarting a loop (gang release, reclaim) an unexpected error ended; "
        "doubles per failure in a row, jittered."
    )
    loop_restart_max_seconds: Seconds = pydantic.Field(
        default=60, description="Longest wait before restarting a failed loop (seconds)."
    )


class Dra(Model):
    """GPUs that are Dynamic Resource Allocation devices (`resource.k8s.io/v1`, read where the cluster serves it)."""

    gpu_device_classes: tuple[str, ...] = pydantic.Field(
        default=("gpu.nvidia.com", "mig.nvidia.com"),
        description="DeviceClasses whose devices are GPUs (NVIDIA's DRA driver: gpu.nvidia.com, and mig.nvidia.com "
                    "for MIG devices; a class is a MIG class when its selector pins type 'mig' or a profile). A node "
                    "without a device plugin's GPUs has as many GPUs as ResourceSlice devices these classes select, "
                    "and its MIG devices count as nvidia.com/mig-<profile> slices by their profile attribute; a "
                    "pod's claims on them count as GPUs (MIG: by the one profile the class or the request's selector "
                    "pins). Empty: DRA devices are never GPUs.",
    )
    domain_claims: bool = pydantic.Field(
        default=False,
        description="Give a pod placed at release that asks 2 or more GPUs through one claim template a claim of its "
                    "own (the webhook names it at CREATE; whatever lifts our gate creates it, owned by the pod), whose "
                    "first alternative is the planned NVLink domain's devices: kube-scheduler's allocator otherwise "
                    "takes the first free devices in the slice's order, whatever their domain (docs/placement.md). "
                    "The webhook's and the uninstall hook's ServiceAccounts then need resourceclaims create.",
    )


class Settings(Model):
    """Everything; `settings_loader.load()` builds one from the file, the environment and flags."""

    names: Names = Names()
    scoring: Scoring = Scoring()
    tiers: Tiers = Tiers()
    admission: Admission = Admission()
    webhook: Webhook = Webhook()
    kubernetes: Kubernetes = Kubernetes()
    prometheus: Prometheus = Prometheus()
    descheduler: Descheduler = Descheduler()
    dra: Dra = Dra()
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = pydantic.Field(
        default="INFO", description="DEBUG | INFO | WARNING | ERROR."
    )

    @pydantic.model_validator(mode="after")
    def _check_controller_staleness(self) -> Settings:
        renewal = self.descheduler.leader_election.retry_period_seconds
        if self.admission.controller_stale_seconds <= renewal:
            raise ValueError(
                f"admission.controller_stale_seconds ({self.admission.controller_stale_seconds:g}) must exceed "
                f"descheduler.leader_election.retry_period_seconds ({renewal:g}): a live leader renews only that often"
            )
        return self


class SettingsError(Exception):
    """Bad configuration; the message names each offending key."""


def validate(data: dict[str, Any], *, source: str) -> Settings:
    """`data` (a settings document) as `Settings`, or SettingsError naming each bad key and `source`."""
    try:
        return Settings(**data)
    except pydantic.ValidationError as exc:
        raise SettingsError(_describe(exc, source=source)) from exc


def merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`extra` over `base`, nested mappings merged key by key (settings documents)."""
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def _describe(exc: pydantic.ValidationError, *, source: str) -> str:
    lines = [f"invalid settings ({source}):"]
    for error in exc.errors():
        key = ".".join(str(part) for part in error["loc"]) or "(top level)"
        lines.append(f"  {key}: {error['msg']}")
    return "\n".join(lines)
