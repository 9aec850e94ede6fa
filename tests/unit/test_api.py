"""The typed API: defaults a user expects, and every cross-field rule with its message."""

from __future__ import annotations

import copy
import json

import pytest

from specdecode import api

from ..spec_corpus import BROKEN, VALID, spec_over, spec_with
from .conftest import SAMPLES, load_yaml, service_doc


def test_minimal_spec_gets_the_documented_defaults(minimal_spec):
    spec = api.parse_spec(minimal_spec)
    assert spec.replicas == 1
    assert spec.speculation.min_k == 1 and spec.speculation.max_k == 8
    assert spec.speculation.allow_disable is True
    assert spec.engine.version == "0.33.0"
    assert spec.engine.image_ref() == "vllm/vllm-openai:v0.33.0"
    assert spec.resources.gpu_resource_name == "nvidia.com/gpu"
    assert spec.rollout.max_surge == 0 and spec.rollout.max_unavailable == 1
    assert spec.autotune.mode == api.AutotuneMode.AUTO
    assert spec.target_tensor_parallel_size == 1


def test_tensor_parallel_size_defaults_to_the_gpu_count(minimal_spec):
    spec = api.parse_spec({**minimal_spec, "resources": {"gpus": 4}})
    assert spec.target_tensor_parallel_size == 4


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_every_sample_is_valid(path):
    service = api.parse_service(load_yaml(path))
    assert service.spec.speculation.min_k <= service.spec.speculation.num_speculative_tokens


def test_wire_round_trip_is_stable(minimal_spec):
    spec = api.parse_spec(minimal_spec)
    assert api.parse_spec(spec.to_wire()) == spec


@pytest.mark.parametrize("case_id,change,field,words", BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_spec_names_the_field_and_the_fix(case_id, change, field, words):
    with pytest.raises(api.SpecError) as err:
        api.parse_spec(spec_with(change))
    message = str(err.value)
    assert message.startswith(field + ":"), message
    assert words in message
    assert "\n" not in message


@pytest.mark.parametrize("case_id,change,field,words", VALID, ids=[v[0] for v in VALID])
def test_valid_corpus_specs_parse(case_id, change, field, words):
    api.parse_spec(spec_with(change))


def test_a_spec_over_256_kib_of_pass_through_objects_is_refused_naming_the_largest_field():
    """The apiserver admits it (CEL cannot see inside pass-through objects); the operator and
    `validate` refuse it alike, through parse_spec / parse_service."""
    spec = spec_over(300 * 1024)
    assert len(json.dumps(spec)) > 300 * 1024
    with pytest.raises(api.SpecTooLarge, match=r"^spec\.pod\.volumes: \d+ KiB of JSON takes the spec to 3\d\d KiB, "
                                                r"over the 256 KiB a spec may take: move .* into a ConfigMap"):
        api.parse_spec(spec)
    with pytest.raises(api.SpecTooLarge):
        api.parse_service(service_doc(spec))
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": [f"z{i:05d}" * 8 for i in range(6000)]}]}]}}}
    with pytest.raises(api.SpecTooLarge, match=r"^spec\.scheduling\.affinity: "):
        api.parse_spec(spec_with({"scheduling": {"affinity": affinity}}))


def test_a_spec_just_under_the_size_bound_parses():
    spec = spec_over(240 * 1024)
    assert 240 * 1024 < len(json.dumps(spec, separators=(",", ":"))) < api.SPEC_MAX_BYTES
    api.parse_spec(spec)


@pytest.mark.parametrize("text,nanoseconds", [
    ("1h30m", 5_400_000_000_000), ("0.5s", 500_000_000), ("0.0000000001ms", 0), ("1.5ms", 1_500_000), ("0s0m", 0),
])
def test_duration_nanoseconds_truncate_as_go_does(text, nanoseconds):
    assert api.duration_nanoseconds(text) == nanoseconds


def test_durations_beyond_int64_nanoseconds_are_refused():
    with pytest.raises(ValueError, match="too long"):
        api.duration_nanoseconds("2562048h")
    assert api.duration_nanoseconds("2562047h") > 0


def test_service_document_checks_kind_and_name(minimal_spec):
    with pytest.raises(api.SpecError, match="apiVersion/kind"):
        api.parse_service({**service_doc(minimal_spec), "kind": "Deployment"})
    bad_name = service_doc(minimal_spec, name="Not_A_DNS_Label")
    with pytest.raises(api.SpecError, match="metadata.name"):
        api.parse_service(bad_name)


@pytest.mark.parametrize(
    "text,seconds",
    [("30s", 30), ("5m", 300), ("1h30m", 5400), ("250ms", 0.25), ("90", 90), (12, 12), ("6h", 21600)],
)
def test_durations(text, seconds):
    assert api.parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["5 minutes", "-3s", "1d", ""])
def test_bad_durations_say_how_to_write_one(bad):
    with pytest.raises(ValueError, match="90s"):
        api.parse_duration(bad)


def test_every_rule_cel_names_only_wire_fields():
    """A rule's CEL must speak camelCase, the names the apiserver sees."""
    import re

    for model in [api.Speculation, api.NgramWindow, api.BatchSizeRange, api.Engine, api.Rollout, api.ModelCache, api.SpecDecodeServiceSpec]:
        for rule in model.rules:
            assert not re.search(r"self\.[a-z]+_[a-z]", rule.cel), (model.__name__, rule.cel)


def test_experiments_get_the_documented_defaults(minimal_spec):
    experiments = api.parse_spec(minimal_spec).autotune.experiments
    assert experiments.enabled and experiments.control
    assert (experiments.replicas, experiments.max_extra_replicas, experiments.min_requests) == (1, 0, 200)
    assert (experiments.max_duration, experiments.min_effect, experiments.control_interval) == ("30m", 0.03, "168h")


def test_the_canary_plan_is_the_specs(minimal_spec):
    from specdecode.control.experiments import CanaryPlan

    spec = api.parse_spec({**minimal_spec, "replicas": 4, "autotune": {"experiments": {
        "replicas": 2, "maxDuration": "1h", "minRequests": 500, "minEffect": 0.05, "controlInterval": "24h"}}})
    plan = CanaryPlan.from_spec(spec)
    assert (plan.replicas, plan.max_duration_s, plan.min_requests, plan.min_effect, plan.control_interval_s) == (
        2, 3600.0, 500.0, 0.05, 86400.0)
    assert plan.main_replicas(spec) == 2  # capacity-neutral: the canary borrows two
    no_control = api.parse_spec({**minimal_spec, "autotune": {"experiments": {"control": False}}})
    assert CanaryPlan.from_spec(no_control).control_interval_s is None


def test_a_surge_budget_keeps_the_main_deployment_whole(minimal_spec):
    from specdecode.control.experiments import CanaryPlan

    spec = api.parse_spec({**minimal_spec, "replicas": 1, "rollout": {"maxSurge": 1, "maxUnavailable": 0},
                           "autotune": {"experiments": {"maxExtraReplicas": 1}}})
    plan = CanaryPlan.from_spec(spec)
    assert plan.blocker(spec) is None and plan.main_replicas(spec) == 1


def test_the_running_experiment_is_the_last_record_while_it_runs():
    from specdecode.control.experiments import running_record

    def record(verdict: str) -> dict:
        return {"purpose": "Reprobe", "candidate": "ngram K=3", "candidateEnabled": True, "candidateK": 3,
                "candidateHash": "c", "incumbentHash": "i", "startedAt": "2026-01-01T00:00:00Z", "verdict": verdict}

    status = api.SpecDecodeServiceStatus.model_validate({"experiments": [record("AbortWorse"), record("Running")]})
    assert running_record(status).candidate_k == 3
    assert running_record(api.SpecDecodeServiceStatus.model_validate({"experiments": [record("Running"), record("Promote")]})) is None
    assert running_record(api.SpecDecodeServiceStatus()) is None and running_record(None) is None


def test_status_keeps_at_most_eight_experiments():
    from specdecode import constants as C

    schema = api.SpecDecodeServiceStatus.model_json_schema(by_alias=True)
    assert schema["properties"]["experiments"]["maxItems"] == C.MAX_EXPERIMENTS == 8
