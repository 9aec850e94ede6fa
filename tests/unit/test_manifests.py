"""The install tree under manifests/, checked offline: every overlay builds with kustomize;
every object validates strictly (built-in kinds against Kubernetes 1.34's OpenAPI schemas,
custom resources against their CRD's schema); the operator Deployment has what production
needs and agrees with the RBAC, the peering object, the settings and the image; alerts fire
when they should (`promtool test rules`), and the dashboard and rules only name metrics that
exist."""

from __future__ import annotations

import functools
import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from specdecode import constants as C
from specdecode.shell import instrumentation
from specdecode.shell.settings import ENV_PREFIX, OperatorSettings

from .conftest import KUBERNETES_SCHEMA_VERSION

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "manifests"
OVERLAYS = ["default", "prometheus-operator", "namespaced"]
THIRD_PARTY_PO = MANIFESTS / "third_party" / "prometheus-operator"
PROMETHEUS_RULE = MANIFESTS / "overlays" / "prometheus-operator" / "prometheusrule.yaml"
DASHBOARD = MANIFESTS / "overlays" / "prometheus-operator" / "dashboards" / "specdecode.json"
OPERATOR_NAMESPACE = "specdecode-system"
METRICS_JOB = "specdecode-operator-metrics"

# vLLM's metric names (0.33.0, V1 engine), from the project's REFERENCE.md.
VLLM_METRICS = {
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    "vllm:e2e_request_latency_seconds_bucket",
    "vllm:request_time_per_output_token_seconds_bucket",
    "vllm:request_time_per_output_token_seconds_sum",
    "vllm:request_time_per_output_token_seconds_count",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:generation_tokens_total",
}
# ... and as Prometheus 2.x stores them from an OpenMetrics scrape (the colon escaped).
VLLM_METRICS_ESCAPED = {name.replace("vllm:", "vllm_", 1) for name in VLLM_METRICS}


# --------------------------------------------------------------------------- helpers

def kubectl_binary() -> str:
    found = shutil.which("kubectl")
    if found:
        return found
    from specdecode.tools.localstack.build import cached_binaries

    binaries = cached_binaries()
    if binaries is None:
        pytest.fail("no kubectl: install one or build the local stack (`specdecode cluster build`)")
    return str(binaries.kubectl)


@functools.lru_cache(maxsize=None)
def kustomize(relative: str) -> tuple[dict, ...]:
    """The objects `kubectl kustomize manifests/<relative>` builds (no cluster needed)."""
    done = subprocess.run([kubectl_binary(), "kustomize", str(MANIFESTS / relative)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"kubectl kustomize manifests/{relative} failed:\n{done.stderr}"
    return tuple(d for d in yaml.safe_load_all(done.stdout) if d)


def find(objects, kind: str, name: str | None = None) -> dict:
    matches = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def crd_documents() -> list[dict]:
    """Every CRD the install knows: ours (base) and the pinned Prometheus Operator ones."""
    crds = [o for o in kustomize("base") if o["kind"] == "CustomResourceDefinition"]
    crds += [o for o in kustomize("overlays/namespaced")
             if o["kind"] == "CustomResourceDefinition" and o["metadata"]["name"] == "kopfpeerings.kopf.dev"]
    crds += [o for o in kustomize("third_party/prometheus-operator")]
    return crds


def openapi_to_jsonschema(node: dict, root: bool = False) -> dict:
    """A CRD's structural OpenAPI v3 schema as a strict JSON Schema (draft 4): unknown fields
    are errors wherever the apiserver would prune them, nullable becomes a null type,
    int-or-string a union; apiVersion, kind and metadata are implicit at the root."""
    out: dict = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {name: openapi_to_jsonschema(sub) for name, sub in value.items()}
        elif key in ("items", "not") or (key == "additionalProperties" and isinstance(value, dict)):
            out[key] = openapi_to_jsonschema(value)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [openapi_to_jsonschema(sub) for sub in value]
        elif key.startswith("x-kubernetes-") or key == "nullable":
            continue
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if root or node.get("x-kubernetes-embedded-resource"):
        props = out.setdefault("properties", {})
        props.setdefault("apiVersion", {"type": "string"})
        props.setdefault("kind", {"type": "string"})
        props.setdefault("metadata", {"type": "object"})
    if "properties" in node and "additionalProperties" not in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def crd_validators() -> dict[tuple[str, str], object]:
    import jsonschema

    validators = {}
    for crd in crd_documents():
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            # Not check_schema(): CRD patterns may use RE2 syntax such as (?i) that the
            # metaschema's ECMA regex format refuses; Python's re evaluates them alike.
            schema = openapi_to_jsonschema(version["schema"]["openAPIV3Schema"], root=True)
            validators[(f"{group}/{version['name']}", kind)] = jsonschema.Draft4Validator(schema)
    return validators


def exposed_operator_metrics() -> dict[str, tuple[str, ...]]:
    """The operator's metric names as Prometheus sees them, with their label names."""
    from prometheus_client import Counter, Gauge

    names = {}
    for value in vars(instrumentation).values():
        if isinstance(value, Counter):
            names[value._name + "_total"] = tuple(value._labelnames)
        elif isinstance(value, Gauge):
            names[value._name] = tuple(value._labelnames)
    return names


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(?:specdecode_[a-z0-9_]+|vllm[:_][a-z0-9_:]+)", expr)) - {"specdecode_service", "specdecode_config_hash"}


def prometheus_rule_groups() -> list[dict]:
    return yaml.safe_load(PROMETHEUS_RULE.read_text())["spec"]["groups"]


def pyproject_version() -> str:
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


# --------------------------------------------------------------------------- kustomize tree

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_builds(overlay):
    kinds = {o["kind"] for o in kustomize(f"overlays/{overlay}")}
    peering = "KopfPeering" if overlay == "namespaced" else "ClusterKopfPeering"
    assert {"Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
            peering, "Deployment", "Service", "NetworkPolicy"} <= kinds
    if overlay == "prometheus-operator":
        assert {"ServiceMonitor", "PrometheusRule", "ConfigMap"} <= kinds


def test_crd_copy_is_the_generated_crd_byte_for_byte():
    copy = MANIFESTS / "base" / "crd" / "specdecodeservices.yaml"
    assert copy.read_bytes() == (REPO / "crds" / "specdecodeservices.yaml").read_bytes(), (
        "manifests/base/crd/specdecodeservices.yaml is stale: "
        "cp crds/specdecodeservices.yaml manifests/base/crd/specdecodeservices.yaml")


def test_crds_kustomization_is_exactly_the_base_crds():
    base_crds = sorted(o["metadata"]["name"] for o in kustomize("base") if o["kind"] == "CustomResourceDefinition")
    crds_only = kustomize("crds")
    assert {o["kind"] for o in crds_only} == {"CustomResourceDefinition"}
    assert sorted(o["metadata"]["name"] for o in crds_only) == base_crds
    assert C.CRD_NAME in base_crds and "clusterkopfpeerings.kopf.dev" in base_crds


def test_lead_files_are_used_as_they_are():
    """rbac.yaml and kopf-peering.yaml are applied by path in the e2e harness: the install
    must be made of exactly those objects, not copies."""
    base = kustomize("base")
    for path in ("rbac.yaml", "kopf-peering.yaml"):
        for doc in (d for d in yaml.safe_load_all((MANIFESTS / "base" / path).read_text()) if d):
            built = find(base, doc["kind"], doc["metadata"]["name"])
            labels = dict(built["metadata"].get("labels") or {})
            labels.pop("app.kubernetes.io/part-of", None)
            built = {**built, "metadata": {**built["metadata"], "labels": labels}}
            if not labels:
                built["metadata"].pop("labels")
            assert built == doc


# --------------------------------------------------------------------------- validation

@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_validates_strictly(overlay):
    import kubernetes_validate

    custom = crd_validators()
    for obj in kustomize(f"overlays/{overlay}"):
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        key = (obj["apiVersion"], obj["kind"])
        if key in custom:
            errors = sorted(custom[key].iter_errors(obj), key=lambda e: list(e.path))
            assert not errors, f"{where}: " + "; ".join(f"{list(e.path)}: {e.message}" for e in errors)
        else:
            try:
                kubernetes_validate.validate(obj, KUBERNETES_SCHEMA_VERSION, strict=True)
            except kubernetes_validate.ValidationError as err:
                pytest.fail(f"{where}: {err.message} at {list(err.path)}")


def test_crd_schema_validation_is_strict():
    """The custom-resource check would catch a typo: it is not a rubber stamp."""
    validators = crd_validators()
    monitor = find(kustomize("overlays/prometheus-operator"), "ServiceMonitor")
    typo = json.loads(json.dumps(monitor))
    typo["spec"]["endpoints"][0]["honourLabels"] = True
    assert list(validators[("monitoring.coreos.com/v1", "ServiceMonitor")].iter_errors(typo))
    rule = find(kustomize("overlays/prometheus-operator"), "PrometheusRule")
    wrong = json.loads(json.dumps(rule))
    wrong["spec"]["groups"][0]["rules"][0]["for"] = 10
    assert list(validators[("monitoring.coreos.com/v1", "PrometheusRule")].iter_errors(wrong))


# --------------------------------------------------------------------------- the operator

def operator_deployment(overlay: str = "default") -> dict:
    return find(kustomize(f"overlays/{overlay}"), "Deployment", C.OPERATOR_NAME)


def operator_container(overlay: str = "default") -> dict:
    (container,) = operator_deployment(overlay)["spec"]["template"]["spec"]["containers"]
    return container


def test_one_replica_recreated_never_two():
    spec = operator_deployment()["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}


def test_pod_runs_restricted():
    pod = operator_deployment()["spec"]["template"]["spec"]
    container = operator_container()
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert pod["automountServiceAccountToken"] is True
    # The read-only root needs a writable /tmp, and the image points every cache there.
    tmp = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert len(tmp) == 1
    assert any(v["name"] == tmp[0]["name"] and "emptyDir" in v for v in pod["volumes"])
    namespace = find(kustomize("overlays/default"), "Namespace", OPERATOR_NAMESPACE)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_probes_ports_and_resources():
    container = operator_container()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"healthz": 8080, "metrics": 8081}
    for probe in ("livenessProbe", "startupProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "healthz"}
    resources = container["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"])
    assert "memory" in resources["limits"]


def test_environment_is_valid_operator_settings():
    """Every variable the Deployment sets is a setting, and together they load; the ports and
    the peering name they give are the ones the manifests use elsewhere."""
    env = {e["name"]: e["value"] for e in operator_container()["env"]}
    fields = {ENV_PREFIX + name.upper() for name in OperatorSettings.model_fields}
    assert set(env) <= fields, f"unknown settings: {set(env) - fields}"
    settings = OperatorSettings.from_environment(environ=env)
    assert settings.log_format == "json"
    assert env["SPECDECODE_PROMETHEUS_URL"].startswith("http")
    ports = {p["name"]: p["containerPort"] for p in operator_container()["ports"]}
    assert (settings.liveness_port, settings.metrics_port) == (ports["healthz"], ports["metrics"])
    peering = find(kustomize("overlays/default"), "ClusterKopfPeering")
    assert settings.peering_name == peering["metadata"]["name"]
    assert settings.standalone is False and settings.namespaces == []


def test_runs_as_the_account_the_rbac_binds():
    objects = kustomize("overlays/default")
    pod = operator_deployment()["spec"]["template"]["spec"]
    account = find(objects, "ServiceAccount", pod["serviceAccountName"])
    binding = find(objects, "ClusterRoleBinding", C.OPERATOR_NAME)
    assert {"kind": "ServiceAccount", "name": account["metadata"]["name"],
            "namespace": account["metadata"]["namespace"]} in binding["subjects"]
    role = find(objects, "ClusterRole", binding["roleRef"]["name"])
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]


WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "*"}
OPERATOR_ACCOUNT = {"kind": "ServiceAccount", "name": C.OPERATOR_NAME, "namespace": OPERATOR_NAMESPACE}


def _granted(objects, binding_kind: str) -> list[tuple[dict, dict]]:
    """(binding, role rules' owner) for every binding of `binding_kind` naming the operator."""
    out = []
    for binding in (o for o in objects if o["kind"] == binding_kind):
        if OPERATOR_ACCOUNT in binding.get("subjects", []):
            out.append((binding, find(objects, binding["roleRef"]["kind"], binding["roleRef"]["name"])))
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_secret_of_any_namespace_is_readable_by_default(overlay):
    """Tenant credentials are granted per namespace by the platform
    (manifests/examples/tenant-credentials-rolebinding.yaml), never by the install."""
    objects = kustomize(f"overlays/{overlay}")
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        for binding, role in _granted(objects, kind):
            for rule in role["rules"]:
                assert "secrets" not in rule["resources"], f"{kind} {binding['metadata']['name']} grants secrets"
    assert not [o for o in objects if o["kind"] == "Role"]


def test_tenant_credentials_example_binds_get_secrets_in_one_namespace():
    (binding,) = yaml.safe_load_all((MANIFESTS / "examples" / "tenant-credentials-rolebinding.yaml").read_text())
    assert binding["kind"] == "RoleBinding" and binding["metadata"]["namespace"]
    assert OPERATOR_ACCOUNT in binding["subjects"]
    role = find(kustomize("base"), "ClusterRole", binding["roleRef"]["name"])
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]


def test_namespaced_install_writes_only_where_it_watches():
    objects = kustomize("overlays/namespaced")
    env = {e["name"]: e["value"] for e in operator_container("namespaced")["env"]}
    settings = OperatorSettings.from_environment(environ=env)
    assert settings.namespaces, "the namespaced overlay must list the namespaces it watches"
    # Cluster-wide: read only.
    for binding, role in _granted(objects, "ClusterRoleBinding"):
        for rule in role["rules"]:
            assert not set(rule["verbs"]) & WRITE_VERBS, f"{binding['metadata']['name']}: cluster-wide {rule}"
    # Each watched namespace: the operator's rights and kopf's peering object, nowhere else.
    bound = {b["metadata"]["namespace"]: role for b, role in _granted(objects, "RoleBinding")}
    assert set(bound) == set(settings.namespaces)
    peerings = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in objects if o["kind"] == "KopfPeering"}
    assert peerings == {(ns, settings.peering_name) for ns in settings.namespaces}
    assert not [o for o in objects if o["kind"] == "ClusterKopfPeering"]
    # The same namespaced rights as the cluster-wide install, so both run the same operator.
    cluster_rules = find(kustomize("base"), "ClusterRole", C.OPERATOR_NAME)["rules"]
    cluster_scoped = {"clusterkopfpeerings", "customresourcedefinitions", "namespaces"}
    expected = [r for r in cluster_rules if not set(r["resources"]) & cluster_scoped]
    expected.append({"apiGroups": ["kopf.dev"], "resources": ["kopfpeerings"], "verbs": ["get", "list", "watch", "patch"]})
    for role in bound.values():
        assert role["rules"] == expected


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_spec_urls_are_refused_unless_the_platform_allows_them(overlay):
    env = {e["name"]: e["value"] for e in operator_container(overlay)["env"]}
    assert env["SPECDECODE_ALLOWED_PROMETHEUS_URLS"] == ""
    assert OperatorSettings.from_environment(environ=env).allowed_prometheus_urls == []


def test_image_is_this_version():
    name, _, tag = operator_container()["image"].rpartition(":")
    assert name == C.OPERATOR_NAME and tag == pyproject_version()


def test_operator_deployment_is_not_taken_for_a_child():
    """The operator watches Deployments labelled managed-by=specdecode-operator as its vLLM
    children; its own Deployment must not carry that label, nor Argo CD's tracking label."""
    for obj in (operator_deployment(), operator_deployment()["spec"]["template"]):
        labels = obj["metadata"].get("labels") or {}
        assert labels.get(C.LABEL_MANAGED_BY) != C.LABEL_MANAGED_BY_VALUE
        assert "app.kubernetes.io/instance" not in labels


def test_metrics_service_and_monitor_find_the_operator():
    objects = kustomize("overlays/prometheus-operator")
    service = find(objects, "Service", METRICS_JOB)
    pod_labels = operator_deployment()["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["metrics"]
    monitor = find(objects, "ServiceMonitor")
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    # The per-service series carry the service's `namespace`; only honorLabels keeps it over
    # the target's (specdecode-system) instead of renaming it exported_namespace.
    assert endpoint["honorLabels"] is True


def test_network_policy_admits_only_the_operators_ports():
    policy = find(kustomize("overlays/default"), "NetworkPolicy")
    pod_labels = operator_deployment()["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    assert sorted(p["port"] for p in rule["ports"]) == sorted(p["name"] for p in operator_container()["ports"])


def test_dashboard_configmap_is_picked_up_by_grafana():
    config_map = find(kustomize("overlays/prometheus-operator"), "ConfigMap", "specdecode-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == OPERATOR_NAMESPACE
    assert json.loads(config_map["data"]["specdecode.json"]) == json.loads(DASHBOARD.read_text())


# --------------------------------------------------------------------------- alerts

def test_alerts_cover_the_failure_modes():
    alerts = {r["alert"]: r for g in prometheus_rule_groups() for r in g["rules"]}
    assert set(alerts) == {
        "SpecDecodeOperatorDown", "SpecDecodeReconcileErrors", "SpecDecodeOperatorErrors",
        "SpecDecodeSpeculationDisabledByFallback", "SpecDecodeAcceptanceBelowFloor", "SpecDecodeMetricsUnavailable",
        "SpecDecodeInvalidSpec", "SpecDecodeDegraded", "SpecDecodeStartupFailed", "SpecDecodeSLOBreach",
        "SpecDecodeOutageRisk",
    }
    for name, rule in alerts.items():
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"]), name
        assert "runbook" not in rule["annotations"], name  # a link into the docs, not commands
    assert f'job="{METRICS_JOB}"' in alerts["SpecDecodeOperatorDown"]["expr"]


def test_rules_and_dashboard_name_only_existing_metrics_with_their_labels():
    operator_metrics = exposed_operator_metrics()
    exprs = [r["expr"] for g in prometheus_rule_groups() for r in g["rules"]]
    exprs += [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p.get("targets", [])]
    used = set().union(*(metric_names(e) for e in exprs))
    assert used, "no metric names found"
    unknown = {m for m in used if m not in operator_metrics and m not in VLLM_METRICS | VLLM_METRICS_ESCAPED}
    assert not unknown, f"metrics that neither the operator nor vLLM exposes: {unknown}"
    # The operator's per-service series carry the labels vLLM's get from the PodMonitor
    # (DESIGN: all PromQL groups by namespace, specdecode_service).
    per_service = ("namespace", C.PROM_LABEL_SERVICE)
    for gauge in ("specdecode_speculation_enabled", "specdecode_metrics_available", "specdecode_speculative_tokens",
                  "specdecode_acceptance_rate", "specdecode_acceptance_alpha", "specdecode_acceptance_floor"):
        assert operator_metrics[gauge] == per_service, gauge
    assert operator_metrics["specdecode_decisions_total"] == (*per_service, "action", "mode")
    # ... and nothing selects or reports a `service` label any more (`$service` is Grafana's variable).
    rules = [r for g in prometheus_rule_groups() for r in g["rules"]]
    for text in exprs + [a for r in rules for a in r.get("annotations", {}).values()]:
        assert not re.search(r"(?<![\w$])service\s*(=|!=|=~|!~)|[(,]\s*service\s*[),]|\$labels\.service\b", text), text


def _promtool() -> str:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (Debian package prometheus; .ci/run installs it)")
    return promtool


def _write_rules(path: Path, groups: list[dict]) -> Path:
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return path


def test_rules_pass_promtool_check(tmp_path):
    done = subprocess.run([_promtool(), "check", "rules", str(_write_rules(tmp_path / "rules.yaml", prometheus_rule_groups()))],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def _series(name: str, labels: dict, values: str) -> dict:
    inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


OPERATOR_TARGET = {"job": METRICS_JOB, "namespace": OPERATOR_NAMESPACE}
# What the ServiceMonitor's target adds to every series of the operator (the per-service
# series keep their own `namespace` through honorLabels), for the pod before and after a restart.
OPERATOR_POD = {"job": METRICS_JOB, "service": METRICS_JOB, "endpoint": "metrics", "container": "operator",
                "pod": "specdecode-operator-5d8c7-x2x4q", "instance": "10.1.2.3:8081"}
RESTARTED_POD = {**OPERATOR_POD, "pod": "specdecode-operator-5d8c7-k9w7z", "instance": "10.1.2.9:8081"}
SERVICE = {"namespace": "team-a", "specdecode_service": "llama"}
QUIET = {"namespace": "team-b", "specdecode_service": "qwen"}
THIRD = {"namespace": "team-b", "specdecode_service": "mistral"}


def _operator(name: str, service: dict, values: str, pod: dict = OPERATOR_POD, **labels: str) -> dict:
    """A per-service series of the operator as Prometheus stores it."""
    return _series(name, {**pod, **service, **labels}, values)


def _fired(service: dict) -> list[dict]:
    """A per-service alert's labels: the service's and the severity, none of the operator pod's."""
    return [{"exp_labels": {"severity": "warning", **service}}]


# promtool unit tests: each alert fires on the series that should fire it, and only on those.
ALERT_TESTS = [
    {"interval": "1m", "input_series": [_series("up", OPERATOR_TARGET, "1x5 0x30")],
     "alert_rule_test": [
         {"eval_time": "5m", "alertname": "SpecDecodeOperatorDown", "exp_alerts": []},
         {"eval_time": "12m", "alertname": "SpecDecodeOperatorDown", "exp_alerts": []},
         {"eval_time": "20m", "alertname": "SpecDecodeOperatorDown", "exp_alerts": [{"exp_labels": {"severity": "critical"}}]},
     ]},
    {"interval": "1m", "input_series": [_series("specdecode_reconciles_total", {"result": "ok"}, "0+5x40")],
     "alert_rule_test": [
         # Never scraped at all is down too.
         {"eval_time": "30m", "alertname": "SpecDecodeOperatorDown", "exp_alerts": [{"exp_labels": {"severity": "critical"}}]},
         {"eval_time": "30m", "alertname": "SpecDecodeReconcileErrors", "exp_alerts": []},
     ]},
    {"interval": "1m", "input_series": [
        _series("up", OPERATOR_TARGET, "1x40"),
        _series("specdecode_reconciles_total", {**OPERATOR_TARGET, "result": "error"}, "0+1x40"),
        _series("specdecode_errors_total", {**OPERATOR_TARGET, "stage": "apply"}, "0+1x40"),
        _series("specdecode_errors_total", {**OPERATOR_TARGET, "stage": "status"}, "3x40"),
    ], "alert_rule_test": [
        {"eval_time": "10m", "alertname": "SpecDecodeReconcileErrors", "exp_alerts": []},
        {"eval_time": "30m", "alertname": "SpecDecodeReconcileErrors", "exp_alerts": [{"exp_labels": {"severity": "warning"}}]},
        {"eval_time": "30m", "alertname": "SpecDecodeOperatorErrors",
         "exp_alerts": [{"exp_labels": {"severity": "warning", "stage": "apply"}}]},
        {"eval_time": "30m", "alertname": "SpecDecodeOperatorDown", "exp_alerts": []},
    ]},
    {"interval": "1m", "input_series": [
        # llama: on, then turned off by a disable decision at minute 10.
        _operator("specdecode_speculation_enabled", SERVICE, "1x10 0x40"),
        _operator("specdecode_decisions_total", SERVICE, "0x10 1x40", action="disable", mode="Auto"),
        # qwen: off all along (declared off by its user), no decision of the operator.
        _operator("specdecode_speculation_enabled", QUIET, "0x50"),
        # mistral: its pods could not start at minute 12; the controller fell back.
        _operator("specdecode_speculation_enabled", THIRD, "1x12 0x38"),
        _operator("specdecode_decisions_total", THIRD, "0x12 1x38", action="fallback", mode="Auto"),
    ], "alert_rule_test": [
        {"eval_time": "5m", "alertname": "SpecDecodeSpeculationDisabledByFallback", "exp_alerts": []},
        {"eval_time": "11m", "alertname": "SpecDecodeSpeculationDisabledByFallback", "exp_alerts": _fired(SERVICE)},
        {"eval_time": "20m", "alertname": "SpecDecodeSpeculationDisabledByFallback",
         "exp_alerts": _fired(SERVICE) + _fired(THIRD)},
        # An hour after the decisions the alerts resolve.
        {"eval_time": "72m", "alertname": "SpecDecodeSpeculationDisabledByFallback", "exp_alerts": []},
    ]},
    {"interval": "1m", "input_series": [
        # llama: turned off by its user's edit at minute 10, no decision of the operator about
        # it; in the same hour the operator recommends disabling qwen (Recommend mode: it stays on).
        _operator("specdecode_speculation_enabled", SERVICE, "1x10 0x40"),
        _operator("specdecode_speculation_enabled", QUIET, "1x50"),
        _operator("specdecode_decisions_total", QUIET, "0x10 1x40", action="disable", mode="Recommend"),
        # mistral: the operator lowered K, then its user turned speculation off.
        _operator("specdecode_speculation_enabled", THIRD, "1x15 0x35"),
        _operator("specdecode_decisions_total", THIRD, "0x10 1x40", action="set_k", mode="Auto"),
        # gemma: off all along, though a disable was counted for it (a recommendation): nothing
        # was turned off this hour.
        _operator("specdecode_speculation_enabled", {"namespace": "team-c", "specdecode_service": "gemma"}, "0x50"),
        _operator("specdecode_decisions_total", {"namespace": "team-c", "specdecode_service": "gemma"}, "0x10 1x40",
                  action="disable", mode="Recommend"),
    ], "alert_rule_test": [
        # Another service's decision, or a decision that did not turn speculation off: no alert.
        {"eval_time": "20m", "alertname": "SpecDecodeSpeculationDisabledByFallback", "exp_alerts": []},
        {"eval_time": "45m", "alertname": "SpecDecodeSpeculationDisabledByFallback", "exp_alerts": []},
    ]},
    {"interval": "1m", "input_series": [
        # The operator pod restarts at minute 20 (new pod and instance labels), ten minutes
        # after it disabled llama: its counters start again from zero.
        _operator("specdecode_speculation_enabled", SERVICE, "1x10 0x10"),
        _operator("specdecode_decisions_total", SERVICE, "0x10 1x10", action="disable", mode="Auto"),
        _operator("specdecode_speculation_enabled", SERVICE, "_x21 0x40", pod=RESTARTED_POD),
    ], "alert_rule_test": [
        {"eval_time": "30m", "alertname": "SpecDecodeSpeculationDisabledByFallback", "exp_alerts": _fired(SERVICE)},
    ]},
    {"interval": "1m", "input_series": [
        # llama: alpha 0.3 under its floor 0.35; qwen: alpha 0.5 over its floor 0.45;
        # mistral: alpha 0.5 under its own floor 0.6 (the floor is per service).
        _operator("specdecode_acceptance_alpha", SERVICE, "0.3x100"),
        _operator("specdecode_acceptance_floor", SERVICE, "0.35x100"),
        _operator("specdecode_acceptance_alpha", QUIET, "0.5x100"),
        _operator("specdecode_acceptance_floor", QUIET, "0.45x100"),
        _operator("specdecode_acceptance_alpha", THIRD, "0.5x100"),
        _operator("specdecode_acceptance_floor", THIRD, "0.6x100"),
    ], "alert_rule_test": [
        {"eval_time": "20m", "alertname": "SpecDecodeAcceptanceBelowFloor", "exp_alerts": []},
        {"eval_time": "60m", "alertname": "SpecDecodeAcceptanceBelowFloor",
         "exp_alerts": _fired(SERVICE) + _fired(THIRD)},
    ]},
    {"interval": "1m", "input_series": [
        # llama: under the floor for 20 minutes, then the operator turned speculation off and
        # the window has no drafts: alpha is absent. qwen: under it for 20 minutes, then back over.
        _operator("specdecode_acceptance_alpha", SERVICE, "0.3x20"),
        _operator("specdecode_acceptance_floor", SERVICE, "0.35x100"),
        _operator("specdecode_acceptance_alpha", QUIET, "0.3x20 0.5x80"),
        _operator("specdecode_acceptance_floor", QUIET, "0.35x100"),
    ], "alert_rule_test": [
        {"eval_time": "15m", "alertname": "SpecDecodeAcceptanceBelowFloor", "exp_alerts": []},
        {"eval_time": "45m", "alertname": "SpecDecodeAcceptanceBelowFloor", "exp_alerts": []},
        {"eval_time": "90m", "alertname": "SpecDecodeAcceptanceBelowFloor", "exp_alerts": []},
    ]},
    {"interval": "1m", "input_series": [
        # A restart of the operator pod at minute 20 does not start the 30 minutes again.
        _operator("specdecode_acceptance_alpha", SERVICE, "0.3x20"),
        _operator("specdecode_acceptance_floor", SERVICE, "0.35x20"),
        _operator("specdecode_acceptance_alpha", SERVICE, "_x22 0.3x60", pod=RESTARTED_POD),
        _operator("specdecode_acceptance_floor", SERVICE, "_x22 0.35x60", pod=RESTARTED_POD),
    ], "alert_rule_test": [
        {"eval_time": "40m", "alertname": "SpecDecodeAcceptanceBelowFloor", "exp_alerts": _fired(SERVICE)},
    ]},
    {"interval": "1m", "input_series": [
        _operator("specdecode_metrics_available", SERVICE, "1x5 0x30"),
        _operator("specdecode_metrics_available", QUIET, "1x35"),
    ], "alert_rule_test": [
        {"eval_time": "15m", "alertname": "SpecDecodeMetricsUnavailable", "exp_alerts": []},
        {"eval_time": "25m", "alertname": "SpecDecodeMetricsUnavailable", "exp_alerts": _fired(SERVICE)},
    ]},
]


def test_alerts_fire_exactly_when_they_should(tmp_path):
    promtool = _promtool()
    # promtool compares annotations exactly; the unit tests are about expr, for and labels.
    groups = [{**g, "rules": [{k: v for k, v in r.items() if k != "annotations"} for r in g["rules"]]}
              for g in prometheus_rule_groups()]
    _write_rules(tmp_path / "rules.yaml", groups)
    tests = tmp_path / "tests.yaml"
    tests.write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": ALERT_TESTS},
                                    sort_keys=False))
    done = subprocess.run([promtool, "test", "rules", str(tests)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


# --------------------------------------------------------------------------- dashboard

def test_dashboard_has_the_panels_a_platform_team_asks_for():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"]
    panels = {p["title"]: p for p in dashboard["panels"] if p["type"] != "row"}
    expressions = {title: " ".join(t["expr"] for t in p["targets"]) for title, p in panels.items()}

    def panel_with(*fragments):
        return [t for t, e in expressions.items() if all(f in e for f in fragments)]

    assert panel_with("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total",
                      "namespace, specdecode_service")
    assert panel_with("vllm:spec_decode_num_accepted_tokens_per_pos_total", "position")
    assert panel_with("specdecode_speculative_tokens", "namespace, specdecode_service")
    assert panel_with("specdecode_acceptance_alpha", "specdecode_acceptance_floor", "namespace, specdecode_service")
    assert panel_with("histogram_quantile(0.95", "vllm:e2e_request_latency_seconds_bucket")
    assert panel_with("histogram_quantile(0.95", "vllm:request_time_per_output_token_seconds_bucket")
    assert panel_with("specdecode_decisions_total", "[1h]", "namespace, specdecode_service, action")
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"datasource", "namespace", "service"} <= variables
    for panel in panels.values():
        assert panel["datasource"]["uid"] == "${datasource}"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_dashboard_and_rules_read_vllms_series_under_either_stored_name():
    """Prometheus 2.x stores vLLM's series as `vllm_...` (OpenMetrics scrape), Prometheus 3 or
    a classic-text scrape as `vllm:...`: every query names both, in one expression."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if isinstance(v.get("query"), dict)]
    exprs += [r["expr"] for g in prometheus_rule_groups() for r in g["rules"]]
    read = 0
    for expr in exprs:
        names = {m for m in metric_names(expr) if m.startswith("vllm")}
        colon = {m for m in names if m.startswith("vllm:")}
        assert {m.replace("vllm:", "vllm_", 1) for m in colon} == names - colon, expr
        read += len(colon)
    assert read >= 10, "the dashboard reads vLLM's series"


def test_dashboard_queries_parse(tmp_path):
    """Each panel query is valid PromQL once Grafana's variables are substituted."""
    promtool = _promtool()
    substitutions = {"$__rate_interval": "5m", "$namespace": ".*", "$service": ".*"}
    rules = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable, value in substitutions.items():
                expr = expr.replace(variable, value)
            assert "$" not in expr, expr
            rules.append({"record": f"dashboard:panel{panel['id']}:{target['refId'].lower()}", "expr": expr})
    path = _write_rules(tmp_path / "dashboard.yaml", [{"name": "dashboard", "rules": rules}])
    done = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


# --------------------------------------------------------------------------- third-party CRDs

def test_prometheus_operator_crds_are_the_recorded_ones():
    recorded = {}
    for line in (THIRD_PARTY_PO / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split()
        recorded[name] = digest
    files = sorted(p.name for p in THIRD_PARTY_PO.glob("monitoring.coreos.com_*.yaml"))
    assert sorted(recorded) == files
    for name in files:
        assert hashlib.sha256((THIRD_PARTY_PO / name).read_bytes()).hexdigest() == recorded[name], (
            f"{name} changed: regenerate with generate.sh (it rewrites SHA256SUMS)")
    kinds = {o["spec"]["names"]["kind"]: o for o in kustomize("third_party/prometheus-operator")}
    assert set(kinds) == {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
    for crd in kinds.values():
        assert crd["spec"]["group"] == "monitoring.coreos.com"
        assert [v["name"] for v in crd["spec"]["versions"] if v["storage"]] == ["v1"]


# --------------------------------------------------------------------------- documentation

def test_docs_document_every_setting():
    page = (REPO / "docs" / "operations" / "configuration.md").read_text()
    for name in OperatorSettings.model_fields:
        assert f"`{ENV_PREFIX}{name.upper()}`" in page, f"{ENV_PREFIX}{name.upper()} is not in docs/operations/configuration.md"


# --------------------------------------------------------------------------- samples

def test_samples_kustomization_brings_what_every_sample_needs():
    """`kubectl apply -k manifests/samples` applies every sample with the namespace and the
    model-cache claim they name (the token Secret is the one command in its header)."""
    from .conftest import SAMPLES

    objects = kustomize("samples")
    services = [o for o in objects if o["kind"] == "SpecDecodeService"]
    assert sorted(s["metadata"]["name"] for s in services) == sorted(
        yaml.safe_load(p.read_text())["metadata"]["name"] for p in SAMPLES)
    namespaces = {o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"}
    claims = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in objects if o["kind"] == "PersistentVolumeClaim"}
    for service in services:
        namespace = service["metadata"]["namespace"]
        assert namespace in namespaces
        assert (namespace, service["spec"]["modelCache"]["claimName"]) in claims
    (claim,) = [o for o in objects if o["kind"] == "PersistentVolumeClaim"]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    secrets = {s["spec"]["modelCache"]["hfTokenSecret"]["name"] for s in services if "hfTokenSecret" in s["spec"]["modelCache"]}
    header = (MANIFESTS / "samples" / "kustomization.yaml").read_text()
    assert all(f"create secret generic {name} " in header for name in secrets)
