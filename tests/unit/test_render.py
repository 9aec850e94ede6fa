"""The renderer: what vLLM would run, on which nodes, rolled how, and nothing else."""

from __future__ import annotations

import json
import os

import kubernetes_validate
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdecode import api, constants as C
from specdecode.render import workload as render, vllm_args as vllm

from .conftest import KUBERNETES_SCHEMA_VERSION, REPO, SAMPLES, load_yaml, service_doc

GOLDEN = REPO / "tests" / "unit" / "golden"


def _service(spec: dict, **kw) -> api.SpecDecodeService:
    return api.parse_service(service_doc(spec, **kw))


def _deployment(objects):
    return next(o for o in objects if o["kind"] == "Deployment")


def _args(objects) -> list[str]:
    return _deployment(objects)["spec"]["template"]["spec"]["containers"][0]["args"]


def _sample(name: str) -> api.SpecDecodeService:
    return api.parse_service(load_yaml(REPO / "manifests" / "samples" / name))


DRAFT_SAMPLE = "llama-3.1-8b-draft-model.yaml"


def test_draft_model_sample_renders_deployment_service_pdb_and_podmonitor():
    objects = render.render_all(_sample(DRAFT_SAMPLE), render.SpeculationChoice(k=4))
    assert [o["kind"] for o in objects] == ["Deployment", "Service", "PodDisruptionBudget", "PodMonitor"]
    args = _args(objects)
    assert args.count("--speculative-config") == 1
    config = json.loads(args[args.index("--speculative-config") + 1])
    assert config["method"] == "draft_model"
    assert config["model"] == "meta-llama/Llama-3.2-1B-Instruct"
    assert config["num_speculative_tokens"] == 4


def test_speculation_off_renders_no_speculative_flag():
    args = _args(render.render_all(_sample(DRAFT_SAMPLE), render.SpeculationChoice.off()))
    assert not [a for a in args if "specul" in a or a.startswith("--spec") or "ngram" in a]


def test_old_vllm_gets_the_legacy_flags():
    service = _sample(DRAFT_SAMPLE)
    spec = service.spec.model_copy(update={"engine": service.spec.engine.model_copy(update={"version": "0.7.3"})})
    args = _args(render.render_all(service.model_copy(update={"spec": spec}), render.SpeculationChoice(k=4)))
    assert "--speculative-config" not in args
    assert args[args.index("--speculative-model") + 1] == "meta-llama/Llama-3.2-1B-Instruct"
    assert args[args.index("--num-speculative-tokens") + 1] == "4"


def test_unknown_version_gets_the_newest_dialect():
    service = _sample(DRAFT_SAMPLE)
    spec = service.spec.model_copy(update={"engine": service.spec.engine.model_copy(update={"version": "nightly"})})
    args = _args(render.render_all(service.model_copy(update={"spec": spec}), render.SpeculationChoice(k=2)))
    assert "--speculative-config" in args


def test_changing_k_changes_the_pod_template_hash_and_nothing_else_of_the_selector():
    service = _sample(DRAFT_SAMPLE)
    five = _deployment(render.render_all(service, render.SpeculationChoice(k=5)))
    three = _deployment(render.render_all(service, render.SpeculationChoice(k=3)))
    off = _deployment(render.render_all(service, render.SpeculationChoice.off()))
    hashes = {d["spec"]["template"]["metadata"]["labels"][C.LABEL_CONFIG_HASH] for d in (five, three, off)}
    assert len(hashes) == 3
    assert five["spec"]["selector"] == three["spec"]["selector"] == off["spec"]["selector"]
    assert C.LABEL_CONFIG_HASH not in five["spec"]["selector"]["matchLabels"]


def test_rendering_is_deterministic():
    service = _sample(DRAFT_SAMPLE)
    assert render.render_all(service, render.SpeculationChoice(k=3)) == render.render_all(service, render.SpeculationChoice(k=3))


def test_pod_runs_on_gpu_nodes_without_service_links_and_with_a_token_from_a_secret():
    pod = _deployment(render.render_all(_sample(DRAFT_SAMPLE), render.SpeculationChoice(k=4)))["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["enableServiceLinks"] is False
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["command"] == ["vllm", "serve"]
    assert container["args"][0] == "meta-llama/Llama-3.1-8B-Instruct"
    token = next(e for e in container["env"] if e["name"] == "HF_TOKEN")
    assert token["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token"}
    assert not any("hf_" in a.lower() or "token=" in a.lower() for a in container["args"])
    assert container["startupProbe"]["httpGet"]["path"] == "/health"
    assert container["startupProbe"]["periodSeconds"] * container["startupProbe"]["failureThreshold"] >= 30 * 60
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]


def test_rollout_defaults_fit_gpus():
    strategy = _deployment(render.render_all(_sample(DRAFT_SAMPLE), render.SpeculationChoice(k=4)))["spec"]["strategy"]
    assert strategy["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}


def test_single_replica_has_no_pdb_and_podmonitor_can_be_left_out(minimal_spec):
    objects = render.render_all(_service(minimal_spec), render.SpeculationChoice(k=3), pod_monitor_served=False)
    assert [o["kind"] for o in objects] == ["Deployment", "Service"]


def test_podmonitor_relabels_to_the_names_promql_groups_by():
    monitor = render.render_pod_monitor(_sample(DRAFT_SAMPLE))
    targets = {r["targetLabel"] for r in monitor["spec"]["podMetricsEndpoints"][0]["relabelings"]}
    assert targets == {C.PROM_LABEL_SERVICE, C.PROM_LABEL_CONFIG_HASH}


def test_podmonitor_pins_the_scrape_protocols_only_when_asked(minimal_spec):
    assert "scrapeProtocols" not in render.render_pod_monitor(_service(minimal_spec))["spec"]
    spec = {**minimal_spec, "metrics": {"scrapeProtocols": ["PrometheusText0.0.4"]}}
    assert render.render_pod_monitor(_service(spec))["spec"]["scrapeProtocols"] == ["PrometheusText0.0.4"]
    with pytest.raises(api.SpecError, match="scrapeProtocols"):
        _service({**minimal_spec, "metrics": {"scrapeProtocols": ["PrometheusText0.0.4", "PrometheusText0.0.4"]}})
    with pytest.raises(api.SpecError, match="scrapeProtocols"):
        _service({**minimal_spec, "metrics": {"scrapeProtocols": ["Text"]}})


def test_podmonitor_matches_the_pinned_prometheus_operator_schema(minimal_spec):
    """The PodMonitor CRD shipped under manifests/third_party validates what we render, and the
    API offers exactly its scrape protocols."""
    import typing

    import jsonschema

    crd = load_yaml(REPO / "manifests" / "third_party" / "prometheus-operator" / "monitoring.coreos.com_podmonitors.yaml")
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    protocols = schema["properties"]["spec"]["properties"]["scrapeProtocols"]["items"]["enum"]
    hint = typing.get_type_hints(api.Metrics)["scrape_protocols"]
    assert set(typing.get_args(typing.get_args(hint)[0])) == set(protocols)
    spec = {**minimal_spec, "metrics": {"scrapeProtocols": ["PrometheusText0.0.4", "OpenMetricsText1.0.0"]}}
    jsonschema.validate(render.render_pod_monitor(_service(spec)), schema)


def test_owner_reference_when_the_operator_renders():
    objects = render.render_all(_sample(DRAFT_SAMPLE), render.SpeculationChoice(k=4), owner_uid="1234")
    for obj in objects:
        (ref,) = obj["metadata"]["ownerReferences"]
        assert ref["uid"] == "1234" and ref["controller"] is True and ref["kind"] == "SpecDecodeService"


def test_non_root_moves_caches_to_writable_volumes(minimal_spec):
    objects = render.render_all(_service({**minimal_spec, "pod": {"runAsUser": 1000}}), render.SpeculationChoice(k=3))
    pod = _deployment(objects)["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert env["HOME"] == render.NON_ROOT_HOME and env["VLLM_CACHE_ROOT"].startswith(render.NON_ROOT_HOME)


def test_per_batch_size_table_is_capped_at_k(minimal_spec):
    spec = {**minimal_spec, "speculation": {"method": "ngram", "numSpeculativeTokens": 4, "perBatchSizeK": [
        {"minBatchSize": 1, "maxBatchSize": 8, "k": 6}, {"minBatchSize": 9, "maxBatchSize": 64, "k": 0}]}}
    args = _args(render.render_all(_service(spec), render.SpeculationChoice(k=4)))
    config = json.loads(args[args.index("--speculative-config") + 1])
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 8, 4], [9, 64, 0]]


@pytest.mark.parametrize("version, off", [
    ("0.7.3", ["--enable-chunked-prefill=False"]),   # StoreBoolean, no --no- form (wheel arg_utils.py:745)
    ("0.8.0", ["--enable-chunked-prefill=False"]),
    ("0.8.4", ["--enable-chunked-prefill=False"]),
    ("0.8.5", ["--no-enable-chunked-prefill"]),      # BooleanOptionalAction from here on
    ("0.33.0", ["--no-enable-chunked-prefill"]),
    ("nightly", ["--no-enable-chunked-prefill"]),
])
def test_chunked_prefill_off_in_each_releases_own_form(minimal_spec, version, off):
    def args(enabled):
        spec = {**minimal_spec, "engine": {"version": version, "enableChunkedPrefill": enabled}}
        return _args(render.render_all(_service(spec), render.SpeculationChoice.off()))

    assert [a for a in args(False) if "chunked" in a] == off
    assert [a for a in args(True) if "chunked" in a] == ["--enable-chunked-prefill"]


TABLE = [{"minBatchSize": 1, "maxBatchSize": 8, "k": 3}, {"minBatchSize": 9, "maxBatchSize": 64, "k": 0}]


def test_a_k_table_vllm_would_drop_for_the_method_is_refused(minimal_spec):
    def spec(version):
        return {**minimal_spec, "speculation": {"method": "suffix", "numSpeculativeTokens": 4, "perBatchSizeK": TABLE},
                "engine": {"version": version}}

    # 0.32.0 passes the table's K to the suffix proposer; 0.33.0 runs suffix on Model Runner V1,
    # which drops the table with only a warning in the pod's log.
    assert "--speculative-config" in _args(render.render_all(_service(spec("0.32.0")), render.SpeculationChoice(k=4)))
    with pytest.raises(render.RenderError, match=r"^spec.speculation.perBatchSizeK: .*Model Runner V1.*remove it"):
        render.render_all(_service(spec("0.33.0")), render.SpeculationChoice(k=4))


@pytest.mark.parametrize("version, why", [("0.33.0", "drops it with data parallelism"), ("0.25.0", "deadlock")])
def test_a_k_table_with_data_parallelism_is_refused(minimal_spec, version, why):
    spec = {**minimal_spec, "speculation": {"method": "ngram", "numSpeculativeTokens": 4, "perBatchSizeK": TABLE},
            "engine": {"version": version, "extraArgs": ["--data-parallel-size", "2"]}}
    with pytest.raises(render.RenderError, match=f"spec.speculation.perBatchSizeK: .*{why}.*--data-parallel-size"):
        render.render_all(_service(spec), render.SpeculationChoice(k=4))
    spec["engine"]["extraArgs"] = ["-dp=1"]
    assert _args(render.render_all(_service(spec), render.SpeculationChoice(k=4)))[-1] == "-dp=1"


def test_draft_model_sharded_unlike_the_target_is_a_render_error(minimal_spec):
    spec = {**minimal_spec, "speculation": {"method": "draft_model", "draftModel": "d", "draftTensorParallelSize": 1}, "resources": {"gpus": 2}}
    with pytest.raises(render.RenderError, match="draftTensorParallelSize.*set it to 2"):
        render.render_all(_service(spec), render.SpeculationChoice(k=3))


def test_mtp_gets_its_old_name_on_old_releases(minimal_spec):
    spec = {**minimal_spec, "speculation": {"method": "mtp"}, "engine": {"version": "0.10.1"}}
    args = _args(render.render_all(_service(spec), render.SpeculationChoice(k=1)))
    assert json.loads(args[args.index("--speculative-config") + 1])["method"] == "deepseek_mtp"


def test_method_the_version_lacks_is_a_render_error(minimal_spec):
    spec = {**minimal_spec, "speculation": {"method": "eagle3", "draftModel": "h"}, "engine": {"version": "0.7.3"}}
    with pytest.raises(render.RenderError, match="spec.engine.version"):
        render.render_all(_service(spec), render.SpeculationChoice(k=3))


def _validate_k8s(obj):
    if obj["kind"] == "PodMonitor":
        return  # not a core type: the e2e tests apply it against the Prometheus Operator's CRD
    kubernetes_validate.validate(obj, KUBERNETES_SCHEMA_VERSION, strict=True)


@pytest.mark.parametrize("path", SAMPLES, ids=lambda p: p.name)
def test_samples_match_their_golden_files_and_validate(path):
    service = api.parse_service(load_yaml(path))
    objects = render.render_all(service, render.initial_choice(service.spec))
    for obj in objects:
        _validate_k8s(obj)
    rendered = yaml.safe_dump_all(objects, sort_keys=False, width=1000)
    golden = GOLDEN / path.name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text(rendered)
    assert golden.read_text() == rendered, f"{golden.name} differs: rerun with UPDATE_GOLDEN=1 if intended"


# ---------------------------------------------------------------------------------------------
# Properties: whatever the API accepts renders valid objects that read back the same
# ---------------------------------------------------------------------------------------------

_methods = st.sampled_from([m.value for m in api.SpeculationMethod])


@st.composite
def specs(draw):
    method = draw(_methods)
    min_k = draw(st.integers(1, 8))
    max_k = draw(st.integers(min_k, 16))
    k = draw(st.integers(min_k, max_k))
    gpus = draw(st.integers(1, 8))
    speculation: dict = {"method": method, "minK": min_k, "maxK": max_k, "numSpeculativeTokens": k}
    if method in ("draft_model", "eagle", "eagle3"):
        speculation["draftModel"] = draw(st.sampled_from(["org/draft-0.5b", "/models/eagle-head", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"]))
        # vLLM's V1 draft-model runner wants the target's TP; EAGLE heads may also use 1.
        speculation["draftTensorParallelSize"] = gpus if method == "draft_model" else draw(st.sampled_from([1, gpus]))
    if method == "draft_model":
        speculation["useHeterogeneousVocab"] = draw(st.booleans())
    if method == "ngram" and draw(st.booleans()):
        lo = draw(st.integers(1, 6))
        speculation["ngram"] = {"promptLookupMin": lo, "promptLookupMax": draw(st.integers(lo, 8))}
    # vLLM 0.33 (the default version) drops a table for suffix: the renderer refuses that pair
    # (test_a_k_table_vllm_would_drop_for_the_method_is_refused).
    if method != "suffix" and draw(st.booleans()):
        split = draw(st.integers(1, 63))
        speculation["perBatchSizeK"] = [
            {"minBatchSize": 1, "maxBatchSize": split, "k": draw(st.integers(0, max_k))},
            {"minBatchSize": split + 1, "maxBatchSize": 1024, "k": draw(st.integers(0, max_k))},
        ]
    spec = {
        "model": {"name": draw(st.sampled_from(["Qwen/Qwen2.5-7B-Instruct", "/models/llama"]))},
        "speculation": speculation,
        "replicas": draw(st.integers(0, 6)),
        "resources": {"gpus": gpus, "cpu": draw(st.sampled_from(["4", "7500m"])), "memory": "64Gi"},
        "engine": {"maxNumSeqs": draw(st.integers(1, 1024)), "gpuMemoryUtilization": draw(st.sampled_from([0.8, 0.9, 0.95]))},
        "modelCache": draw(st.sampled_from([{}, {"type": "PersistentVolumeClaim", "claimName": "cache"}])),
        "rollout": draw(st.sampled_from([{}, {"maxSurge": 1, "maxUnavailable": 0}])),
    }
    return spec


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=specs(), off=st.booleans())
def test_every_accepted_spec_renders_valid_objects_that_read_back(spec, off):
    service = _service(spec)
    choice = render.SpeculationChoice.off() if off else render.initial_choice(service.spec)
    objects = render.render_all(service, choice)
    for obj in objects:
        _validate_k8s(obj)
    parsed = vllm.parse_speculative_args(_args(objects))
    if off:
        assert parsed is None
    else:
        assert parsed is not None
        assert parsed.method == spec["speculation"]["method"]
        assert parsed.model == spec["speculation"].get("draftModel")
        assert parsed.num_speculative_tokens == spec["speculation"]["numSpeculativeTokens"]


@pytest.mark.parametrize("cache, volume", [
    ({}, {"emptyDir": {}}),
    ({"claimName": "hf-model-cache"}, {"persistentVolumeClaim": {"claimName": "hf-model-cache"}}),
    ({"type": "PersistentVolumeClaim", "claimName": "c"}, {"persistentVolumeClaim": {"claimName": "c"}}),
    ({"type": "EmptyDir", "claimName": "c", "sizeLimit": "40Gi"}, {"emptyDir": {"sizeLimit": "40Gi"}}),
])
def test_a_named_claim_is_the_model_cache_unless_type_says_otherwise(minimal_spec, cache, volume):
    objects = render.render_all(_service({**minimal_spec, "modelCache": cache}), render.SpeculationChoice(k=3))
    volumes = {v["name"]: v for v in _deployment(objects)["spec"]["template"]["spec"]["volumes"]}
    assert volumes["model-cache"] == {"name": "model-cache", **volume}
