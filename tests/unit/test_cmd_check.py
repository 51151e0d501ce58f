"""`gpu-steward check` (the chart's helm test): what the webhook's metrics say about the descheduler."""

from __future__ import annotations

import pytest

from gpu_steward import cmd_check

STALE = 30.0


def metrics(age: str | None) -> str:
    lines = ["# HELP gpu_steward_admission_controller_lease_age_seconds ...",
             "gpu_steward_admission_snapshot_age_seconds 1.0"]
    if age is not None:
        lines.append(f"{cmd_check.LEASE_AGE} {age}")
    return "\n".join(lines)


@pytest.mark.parametrize(
    ("age", "ok", "why"),
    [
        pytest.param("2.0", True, "a descheduler leads (its Lease renewed 2s ago)", id="renewed-recently"),
        pytest.param("0.0", True, "a descheduler leads (its Lease renewed 0s ago)", id="just-now"),
        pytest.param("29.9", True, "a descheduler leads (its Lease renewed 30s ago)", id="just-under-stale"),
        pytest.param("30.0", False, "last seen renewed 30s ago (admission.controller_stale_seconds 30): "
                     "no descheduler leads", id="at-stale"),
        pytest.param("-1.0", False, "has not seen the descheduler's leader Lease held", id="never-seen"),
        pytest.param(None, False, f"{cmd_check.LEASE_AGE} missing", id="metric-missing"),
    ],
)
def test_lease_check(age: str | None, ok: bool, why: str) -> None:
    passed, reason = cmd_check.lease_check(metrics(age), stale_after=STALE)
    assert passed is ok and why in reason, reason


def test_check_needs_something_to_check(capsys: pytest.CaptureFixture[str]) -> None:
    from gpu_steward import cli

    assert cli.main(["check"]) == 2
    assert "give --webhook URL, --prometheus URL or both" in capsys.readouterr().err
