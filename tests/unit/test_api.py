"""The typed API: defaults a user expects, and every cross-field rule with its message."""

from __future__ import annotations

import copy

import pytest

from specdecode import api

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


BROKEN = [
    # (change to a valid spec, field the message must name, words the message must contain)
    ({"speculation": {"method": "ngram", "draftModel": "x"}}, "spec.speculation", "draftModel is not used"),
    ({"speculation": {"method": "eagle3"}}, "spec.speculation", "draftModel is required"),
    ({"speculation": {"method": "draft_model"}}, "spec.speculation", "draftModel is required"),
    ({"speculation": {"method": "ngram", "minK": 5, "maxK": 2, "numSpeculativeTokens": 3}}, "spec.speculation", "minK must not exceed maxK"),
    ({"speculation": {"method": "ngram", "numSpeculativeTokens": 9}}, "spec.speculation", "within [minK, maxK]"),
    ({"speculation": {"method": "ngram", "ngram": {"promptLookupMin": 6, "promptLookupMax": 3}}}, "spec.speculation.ngram", "promptLookupMin must not exceed"),
    ({"speculation": {"method": "mtp", "ngram": {"promptLookupMax": 3}}}, "spec.speculation", "ngram settings apply to method ngram only"),
    ({"speculation": {"method": "eagle", "draftModel": "h", "useHeterogeneousVocab": True}}, "spec.speculation", "useHeterogeneousVocab works with method draft_model only"),
    ({"speculation": {"method": "ngram", "perBatchSizeK": [{"minBatchSize": 2, "maxBatchSize": 8, "k": 2}]}}, "spec.speculation", "starting at minBatchSize 1"),
    ({"speculation": {"method": "ngram", "perBatchSizeK": [{"minBatchSize": 1, "maxBatchSize": 8, "k": 4}, {"minBatchSize": 8, "maxBatchSize": 64, "k": 2}]}}, "spec.speculation", "must not overlap"),
    ({"speculation": {"method": "ngram", "perBatchSizeK": [{"minBatchSize": 1, "maxBatchSize": 8, "k": 12}]}}, "spec.speculation", "must not exceed maxK"),
    ({"speculation": {"method": "ngram", "perBatchSizeK": [{"minBatchSize": 9, "maxBatchSize": 8, "k": 1}]}}, "spec.speculation.perBatchSizeK[0]", "minBatchSize must not exceed maxBatchSize"),
    ({"speculation": {"method": "draft_model", "draftModel": "d", "draftTensorParallelSize": 2}, "resources": {"gpus": 4}}, "spec", "draftTensorParallelSize must be 1 or the target's"),
    ({"engine": {"tensorParallelSize": 8}, "resources": {"gpus": 2}}, "spec", "tensorParallelSize must not exceed resources.gpus"),
    ({"engine": {"extraArgs": ["--speculative-config", "{}"]}}, "spec.engine", "must not carry speculative flags"),
    ({"engine": {"extraArgs": ["--num-speculative-tokens=3"]}}, "spec.engine", "must not carry speculative flags"),
    ({"rollout": {"maxSurge": 0, "maxUnavailable": 0}}, "spec.rollout", "cannot both be 0"),
    ({"modelCache": {"type": "PersistentVolumeClaim"}}, "spec.modelCache", "claimName is required"),
    ({"autotune": {"cooldown": "ten minutes"}}, "spec.autotune.cooldown", "should match pattern"),
    ({"autotune": {"mode": "Aggressive"}}, "spec.autotune.mode", "must be 'Auto', 'Recommend' or 'Off'"),
    ({"replicas": -1}, "spec.replicas", "greater than or equal to 0"),
    ({"speculation": {"method": "ngram", "numSpeculativeTokens": "three"}}, "spec.speculation.numSpeculativeTokens", "valid integer"),
    ({"speculation": {"method": "ngram", "maxk": 4}}, "spec.speculation.maxk", "is not a field"),
    ({"model": {}}, "spec.model.name", "is required"),
]


@pytest.mark.parametrize("change,field,words", BROKEN, ids=[b[2][:40] for b in BROKEN])
def test_broken_spec_names_the_field_and_the_fix(minimal_spec, change, field, words):
    spec = copy.deepcopy(minimal_spec)
    spec.update(change)
    with pytest.raises(api.SpecError) as err:
        api.parse_spec(spec)
    message = str(err.value)
    assert message.startswith(field + ":"), message
    assert words in message
    assert "\n" not in message


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
