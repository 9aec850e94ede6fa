"""A tenant on the local control plane: a ServiceAccount with rights on SpecDecodeServices (and
Events, and its own Secrets) in one namespace only, against the session's operator under the
shipped RBAC. What it must not get: a Secret of the operator's namespace sent anywhere, a
request to a URL the platform did not allow, an answer of an internal endpoint reflected, or a
token planted in a failing pod's message shown in status, Events, the operator's log or its
/metrics. And the namespaced install: an operator under `manifests/overlays/namespaced`'s
RBAC writes only in the namespace it watches.
"""

from __future__ import annotations

import json
import subprocess
import threading
import urllib.request
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Callable, Iterator

import pytest
import yaml

from specdecode import constants as C
from specdecode.tools.localstack import ClusterInfo
from specdecode.tools.localstack.stack import free_port, spawn, wait_http_ok

from .conftest import wait_for
from .operator_harness import NO_PROMETHEUS, audit_writes, holds_for, kubectl
from .test_startup_failure import failing_pods, qwen

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
OPERATOR_NAMESPACE = "specdecode-system"
RUN = uuid.uuid4().hex[:10]
# Planted secrets: each must never appear on a surface the tenant (or a log reader) sees.
ADMIN_TOKEN = f"adminPromToken{RUN}Zq9"
TENANT_TOKEN = f"tenantPromToken{RUN}Xy7"
HF_TOKEN = f"hf_PlantedHubToken{RUN}Ab12"
BODY_SECRET = f"db-password=BodySecret{RUN}"
INTERNAL_ADDRESS = "10.96.77.42"


@dataclass
class Listener:
    """An HTTP server on a loopback address that records every request and answers 500 with
    a body an internal service might send (a secret and an internal address in it)."""

    host: str
    requests: list[dict] = field(default_factory=list)

    def __post_init__(self) -> None:
        recorded = self.requests

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                recorded.append({"path": self.path, "headers": dict(self.headers)})
                body = f"internal error: {BODY_SECRET} at {INTERNAL_ADDRESS}".encode()
                self.send_response(500)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer((self.host, 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def listeners() -> Iterator[tuple[Listener, Listener]]:
    """(allowed, foreign): the session operator allows http://127.0.0.1:* (its tests'
    Prometheus servers) and nothing else, so 127.0.0.2 stands for any foreign address."""
    allowed, foreign = Listener("127.0.0.1"), Listener("127.0.0.2")
    try:
        yield allowed, foreign
    finally:
        allowed.close()
        foreign.close()


def tenant_rbac(namespace: str, account: str) -> list[dict]:
    return [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "sds-author", "namespace": namespace},
         "rules": [
             {"apiGroups": [C.GROUP], "resources": [C.PLURAL], "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
             {"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list", "watch"]},
             {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create", "get"]},
         ]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "sds-author", "namespace": namespace},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "sds-author"},
         "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}]},
    ]


@pytest.fixture
def tenant(cluster: ClusterInfo, namespace: str, tmp_path: Path) -> Callable[..., subprocess.CompletedProcess]:
    """kubectl as the tenant: a ServiceAccount of the test namespace with the Role above."""
    kubectl(cluster, "apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(tenant_rbac(namespace, "tenant")))
    config = cluster.service_account_kubeconfig(namespace, "tenant", tmp_path / "tenant.kubeconfig")

    def run(*args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
        command = [str(cluster.kubectl), "--kubeconfig", str(config), "--cache-dir", str(tmp_path / "kubectl-cache"), *args]
        done = subprocess.run(command, input=input, capture_output=True, text=True, timeout=60)
        if check and done.returncode != 0:
            raise AssertionError(f"tenant: kubectl {' '.join(args)} failed: {done.stderr.strip()}")
        return done

    return run


@pytest.fixture
def admin_secret(cluster: ClusterInfo) -> str:
    """The platform's Prometheus token, in the operator's namespace."""
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "prom-creds", "namespace": OPERATOR_NAMESPACE},
              "stringData": {"token": ADMIN_TOKEN}}
    kubectl(cluster, "apply", "--server-side", "-f", "-", input=json.dumps(secret))
    return "prom-creds"


def service(namespace: str, name: str, url: str, auth: dict | None = None) -> dict:
    metrics: dict = {"prometheusUrl": url}
    if auth:
        metrics["auth"] = auth
    return {
        "apiVersion": C.API_VERSION, "kind": C.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"name": "Qwen/Qwen2.5-7B-Instruct"},
            "speculation": {"method": "ngram", "numSpeculativeTokens": 3},
            "autotune": {"evaluationInterval": "2s"},
            "metrics": metrics,
        },
    }


def metrics_condition(tenant, namespace: str, name: str) -> dict:
    done = tenant("get", "sds", name, "-n", namespace, "-o", "json", check=False)
    if done.returncode != 0:
        return {}
    conditions = (json.loads(done.stdout).get("status") or {}).get("conditions", [])
    return next((c for c in conditions if c["type"] == C.COND_METRICS_AVAILABLE), {})


def wait_metrics_reason(tenant, namespace: str, name: str, reason: str) -> dict:
    return wait_for(lambda: (c := metrics_condition(tenant, namespace, name)).get("reason") == reason and c,
                    90, f"{name}: MetricsAvailable reason {reason}")


def surfaces(tenant, namespace: str, operator) -> dict[str, str]:
    """Everything a tenant or a reader of the operator's log and metrics can see."""
    return {
        "status (kubectl get sds)": tenant("get", "sds", "-n", namespace, "-o", "yaml").stdout,
        "Events": tenant("get", "events", "-n", namespace, "-o", "yaml").stdout,
        "operator log": operator.process.managed.log_path.read_text(errors="replace"),
        "operator /metrics": urllib.request.urlopen(operator.process.metrics_url, timeout=5).read().decode(),
    }


def assert_absent(texts: dict[str, str], *secrets: str) -> None:
    for where, text in texts.items():
        for secret in secrets:
            assert secret not in text, f"{secret!r} leaked into {where}"


def test_a_tenant_cannot_send_the_operators_secret_nor_reach_a_foreign_url(
    cluster, operator, namespace, tenant, admin_secret, listeners
):
    allowed, foreign = listeners
    # The tenant's rights, as the issue states them.
    assert tenant("auth", "can-i", "get", f"secret/{admin_secret}", "-n", OPERATOR_NAMESPACE, check=False).stdout.strip() == "no"
    assert tenant("auth", "can-i", "create", C.PLURAL, "-n", namespace).stdout.strip() == "yes"

    steal = {"bearerTokenSecret": {"name": admin_secret, "key": "token"}, "headers": {"X-Scope-OrgID": "victim"}}
    manifests = [
        service(namespace, "steal", foreign.url, steal),      # a URL the platform did not allow
        service(namespace, "borrow", allowed.url, steal),     # an allowed URL, the operator's Secret
        service(namespace, "reflect", allowed.url + "/api"),  # an allowed URL that answers 500
    ]
    tenant("apply", "-f", "-", input=yaml.safe_dump_all(manifests))

    refused = wait_metrics_reason(tenant, namespace, "steal", C.REASON_PROMETHEUS_URL_NOT_ALLOWED)
    assert refused["status"] == "False"
    assert "spec.metrics.prometheusUrl" in refused["message"] and "SPECDECODE_ALLOWED_PROMETHEUS_URLS" in refused["message"]

    no_access = wait_metrics_reason(tenant, namespace, "borrow", C.REASON_PROMETHEUS_CREDENTIALS_UNAVAILABLE)
    assert "spec.metrics.auth.bearerTokenSecret" in no_access["message"]
    assert f"{namespace}/{admin_secret}" in no_access["message"]  # looked up in the tenant's namespace
    assert "specdecode-operator-tenant-credentials" in no_access["message"]  # the fix

    failed = wait_for(lambda: "HTTP 500" in (c := metrics_condition(tenant, namespace, "reflect")).get("message", "") and c,
                      90, "reflect: the endpoint's failure reported as its HTTP status")
    assert failed["status"] == "False"
    assert allowed.requests, "the allowed URL was queried"

    # Several evaluations later: the foreign listener never got a request, and no request
    # anywhere carried the operator's Secret or the tenant's chosen org header.
    holds_for(lambda: not foreign.requests, 6, "no request to a URL outside the allowlist")
    for request in allowed.requests:
        assert ADMIN_TOKEN not in json.dumps(request["headers"])
        assert "Authorization" not in request["headers"] and "X-Scope-OrgID" not in request["headers"]

    assert_absent(surfaces(tenant, namespace, operator), ADMIN_TOKEN, BODY_SECRET, INTERNAL_ADDRESS)


def test_a_tenant_secret_granted_by_the_platform_goes_to_its_allowed_url_only(
    cluster, operator, namespace, tenant, listeners
):
    allowed, foreign = listeners
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "team-prom", "namespace": namespace},
              "stringData": {"token": TENANT_TOKEN}}
    tenant("apply", "-f", "-", input=json.dumps(secret))
    # The platform lets the operator read this namespace's Secrets: the shipped example binding.
    binding = yaml.safe_load((REPO / "manifests" / "examples" / "tenant-credentials-rolebinding.yaml").read_text())
    binding["metadata"]["namespace"] = namespace
    kubectl(cluster, "apply", "--server-side", "-f", "-", input=yaml.safe_dump(binding))

    auth = {"bearerTokenSecret": {"name": "team-prom", "key": "token"}, "headers": {"X-Scope-OrgID": "team"}}
    tenant("apply", "-f", "-", input=yaml.safe_dump_all([
        service(namespace, "own", allowed.url, auth),
        service(namespace, "elsewhere", foreign.url, auth),
    ]))
    wait_for(lambda: any(r["headers"].get("Authorization") == f"Bearer {TENANT_TOKEN}" for r in allowed.requests),
             90, "the tenant's own token sent to its allowed Prometheus")
    assert all(r["headers"].get("X-Scope-OrgID") == "team" for r in allowed.requests)
    wait_metrics_reason(tenant, namespace, "elsewhere", C.REASON_PROMETHEUS_URL_NOT_ALLOWED)
    holds_for(lambda: not foreign.requests, 4, "the tenant's token is not sent to a URL outside the allowlist")
    assert_absent(surfaces(tenant, namespace, operator), TENANT_TOKEN, BODY_SECRET)


def test_a_token_in_a_failing_pods_message_is_redacted_everywhere(cluster, kube_api, operator, namespace, tenant):
    leaky = (f"OSError: 401 Client Error: Unauthorized for url https://huggingface.co/api/models/Qwen/Qwen2.5-0.5B-Instruct "
             f"with token {HF_TOKEN} (Authorization: Bearer {ADMIN_TOKEN})")
    with failing_pods(kube_api, namespace, leaky, speculative_only=False):
        tenant("apply", "-f", "-", input=yaml.safe_dump(qwen(namespace)))

        def reported() -> dict:
            obj = json.loads(tenant("get", "sds", "qwen", "-n", namespace, "-o", "json").stdout)
            conds = (obj.get("status") or {}).get("conditions", [])
            return next((c for c in conds if c["reason"] == C.REASON_STARTUP_FAILURE and "[REDACTED]" in c["message"]), {})

        cond = wait_for(reported, 120, "a StartupFailure condition quoting the pod's message, redacted")
        assert "401 Client Error" in cond["message"]  # the cause still shows
        wait_for(lambda: C.REASON_STARTUP_FAILURE in tenant("get", "events", "-n", namespace, "-o", "yaml").stdout,
                 60, "the StartupFailure Event")
        assert_absent(surfaces(tenant, namespace, operator), HF_TOKEN, ADMIN_TOKEN)


# --------------------------------------------------------------------- the namespaced install

def namespaced_install(cluster: ClusterInfo, namespace: str, account: str, suffix: str) -> list[dict]:
    """manifests/overlays/namespaced's RBAC and peering for `namespace`, bound to a ServiceAccount
    of the test's own (and cluster-scoped names suffixed), so that it cannot mix with the
    session's cluster-wide operator account."""
    built = subprocess.run([str(cluster.kubectl), "kustomize", str(REPO / "manifests" / "overlays" / "namespaced")],
                           capture_output=True, text=True, check=True).stdout
    subject = {"kind": "ServiceAccount", "name": account, "namespace": namespace}
    out = []
    for obj in yaml.safe_load_all(built):
        kind = obj["kind"]
        if kind in ("ClusterRole", "ClusterRoleBinding"):
            obj["metadata"]["name"] += suffix
        if kind in ("ClusterRoleBinding", "RoleBinding"):
            obj["subjects"] = [subject]
            if obj["roleRef"]["kind"] == "ClusterRole":
                obj["roleRef"]["name"] += suffix
        if kind in ("RoleBinding", "KopfPeering"):
            obj["metadata"]["namespace"] = namespace
        if kind in ("ClusterRole", "ClusterRoleBinding", "RoleBinding", "KopfPeering") or (
            kind == "CustomResourceDefinition" and obj["metadata"]["name"] == "kopfpeerings.kopf.dev"
        ):
            out.append(obj)
    return out


def can_i(cluster: ClusterInfo, user: str, *args: str) -> bool:
    return kubectl(cluster, "auth", "can-i", "--as", user, *args, check=False).stdout.strip() == "yes"


def test_the_namespaced_install_writes_only_where_it_watches(cluster, kube_api, operator, namespace, tmp_path):
    account, suffix = "specdecode-namespaced", f"-e2e-{RUN}"
    user = f"system:serviceaccount:{namespace}:{account}"
    objects = namespaced_install(cluster, namespace, account, suffix)
    crds = [o for o in objects if o["kind"] == "CustomResourceDefinition"]
    kubectl(cluster, "apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(crds))
    wait_for(lambda: kubectl(cluster, "get", "crd/kopfpeerings.kopf.dev", "-o",
                             'jsonpath={.status.conditions[?(@.type=="Established")].status}', check=False).stdout == "True",
             60, "the KopfPeering CRD Established")
    config = cluster.service_account_kubeconfig(namespace, account, tmp_path / "namespaced.kubeconfig")
    kubectl(cluster, "apply", "--server-side", "-f", "-", input=yaml.safe_dump_all([o for o in objects if o not in crds]))

    # What the apiserver grants the account: writes in the watched namespace, nowhere else.
    assert can_i(cluster, user, "create", "deployments", "-n", namespace)
    assert can_i(cluster, user, "patch", f"{C.PLURAL}.{C.GROUP}", "-n", namespace)
    for elsewhere in ("kube-system", "default", OPERATOR_NAMESPACE):
        assert not can_i(cluster, user, "create", "deployments", "-n", elsewhere)
        assert not can_i(cluster, user, "get", "pods", "--subresource=log", "-n", elsewhere)
    assert not can_i(cluster, user, "get", "secrets", "-n", namespace)
    assert not can_i(cluster, user, "patch", "clusterkopfpeerings.kopf.dev")
    assert can_i(cluster, user, "list", "namespaces")  # read-only discovery for kopf

    # Only one operator may handle the namespace: the session's cluster-wide one pauses.
    operator.stack.close()
    liveness, metrics_port = free_port(), free_port()
    log_path = tmp_path / "namespaced-operator.log"
    process = spawn("operator (namespaced)", [
        "run", "--kubeconfig", str(config), "-n", namespace, "--prometheus-url", NO_PROMETHEUS,
        "--reconcile-interval", "2", "--evaluation-tick", "1",
        "--liveness-port", str(liveness), "--metrics-port", str(metrics_port),
    ], log_path, env={"KUBECONFIG": ""})
    try:
        wait_http_ok(f"http://127.0.0.1:{liveness}/healthz", 60, process)
        _, since = audit_writes(cluster, user, namespace)
        kubectl(cluster, "apply", "-f", "-", input=yaml.safe_dump(service(namespace, "scoped", NO_PROMETHEUS)))
        wait_for(lambda: kubectl(cluster, "get", "deployment", "scoped", "-n", namespace, check=False).returncode == 0,
                 60, "the namespaced operator rendered the Deployment")
        wait_for(lambda: (json.loads(kubectl(cluster, "get", "sds", "scoped", "-n", namespace, "-o", "json").stdout)
                          .get("status") or {}).get("observedGeneration"), 60, "status written")
        writes, _ = audit_writes(cluster, user, namespace, since)
        assert {w["objectRef"]["resource"] for w in writes} >= {"deployments", C.PLURAL}
        # Every write this account made, anywhere, was in the watched namespace.
        for line in cluster.audit_log.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            if entry.get("user", {}).get("username") != user or entry.get("verb") not in (
                "create", "update", "patch", "delete", "deletecollection"
            ):
                continue
            assert (entry.get("objectRef") or {}).get("namespace") == namespace, f"write outside: {entry['requestURI']}"
        log = log_path.read_text(errors="replace")
        assert "Forbidden" not in log and "Not enough permissions" not in log, log[-3000:]
    finally:
        process.stop()
        operator.restart()
