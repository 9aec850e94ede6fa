"""A corpus of SpecDecodeService specs, broken and valid, shared by the unit tests (Python's
verdict and message) and the e2e test that puts each one through the real apiserver too: the
two verdicts must agree case by case.

A case is (id, change, field, words): `change` updates a minimal valid spec; for a broken case
`field` is the path the message must start with and `words` what it must say; a valid case has
`field` None.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Iterator, Optional

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[1]
# The SpecDecodeService samples (their kustomization.yaml and prerequisites/ beside them).
SAMPLES = sorted(p for p in (REPO / "manifests" / "samples").glob("*.yaml") if p.name != "kustomization.yaml")

MINIMAL_SPEC: dict[str, Any] = {"model": {"name": "Qwen/Qwen2.5-7B-Instruct"}, "speculation": {"method": "ngram"}}

Case = tuple[str, dict[str, Any], Optional[str], Optional[str]]


def _ngram(**fields: Any) -> dict[str, Any]:
    return {"speculation": {"method": "ngram", **fields}}


# Every CEL rule's violation, the fields' own bounds and types, and unknown fields.
BROKEN: list[Case] = [
    ("draft-not-used", {"speculation": {"method": "ngram", "draftModel": "x"}}, "spec.speculation", "draftModel is not used"),
    ("eagle3-no-draft", {"speculation": {"method": "eagle3"}}, "spec.speculation", "draftModel is required"),
    ("draft-model-no-draft", {"speculation": {"method": "draft_model"}}, "spec.speculation", "draftModel is required"),
    ("mink-above-maxk", _ngram(minK=5, maxK=2, numSpeculativeTokens=3), "spec.speculation", "minK must not exceed maxK"),
    ("k-outside-bounds", _ngram(numSpeculativeTokens=9), "spec.speculation", "within [minK, maxK]"),
    ("ngram-window-inverted", _ngram(ngram={"promptLookupMin": 6, "promptLookupMax": 3}), "spec.speculation.ngram", "promptLookupMin must not exceed"),
    ("ngram-settings-for-mtp", {"speculation": {"method": "mtp", "ngram": {"promptLookupMax": 3}}}, "spec.speculation", "ngram settings apply to method ngram only"),
    ("heterogeneous-vocab-eagle", {"speculation": {"method": "eagle", "draftModel": "h", "useHeterogeneousVocab": True}}, "spec.speculation", "useHeterogeneousVocab works with method draft_model only"),
    ("ranges-not-from-1", _ngram(perBatchSizeK=[{"minBatchSize": 2, "maxBatchSize": 8, "k": 2}]), "spec.speculation", "starting at minBatchSize 1"),
    ("ranges-overlap", _ngram(perBatchSizeK=[{"minBatchSize": 1, "maxBatchSize": 8, "k": 4}, {"minBatchSize": 8, "maxBatchSize": 64, "k": 2}]), "spec.speculation", "must not overlap"),
    ("ranges-repeated", _ngram(perBatchSizeK=[{"minBatchSize": 1, "maxBatchSize": 8, "k": 2}] * 2), "spec.speculation", "must not overlap"),
    ("range-k-above-maxk", _ngram(perBatchSizeK=[{"minBatchSize": 1, "maxBatchSize": 8, "k": 12}]), "spec.speculation", "must not exceed maxK"),
    ("range-inverted", _ngram(perBatchSizeK=[{"minBatchSize": 9, "maxBatchSize": 8, "k": 1}]), "spec.speculation.perBatchSizeK[0]", "minBatchSize must not exceed maxBatchSize"),
    ("draft-tp", {"speculation": {"method": "draft_model", "draftModel": "d", "draftTensorParallelSize": 2}, "resources": {"gpus": 4}}, "spec", "draftTensorParallelSize must be 1 or the target's"),
    ("tp-above-gpus", {"engine": {"tensorParallelSize": 8}, "resources": {"gpus": 2}}, "spec", "tensorParallelSize must not exceed resources.gpus"),
    ("extra-args-speculative-config", {"engine": {"extraArgs": ["--speculative-config", "{}"]}}, "spec.engine", "must not carry speculative flags"),
    ("extra-args-legacy-flag", {"engine": {"extraArgs": ["--num-speculative-tokens=3"]}}, "spec.engine", "must not carry speculative flags"),
    ("extra-args-port", {"engine": {"extraArgs": ["--port=9000"]}}, "spec.engine", "must not carry speculative flags or --port"),
    ("rollout-stuck", {"rollout": {"maxSurge": 0, "maxUnavailable": 0}}, "spec.rollout", "cannot both be 0"),
    ("pvc-without-claim", {"modelCache": {"type": "PersistentVolumeClaim"}}, "spec.modelCache", "claimName is required"),
    # Durations: the pattern, and zero where zero disables the control loop.
    ("duration-words", {"autotune": {"cooldown": "ten minutes"}}, "spec.autotune.cooldown", "should match pattern"),
    ("window-zero", {"autotune": {"window": "0s"}}, "spec.autotune.window", "must be longer than 0"),
    ("evaluation-interval-zero", {"autotune": {"evaluationInterval": "0m"}}, "spec.autotune.evaluationInterval", "must be longer than 0"),
    ("scrape-interval-zero", {"metrics": {"scrapeInterval": "0ms"}}, "spec.metrics.scrapeInterval", "must be longer than 0"),
    ("scrape-interval-zero-sum", {"metrics": {"scrapeInterval": "0h0m0s"}}, "spec.metrics.scrapeInterval", "must be longer than 0"),
    ("scrape-interval-below-a-nanosecond", {"metrics": {"scrapeInterval": "0.0000000001ms"}}, "spec.metrics.scrapeInterval", "must be longer than 0"),
    ("startup-timeout-zero", {"rollout": {"startupTimeout": "0s"}}, "spec.rollout.startupTimeout", "must be longer than 0"),
    ("slo-zero", {"autotune": {"slo": {"p95EndToEnd": "0s"}}}, "spec.autotune.slo.p95EndToEnd", "must be longer than 0"),
    ("window-overflows", {"autotune": {"window": "9999999999999h"}}, "spec.autotune.window", "too long"),
    # Prometheus label names in the metrics selector.
    ("selector-name-label", {"metrics": {"selector": {"__name__": "up"}}}, "spec.metrics.selector", "Prometheus label names"),
    ("selector-reserved-label", {"metrics": {"selector": {"__meta_x": "y"}}}, "spec.metrics.selector", "Prometheus label names"),
    ("selector-dash", {"metrics": {"selector": {"gpu-pool": "east"}}}, "spec.metrics.selector", "Prometheus label names"),
    ("selector-digit-first", {"metrics": {"selector": {"1zone": "a"}}}, "spec.metrics.selector", "Prometheus label names"),
    ("selector-empty-key", {"metrics": {"selector": {"": "a"}}}, "spec.metrics.selector", "Prometheus label names"),
    # Bounds.
    ("mode-unknown", {"autotune": {"mode": "Aggressive"}}, "spec.autotune.mode", "must be 'Auto', 'Recommend' or 'Off'"),
    ("replicas-negative", {"replicas": -1}, "spec.replicas", "greater than or equal to 0"),
    ("replicas-above-ceiling", {"replicas": 1024}, "spec.replicas", "less than or equal to 256"),
    ("k-above-16", _ngram(maxK=17), "spec.speculation.maxK", "less than or equal to 16"),
    ("floor-above-1", {"autotune": {"acceptanceFloor": 1.5}}, "spec.autotune.acceptanceFloor", "less than or equal to 1"),
    ("experiments-replicas-zero", {"autotune": {"experiments": {"replicas": 0}}}, "spec.autotune.experiments.replicas", "greater than or equal to 1"),
    ("experiments-replicas-above-8", {"autotune": {"experiments": {"replicas": 9}}}, "spec.autotune.experiments.replicas", "less than or equal to 8"),
    ("experiments-extra-above-8", {"autotune": {"experiments": {"maxExtraReplicas": 9}}}, "spec.autotune.experiments.maxExtraReplicas", "less than or equal to 8"),
    ("experiments-min-effect-above-half", {"autotune": {"experiments": {"minEffect": 0.6}}}, "spec.autotune.experiments.minEffect", "less than or equal to 0.5"),
    ("experiments-min-requests-zero", {"autotune": {"experiments": {"minRequests": 0}}}, "spec.autotune.experiments.minRequests", "greater than or equal to 1"),
    ("experiments-max-duration-zero", {"autotune": {"experiments": {"maxDuration": "0s"}}}, "spec.autotune.experiments.maxDuration", "must be longer than 0"),
    ("experiments-control-interval-words", {"autotune": {"experiments": {"controlInterval": "a week"}}}, "spec.autotune.experiments.controlInterval", "should match pattern"),
    ("experiments-unknown-field", {"autotune": {"experiments": {"maxReplicas": 2}}}, "spec.autotune.experiments.maxReplicas", "is not a field"),
    ("gpu-memory-zero", {"engine": {"gpuMemoryUtilization": 0}}, "spec.engine.gpuMemoryUtilization", "greater than 0"),
    ("model-name-empty", {"model": {"name": ""}}, "spec.model.name", "at least 1 character"),
    ("model-name-huge", {"model": {"name": "m" * 513}}, "spec.model.name", "at most 512 characters"),
    ("extra-arg-huge", {"engine": {"extraArgs": ["--chat-template=" + "x" * 2000]}}, "spec.engine.extraArgs", "at most 1024 characters"),
    ("extra-args-too-many", {"engine": {"extraArgs": ["--enforce-eager"] * 33}}, "spec.engine.extraArgs", "at most 32 items"),
    ("env-value-huge", {"engine": {"env": [{"name": "A", "value": "v" * 600}]}}, "spec.engine.env[0].value", "at most 512 characters"),
    ("env-too-many", {"engine": {"env": [{"name": f"V{i}", "value": "1"} for i in range(33)]}}, "spec.engine.env", "at most 32 items"),
    ("pod-label-value-long", {"pod": {"labels": {"team": "t" * 64}}}, "spec.pod.labels", "at most 63 characters"),
    ("pod-label-key-long", {"pod": {"labels": {"k" * 318: "v"}}}, "spec.pod.labels", "at most 317 characters"),
    ("pod-annotations-too-many", {"pod": {"annotations": {f"a{i}": "v" for i in range(17)}}}, "spec.pod.annotations", "at most 16 items"),
    ("pod-annotation-huge", {"pod": {"annotations": {"big": "x" * 300_000}}}, "spec.pod.annotations", "at most 512 characters"),
    ("node-selector-too-many", {"scheduling": {"nodeSelector": {f"n{i}": "v" for i in range(17)}}}, "spec.scheduling.nodeSelector", "at most 16 items"),
    ("headers-too-many", {"metrics": {"auth": {"headers": {f"H{i}": "v" for i in range(9)}}}}, "spec.metrics.auth.headers", "at most 8 items"),
    ("volumes-too-many", {"pod": {"volumes": [{"name": f"v{i}", "emptyDir": {}} for i in range(17)]}}, "spec.pod.volumes", "at most 16 items"),
    ("prometheus-url-scheme", {"metrics": {"prometheusUrl": "prometheus:9090"}}, "spec.metrics.prometheusUrl", "should match pattern"),
    # Types and unknown fields.
    ("k-not-a-number", _ngram(numSpeculativeTokens="three"), "spec.speculation.numSpeculativeTokens", "valid integer"),
    ("replicas-float", {"replicas": 1.5}, "spec.replicas", "valid integer"),
    ("extra-args-not-a-list", {"engine": {"extraArgs": "--enforce-eager"}}, "spec.engine.extraArgs", "valid list"),
    ("selector-value-number", {"metrics": {"selector": {"zone": 3}}}, "spec.metrics.selector.zone", "valid string"),
    ("engine-not-an-object", {"engine": "vllm"}, "spec.engine", "valid dictionary"),
    ("unknown-field-misspelled", _ngram(maxk=4), "spec.speculation.maxk", "is not a field"),
    ("unknown-field-top", {"gpus": 2}, "spec.gpus", "is not a field"),
    ("model-missing-name", {"model": {}}, "spec.model.name", "is required"),
]

# Specs the apiserver and `specdecode validate` must both accept: edges of the bounds, and
# blocks that leave out fields a CEL rule reads (an engine block without extraArgs).
VALID: list[Case] = [
    ("minimal", {}, None, None),
    ("engine-without-extra-args", {"engine": {"version": "0.33.0", "gpuMemoryUtilization": 0.9}}, None, None),
    ("engine-image-only", {"engine": {"image": "vllm/vllm-openai:v0.33.0-cu130"}}, None, None),
    ("speculation-tp-without-engine", {"speculation": {"method": "draft_model", "draftModel": "d", "draftTensorParallelSize": 1}}, None, None),
    ("durations-small", {"autotune": {"window": "1ms", "evaluationInterval": "0.5s"}, "metrics": {"scrapeInterval": "0.000001ms"}}, None, None),
    ("zero-where-zero-means-none", {"autotune": {"warmup": "0s", "cooldown": "0s"}}, None, None),
    ("selector-valid", {"metrics": {"selector": {"cluster": "gpu-east", "_private": "x", "Zone9": "\"quoted\"\n"}}}, None, None),
    ("per-batch-size-k-empty", _ngram(perBatchSizeK=[]), None, None),  # no table (the CEL rule refused it)
    ("replicas-zero", {"replicas": 0}, None, None),
    ("experiments-at-bounds", {"autotune": {"experiments": {"replicas": 8, "maxExtraReplicas": 8, "minEffect": 0.5, "minRequests": 1, "maxDuration": "1ms", "control": False}}}, None, None),
    ("experiments-off", {"autotune": {"experiments": {"enabled": False}}}, None, None),
    ("replicas-ceiling", {"replicas": 256}, None, None),
    ("extra-args-at-bound", {"engine": {"extraArgs": ["--a=" + "x" * 1020] * 32}}, None, None),
    ("pod-labels-at-bound", {"pod": {"labels": {f"k{i:02d}" + "k" * 314: "v" * 63 for i in range(16)}}}, None, None),
]


def spec_with(change: dict[str, Any]) -> dict[str, Any]:
    spec = copy.deepcopy(MINIMAL_SPEC)
    spec.update(copy.deepcopy(change))
    return spec


def document(spec: dict[str, Any], name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "serving.specdecode.io/v1alpha1",
        "kind": "SpecDecodeService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def sample_documents() -> list[tuple[str, dict[str, Any]]]:
    """The shipped samples, as (file name, document)."""
    return [(path.name, yaml.safe_load(path.read_text())) for path in SAMPLES]


def spec_over(size_bytes: int) -> dict[str, Any]:
    """A spec larger than `size_bytes` of JSON with every typed field within its bounds: only
    the pass-through Kubernetes objects (here pod.volumes) can carry that much. Over
    api.SPEC_MAX_BYTES the apiserver admits it and `validate` and the operator refuse it."""
    items = [{"key": f"k{j}", "path": "p" * 200} for j in range(size_bytes // (16 * 220) + 1)]
    return spec_with({"pod": {"volumes": [{"name": f"v{i}", "configMap": {"name": "c", "items": items}} for i in range(16)]}})


# ------------------------------------------------------------------------- generated specs
# Values on both sides of every bound and every CEL rule, per section of the spec: the
# admission corpus draws whole specs, the CEL agreement test (tests/unit/test_cel_rules.py)
# draws the sections a rule reads.

DURATIONS = st.one_of(
    st.sampled_from(["0s", "0ms", "0h0m", "30s", "5m", "1h30m", "250ms", "0.5s", "1.5h", "10", "5 minutes",
                     "-1s", "1d", "", "0.0000000001ms", "0.000001ms", "9999999999999h", "2562047h", "2562048h",
                     "0.0000000009s", "1.0000000001s"]),
    st.builds(lambda n, u: f"{n}{u}", st.integers(0, 10**7), st.sampled_from(["ms", "s", "m", "h"])),
)
LABEL_KEYS = st.one_of(
    st.sampled_from(["cluster", "__name__", "__x", "a-b", "1a", "_ok", "Zone9", "", "a.b", "é"]),
    st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,12}", fullmatch=True),
    st.just("k" * 129),
)
SHORT_TEXT = st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), max_size=8)
METHODS = st.sampled_from(["ngram", "mtp", "suffix", "draft_model", "eagle", "eagle3", "medusa"])
SCRAPE_PROTOCOLS = st.sampled_from(["PrometheusProto", "OpenMetricsText1.0.0", "PrometheusText0.0.4"])
SECTIONS: dict[str, Any] = {
    "replicas": st.integers(-2, 300),
    "speculation": st.fixed_dictionaries({"method": METHODS}, optional={
        "draftModel": st.sampled_from(["org/draft", ""]),
        "numSpeculativeTokens": st.integers(0, 18),
        "minK": st.integers(0, 18),
        "maxK": st.integers(0, 18),
        "allowDisable": st.booleans(),
        "draftTensorParallelSize": st.integers(1, 9),
        "useHeterogeneousVocab": st.booleans(),
        "ngram": st.fixed_dictionaries({}, optional={
            "promptLookupMin": st.integers(1, 8), "promptLookupMax": st.integers(1, 8)}),
        "perBatchSizeK": st.lists(st.fixed_dictionaries({
            "minBatchSize": st.integers(0, 70), "maxBatchSize": st.integers(0, 70), "k": st.integers(-1, 17)}), max_size=3),
    }),
    "engine": st.fixed_dictionaries({}, optional={
        "version": st.sampled_from(["0.33.0", "0.8.5", "nightly"]),
        "extraArgs": st.lists(st.sampled_from(["--enforce-eager", "--port=1", "-sc", "--spec-tokens=2",
                                               "--max-model-len=4096", "x" * 1100]), max_size=3),
        "tensorParallelSize": st.integers(0, 9),
        "gpuMemoryUtilization": st.floats(-0.5, 1.5, allow_nan=False),
    }),
    "resources": st.fixed_dictionaries({}, optional={"gpus": st.integers(-1, 9)}),
    "rollout": st.fixed_dictionaries({}, optional={
        "maxSurge": st.integers(-1, 2), "maxUnavailable": st.integers(-1, 2), "startupTimeout": DURATIONS}),
    "scheduling": st.fixed_dictionaries({}, optional={
        "nodeSelector": st.dictionaries(st.sampled_from(["zone", "k" * 318]), st.sampled_from(["a", "v" * 64]),
                                        max_size=2),
    }),
    "modelCache": st.fixed_dictionaries({}, optional={
        "type": st.sampled_from(["EmptyDir", "PersistentVolumeClaim", "HostPath"]),
        "claimName": st.sampled_from(["weights", "w" * 254]),
    }),
    "autotune": st.fixed_dictionaries({}, optional={
        "mode": st.sampled_from(["Auto", "Recommend", "Off", "auto"]),
        "window": DURATIONS, "evaluationInterval": DURATIONS, "cooldown": DURATIONS, "warmup": DURATIONS,
        "acceptanceFloor": st.floats(-0.5, 1.5, allow_nan=False),
        "maxChangesPerHour": st.integers(-1, 70),
        "slo": st.fixed_dictionaries({}, optional={"p95EndToEnd": DURATIONS, "p95TimePerOutputToken": DURATIONS}),
        "experiments": st.fixed_dictionaries({}, optional={
            "enabled": st.booleans(), "replicas": st.integers(0, 9), "maxExtraReplicas": st.integers(-1, 9),
            "maxDuration": DURATIONS, "controlInterval": DURATIONS, "minRequests": st.integers(0, 300),
            "minEffect": st.floats(-0.1, 0.7, allow_nan=False), "control": st.booleans()}),
    }),
    "metrics": st.fixed_dictionaries({}, optional={
        "scrapeInterval": DURATIONS,
        "selector": st.dictionaries(LABEL_KEYS, SHORT_TEXT, max_size=3),
        "prometheusUrl": st.sampled_from(["http://prom:9090", "prom:9090", "https://x"]),
        "scrapeProtocols": st.lists(SCRAPE_PROTOCOLS, max_size=3),
        "auth": st.fixed_dictionaries({}, optional={
            "headers": st.dictionaries(st.sampled_from(["X-Scope-OrgID", "h" * 129]), st.just("t"), max_size=2)}),
    }),
    "pod": st.fixed_dictionaries({}, optional={
        "labels": st.dictionaries(st.sampled_from(["team", "k" * 318]), st.sampled_from(["a", "v" * 64]), max_size=2),
        "annotations": st.dictionaries(st.sampled_from(["note", "a" * 254]), st.sampled_from(["a", "v" * 513]),
                                       max_size=2),
    }),
}
SPEC_CHANGES = st.fixed_dictionaries({}, optional={**SECTIONS, "unknownField": st.just(1)})


def generated(strategy: Any, count: int) -> list[Any]:
    """`count` examples of a hypothesis strategy, the same on every run (derandomized)."""
    examples: list[Any] = []

    @settings(max_examples=count, database=None, deadline=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(example: Any) -> None:
        examples.append(example)

    collect()
    return examples


def generated_changes(count: int) -> list[dict[str, Any]]:
    """Whole-spec changes (every section optional, an unknown field now and then)."""
    return generated(SPEC_CHANGES, count)


def walk_schema(node: Any, path: str = "$", items: str = "[]", values: str = "{}") -> Iterator[tuple[str, Any]]:
    """Every node of an OpenAPI schema with its path (list items as ``items``, map values as
    ``values``): what the CRD tests and the CEL agreement test walk."""
    yield path, node
    if isinstance(node, dict):
        for key, child in node.get("properties", {}).items():
            yield from walk_schema(child, f"{path}.{key}", items, values)
        if isinstance(node.get("items"), dict):
            yield from walk_schema(node["items"], f"{path}{items}", items, values)
        if isinstance(node.get("additionalProperties"), dict):
            yield from walk_schema(node["additionalProperties"], f"{path}{values}", items, values)
