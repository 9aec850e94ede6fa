"""Unit tests of the local stack's pure parts: build planning, rendering, command lines."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from specdecode.tools.localstack import build, cluster, manifests
from specdecode.tools.localstack.build import (ETCD, GOBUILD_ROOT, HELM, KUBERNETES, KWOK, BuildError, Binaries,
                                         ComponentBuild)
from specdecode.tools.localstack.cluster import ClusterError, ClusterInfo
from specdecode.tools.localstack.manifests import ClusterSpec


def fake_binaries(root: Path = Path("/cache")) -> Binaries:
    return Binaries(
        kube_apiserver=root / "kubernetes-v1.34.4/bin/kube-apiserver",
        kube_controller_manager=root / "kubernetes-v1.34.4/bin/kube-controller-manager",
        kube_scheduler=root / "kubernetes-v1.34.4/bin/kube-scheduler",
        kubectl=root / "kubernetes-v1.34.4/bin/kubectl",
        etcd=root / "etcd-v3.6.16/bin/etcd",
        kwok=root / "kwok-v0.7.0/bin/kwok",
        kwokctl=root / "kwok-v0.7.0/bin/kwokctl",
        helm=root / "helm-v3.19.5/bin/helm",
        kubernetes_version="v1.34.4",
        etcd_version="v3.6.16",
        kwok_version="v0.7.0",
        helm_version="v3.19.5",
    )


# --- build planning ---------------------------------------------------------------------------

GOMOD = """\
module specdecode.localstack/gobuild/kubernetes

go 1.24.0

require k8s.io/kubernetes v1.34.4

require (
\tgithub.com/foo/bar v1.2.3 // indirect
)

replace (
\tk8s.io/api => k8s.io/api v0.34.4
)
"""


def test_required_version_reads_require_lines_and_ignores_replacements():
    assert build.required_version(GOMOD, "k8s.io/kubernetes") == "v1.34.4"
    assert build.required_version(GOMOD, "github.com/foo/bar") == "v1.2.3"
    with pytest.raises(BuildError, match="does not require k8s.io/api"):
        build.required_version(GOMOD, "k8s.io/api")


def test_go_directive_and_version_parsing():
    assert build.go_directive(GOMOD) == (1, 24)
    assert build.parse_go_version("go version go1.26.8 linux/amd64") == (1, 26, 8)
    assert build.parse_go_version("go version go1.27 linux/arm64") == (1, 27, 0)
    with pytest.raises(BuildError):
        build.parse_go_version("command not found")


def test_kubernetes_ldflags_stamp_both_version_packages():
    flags = build.kubernetes_version_ldflags("v1.34.4", "2026-01-02T03:04:05Z")
    for package in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        assert f"-X {package}.gitVersion=v1.34.4" in flags
        assert f"-X {package}.gitMajor=1" in flags
        assert f"-X {package}.gitMinor=34" in flags
        assert f"-X {package}.gitTreeState=clean" in flags
        assert f"-X {package}.buildDate=2026-01-02T03:04:05Z" in flags
    with pytest.raises(BuildError):
        build.kubernetes_version_ldflags("1.34", "x")


def test_helm_is_stamped_with_its_version_and_the_kubernetes_minor_of_its_client_go():
    """Without the stamps `helm version` says v3.19 and `helm template`/`lint` assume
    Kubernetes 1.20 for .Capabilities.KubeVersion."""
    gomod = (GOBUILD_ROOT / "helm" / "go.mod").read_text()
    version = build.required_version(gomod, HELM.module)
    flags = build.ldflags_for(HELM, version, "d", gomod)
    assert flags[:2] == ("-s", "-w")
    assert f"-X helm.sh/helm/v3/internal/version.version={version}" in flags
    assert build.required_version(gomod, "k8s.io/client-go").startswith("v0.34.")
    for package in ("lint/rules", "chartutil"):
        assert f"-X helm.sh/helm/v3/pkg/{package}.k8sVersionMinor=34" in flags
    with pytest.raises(BuildError):
        build.helm_version_ldflags("v3.19.5", "v1.34.0")


def test_only_kubernetes_gets_version_stamps_and_all_are_stripped():
    assert build.ldflags_for(ETCD, "v3.6.16", "d") == ("-s", "-w")
    assert build.ldflags_for(KWOK, "v0.7.0", "d") == ("-s", "-w")
    assert build.ldflags_for(KUBERNETES, "v1.34.4", "d")[:2] == ("-s", "-w")


def _plan(spec=KUBERNETES, sources=None, date="2026-01-01T00:00:00Z") -> ComponentBuild:
    sources = sources if sources is not None else {"go.mod": GOMOD.encode(), "go.sum": b"sum"}
    return build.plan_component(spec, Path("/src") / spec.name, sources, Path("/cache"), "linux/amd64", date)


def test_plan_keys_the_cache_by_component_and_version():
    plan = _plan()
    assert plan.version == "v1.34.4"
    assert plan.cache_dir == Path("/cache/kubernetes-v1.34.4")
    assert plan.bin_dir == Path("/cache/kubernetes-v1.34.4/bin")
    assert plan.binary("kubectl") == Path("/cache/kubernetes-v1.34.4/bin/kubectl")


def test_digest_ignores_build_date_but_not_pins():
    assert _plan(date="2026-01-01T00:00:00Z").digest == _plan(date="2027-05-05T00:00:00Z").digest
    repinned = {"go.mod": GOMOD.encode(), "go.sum": b"other sum"}
    assert _plan(sources=repinned).digest != _plan().digest
    assert _plan(sources={"go.mod": GOMOD.encode(), "go.sum": b"sum", "main.go": b"x"}).digest != _plan().digest


def test_plan_refuses_an_incomplete_builder_module():
    with pytest.raises(BuildError, match="lacks go.mod or go.sum"):
        _plan(sources={"go.mod": GOMOD.encode()})


def test_go_build_command_is_pinned_trimmed_and_verbose():
    plan = _plan()
    command = build.go_build_command("go", plan, Path("/out"))
    assert command[:2] == ["go", "build"]
    for flag in ("-v", "-trimpath", "-mod=readonly", "-buildvcs=false"):
        assert flag in command
    ldflags = command[command.index("-ldflags") + 1]
    assert ldflags.startswith("-s -w -X k8s.io/component-base/version.gitMajor=1")
    assert command[command.index("-o") + 1] == "/out/"
    assert command[-4:] == list(KUBERNETES.packages)


def test_go_environment_forbids_toolchain_downloads_and_cgo():
    env = build.go_environment({"PATH": "/bin", "GOTOOLCHAIN": "auto", "CGO_ENABLED": "1"})
    assert env == {"PATH": "/bin", "GOTOOLCHAIN": "local", "CGO_ENABLED": "0"}


def test_cache_root_precedence(tmp_path):
    assert build.default_cache_root({"SPECDECODE_CACHE_DIR": str(tmp_path)}) == tmp_path
    assert build.default_cache_root({"XDG_CACHE_HOME": "/x"}) == Path("/x/specdecode")
    assert build.default_cache_root({}) == Path.home() / ".cache" / "specdecode"


def test_find_go_explains_the_fix_when_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "_WELL_KNOWN_GO", tmp_path / "nope")
    with pytest.raises(BuildError, match="go not found: install Go 1.26"):
        build.find_go({"PATH": str(tmp_path)})
    with pytest.raises(BuildError, match="SPECDECODE_GO"):
        build.find_go({"SPECDECODE_GO": str(tmp_path / "nope")})


def test_shipped_builder_modules_pin_one_kubernetes_minor():
    """The committed go.mod files are what gets built: check the versions the stack promises."""
    plans = {plan.spec.name: plan for plan in build.plan_builds(Path("/cache"))}
    kubernetes = plans["kubernetes"].version
    assert kubernetes.startswith("v1.34.")
    assert plans["etcd"].version.startswith("v3.6.")
    gomod = (GOBUILD_ROOT / "kubernetes" / "go.mod").read_text()
    staging = [line.split() for line in gomod.splitlines() if "=>" in line]
    assert staging, "the kubernetes builder module must replace the staging modules"
    staging_version = "v0." + kubernetes.removeprefix("v1.")
    assert all(parts[0] == parts[2] and parts[3] == staging_version for parts in staging), staging
    # kwok's own Kubernetes libraries must be within one minor of the control plane.
    kwok_sum = (GOBUILD_ROOT / "kwok" / "go.mod").read_text()
    client_go = build.required_version(kwok_sum, "k8s.io/client-go")
    assert abs(int(client_go.split(".")[1]) - int(kubernetes.split(".")[1])) <= 1
    for name in ("kubernetes", "etcd", "kwok"):
        assert (GOBUILD_ROOT / name / "go.sum").stat().st_size > 0


def test_is_cached_requires_matching_digest_and_binaries(tmp_path):
    plan = build.plan_component(ETCD, tmp_path, {"go.mod": b"require go.etcd.io/etcd/server/v3 v3.6.16\n",
                                                 "go.sum": b""}, tmp_path / "cache", "linux/amd64", "d")
    assert not build.is_cached(plan)
    plan.bin_dir.mkdir(parents=True)
    (plan.bin_dir / "etcd").write_text("#!/bin/sh\n")
    (plan.bin_dir / "etcd").chmod(0o755)
    plan.info_file.write_text('{"digest": "stale"}')
    assert not build.is_cached(plan)
    plan.info_file.write_text(f'{{"digest": "{plan.digest}"}}')
    assert build.is_cached(plan)


def test_plain_reporter_logs_milestones_not_every_package(capsys):
    from specdecode.tools.localstack.progress import PlainReporter

    plan = _plan()
    reporter = PlainReporter(stream=sys.stdout, interval=3600)
    reporter.begin(plan)
    reporter.status(plan, "downloading k8s.io/api v0.34.4")
    reporter.status(plan, "compiling")
    reporter.set_total(plan, 3)
    for package in ("a", "b", "c"):
        reporter.advance(plan, package)
    reporter.finish(plan, 75)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4, lines
    assert "downloaded 1 modules" in lines[1]
    assert lines[-1].endswith("built in 1m15s -> /cache/kubernetes-v1.34.4/bin")


# --- manifests ----------------------------------------------------------------------------------

@pytest.mark.parametrize("text,ms", [("2s", 2000), ("500ms", 500), ("1m30s", 90_000), ("0", 0),
                                     ("0s", 0), ("1.5s", 1500), ("1h", 3_600_000)])
def test_duration_ms(text, ms):
    assert manifests.duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "2", "s", "2 s", "two seconds", "-1s", "1d"])
def test_duration_ms_rejects(text):
    with pytest.raises(ValueError, match="is not a duration"):
        manifests.duration_ms(text, "ready-delay")


def test_cluster_spec_validation():
    ClusterSpec().validate()
    with pytest.raises(ValueError, match="nodes"):
        ClusterSpec(nodes=0).validate()
    with pytest.raises(ValueError, match="ready-delay"):
        ClusterSpec(ready_delay="soon").validate()


def test_gpu_node_has_gpus_labels_and_the_device_plugin_taint():
    node = manifests.gpu_node(2, ClusterSpec(kubernetes_version="v1.34.4"))
    assert node["metadata"]["name"] == "gpu-node-2"
    labels = node["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert labels["nvidia.com/gpu.count"] == "8"
    assert labels["type"] == "kwok"
    assert node["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
    for field in ("allocatable", "capacity"):
        assert node["status"][field] | {} == {
            "cpu": "96", "memory": "1Ti", "pods": "110", "ephemeral-storage": "10Ti", "nvidia.com/gpu": "8",
        }
    assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.34.4"
    assert [n["metadata"]["name"] for n in manifests.gpu_nodes(ClusterSpec(nodes=3))] == [
        "gpu-node-0", "gpu-node-1", "gpu-node-2"]


def test_audit_policy_logs_each_write_once_and_hides_credentials():
    policy = manifests.audit_policy()
    assert policy["omitStages"] == ["RequestReceived"]
    rules = policy["rules"]
    assert rules[0] == {"level": "None", "verbs": ["get", "list", "watch"]}
    credential_rule = rules[1]
    assert credential_rule["level"] == "Metadata"
    assert "secrets" in credential_rule["resources"][0]["resources"]
    assert "serviceaccounts/token" in credential_rule["resources"][0]["resources"]
    assert rules[2] == {"level": "Request", "verbs": list(manifests.WRITE_VERBS)}


PORTS = manifests.Ports(kube_apiserver=6443, etcd=2379, etcd_peer=2380, kwok_controller=10247,
                        kube_controller_manager=10257, kube_scheduler=10259)


def test_kwokctl_configuration_uses_local_binaries_on_loopback(tmp_path):
    config = manifests.kwokctl_configuration(fake_binaries(), tmp_path / "audit.yaml", PORTS)
    options = config["options"]
    assert config["kind"] == "KwokctlConfiguration"
    assert options["runtime"] == "binary"
    assert options["bindAddress"] == "127.0.0.1"
    assert options["securePort"] and options["kubeAuthorization"] and options["kubeAdmission"]
    assert options["kubeApiserverBinary"] == "/cache/kubernetes-v1.34.4/bin/kube-apiserver"
    assert options["kwokControllerBinary"] == "/cache/kwok-v0.7.0/bin/kwok"
    assert options["etcdBinary"] == "/cache/etcd-v3.6.16/bin/etcd"
    assert options["kubeAuditPolicy"] == str(tmp_path / "audit.yaml")
    assert (options["kubeApiserverPort"], options["etcdPort"], options["etcdPeerPort"]) == (6443, 2379, 2380)
    assert (options["kwokControllerPort"], options["kubeControllerManagerPort"],
            options["kubeSchedulerPort"]) == (10247, 10257, 10259)
    patches = {p["name"]: {a["key"]: a["value"] for a in p["extraArgs"]} for p in config["componentsPatches"]}
    assert patches == {
        # Room for the Services of a 500-service fleet (the default /24 holds about 250).
        "kube-apiserver": {"service-cluster-ip-range": "10.96.0.0/16"},
        # 200 requests a second per controller (the default 20 made the stack alone need 120 s to
        # bring 500 Deployments to available: a floor under `bench fleet` that is not the operator's).
        "kube-controller-manager": {"use-service-account-credentials": "true", "leader-elect": "false",
                                    "kube-api-qps": "200", "kube-api-burst": "400"},
        # Without leader election the controllers ride out an API server outage (test_apiserver_outage).
        "kube-scheduler": {"leader-elect": "false"},
    }
    # Every binary option must point at a local file, never at a download URL.
    assert not any(str(value).startswith("http") for value in options.values())


def _stages(**spec) -> dict[str, dict]:
    return {stage["metadata"]["name"]: stage for stage in manifests.pod_stages(ClusterSpec(**spec))}


def test_pod_stages_replace_the_instant_ready_with_a_delay():
    stages = _stages(ready_delay="30s", fail_after="5s", crash_backoff="3s")
    assert list(stages) == ["specdecode-pod-start", "specdecode-pod-ready", "specdecode-pod-crash",
                            "specdecode-pod-crash-backoff", "specdecode-pod-restart", "specdecode-pod-delete"]
    assert "delay" not in stages["specdecode-pod-start"]["spec"]
    ready = stages["specdecode-pod-ready"]["spec"]
    assert ready["delay"] == {"durationMilliseconds": 30_000, "durationFrom": {
        "expressionFrom": '.metadata.annotations["sim.specdecode.io/ready-delay"]'}}
    assert {"key": '.metadata.annotations["sim.specdecode.io/fail-startup"]', "operator": "DoesNotExist"} in \
        ready["selector"]["matchExpressions"]
    assert stages["specdecode-pod-crash"]["spec"]["delay"]["durationMilliseconds"] == 5000
    assert stages["specdecode-pod-crash-backoff"]["spec"]["delay"]["durationMilliseconds"] == 3000
    assert stages["specdecode-pod-delete"]["spec"]["next"] == {"delete": True}
    for stage in stages.values():
        assert stage["apiVersion"] == "kwok.x-k8s.io/v1alpha1"
        assert stage["spec"]["resourceRef"] == {"apiGroup": "v1", "kind": "Pod"}


def test_crash_loop_stages_are_selected_by_the_failing_containers_state():
    stages = _stages()
    states = {}
    for name in ("specdecode-pod-crash", "specdecode-pod-crash-backoff", "specdecode-pod-restart"):
        expressions = stages[name]["spec"]["selector"]["matchExpressions"]
        state_rule = [rule for rule in expressions if "keys" in rule["key"]]
        assert len(state_rule) == 1
        states[name] = state_rule[0]["values"]
    assert states == {"specdecode-pod-crash": ["running"], "specdecode-pod-crash-backoff": ["terminated"],
                      "specdecode-pod-restart": ["waiting"]}
    crash = stages["specdecode-pod-crash"]["spec"]["next"]["statusTemplate"]
    assert "exitCode: 1" in crash and "$message" in crash
    assert "{{ add1 $restarts }}" in stages["specdecode-pod-restart"]["spec"]["next"]["statusTemplate"]
    assert "CrashLoopBackOff" in stages["specdecode-pod-crash-backoff"]["spec"]["next"]["statusTemplate"]


def test_status_templates_balance_their_actions():
    """A cheap guard against a broken Go template: every {{ if/range/with }} has its {{ end }}."""
    import re

    for stage in manifests.pod_stages(ClusterSpec()):
        template = stage["spec"]["next"].get("statusTemplate", "")
        opened = len(re.findall(r"{{-?\s*(?:if|range|with)\b", template))
        closed = len(re.findall(r"{{-?\s*end\s*-?}}", template))
        assert opened == closed, stage["metadata"]["name"]


# --- cluster: pure helpers -----------------------------------------------------------------------

@pytest.mark.parametrize("name", ["specdecode", "e2e", "a", "demo-1"])
def test_valid_cluster_names(name):
    assert cluster.validate_cluster_name(name) == name


@pytest.mark.parametrize("name", ["", "Upper", "-x", "x-", "a_b", "a" * 41, "../etc"])
def test_invalid_cluster_names(name):
    with pytest.raises(ClusterError, match="invalid cluster name"):
        cluster.validate_cluster_name(name)


def test_state_root_precedence():
    assert cluster.default_state_root({"SPECDECODE_STATE_DIR": "/s"}) == Path("/s")
    assert cluster.default_state_root({"XDG_STATE_HOME": "/x"}) == Path("/x/specdecode/cluster")
    assert cluster.default_state_root({}) == Path.home() / ".local/state/specdecode/cluster"


def test_kwokctl_never_touches_the_users_kubeconfig_or_kwok_dir():
    kubeconfig = Path("/state/kubeconfig")
    create = cluster.kwokctl_create_command(Path("/bin/kwokctl"), "e2e", Path("/state/kwokctl.yaml"), kubeconfig)
    assert create[create.index("--kubeconfig") + 1] == str(kubeconfig)
    assert create[create.index("--name") + 1] == "e2e"
    assert create[create.index("--runtime") + 1] == "binary"
    env = cluster.kwokctl_environment({"PATH": "/usr/bin", "KUBECONFIG": "/home/u/.kube/config",
                                       "KWOK_RUNTIME": "docker", "HOME": "/home/u"},
                                      Path("/state"), Path("/cache/k8s/bin"))
    assert env == {"PATH": "/cache/k8s/bin" + os.pathsep + "/usr/bin", "HOME": "/home/u",
                   "KWOK_WORKDIR": "/state/kwok", "KUBECACHEDIR": "/state/kube-cache"}


def test_render_kwokctl_config_is_one_stream_of_options_then_stages(tmp_path):
    text = cluster.render_kwokctl_config(fake_binaries(), ClusterSpec(), tmp_path / "audit.yaml", PORTS)
    documents = list(yaml.safe_load_all(text))
    assert documents[0]["kind"] == "KwokctlConfiguration"
    assert {doc["kind"] for doc in documents[1:]} == {"Stage"}


KUBECONFIG = """
apiVersion: v1
kind: Config
clusters:
- name: kwok-e2e
  cluster: {server: "https://127.0.0.1:34567", certificate-authority: /state/pki/ca.crt}
contexts:
- name: kwok-e2e
  context: {cluster: kwok-e2e, user: kwok-e2e}
current-context: kwok-e2e
users:
- name: kwok-e2e
  user: {}
"""


def test_server_from_kubeconfig():
    assert cluster.server_from_kubeconfig(KUBECONFIG) == "https://127.0.0.1:34567"
    with pytest.raises(ClusterError, match="no usable current context"):
        cluster.server_from_kubeconfig("apiVersion: v1\nkind: Config\n")


def test_spec_mismatch_names_each_difference():
    assert cluster.spec_mismatch(ClusterSpec(), ClusterSpec()) == []
    assert cluster.spec_mismatch(ClusterSpec(nodes=4), ClusterSpec(nodes=2, ready_delay="5s")) == [
        "nodes: running 4, wanted 2", "ready_delay: running '2s', wanted '5s'"]


def test_cluster_info_round_trips_through_json(tmp_path):
    info = ClusterInfo(name="e2e", kubeconfig=tmp_path / "kubeconfig", server="https://127.0.0.1:1",
                       audit_log=tmp_path / "audit.log", kubectl=tmp_path / "kubectl", state_dir=tmp_path,
                       log_dir=tmp_path / "logs", kubernetes_version="v1.34.4", spec=ClusterSpec(nodes=2))
    assert ClusterInfo.from_json(info.to_json()) == info
    assert info.kubectl_command("get", "nodes") == [str(tmp_path / "kubectl"), "--kubeconfig",
                                                    str(tmp_path / "kubeconfig"), "--cache-dir",
                                                    str(tmp_path / "kube-cache"), "get", "nodes"]
    assert info.environ({"A": "1"}) == {"A": "1", "KUBECONFIG": str(tmp_path / "kubeconfig")}


def test_processes_referencing_finds_and_terminate_stops_a_child(tmp_path):
    marker = tmp_path / "workdir"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(marker / "etcd")])
    sibling = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", str(marker) + "-2/etcd"])
    try:
        # A child shows its own command line only once it has exec'd: wait for that, bounded.
        deadline = time.monotonic() + 10
        while cluster.processes_referencing(marker) != [child.pid] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert cluster.processes_referencing(marker) == [child.pid]
        cluster.terminate([child.pid], grace_seconds=5)
        assert child.wait(timeout=5) is not None
    finally:
        for process in (child, sibling):
            process.kill()
            process.wait()
    assert cluster.processes_referencing(marker) == []


def test_port_in_use_and_port_choice():
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        busy = server.getsockname()[1]
        assert cluster.port_in_use(busy)
        with pytest.raises(ClusterError, match=f"port {busy} on 127.0.0.1 is in use"):
            cluster.choose_ports(busy)
    ports = cluster.choose_ports()
    assert len(set(ports.kwokctl_options().values())) == 6
    free = cluster.free_ports(1)[0]
    assert cluster.choose_ports(free).kube_apiserver == free


def test_an_absent_cluster_has_no_kubeconfig(tmp_path):
    local = cluster.LocalCluster("nothing", tmp_path / "state", log=lambda message: None)
    assert local.status().state == "absent"
    with pytest.raises(ClusterError, match="is not up: run `specdecode cluster up --name nothing`"):
        local.kubeconfig()
    assert local.down() is False


def test_cli_status_of_an_absent_cluster_exits_3(tmp_path, capsys):
    from specdecode.cli import main

    assert main(["cluster", "status", "--name", "nothing", "--state-dir", str(tmp_path)]) == 3
    assert "cluster 'nothing': absent" in capsys.readouterr().out
    assert main(["cluster", "kubeconfig", "--name", "nothing", "--state-dir", str(tmp_path)]) == 2
