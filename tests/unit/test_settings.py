"""common.settings: defaults, YAML file < environment < overrides, and errors that name the dotted key."""

from __future__ import annotations

import pathlib
from typing import Any

import pydantic
import pytest

from common import settings, settings_loader


def _yaml(tmp_path: pathlib.Path, text: str) -> pathlib.Path:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return path


def _load(
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    yaml_text: str,
    env: dict[str, str],
    overrides: dict[str, Any] | None,
) -> settings.Settings:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return settings_loader.load(config_file=_yaml(tmp_path, yaml_text), overrides=overrides)


def test_defaults_load_without_file_or_env() -> None:
    loaded = settings_loader.load()
    assert loaded == settings.Settings()
    assert loaded.webhook.port == 8443
    assert loaded.names.prefix == "gpu-steward.io/"
    assert loaded.tiers.default is settings.Tier.NORMAL
    assert [loaded.tiers.for_tier(t).name for t in settings.Tier] == [
        "gpu-steward-critical",
        "gpu-steward-normal",
        "gpu-steward-scavenger",
    ]
    assert loaded.tiers.scavenger.preemption_policy == "Never"
    assert loaded.admission.default_placement is settings.Placement.STRICT


@pytest.mark.parametrize(
    ("yaml_text", "env", "overrides", "expected_port"),
    [
        pytest.param("", {}, None, 8443, id="default"),
        pytest.param("webhook:\n  port: 9000\n", {}, None, 9000, id="file-over-default"),
        pytest.param("webhook:\n  port: 9000\n", {"GPU_STEWARD_WEBHOOK__PORT": "9443"}, None, 9443, id="env-over-file"),
        pytest.param("", {"GPU_STEWARD_WEBHOOK__PORT": "9443"}, None, 9443, id="env-over-default"),
        pytest.param("webhook:\n  port: 9000\n", {}, {"webhook": {"port": 1234}}, 1234, id="override-over-file"),
        pytest.param(
            "webhook:\n  port: 9000\n",
            {"GPU_STEWARD_WEBHOOK__PORT": "9443"},
            {"webhook": {"port": 1234}},
            1234,
            id="override-over-env",
        ),
    ],
)
def test_precedence(
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    yaml_text: str,
    env: dict[str, str],
    overrides: dict[str, Any] | None,
    expected_port: int,
) -> None:
    loaded = _load(tmp_path, monkeypatch, yaml_text=yaml_text, env=env, overrides=overrides)
    assert loaded.webhook.port == expected_port


def test_config_file_named_by_environment(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings_loader.CONFIG_ENV, str(_yaml(tmp_path, "webhook:\n  port: 7000\n")))
    assert settings_loader.load().webhook.port == 7000


def test_overrides_merge_deeply_and_keep_siblings(tmp_path: pathlib.Path) -> None:
    path = _yaml(tmp_path, "webhook:\n  port: 9000\n  host: 127.0.0.1\n")
    loaded = settings_loader.load(config_file=path, overrides={"webhook": {"port": 1234}, "log_level": "DEBUG"})
    assert (loaded.webhook.host, loaded.webhook.port, loaded.log_level) == ("127.0.0.1", 1234, "DEBUG")


def test_settings_are_frozen() -> None:
    loaded = settings_loader.load()
    with pytest.raises(pydantic.ValidationError, match="frozen"):
        loaded.webhook.port = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("yaml_text", "env", "overrides", "key", "message"),
    [
        pytest.param("webhook:\n  prot: 1\n", {}, None, "webhook.prot", "Extra inputs", id="unknown-key-file"),
        pytest.param("bogus: 1\n", {}, None, "bogus", "Extra inputs", id="unknown-top-level-key"),
        pytest.param("", {"GPU_STEWARD_WEBHOOK__PROT": "1"}, None, "webhook.prot", "Extra inputs",
                     id="unknown-key-env"),
        pytest.param("", {}, {"webhook": {"prt": 1}}, "webhook.prt", "Extra inputs", id="unknown-key-override"),
        pytest.param("webhook:\n  port: abc\n", {}, None, "webhook.port", "valid integer", id="bad-value-file"),
        pytest.param("webhook:\n  port: 70000\n", {}, None, "webhook.port", "less than or equal to 65535",
                     id="port-out-of-range"),
        pytest.param("", {"GPU_STEWARD_WEBHOOK__PORT": "abc"}, None, "webhook.port", "valid integer",
                     id="bad-value-env"),
        pytest.param("", {}, {"webhook": {"port": 0}}, "webhook.port", "greater than or equal to 1",
                     id="bad-value-override"),
        pytest.param("descheduler:\n  reclaim:\n    max_gap_intervals: 0\n", {}, None,
                     "descheduler.reclaim.max_gap_intervals", "greater than 0", id="nested-bound"),
        pytest.param("descheduler:\n  reclaim:\n    mode: sometimes\n", {}, None,
                     "descheduler.reclaim.mode", "'on-demand' or 'always'", id="literal"),
        pytest.param("tiers:\n  default: gold\n", {}, None, "tiers.default", "'critical', 'normal' or 'scavenger'",
                     id="unknown-tier"),
        pytest.param("names:\n  prefix: gpu-steward.io\n", {}, None, "names.prefix", "should match pattern",
                     id="prefix-without-slash"),
        pytest.param("scoring:\n  small_pod_max_gpus: 5\n", {}, None, "scoring",
                     "large_pod_min_gpus must be greater than small_pod_max_gpus", id="pod-classes-overlap"),
        pytest.param("scoring:\n  small_pod_max_gpus: 4\n  large_pod_min_gpus: 4\n", {}, None, "scoring",
                     "large_pod_min_gpus must be greater than small_pod_max_gpus", id="pod-classes-equal"),
        pytest.param("scoring:\n  low_utilisation_below: 0.8\n", {}, None, "scoring",
                     "low_utilisation_below must not exceed high_utilisation_above", id="utilisation-marks-crossed"),
        pytest.param("scoring:\n  high_utilisation_above: 1.2\n", {}, None, "scoring.high_utilisation_above",
                     "less than or equal to 1", id="utilisation-mark-not-a-fraction"),
        pytest.param("tiers:\n  rules:\n  - name: everyone\n    tier: critical\n", {}, None, "tiers.rules.0",
                     "tier rule 'everyone' has no criterion", id="empty-tier-rule"),
        pytest.param("tiers:\n  rules:\n  - name: ''\n    tier: critical\n    namespaces: [prod]\n", {}, None,
                     "tiers.rules.0.name", "at least 1 character", id="unnamed-tier-rule"),
        pytest.param("tiers:\n  critical:\n    name: c\n    value: 2000000000\n", {}, None,
                     "tiers.critical.value", "less than or equal to 1000000000", id="class-value-above-user-max"),
        pytest.param("prometheus:\n  scope_matchers: ['cluster=prod-a']\n", {}, None, "prometheus.scope_matchers",
                     "'cluster=prod-a' is not a PromQL label matcher", id="matcher-value-unquoted"),
        pytest.param("prometheus:\n  scope_matchers: ['cluster==\"a\"']\n", {}, None, "prometheus.scope_matchers",
                     "is not a PromQL label matcher", id="matcher-operator-unknown"),
        pytest.param("prometheus:\n  scope_matchers: ['{cluster=\"a\"}']\n", {}, None, "prometheus.scope_matchers",
                     "is not a PromQL label matcher", id="matcher-in-braces"),
        pytest.param("prometheus:\n  hostname_match: fold\n", {}, None, "prometheus.hostname_match",
                     "'exact' or 'short-name'", id="hostname-match-literal"),
        pytest.param("admission:\n  release_min_gpus: 0\n", {}, None, "admission.release_min_gpus",
                     "greater than or equal to 1", id="release-min-gpus-zero"),
        pytest.param("admission:\n  controller_stale_seconds: 2\n", {}, None, "(top level)",
                     "admission.controller_stale_seconds (2) must exceed "
                     "descheduler.leader_election.retry_period_seconds (2)", id="controller-stale-before-a-renewal"),
    ],
)
def test_errors_name_the_dotted_key(
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    yaml_text: str,
    env: dict[str, str],
    overrides: dict[str, Any] | None,
    key: str,
    message: str,
) -> None:
    with pytest.raises(settings.SettingsError) as caught:
        _load(tmp_path, monkeypatch, yaml_text=yaml_text, env=env, overrides=overrides)
    lines = str(caught.value).splitlines()
    assert lines[0].startswith("invalid settings")
    assert any(line.strip().startswith(f"{key}: ") and message in line for line in lines[1:]), str(caught.value)


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        pytest.param("- 1\n- 2\n", "expected a mapping at the top level", id="top-level-list"),
        pytest.param("webhook: [\n", "while parsing", id="broken-yaml"),
    ],
)
def test_unreadable_file(tmp_path: pathlib.Path, yaml_text: str, message: str) -> None:
    path = _yaml(tmp_path, yaml_text)
    with pytest.raises(settings.SettingsError, match=message) as caught:
        settings_loader.load(config_file=path)
    assert str(caught.value).startswith(f"settings file {path}: ")


def test_missing_file(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(settings.SettingsError, match="No such file"):
        settings_loader.load(config_file=path)


def test_tier_rule_with_one_criterion_is_valid(tmp_path: pathlib.Path) -> None:
    path = _yaml(
        tmp_path,
        "tiers:\n  rules:\n  - name: prod\n    tier: critical\n    namespace_labels: {env: prod}\n",
    )
    rule = settings_loader.load(config_file=path).tiers.rules[0]
    assert (rule.name, rule.tier, rule.namespace_labels) == ("prod", settings.Tier.CRITICAL, {"env": "prod"})


@pytest.mark.parametrize(
    ("class_name", "expected"),
    [
        pytest.param("gpu-steward-critical", settings.Tier.CRITICAL, id="critical"),
        pytest.param("gpu-steward-scavenger", settings.Tier.SCAVENGER, id="scavenger"),
        pytest.param("system-cluster-critical", None, id="not-ours"),
    ],
)
def test_tier_of_class(class_name: str, expected: settings.Tier | None) -> None:
    assert settings.Tiers().tier_of_class(class_name) == expected


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        pytest.param(
            "gpu-steward.io/",
            {
                "tier": "gpu-steward.io/tier",
                "gang_name": "gpu-steward.io/gang-name",
                "gang_size": "gpu-steward.io/gang-size",
                "placement": "gpu-steward.io/placement",
                "skip": "gpu-steward.io/skip",
                "gate": "gpu-steward.io/gang",
                "decision": "gpu-steward.io/decision",
                "nvlink_domains": "gpu-steward.io/nvlink-domains",
                "nvlink_domain_size": "gpu-steward.io/nvlink-domain-size",
                "nvlink_topology": "gpu-steward.io/nvlink-topology",
            },
            id="default-prefix",
        ),
        pytest.param(
            "gpus.example.com/",
            {
                "tier": "gpus.example.com/tier",
                "gang_name": "gpus.example.com/gang-name",
                "gang_size": "gpus.example.com/gang-size",
                "placement": "gpus.example.com/placement",
                "skip": "gpus.example.com/skip",
                "gate": "gpus.example.com/gang",
                "decision": "gpus.example.com/decision",
                "nvlink_domains": "gpus.example.com/nvlink-domains",
                "nvlink_domain_size": "gpus.example.com/nvlink-domain-size",
                "nvlink_topology": "gpus.example.com/nvlink-topology",
            },
            id="custom-prefix",
        ),
    ],
)
def test_names_derive_from_prefix(prefix: str, expected: dict[str, str]) -> None:
    names = settings.Names(prefix=prefix)
    assert {attr: getattr(names, attr) for attr in expected} == expected


def test_the_model_reads_no_environment_only_load_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings(...) built in a test (or in a pure module) is what it says; only load() reads the environment."""
    monkeypatch.setenv("GPU_STEWARD_TIERS__DEFAULT", "scavenger")
    assert settings.Settings().tiers.default is settings.Tier.NORMAL
    assert settings_loader.load().tiers.default is settings.Tier.SCAVENGER


@pytest.mark.parametrize(
    ("environ", "check"),
    [
        pytest.param({"GPU_STEWARD_TIERS__DEFAULT": "scavenger"}, lambda s: s.tiers.default == "scavenger",
                     id="nested-field"),
        pytest.param({"gpu_steward_webhook__port": "9443"}, lambda s: s.webhook.port == 9443,
                     id="names-case-insensitive"),
        pytest.param({"GPU_STEWARD_LOG_LEVEL": "DEBUG"}, lambda s: s.log_level == "DEBUG", id="top-level-field"),
        pytest.param({"GPU_STEWARD_PROMETHEUS__LABELS__POD": '["exported_pod"]'},
                     lambda s: s.prometheus.labels.pod == ["exported_pod"], id="list-as-json"),
        pytest.param({"GPU_STEWARD_PROMETHEUS__HEADERS": '{"X-Scope-OrgID": "gpu"}'},
                     lambda s: s.prometheus.headers == {"X-Scope-OrgID": "gpu"}, id="mapping-as-json"),
        pytest.param({"GPU_STEWARD_LOG_FORMAT": "json"}, lambda s: s == settings.Settings(),
                     id="not-a-setting-is-not-ours"),
        pytest.param({"OTHER_WEBHOOK__PORT": "1"}, lambda s: s == settings.Settings(), id="other-prefix"),
    ],
)
def test_environment_spells_settings(environ: dict[str, str], check: Any) -> None:
    assert check(settings_loader.load(environ=environ))


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        pytest.param({"GPU_STEWARD_PROMETHEUS__LABELS__POD": "[pod"}, "GPU_STEWARD_PROMETHEUS__LABELS__POD: not JSON",
                     id="broken-json"),
        pytest.param({"GPU_STEWARD_LOG_LEVEL__X": "1"}, "log_level: Input should be", id="field-used-as-group"),
    ],
)
def test_environment_errors_name_the_variable(environ: dict[str, str], message: str) -> None:
    with pytest.raises(settings.SettingsError) as caught:
        settings_loader.load(environ=environ)
    assert message in str(caught.value)


def test_path_settings_are_text_and_accept_paths(tmp_path: pathlib.Path) -> None:
    assert settings.Webhook(cert_file=tmp_path / "tls.crt").cert_file == str(tmp_path / "tls.crt")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("yaml_text", "env", "overrides", "source"),
    [
        pytest.param(None, {"GPU_STEWARD_WEBHOOK__PORT": "0"}, None, "environment", id="environment"),
        pytest.param("webhook:\n  port: 0\n", {}, None, "{path} and environment", id="file"),
        pytest.param(None, {}, {"webhook": {"port": 0}}, "command-line flags", id="flags"),
    ],
)
def test_errors_say_where_the_bad_value_came_from(
    tmp_path: pathlib.Path, yaml_text: str | None, env: dict[str, str], overrides: dict[str, Any] | None, source: str
) -> None:
    path = _yaml(tmp_path, yaml_text) if yaml_text is not None else None
    with pytest.raises(settings.SettingsError) as caught:
        settings_loader.load(config_file=path, overrides=overrides, environ=env)
    assert str(caught.value).splitlines()[0] == f"invalid settings ({source.format(path=path)}):"
