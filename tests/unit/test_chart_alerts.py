"""The chart's alerts as Prometheus evaluates them (`promtool test rules` on the PrometheusRule
`helm template` renders): the operator-down alert watches the job of the release's own metrics
Service, whatever fullnameOverride says, and the per-service alerts fire on the phase and
condition series the operator exports, after their `for`, and only for the service concerned."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from specdecode import constants as C
from specdecode.shell import instrumentation

from .test_chart import find, render
from .test_manifests import OPERATOR_POD, RESTARTED_POD

RUNBOOKS = "https://github.com/specdecode/specdecode-operator/blob/main/docs/operations/runbooks.md"
LLAMA = {"namespace": "team-a", "specdecode_service": "llama"}
QWEN = {"namespace": "team-b", "specdecode_service": "qwen"}


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool not installed (Debian package prometheus; .ci/run installs it): "
                    "the alerts cannot be evaluated")
    return found


def rule_groups(*sets: str, release: str = "specdecode-operator") -> list[dict]:
    return find(render(release, "prometheusRule.enabled=true", "serviceMonitor.enabled=true", *sets),
                "PrometheusRule")["spec"]["groups"]


def series(name: str, labels: dict, values: str) -> dict:
    return {"series": name + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "values": values}


def run_promtool(tmp_path: Path, groups: list[dict], tests: list[dict]) -> subprocess.CompletedProcess:
    # promtool compares annotations exactly: these tests are about expr, for and labels.
    groups = [{**g, "rules": [{k: v for k, v in r.items() if k != "annotations"} for r in g["rules"]]} for g in groups]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(
        {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}, sort_keys=False))
    return subprocess.run([promtool(), "test", "rules", "tests.yaml"], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)


def assert_passes(tmp_path: Path, groups: list[dict], tests: list[dict]) -> None:
    done = run_promtool(tmp_path, groups, tests)
    assert done.returncode == 0, done.stdout + done.stderr


# --------------------------------------------------------------------------- the operator is down

def scraped(job: str) -> list[dict]:
    """The operator up and scraped under `job` for 40 minutes."""
    return [series("up", {"job": job, "namespace": "platform", "instance": "10.1.2.3:8081"}, "1x40")]


DOWN = [{"exp_labels": {"severity": "critical"}}]


def operator_down_test(job: str, expected: list[dict]) -> dict:
    return {"interval": "1m", "input_series": scraped(job),
            "alert_rule_test": [{"eval_time": "30m", "alertname": "SpecDecodeOperatorDown", "exp_alerts": expected}]}


@pytest.mark.parametrize("sets, job", [
    ((), "specdecode-operator-metrics"),
    (("fullnameOverride=sd-two",), "sd-two-metrics"),
    (("nameOverride=sd",), "team-b-sd-metrics"),
])
def test_operator_down_watches_the_releases_own_metrics_job(tmp_path, sets, job):
    release = "team-b" if "nameOverride=sd" in sets else "specdecode-operator"
    objects = render(release, "prometheusRule.enabled=true", "serviceMonitor.enabled=true", *sets)
    assert find(objects, "Service")["metadata"]["name"] == job  # the ServiceMonitor's job label
    groups = find(objects, "PrometheusRule")["spec"]["groups"]
    # Quiet while this release's operator is scraped; firing when only another job is (the
    # default install's, beside a second release).
    assert_passes(tmp_path, groups, [operator_down_test(job, []),
                                     operator_down_test("some-other-operator-metrics", DOWN)])


def test_with_fullname_override_the_default_jobs_rule_would_fire_forever(tmp_path):
    """What the issue found: a rule that kept job="specdecode-operator-metrics" fires for a
    release named otherwise although its operator is up. The check above would catch it."""
    groups = rule_groups(release="specdecode-operator")
    done = run_promtool(tmp_path, groups, [operator_down_test("sd-two-metrics", [])])
    assert done.returncode != 0 and "SpecDecodeOperatorDown" in done.stdout + done.stderr


# --------------------------------------------------------------------------- per-service alerts

def phase(service: dict, current: str, values_now: str, values_else: str = "0x60", pod: dict = OPERATOR_POD) -> list[dict]:
    """specdecode_service_phase as the operator exports it: 1 for `current`, 0 for the others."""
    return [series("specdecode_service_phase", {**pod, **service, "phase": p}, values_now if p == current else values_else)
            for p in instrumentation.PHASES]


def condition(service: dict, type_: str, status: str, reason: str, values: str, pod: dict = OPERATOR_POD) -> dict:
    return series("specdecode_service_condition", {**pod, **service, "type": type_, "status": status, "reason": reason}, values)


def fired(service: dict, severity: str = "warning") -> list[dict]:
    return [{"exp_labels": {"severity": severity, **service}}]


def test_the_alerts_read_the_series_the_operator_exports():
    """The rules' label names and values are the instrumentation's and the API's: a renamed
    label or reason would leave an alert silent forever."""
    assert tuple(instrumentation.SERVICE_PHASE._labelnames) == ("namespace", C.PROM_LABEL_SERVICE, "phase")
    assert tuple(instrumentation.SERVICE_CONDITION._labelnames) == ("namespace", C.PROM_LABEL_SERVICE, "type", "status", "reason")
    assert C.PHASE_DEGRADED in instrumentation.PHASES
    rules = {r["alert"]: r["expr"] for g in rule_groups() for r in g["rules"]}
    assert f'type="{C.COND_DEGRADED}", status="True", reason="{C.REASON_INVALID_SPEC}"' in rules["SpecDecodeInvalidSpec"]
    assert f'reason="{C.REASON_STARTUP_FAILURE}"' in rules["SpecDecodeStartupFailed"]
    assert f'type="{C.COND_SLO_MET}", status="False"' in rules["SpecDecodeSLOBreach"]
    assert f'type="{C.COND_OUTAGE_RISK}", status="True"' in rules["SpecDecodeOutageRisk"]
    assert f'phase="{C.PHASE_DEGRADED}"' in rules["SpecDecodeDegraded"]


SERVICE_ALERT_TESTS = [
    {"interval": "1m", "input_series": [
        # llama: its spec is refused from minute 0 (phase Degraded, reason InvalidSpec);
        # qwen serves.
        *phase(LLAMA, "Degraded", "1x60"),
        condition(LLAMA, "Degraded", "True", "InvalidSpec", "1x60"),
        *phase(QWEN, "Serving", "1x60"),
        condition(QWEN, "Degraded", "False", "AsExpected", "1x60"),
    ], "alert_rule_test": [
        {"eval_time": "4m", "alertname": "SpecDecodeInvalidSpec", "exp_alerts": []},
        {"eval_time": "6m", "alertname": "SpecDecodeInvalidSpec", "exp_alerts": fired(LLAMA)},
        # Its own alert, not a second one for the same cause.
        {"eval_time": "30m", "alertname": "SpecDecodeDegraded", "exp_alerts": []},
    ]},
    {"interval": "1m", "input_series": [
        # llama: replicas unavailable from minute 0; qwen: degraded for 10 minutes only.
        *phase(LLAMA, "Degraded", "1x60"),
        condition(LLAMA, "Degraded", "True", "ReplicasUnavailable", "1x60"),
        *phase(QWEN, "Degraded", "1x10 0x50", "0x10 1x50"),
    ], "alert_rule_test": [
        {"eval_time": "14m", "alertname": "SpecDecodeDegraded", "exp_alerts": []},
        {"eval_time": "16m", "alertname": "SpecDecodeDegraded", "exp_alerts": fired(LLAMA)},
        {"eval_time": "16m", "alertname": "SpecDecodeInvalidSpec", "exp_alerts": []},
    ]},
    {"interval": "1m", "input_series": [
        # llama: pods fail to start with nothing to fall back to; qwen fell back (Degraded False).
        *phase(LLAMA, "Degraded", "1x60"),
        condition(LLAMA, "Degraded", "True", "StartupFailure", "1x60"),
        condition(QWEN, "Degraded", "False", "AsExpected", "1x60"),
        condition(QWEN, "SpeculationEffective", "False", "StartupFailure", "1x60"),
    ], "alert_rule_test": [
        {"eval_time": "9m", "alertname": "SpecDecodeStartupFailed", "exp_alerts": []},
        {"eval_time": "11m", "alertname": "SpecDecodeStartupFailed", "exp_alerts": fired(LLAMA, "critical")},
        {"eval_time": "30m", "alertname": "SpecDecodeDegraded", "exp_alerts": []},
    ]},
    {"interval": "1m", "input_series": [
        # llama: over its SLO for the whole hour, across a restart of the operator pod at
        # minute 20 (new pod labels); qwen: over it for 20 minutes, then back within it.
        condition(LLAMA, "SLOMet", "False", "ObjectiveBreached", "1x20"),
        condition(LLAMA, "SLOMet", "False", "ObjectiveBreached", "_x21 1x40", pod=RESTARTED_POD),
        condition(QWEN, "SLOMet", "False", "ObjectiveBreached", "1x20"),
        condition(QWEN, "SLOMet", "True", "WithinObjectives", "_x20 1x40"),
    ], "alert_rule_test": [
        {"eval_time": "29m", "alertname": "SpecDecodeSLOBreach", "exp_alerts": []},
        {"eval_time": "31m", "alertname": "SpecDecodeSLOBreach", "exp_alerts": fired(LLAMA)},
        {"eval_time": "55m", "alertname": "SpecDecodeSLOBreach", "exp_alerts": fired(LLAMA)},
    ]},
    {"interval": "1m", "input_series": [
        condition(LLAMA, "OutageRisk", "True", "OutagesPossible", "1x60"),
        condition(QWEN, "OutageRisk", "False", "RolloutKeepsCapacity", "1x60"),
    ], "alert_rule_test": [
        {"eval_time": "10m", "alertname": "SpecDecodeOutageRisk", "exp_alerts": []},
        {"eval_time": "20m", "alertname": "SpecDecodeOutageRisk", "exp_alerts": fired(LLAMA, "info")},
    ]},
]


def test_service_alerts_fire_exactly_when_they_should(tmp_path):
    assert_passes(tmp_path, rule_groups(), SERVICE_ALERT_TESTS)


def test_service_alerts_are_the_same_for_any_release(tmp_path):
    assert_passes(tmp_path, rule_groups("fullnameOverride=sd-two"), SERVICE_ALERT_TESTS)


# --------------------------------------------------------------------------- annotations

def test_every_alert_links_its_runbook_and_carries_no_commands():
    for group in rule_groups():
        for rule in group["rules"]:
            annotations = rule["annotations"]
            assert annotations["runbook_url"] == f"{RUNBOOKS}#{rule['alert'].lower()}", rule["alert"]
            assert "runbook" not in annotations, rule["alert"]
            assert {"summary", "description"} <= set(annotations), rule["alert"]
            assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
