"""The Helm chart (charts/specdecode-operator), checked offline with a real Helm built from its
Go module (`specdecode cluster build`): it lints, its CRDs, rules and dashboard are the
project's own files, with default values it renders what the kustomize install applies (the
differences are named below, each with its reason), every object it renders validates against
Kubernetes 1.34 and the CRDs' schemas, and a bad value fails at install naming the value."""

from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from specdecode.shell.settings import ENV_PREFIX, OperatorSettings

from .test_manifests import MANIFESTS, REPO, crd_validators, find, kustomize

CHART = REPO / "charts" / "specdecode-operator"
RELEASE, NAMESPACE = "specdecode-operator", "specdecode-system"
HELM_LABELS = ("app.kubernetes.io/managed-by", "helm.sh/chart")


@functools.lru_cache(maxsize=None)
def helm_binary() -> str:
    from specdecode.tools.localstack.build import cached_binary

    found = cached_binary("helm", "helm")
    if found is None:
        pytest.fail("no helm: build the local stack's binaries first (`specdecode cluster build`, .ci/install does)")
    return str(found)


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([helm_binary(), *args], capture_output=True, text=True, timeout=120)
    if check:
        assert done.returncode == 0, f"helm {' '.join(args)} failed:\n{done.stderr}"
    return done


@functools.lru_cache(maxsize=None)
def template(*sets: str, crds: bool = False) -> tuple[dict, ...]:
    """The objects `helm template` renders with `--set` values (and the CRDs, if asked)."""
    args = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    args += ["--include-crds"] if crds else []
    for value in sets:
        args += ["--set", value]
    return tuple(d for d in yaml.safe_load_all(helm(*args).stdout) if d)


def key(obj: dict) -> tuple[str, str, str]:
    return obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"]


def without_labels(obj: dict, names) -> dict:
    obj = json.loads(json.dumps(obj))
    labels = obj["metadata"].get("labels") or {}
    for name in names:
        labels.pop(name, None)
    if not labels:
        obj["metadata"].pop("labels", None)
    return obj


# Every difference between `helm template` (default values) and `kubectl kustomize
# manifests/overlays/default`, with its reason. Objects only one side has:
ONLY_IN_KUSTOMIZE = {
    # Helm stores the release in its namespace before it creates anything, so the namespace
    # must exist first and cannot be part of the chart: the README creates it with the same
    # Pod Security labels.
    ("Namespace", "", NAMESPACE): "the release namespace is created before `helm install`",
}
ONLY_IN_CHART: dict = {}
# Labels: Helm's own on every templated object; and the chart labels every object part-of
# the operator, where the prometheus-operator overlay's ServiceMonitor and PrometheusRule lack it;
# the chart's crds/ hold the files as written (Helm does not template them), where kustomize
# adds part-of to the peering CRD.
OVERLAY_UNLABELLED = ("ServiceMonitor", "PrometheusRule")


def compare_with_kustomize(chart_objects, overlay: str) -> None:
    ours = {key(o): o for o in chart_objects}
    theirs = {key(o): o for o in kustomize(f"overlays/{overlay}")}
    assert set(theirs) - set(ours) <= set(ONLY_IN_KUSTOMIZE), f"missing from the chart: {set(theirs) - set(ours) - set(ONLY_IN_KUSTOMIZE)}"
    assert set(ours) - set(theirs) <= set(ONLY_IN_CHART), f"only in the chart: {set(ours) - set(theirs) - set(ONLY_IN_CHART)}"
    for name in set(ours) & set(theirs):
        chart_obj = without_labels(ours[name], HELM_LABELS)
        if name[0] in OVERLAY_UNLABELLED:
            chart_obj = without_labels(chart_obj, ("app.kubernetes.io/part-of",))
        kustomize_obj = theirs[name]
        if name[0] == "CustomResourceDefinition":
            chart_obj, kustomize_obj = (without_labels(o, ("app.kubernetes.io/part-of",)) for o in (chart_obj, kustomize_obj))
        assert chart_obj == kustomize_obj, f"{name} differs:\nchart:     {chart_obj}\nkustomize: {kustomize_obj}"


# --------------------------------------------------------------------------- one source of truth

def test_chart_crds_are_the_generated_crds():
    assert (CHART / "crds" / "specdecodeservices.yaml").read_bytes() == (REPO / "crds" / "specdecodeservices.yaml").read_bytes(), (
        "charts/specdecode-operator/crds/specdecodeservices.yaml is stale: "
        "cp crds/specdecodeservices.yaml charts/specdecode-operator/crds/")
    peering = [d for d in yaml.safe_load_all((MANIFESTS / "base" / "kopf-peering.yaml").read_text())
               if d and d["kind"] == "CustomResourceDefinition"]
    assert [yaml.safe_load((CHART / "crds" / "clusterkopfpeerings.yaml").read_text())] == peering


@pytest.mark.parametrize("copy, original", [
    ("files/prometheusrule.yaml", "overlays/prometheus-operator/prometheusrule.yaml"),
    ("files/specdecode.json", "overlays/prometheus-operator/dashboards/specdecode.json"),
])
def test_chart_monitoring_files_are_the_overlays_files(copy, original):
    assert (CHART / copy).read_bytes() == (MANIFESTS / original).read_bytes(), (
        f"charts/specdecode-operator/{copy} is stale: cp manifests/{original} charts/specdecode-operator/{copy}")


def test_helm_lint_passes_strictly():
    done = helm("lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in done.stdout


def test_default_values_render_the_kustomize_install():
    compare_with_kustomize(template(crds=True), "default")


def test_monitoring_values_render_the_prometheus_operator_overlay():
    compare_with_kustomize(
        template("serviceMonitor.enabled=true", "prometheusRule.enabled=true", "dashboard.enabled=true", crds=True),
        "prometheus-operator")


def test_the_comparison_catches_a_difference():
    changed = [json.loads(json.dumps(o)) for o in template(crds=True)]
    find(changed, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] = "text"
    with pytest.raises(AssertionError, match="Deployment"):
        compare_with_kustomize(changed, "default")


# --------------------------------------------------------------------------- validation

VALUE_SETS = {
    "default": (),
    "namespaced": ("watchNamespaces={team-a,team-b}", "prometheus.allowedUrls={https://thanos.example.com/}"),
    "everything": ("serviceMonitor.enabled=true", "podMonitor.enabled=true", "prometheusRule.enabled=true",
                   "dashboard.enabled=true", "prometheus.auth.bearerTokenSecret.name=prom-token",
                   "prometheus.auth.caSecret.name=prom-ca", "tenantNamespaces={team-c}",
                   "tolerations[0].key=dedicated", "tolerations[0].operator=Exists", "priorityClassName=high",
                   "imagePullSecrets[0].name=registry", "podAnnotations.team=platform"),
}


@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_every_rendered_object_validates_strictly(values):
    import kubernetes_validate

    from .conftest import KUBERNETES_SCHEMA_VERSION

    custom = crd_validators()
    objects = template(*VALUE_SETS[values], crds=True)
    assert objects
    for obj in objects:
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        if (obj["apiVersion"], obj["kind"]) in custom:
            errors = list(custom[(obj["apiVersion"], obj["kind"])].iter_errors(obj))
            assert not errors, f"{where}: " + "; ".join(e.message for e in errors)
        else:
            try:
                kubernetes_validate.validate(obj, KUBERNETES_SCHEMA_VERSION, strict=True)
            except kubernetes_validate.ValidationError as err:
                pytest.fail(f"{values}: {where}: {err.message} at {list(err.path)}")


@pytest.mark.parametrize("values", sorted(VALUE_SETS))
def test_the_deployment_environment_is_operator_settings(values):
    (container,) = find(template(*VALUE_SETS[values]), "Deployment")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    fields = {ENV_PREFIX + name.upper() for name in OperatorSettings.model_fields}
    assert set(env) <= fields, set(env) - fields
    OperatorSettings.from_environment(environ={k: v for k, v in env.items() if k in fields})


# --------------------------------------------------------------------------- values

def test_namespaced_install_writes_only_in_the_watched_namespaces():
    objects = template(*VALUE_SETS["namespaced"])
    (container,) = find(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["SPECDECODE_NAMESPACES"] == "team-a,team-b"
    assert env["SPECDECODE_STANDALONE"] == "true"  # kopf would peer per namespace otherwise
    assert env["SPECDECODE_ALLOWED_PROMETHEUS_URLS"] == "https://thanos.example.com/"
    assert OperatorSettings.from_environment(environ={"SPECDECODE_NAMESPACES": env["SPECDECODE_NAMESPACES"]}).namespaces == ["team-a", "team-b"]
    assert not [o for o in objects if o["kind"] == "ClusterKopfPeering"]
    cluster_rules = find(objects, "ClusterRole", RELEASE)["rules"]
    assert {verb for rule in cluster_rules for verb in rule["verbs"]} <= {"get", "list", "watch"}
    assert {r for rule in cluster_rules for r in rule["resources"]} == {"customresourcedefinitions", "namespaces"}
    for namespace in ("team-a", "team-b"):
        role = next(o for o in objects if key(o) == ("Role", namespace, RELEASE))
        assert any("specdecodeservices" in rule["resources"] and "patch" in rule["verbs"] for rule in role["rules"])
        binding = next(o for o in objects if key(o) == ("RoleBinding", namespace, RELEASE))
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": RELEASE, "namespace": NAMESPACE}]
        credentials = next(o for o in objects if key(o) == ("RoleBinding", namespace, f"{RELEASE}-tenant-credentials"))
        assert credentials["roleRef"]["name"] == f"{RELEASE}-tenant-credentials"


def test_cluster_wide_install_reads_no_secret_anywhere_by_default():
    objects = template()
    assert find(objects, "ClusterRole", f"{RELEASE}-tenant-credentials")["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]
    assert not [o for o in objects if o["kind"] == "RoleBinding"]
    for role in (o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] == RELEASE):
        assert not any("secrets" in rule["resources"] for rule in role["rules"])


def test_prometheus_auth_is_mounted_and_named_by_file():
    objects = template("prometheus.url=https://thanos.example.com", "prometheus.auth.bearerTokenSecret.name=prom-token",
                       "prometheus.auth.caSecret.name=prom-ca", "prometheus.auth.caSecret.key=bundle.pem")
    pod = find(objects, "Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert env["SPECDECODE_PROMETHEUS_URL"] == "https://thanos.example.com"
    assert env["SPECDECODE_PROMETHEUS_BEARER_TOKEN_FILE"] == mounts["prometheus-token"] + "/token"
    assert env["SPECDECODE_PROMETHEUS_CA_FILE"] == mounts["prometheus-ca"] + "/bundle.pem"
    assert volumes["prometheus-token"]["secret"]["secretName"] == "prom-token"
    assert volumes["prometheus-ca"]["secret"]["items"] == [{"key": "bundle.pem", "path": "bundle.pem"}]


def test_image_resources_and_log_format_come_from_values():
    objects = template("image.repository=registry.example.com/specdecode-operator", "image.tag=0.2.0",
                       "logFormat=text", "resources.requests.cpu=250m", "resources.limits.memory=1Gi")
    (container,) = find(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert container["image"] == "registry.example.com/specdecode-operator:0.2.0"
    assert env["SPECDECODE_LOG_FORMAT"] == "text"
    assert container["resources"] == {"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}}


@pytest.mark.parametrize("value, named", [
    ("logFormat=xml", "logFormat"),
    ("logLevel=LOUD", "logLevel"),
    ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
    ("watchNamespaces={Team_A}", "/watchNamespaces/0"),
    ("prometheus.url=prometheus:9090", "/prometheus/url"),
    ("prometheus.allowedUrls={thanos.example.com}", "/prometheus/allowedUrls/0"),
    ("reconcileInterval=0", "reconcileInterval"),
    ("promethues.url=http://x", "promethues"),
])
def test_a_bad_value_fails_naming_it(value, named):
    """Helm names the value by its JSON pointer (/image/pullPolicy) and says what is wrong."""
    done = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--set", value, check=False)
    assert done.returncode != 0, f"--set {value} was accepted"
    assert "values don't meet the specifications of the schema" in done.stderr
    assert named in done.stderr, done.stderr
