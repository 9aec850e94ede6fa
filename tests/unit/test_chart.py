"""The Helm chart (charts/specdecode-operator), checked offline with a real Helm built from its
Go module (`specdecode cluster build`): it lints, its CRDs, rules and dashboard are the
project's own files, with default values it renders what the kustomize install applies (the
differences are named below, each with its reason), every object it renders validates against
Kubernetes 1.34 and the CRDs' schemas, and a bad value fails at install naming the value."""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from specdecode.shell.settings import ENV_PREFIX, OperatorSettings

from .test_manifests import MANIFESTS, REPO, crd_validators, find, kustomize

CHART = REPO / "charts" / "specdecode-operator"
RELEASE, NAMESPACE = "specdecode-operator", "specdecode-system"


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


def copy(obj: dict) -> dict:
    return json.loads(json.dumps(obj))


def chart_version() -> str:
    return yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]


# Every difference between `helm template` (default values, release specdecode-operator) and
# `kubectl kustomize manifests/overlays/...`, with its reason. Objects only one side has:
ONLY_IN_KUSTOMIZE = {
    # Helm stores the release in its namespace before it creates anything, so the namespace
    # must exist first and cannot be part of the chart: the README creates it with the same
    # Pod Security labels.
    ("Namespace", "", NAMESPACE): "the release namespace is created before `helm install`",
}
ONLY_IN_CHART: dict = {}
# Objects named after the release in the chart (two releases may share a namespace), by one
# fixed name in the overlay.
RENAMED = {("ConfigMap", NAMESPACE, f"{RELEASE}-dashboard"): ("ConfigMap", NAMESPACE, "specdecode-dashboard")}
# Labels: the chart's objects carry every label of the kustomize object, and Helm's own
# conventions besides (instance, version, managed-by, helm.sh/chart; app.kubernetes.io/name
# where kustomize labels only part-of). Selectors: the chart selects by name and instance (a
# second release never selects the first's pods), the overlay by name and component (one
# install per cluster); test_selectors_select_their_own_release_only checks the chart's.
SELECTORS = {"Deployment": ("spec", "selector"), "Service": ("spec", "selector"),
             "NetworkPolicy": ("spec", "podSelector"), "ServiceMonitor": ("spec", "selector"),
             "PodMonitor": ("spec", "selector")}
# The image: the chart's default is the published one (ghcr.io); the overlay's is a bare name
# that every kustomize user sets with `images:` (test_manifests.py::test_image_is_this_version).
IMAGES = (f"ghcr.io/specdecode/specdecode-operator:{chart_version()}", f"specdecode-operator:{chart_version()}")
# The CRD: the chart's carries helm.sh/resource-policy: keep (crds.keep), so that `helm
# uninstall` leaves it and every SpecDecodeService in place.
CHART_ONLY_ANNOTATIONS = ("helm.sh/resource-policy",)
# kopf's peering CRD is under crds/, which Helm applies as written (no labels of its own);
# kustomize adds part-of to it.
UNTEMPLATED = {("CustomResourceDefinition", "", "clusterkopfpeerings.kopf.dev")}


def _label_maps(obj: dict):
    yield obj["metadata"]
    template = obj.get("spec", {}).get("template") if isinstance(obj.get("spec"), dict) else None
    if template:
        yield template["metadata"]


def normalised(chart_obj: dict, kustomize_obj: dict) -> tuple[dict, dict]:
    """Both objects with the documented differences taken out (asserting each is what it
    should be), so that what is left must be equal."""
    ours, theirs = copy(chart_obj), copy(kustomize_obj)
    if key(ours) in UNTEMPLATED:
        assert "labels" not in ours["metadata"]
        theirs["metadata"].pop("labels")
        return ours, theirs
    for mine, other in zip(_label_maps(ours), _label_maps(theirs)):
        labels, wanted = mine.get("labels") or {}, other.get("labels") or {}
        assert wanted.items() <= labels.items(), f"{key(chart_obj)}: labels {wanted} not all in {labels}"
        assert labels.get("app.kubernetes.io/instance") == RELEASE and labels.get("app.kubernetes.io/managed-by") == "Helm"
        mine["labels"] = wanted
        if not wanted:
            mine.pop("labels")
            other.pop("labels", None)
        annotations = mine.get("annotations") or {}
        for name in CHART_ONLY_ANNOTATIONS:
            annotations.pop(name, None)
        if not annotations:
            mine.pop("annotations", None)
    if ours["kind"] in SELECTORS:
        for obj in (ours, theirs):
            parent, name = SELECTORS[obj["kind"]]
            obj[parent].pop(name)
    if ours["kind"] == "Deployment":
        (mine,) = ours["spec"]["template"]["spec"]["containers"]
        (other,) = theirs["spec"]["template"]["spec"]["containers"]
        assert (mine["image"], other["image"]) == IMAGES
        mine["image"] = other["image"]
    return ours, theirs


def compare_with_kustomize(chart_objects, overlay: str) -> None:
    ours = {RENAMED.get(key(o), key(o)): o for o in chart_objects}
    theirs = {key(o): o for o in kustomize(f"overlays/{overlay}")}
    assert set(theirs) - set(ours) <= set(ONLY_IN_KUSTOMIZE), f"missing from the chart: {set(theirs) - set(ours) - set(ONLY_IN_KUSTOMIZE)}"
    assert set(ours) - set(theirs) <= set(ONLY_IN_CHART), f"only in the chart: {set(ours) - set(theirs) - set(ONLY_IN_CHART)}"
    for name in set(ours) & set(theirs):
        chart_obj, kustomize_obj = normalised(ours[name], theirs[name])
        chart_obj["metadata"]["name"] = kustomize_obj["metadata"]["name"]  # RENAMED
        assert chart_obj == kustomize_obj, f"{name} differs:\nchart:     {chart_obj}\nkustomize: {kustomize_obj}"


# --------------------------------------------------------------------------- one source of truth

def test_chart_crds_are_the_generated_crds():
    assert (CHART / "files" / "crds" / "specdecodeservices.yaml").read_bytes() == (REPO / "crds" / "specdecodeservices.yaml").read_bytes(), (
        "charts/specdecode-operator/files/crds/specdecodeservices.yaml is stale: "
        "cp crds/specdecodeservices.yaml charts/specdecode-operator/files/crds/")
    peering = [d for d in yaml.safe_load_all((MANIFESTS / "base" / "kopf-peering.yaml").read_text())
               if d and d["kind"] == "CustomResourceDefinition"]
    assert [yaml.safe_load((CHART / "crds" / "clusterkopfpeerings.yaml").read_text())] == peering


def test_the_specdecodeservice_crd_is_not_under_crds():
    """Helm installs crds/ once and never upgrades it; a copy there would also collide with the
    templated CRD on a fresh install."""
    assert sorted(p.name for p in (CHART / "crds").iterdir()) == ["clusterkopfpeerings.yaml"], (
        "the SpecDecodeService CRD belongs in charts/specdecode-operator/files/crds/ (templates/crds.yaml renders it)")


@pytest.mark.parametrize("copy_path, original", [
    ("files/prometheusrule.yaml", "overlays/prometheus-operator/prometheusrule.yaml"),
    ("files/specdecode.json", "overlays/prometheus-operator/dashboards/specdecode.json"),
])
def test_chart_monitoring_files_are_the_overlays_files(copy_path, original):
    assert (CHART / copy_path).read_bytes() == (MANIFESTS / original).read_bytes(), (
        f"charts/specdecode-operator/{copy_path} is stale: cp charts/specdecode-operator/{copy_path} manifests/{original}")


def test_helm_lint_passes_strictly():
    done = helm("lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in done.stdout


@pytest.mark.parametrize("values", ["namespaced", "everything", "second-release"])
def test_helm_lint_passes_strictly_with_other_values(values):
    args = [a for value in VALUE_SETS[values] for a in ("--set", value)]
    done = helm("lint", "--strict", str(CHART), *args)
    assert "0 chart(s) failed" in done.stdout


def test_the_ca_key_default_is_the_crds():
    """One default for the CA bundle's key: the operator's own Prometheus (values) and a
    service's spec.metrics.auth.caSecret (the CRD)."""
    crd = yaml.safe_load((REPO / "crds" / "specdecodeservices.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    auth = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["metrics"]["properties"]["auth"]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert auth["properties"]["caSecret"]["properties"]["key"]["default"] == values["prometheus"]["auth"]["caSecret"]["key"] == "ca.crt"


def test_default_values_render_the_kustomize_install():
    compare_with_kustomize(template(crds=True), "default")


def test_monitoring_values_render_the_prometheus_operator_overlay():
    compare_with_kustomize(
        template("serviceMonitor.enabled=true", "prometheusRule.enabled=true", "dashboard.enabled=true", crds=True),
        "prometheus-operator")


def test_the_comparison_catches_a_difference():
    changed = [copy(o) for o in template(crds=True)]
    find(changed, "Deployment")["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"] = "text"
    with pytest.raises(AssertionError, match="Deployment"):
        compare_with_kustomize(changed, "default")


def test_the_comparison_catches_a_lost_label():
    changed = [copy(o) for o in template(crds=True)]
    del find(changed, "Deployment")["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
    with pytest.raises(AssertionError, match="labels"):
        compare_with_kustomize(changed, "default")


# --------------------------------------------------------------------------- validation

VALUE_SETS = {
    "default": (),
    "namespaced": ("watchNamespaces={team-a,team-b}", "prometheus.allowedUrls={https://thanos.example.com/}"),
    "everything": ("serviceMonitor.enabled=true", "prometheusRule.enabled=true",
                   "dashboard.enabled=true", "prometheus.auth.bearerTokenSecret.name=prom-token",
                   "prometheus.auth.caSecret.name=prom-ca", "tenantNamespaces={team-c}",
                   "tolerations[0].key=dedicated", "tolerations[0].operator=Exists", "priorityClassName=high",
                   "imagePullSecrets[0].name=registry", "podAnnotations.team=platform", "podLabels.team=platform",
                   "serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn=arn:aws:iam::111122223333:role/amp",
                   "extraEnv[0].name=HTTPS_PROXY", "extraEnv[0].value=http://proxy.example.com:3128",
                   "extraEnv[1].name=NODE_NAME", "extraEnv[1].valueFrom.fieldRef.fieldPath=spec.nodeName",
                   "extraVolumes[0].name=proxy-ca", "extraVolumes[0].configMap.name=proxy-ca",
                   "extraVolumeMounts[0].name=proxy-ca", "extraVolumeMounts[0].mountPath=/etc/proxy-ca",
                   "extraVolumeMounts[0].readOnly=true", "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
                   ".nodeSelectorTerms[0].matchExpressions[0].key=pool",
                   "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
                   ".nodeSelectorTerms[0].matchExpressions[0].operator=Exists"),
    # A second release beside the first: its own names, a PodMonitor, the CRD left to the first.
    "second-release": ("fullnameOverride=specdecode-two", "nameOverride=sd", "podMonitor.enabled=true",
                       "prometheusRule.enabled=true", "crds.install=false", "serviceAccount.create=false",
                       "serviceAccount.name=platform-operator",
                       "image.digest=sha256:" + "a" * 64),
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
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    fields = {ENV_PREFIX + name.upper() for name in OperatorSettings.model_fields}
    assert set(env) - {"HTTPS_PROXY"} <= fields, set(env) - fields  # extraEnv's own variables aside
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
    ("image.digest=latest", "/image/digest"),
    ("nameOverride=Spec_Decode", "/nameOverride"),
    ("serviceAccount.create=maybe", "/serviceAccount/create"),
    ("crds.install=maybe", "/crds/install"),
    ("crds.upgrade=true", "upgrade"),
    ("extraEnv[0].value=no-name", "/extraEnv/0"),
    ("extraVolumeMounts[0].name=proxy-ca", "/extraVolumeMounts/0"),
])
def test_a_bad_value_fails_naming_it(value, named):
    """Helm names the value by its JSON pointer (/image/pullPolicy) and says what is wrong."""
    done = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--set", value, check=False)
    assert done.returncode != 0, f"--set {value} was accepted"
    assert "values don't meet the specifications of the schema" in done.stderr
    assert named in done.stderr, done.stderr


# --------------------------------------------------------------------------- names and labels

def render(release: str, *sets: str, namespace: str = NAMESPACE) -> list[dict]:
    args = ["template", release, str(CHART), "--namespace", namespace]
    for value in sets:
        args += ["--set", value]
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


def pod_labels(objects) -> dict:
    return find(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]


def selects(selector: dict, labels: dict) -> bool:
    return selector.items() <= labels.items()


@pytest.mark.parametrize("release, sets, fullname", [
    ("specdecode-operator", (), "specdecode-operator"),
    ("team-b", (), "team-b-specdecode-operator"),
    ("team-b-specdecode-operator", (), "team-b-specdecode-operator"),
    ("team-b", ("nameOverride=sd",), "team-b-sd"),
    ("team-b", ("fullnameOverride=sd-two",), "sd-two"),
])
def test_every_name_follows_the_release(release, sets, fullname):
    objects = render(release, *sets, "prometheusRule.enabled=true", "serviceMonitor.enabled=true", "dashboard.enabled=true")
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert {("Deployment", fullname), ("ServiceAccount", fullname), ("ClusterRole", fullname),
            ("ClusterRole", f"{fullname}-tenant-credentials"), ("ClusterRoleBinding", fullname),
            ("ClusterKopfPeering", fullname), ("Service", f"{fullname}-metrics"), ("NetworkPolicy", fullname),
            ("ServiceMonitor", fullname), ("PrometheusRule", fullname), ("ConfigMap", f"{fullname}-dashboard")} <= names
    # Nothing else carries a name of its own, but the CRD.
    assert {n for k, n in names if k != "CustomResourceDefinition"} <= {fullname, f"{fullname}-metrics",
                                                                      f"{fullname}-tenant-credentials", f"{fullname}-dashboard"}
    (container,) = find(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert {"name": "SPECDECODE_PEERING_NAME", "value": fullname} in container["env"]


def test_every_object_carries_the_recommended_labels():
    name = "specdecode-operator"
    for obj in render("team-b", "prometheusRule.enabled=true", "serviceMonitor.enabled=true", "dashboard.enabled=true"):
        if obj["metadata"]["name"] == "clusterkopfpeerings.kopf.dev":
            continue  # crds/: applied as written
        labels = obj["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == name, key(obj)
        assert labels["app.kubernetes.io/instance"] == "team-b", key(obj)
        assert labels["app.kubernetes.io/version"] == chart_version(), key(obj)
        assert labels["app.kubernetes.io/managed-by"] == "Helm", key(obj)
        assert labels["helm.sh/chart"] == f"specdecode-operator-{yaml.safe_load((CHART / 'Chart.yaml').read_text())['version']}"


def test_a_long_release_name_still_gives_valid_names():
    release = "a-release-name-of-fifty-three-characters-for-the-test"[:53]
    for obj in render(release, "serviceMonitor.enabled=true"):
        if obj["kind"] in ("Service", "Deployment", "ServiceAccount"):
            assert len(obj["metadata"]["name"]) <= 63 and not obj["metadata"]["name"].endswith("-"), obj["metadata"]["name"]


def test_selectors_select_their_own_release_only():
    """Two releases in one namespace: each one's Service, NetworkPolicy, ServiceMonitor and
    PodMonitor pick its own pods (or Service), never the other's."""
    first = render("first", "serviceMonitor.enabled=true")
    second = render("second", "fullnameOverride=second-sd", "podMonitor.enabled=true")
    for own, other in ((first, second), (second, first)):
        service = find(own, "Service")
        assert selects(service["spec"]["selector"], pod_labels(own))
        assert not selects(service["spec"]["selector"], pod_labels(other))
        policy = find(own, "NetworkPolicy")["spec"]["podSelector"]["matchLabels"]
        assert selects(policy, pod_labels(own)) and not selects(policy, pod_labels(other))
        deployment = find(own, "Deployment")["spec"]["selector"]["matchLabels"]
        assert selects(deployment, pod_labels(own)) and not selects(deployment, pod_labels(other))
    monitor = find(first, "ServiceMonitor")["spec"]["selector"]["matchLabels"]
    assert selects(monitor, find(first, "Service")["metadata"]["labels"])
    assert not selects(monitor, find(second, "Service")["metadata"]["labels"])
    pod_monitor = find(second, "PodMonitor")["spec"]["selector"]["matchLabels"]
    assert selects(pod_monitor, pod_labels(second)) and not selects(pod_monitor, pod_labels(first))


def test_the_deployment_selector_survives_an_upgrade_to_another_chart_version(tmp_path):
    """A Deployment's selector is immutable: a new chart version (or appVersion) must not change
    it, or `helm upgrade` fails."""
    import shutil

    newer = tmp_path / "specdecode-operator"
    shutil.copytree(CHART, newer)
    chart = yaml.safe_load((newer / "Chart.yaml").read_text())
    chart.update(version="9.9.9", appVersion="9.9.9")
    (newer / "Chart.yaml").write_text(yaml.safe_dump(chart))
    later = [d for d in yaml.safe_load_all(helm("template", RELEASE, str(newer), "-n", NAMESPACE).stdout) if d]
    now = template()
    assert find(later, "Deployment")["spec"]["selector"] == find(now, "Deployment")["spec"]["selector"]
    assert find(later, "Service")["spec"]["selector"] == find(now, "Service")["spec"]["selector"]
    assert pod_labels(later)["app.kubernetes.io/version"] == "9.9.9"  # the labels themselves do follow


# --------------------------------------------------------------------------- the pod

def operator_pod(*sets: str) -> dict:
    return find(template(*sets), "Deployment")["spec"]["template"]["spec"]


def test_the_defaults_run_under_pod_security_restricted():
    pod = operator_pod()
    (container,) = pod["containers"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    context = container["securityContext"]
    assert context["allowPrivilegeEscalation"] is False and context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}


def test_security_contexts_come_from_values():
    pod = operator_pod("podSecurityContext.fsGroup=65532", "securityContext.readOnlyRootFilesystem=false")
    assert pod["securityContext"]["fsGroup"] == 65532
    assert pod["securityContext"]["runAsNonRoot"] is True  # the other defaults stay
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is False


def test_extra_env_and_volumes_come_after_the_charts_own():
    pod = operator_pod(*VALUE_SETS["everything"])
    (container,) = pod["containers"]
    names = [e["name"] for e in container["env"]]
    assert names[-2:] == ["HTTPS_PROXY", "NODE_NAME"] and names[0] == "SPECDECODE_LOG_FORMAT"
    assert container["env"][-1]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert container["volumeMounts"][-1] == {"name": "proxy-ca", "mountPath": "/etc/proxy-ca", "readOnly": True}
    assert pod["volumes"][-1] == {"name": "proxy-ca", "configMap": {"name": "proxy-ca"}}
    assert [v["name"] for v in pod["volumes"]][:1] == ["tmp"]
    assert find(template(*VALUE_SETS["everything"]), "Deployment")["spec"]["template"]["metadata"]["labels"]["team"] == "platform"


def test_the_service_account_can_be_annotated_or_brought():
    objects = template("serviceAccount.annotations.iam\\.gke\\.io/gcp-service-account=sd@project.iam.gserviceaccount.com")
    assert find(objects, "ServiceAccount")["metadata"]["annotations"] == {
        "iam.gke.io/gcp-service-account": "sd@project.iam.gserviceaccount.com"}
    brought = template("serviceAccount.create=false", "serviceAccount.name=platform-operator", "tenantNamespaces={team-c}")
    assert not [o for o in brought if o["kind"] == "ServiceAccount"]
    assert find(brought, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "platform-operator"
    for binding in (o for o in brought if o["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "platform-operator", "namespace": NAMESPACE}]


@pytest.mark.parametrize("sets, image", [
    ((), f"ghcr.io/specdecode/specdecode-operator:{chart_version()}"),
    (("image.tag=0.2.0",), "ghcr.io/specdecode/specdecode-operator:0.2.0"),
    (("image.digest=sha256:" + "b" * 64,), "ghcr.io/specdecode/specdecode-operator@sha256:" + "b" * 64),
    (("image.tag=0.2.0", "image.digest=sha256:" + "b" * 64), "ghcr.io/specdecode/specdecode-operator@sha256:" + "b" * 64),
])
def test_the_image_is_pulled_by_tag_or_by_digest(sets, image):
    assert operator_pod(*sets)["containers"][0]["image"] == image


# --------------------------------------------------------------------------- CRDs

def specdecode_crd(*sets: str) -> dict | None:
    found = [o for o in template(*sets) if o["kind"] == "CustomResourceDefinition"]
    return found[0] if found else None


def test_the_crd_is_the_generated_one_labelled_and_kept():
    crd = specdecode_crd()
    generated = yaml.safe_load((REPO / "crds" / "specdecodeservices.yaml").read_text())
    assert crd["spec"] == generated["spec"]  # int64 bounds included: rendered as text, not re-encoded
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert generated["metadata"]["labels"].items() <= crd["metadata"]["labels"].items()
    assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"


def test_crds_install_and_keep_switch_it():
    assert specdecode_crd("crds.install=false") is None
    assert "annotations" not in specdecode_crd("crds.keep=false")["metadata"]


# --------------------------------------------------------------------------- monitoring

def test_servicemonitor_and_podmonitor_are_exclusive():
    done = helm("template", RELEASE, str(CHART), "-n", NAMESPACE, "--set", "serviceMonitor.enabled=true",
                "--set", "podMonitor.enabled=true", check=False)
    assert done.returncode != 0
    assert "serviceMonitor.enabled and podMonitor.enabled are both true" in done.stderr
    assert "Enable one of the two" in done.stderr
    for enabled, kind in (("serviceMonitor", "ServiceMonitor"), ("podMonitor", "PodMonitor")):
        kinds = [o["kind"] for o in template(f"{enabled}.enabled=true")]
        assert [k for k in kinds if k in ("ServiceMonitor", "PodMonitor")] == [kind]


def test_the_podmonitor_job_is_the_metrics_service_the_alerts_select():
    objects = render("team-b", "fullnameOverride=sd-two", "podMonitor.enabled=true", "prometheusRule.enabled=true")
    (endpoint,) = find(objects, "PodMonitor")["spec"]["podMetricsEndpoints"]
    (relabel,) = endpoint["relabelings"]
    assert relabel == {"action": "replace", "targetLabel": "job", "replacement": find(objects, "Service")["metadata"]["name"]}
    rules = {r["alert"]: r for g in find(objects, "PrometheusRule")["spec"]["groups"] for r in g["rules"]}
    assert 'job="sd-two-metrics"' in rules["SpecDecodeOperatorDown"]["expr"]
    assert "specdecode-operator-metrics" not in json.dumps(find(objects, "PrometheusRule"))


# --------------------------------------------------------------------------- NOTES and README

def notes(tmp_path: Path, *sets: str) -> str:
    """NOTES.txt as `helm install` prints it (helm template leaves NOTES out: a copy of the chart
    renders it through tpl into a ConfigMap)."""
    import shutil

    chart = tmp_path / "specdecode-operator"
    if not chart.exists():
        shutil.copytree(CHART, chart)
        shutil.copy(chart / "templates" / "NOTES.txt", chart / "NOTES.render")
        (chart / "templates" / "notes-test.yaml").write_text(
            'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n'
            '  notes: {{ tpl (.Files.Get "NOTES.render") . | toJson }}\n')
    args = ["template", "team-b", str(chart), "-n", "platform", "--show-only", "templates/notes-test.yaml"]
    for value in sets:
        args += ["--set", value]
    return yaml.safe_load(helm(*args).stdout)["data"]["notes"]


def test_notes_say_what_was_installed_and_how_to_check_it(tmp_path):
    text = notes(tmp_path)
    assert "Deployment platform/team-b-specdecode-operator" in text
    assert "kubectl -n platform rollout status deployment/team-b-specdecode-operator" in text
    assert "kubectl -n platform get pods -l app.kubernetes.io/instance=team-b,app.kubernetes.io/name=specdecode-operator" in text
    assert "kubectl get crd specdecodeservices.serving.specdecode.io" in text
    # The first SpecDecodeService it shows is one the API accepts.
    manifest = text.split("<<'YAML'\n", 1)[1].split("\nYAML\n", 1)[0]
    done = subprocess.run([str(Path(sys.executable).parent / "specdecode"), "validate", "-f", "-"], input=manifest,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_notes_warn_while_the_image_is_the_default_by_tag(tmp_path):
    assert "WARNING: the image is the chart's default" in notes(tmp_path)
    for pinned in ("image.tag=0.1.0", "image.digest=sha256:" + "c" * 64, "image.repository=registry.example.com/sd"):
        assert "WARNING" not in notes(tmp_path, pinned), pinned


def test_notes_follow_the_values(tmp_path):
    text = notes(tmp_path, "watchNamespaces={team-a}", "crds.install=false", "podMonitor.enabled=true",
                 "serviceAccount.create=false", "serviceAccount.name=platform-operator")
    assert "watches the namespaces team-a" in text and "namespace: team-a" in text
    assert "No SpecDecodeService CRD (crds.install=false)" in text
    assert "PodMonitor platform/team-b-specdecode-operator" in text
    assert "ServiceAccount platform-operator (not created by this chart)" in text


def leaf_values(values: dict, prefix: str = "") -> list[str]:
    out = []
    for name, value in values.items():
        path = f"{prefix}{name}"
        if isinstance(value, dict) and value and name not in ("resources", "nodeSelector", "podSecurityContext",
                                                                "securityContext", "labels", "annotations"):
            out += leaf_values(value, path + ".")
        else:
            out.append(path)
    return out


def test_helm_show_readme_documents_every_value():
    readme = helm("show", "readme", str(CHART)).stdout
    assert readme.startswith("# specdecode-operator")
    assert "helm install" in readme and "oci://ghcr.io/specdecode/charts/specdecode-operator" in readme
    documented = set(re.findall(r"^\| `([^`]+)` \|", readme, flags=re.MULTILINE))
    values = leaf_values(yaml.safe_load((CHART / "values.yaml").read_text()))
    assert values
    missing = [v for v in values if v not in documented]
    assert not missing, f"values missing from the values table of charts/specdecode-operator/README.md: {missing}"
    unknown = documented - set(values)
    assert not unknown, f"the README's values table names values the chart does not have: {unknown}"
