"""The local control plane behaves like a GPU cluster: nodes, scheduling, readiness, crashes."""

from __future__ import annotations

import json
import subprocess
import time
import uuid

import pytest

from specdecode.tools.localstack import FAIL_STARTUP_ANNOTATION, LocalCluster
from specdecode.tools.localstack.manifests import duration_ms

from .conftest import wait_for

pytestmark = pytest.mark.e2e

GPU = "nvidia.com/gpu"


def gpu_pod_spec(client, annotations: dict | None = None):
    """A pod template asking for one GPU and tolerating the GPU taint, as the operator renders."""
    return client.V1PodTemplateSpec(
        metadata=client.V1ObjectMeta(labels={"app": "vllm-e2e"}, annotations=annotations),
        spec=client.V1PodSpec(
            tolerations=[client.V1Toleration(key=GPU, operator="Exists", effect="NoSchedule")],
            enable_service_links=False,
            containers=[client.V1Container(
                name="vllm", image="vllm/vllm-openai:v0.11.0",
                resources=client.V1ResourceRequirements(limits={GPU: "1"}, requests={GPU: "1"}),
            )],
        ),
    )


def test_nodes_are_ready_gpu_nodes_with_the_device_plugin_taint(kube_api):
    from kubernetes import client

    nodes = client.CoreV1Api(kube_api).list_node().items
    assert len(nodes) == 4
    for node in nodes:
        ready = {c.type: c.status for c in node.status.conditions}["Ready"]
        assert ready == "True", node.metadata.name
        assert node.status.allocatable[GPU] == "8"
        assert node.status.capacity[GPU] == "8"
        assert node.status.allocatable["cpu"] == "96"
        assert node.status.allocatable["pods"] == "110"
        assert node.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        assert node.metadata.labels["nvidia.com/gpu.count"] == "8"
        assert node.metadata.labels["type"] == "kwok"
        taints = [(t.key, t.value, t.effect) for t in node.spec.taints or []]
        assert (GPU, "present", "NoSchedule") in taints


def test_gpu_deployment_becomes_available_only_after_the_ready_delay(kube_api, namespace, cluster):
    from kubernetes import client

    apps, core = client.AppsV1Api(kube_api), client.CoreV1Api(kube_api)
    deployment = client.V1Deployment(
        metadata=client.V1ObjectMeta(name="vllm"),
        spec=client.V1DeploymentSpec(
            replicas=2,
            selector=client.V1LabelSelector(match_labels={"app": "vllm-e2e"}),
            template=gpu_pod_spec(client),
        ),
    )
    apps.create_namespaced_deployment(namespace, deployment)

    def available():
        status = apps.read_namespaced_deployment_status("vllm", namespace).status
        conditions = {c.type: c.status for c in status.conditions or []}
        return conditions.get("Available") == "True" and status.ready_replicas == 2

    wait_for(available, 60, "the Deployment to become Available with 2 ready replicas")

    pods = core.list_namespaced_pod(namespace, label_selector="app=vllm-e2e").items
    assert len(pods) == 2
    minimum_delay = duration_ms(cluster.spec.ready_delay) / 1000 - 0.5  # timestamps have 1 s resolution
    for pod in pods:
        assert pod.spec.node_name.startswith("gpu-node-")
        assert pod.status.phase == "Running"
        conditions = {c.type: c for c in pod.status.conditions}
        assert conditions["PodScheduled"].status == "True"
        assert conditions["Ready"].status == "True"
        loading = (conditions["Ready"].last_transition_time - pod.status.start_time).total_seconds()
        assert loading >= minimum_delay, f"{pod.metadata.name} was Ready after {loading}s"
        (container,) = pod.status.container_statuses
        assert container.ready and container.restart_count == 0 and container.state.running

    # Deleting the Deployment must take its ReplicaSet and pods with it (garbage collector),
    # and the pods must really go away (kwok removes terminating pods).
    apps.delete_namespaced_deployment("vllm", namespace, propagation_policy="Background")
    wait_for(lambda: not apps.list_namespaced_replica_set(namespace).items, 60,
             "the garbage collector to delete the ReplicaSet")
    wait_for(lambda: not core.list_namespaced_pod(namespace).items, 60, "the pods to be deleted")


def test_startup_failure_crash_loops_with_the_message(kube_api, namespace):
    from kubernetes import client

    core = client.CoreV1Api(kube_api)
    message = "torch.OutOfMemoryError: CUDA out of memory loading the draft model"
    template = gpu_pod_spec(client, annotations={FAIL_STARTUP_ANNOTATION: message})
    pod = client.V1Pod(metadata=client.V1ObjectMeta(name="crasher", annotations=template.metadata.annotations),
                       spec=template.spec)
    core.create_namespaced_pod(namespace, pod)

    seen_terminated = []

    def restarted_twice():
        status = core.read_namespaced_pod_status("crasher", namespace).status
        (container,) = status.container_statuses or [None]
        if container is None:
            return False
        assert not container.ready, "a pod that fails at start-up must never be Ready"
        if container.state.terminated:
            seen_terminated.append(container.state.terminated)
        return container.restart_count >= 2 and container

    container = wait_for(restarted_twice, 60, "the container to restart twice", interval=0.1)
    assert seen_terminated, "never observed the container in its terminated state"
    terminated = seen_terminated[-1]
    assert terminated.exit_code == 1
    assert terminated.message == message
    assert terminated.reason == "Error"
    # After a restart the failure stays visible as the last state, as with a real kubelet.
    assert container.last_state.terminated.message == message
    assert container.last_state.terminated.exit_code == 1


def test_service_account_tokens_authenticate(kube_api, namespace, cluster, tmp_path):
    from kubernetes import client

    core = client.CoreV1Api(kube_api)
    core.create_namespaced_service_account(namespace, client.V1ServiceAccount(
        metadata=client.V1ObjectMeta(name="operator")))
    token = core.create_namespaced_service_account_token("operator", namespace, client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))).status.token
    assert token

    # Ask the server who the token is, over a connection that carries nothing but the token.
    configuration = client.Configuration()
    configuration.host = cluster.server
    configuration.ssl_ca_cert = kube_api.configuration.ssl_ca_cert
    configuration.api_key = {"authorization": f"Bearer {token}"}
    with client.ApiClient(configuration) as token_client:
        review = client.AuthenticationV1Api(token_client).create_self_subject_review(client.V1SelfSubjectReview())
    assert review.status.user_info.username == f"system:serviceaccount:{namespace}:operator"

    # The helper for running a process (the operator) as a ServiceAccount: authenticated as
    # the account, and authorised by RBAC alone (no binding yet, so writes are forbidden).
    kubeconfig = cluster.service_account_kubeconfig(namespace, "operator", tmp_path / "operator.kubeconfig")
    assert kubeconfig.stat().st_mode & 0o077 == 0
    sa_kubectl = [str(cluster.kubectl), "--kubeconfig", str(kubeconfig), "--cache-dir", str(tmp_path / "cache")]
    whoami = subprocess.run([*sa_kubectl, "auth", "whoami", "-o", "json"], capture_output=True, text=True,
                            timeout=30, check=True)
    assert json.loads(whoami.stdout)["status"]["userInfo"]["username"] == \
        f"system:serviceaccount:{namespace}:operator"
    forbidden = subprocess.run([*sa_kubectl, "create", "configmap", "x"], capture_output=True, text=True, timeout=30)
    assert forbidden.returncode != 0 and "forbidden" in forbidden.stderr


def test_writes_are_in_the_audit_log(kube_api, namespace, cluster):
    from kubernetes import client

    name = f"audited-{uuid.uuid4().hex[:6]}"
    client.CoreV1Api(kube_api).create_namespaced_config_map(namespace, client.V1ConfigMap(
        metadata=client.V1ObjectMeta(name=name), data={"k": "v"}))

    def entry():
        for line in cluster.audit_log.read_text().splitlines():
            event = json.loads(line)
            ref = event.get("objectRef", {})
            if ref.get("resource") == "configmaps" and ref.get("name") == name and event["verb"] == "create":
                return event
        return None

    event = wait_for(entry, 30, f"the audit entry of creating configmap {name}")
    assert event["level"] == "Request"
    assert event["stage"] == "ResponseComplete"
    assert event["requestObject"]["data"] == {"k": "v"}


def test_the_apiserver_reports_each_clusterip_allocation_and_etcd_write_the_fleet_bench_reads(
        kube_api, namespace, cluster):
    """`bench fleet` reads the ClusterIP allocations, the etcd writes and the stack's CPU from
    the real apiserver's /metrics and /proc: the names must be the ones this version reports."""
    from kubernetes import client

    from specdecode.tools.bench import stackload

    markers = [str(cluster.state_dir)]
    before = stackload.sample(kube_api, markers, time.monotonic)
    core = client.CoreV1Api(kube_api)
    for index in range(3):
        core.create_namespaced_service(namespace, client.V1Service(
            metadata=client.V1ObjectMeta(name=f"alloc-{index}"),
            spec=client.V1ServiceSpec(selector={"app": "none"}, ports=[client.V1ServicePort(port=8000)])))
    load = stackload.load_between(before, stackload.sample(kube_api, markers, time.monotonic), cores=1)
    assert load.allocations >= 3 and load.allocation_mean_ms is not None and load.allocation_mean_ms > 0
    assert load.etcd_writes >= 6  # each Service and its IPAddress, at least
    assert {"kube-apiserver", "etcd"} <= set(load.cpu_s) and load.cpu_s["kube-apiserver"] > 0


def test_kubectl_and_server_report_the_same_minor(cluster):
    result = subprocess.run(cluster.kubectl_command("version", "-o", "json"), capture_output=True, text=True,
                            timeout=30, check=True)
    versions = json.loads(result.stdout)
    assert versions["clientVersion"]["minor"] == "34"
    assert versions["serverVersion"]["minor"] == "34"
    assert versions["serverVersion"]["gitVersion"] == cluster.kubernetes_version
    assert versions["clientVersion"]["gitVersion"] == cluster.kubernetes_version


def test_up_again_reuses_the_running_cluster(cluster):
    started = time.monotonic()
    again = LocalCluster(cluster.name, cluster.state_dir).up(
        nodes=cluster.spec.nodes, gpus_per_node=cluster.spec.gpus_per_node, ready_delay=cluster.spec.ready_delay,
        progress=False)
    assert time.monotonic() - started < 15
    assert again.server == cluster.server
    assert again.kubeconfig == cluster.kubeconfig


def test_down_stops_every_process_even_without_pid_files(cluster, tmp_path):
    """After a crash kwokctl's pid files may be gone; `down` must still leave no process behind."""
    from specdecode.tools.localstack.cluster import processes_referencing

    local = LocalCluster("e2e-down", tmp_path / "state", log=lambda message: None)
    local.up(nodes=1, ready_delay="1s", progress=False)
    try:
        assert local.status().state == "running"
        assert len(processes_referencing(local.workdir)) >= 5
        for pid_file in (local.workdir / "pids").iterdir():
            pid_file.unlink()
    finally:
        local.down(progress=False)
    assert processes_referencing(local.workdir) == []
    assert not local.state_dir.exists()
    assert local.status().state == "absent"
