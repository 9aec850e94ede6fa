"""The figures of `bench fleet` and `bench faults`, from what they read (pure parts)."""

from __future__ import annotations

import json

import pytest

from specdecode import constants as C
from specdecode.shell import crashpoints
from specdecode.tools.bench import faults, fleet, live

STATUS = """Name:\tpython3
VmHWM:\t  204800 kB
VmRSS:\t  102400 kB
"""
# pid (comm with a space) state ... utime=250 stime=50 at fields 14 and 15
STAT = "4242 (python3 -m x) S " + " ".join(["0"] * 10) + " 250 50 0 0 20 0 4"


def test_process_figures_from_proc():
    sample = live.parse_proc(STATUS, STAT, ticks_per_s=100)
    assert sample.rss_bytes == 100 * 2**20 and sample.peak_rss_bytes == 200 * 2**20
    assert sample.cpu_s == 3.0


def test_prometheus_query_count_from_its_own_metrics():
    text = (
        '# TYPE prometheus_http_requests_total counter\n'
        'prometheus_http_requests_total{code="200",handler="/api/v1/query"} 40\n'
        'prometheus_http_requests_total{code="400",handler="/api/v1/query"} 2\n'
        'prometheus_http_requests_total{code="200",handler="/metrics"} 9\n'
    )
    assert live.counter_sum(text, "prometheus_http_requests_total", handler="/api/v1/query") == 42


def _audit(verb, user, namespace, resource, name="x", subresource=None, stage="ResponseComplete"):
    ref = {"resource": resource, "namespace": namespace, "name": name}
    if subresource:
        ref["subresource"] = subresource
    return json.dumps({"stage": stage, "verb": verb, "user": {"username": user}, "objectRef": ref,
                       "stageTimestamp": "2026-12-01T00:00:00Z"})


def test_audit_writes_counts_one_users_writes_in_the_namespaces():
    lines = [
        _audit("patch", "op", "ns", "specdecodeservices", subresource="status"),
        _audit("patch", "op", "ns", "specdecodeservices", subresource="status", stage="RequestReceived"),
        _audit("get", "op", "ns", "deployments"),
        _audit("create", "op", "ns", "events"),
        _audit("patch", "op", "other", "deployments"),
        _audit("patch", "kwok", "ns", "pods"),
        '{"stage": "ResponseCo',  # a line being written
    ]
    writes = live.audit_writes(lines, "op", ["ns"])
    assert live.count_by(writes) == {"patch specdecodeservices/status": 1, "create events": 1}


def test_the_operators_writes_are_summed_up_by_kind_with_their_latency():
    """Where a fleet's time to Serving goes: each kind of write with how long the apiserver
    took to answer it (a ClusterIP Service waits for its address)."""
    def timed(resource, name, received, answered):
        entry = json.loads(_audit("patch", "op", "ns", resource, name=name))
        entry["requestReceivedTimestamp"] = f"2026-12-01T00:00:{received:06.3f}Z"
        entry["stageTimestamp"] = f"2026-12-01T00:00:{answered:06.3f}Z"
        return json.dumps(entry)

    lines = [timed("services", f"s{i}", 1.0, 1.0 + seconds) for i, seconds in enumerate((5.0, 6.0, 7.0))]
    lines += [timed("deployments", f"d{i}", 2.0, 2.25 + i / 10) for i in range(4)]
    summary = live.latency_by(live.audit_writes(lines, "op", ["ns"]))
    assert list(summary) == ["patch deployments", "patch services"]
    # All three sent at once, answered one a second apart: the apiserver's pace, 1 a second.
    assert summary["patch services"] == {"count": 3, "median_s": 6.0, "p90_s": 7.0, "per_s": 1.0}
    assert summary["patch deployments"]["median_s"] == pytest.approx(0.35)
    assert summary["patch deployments"]["per_s"] == pytest.approx(10.0)


def _write(verb, user, resource, name, second, subresource=None, request=None, code=200):
    ref = {"resource": resource, "namespace": "ns", "name": name}
    if subresource:
        ref["subresource"] = subresource
    return json.dumps({"stage": "ResponseComplete", "verb": verb, "user": {"username": user}, "objectRef": ref,
                       "responseStatus": {"code": code}, "requestObject": request,
                       "stageTimestamp": f"2026-12-01T00:00:{second:02d}.000000Z"},
                      separators=(",", ":"))  # as the apiserver writes it


def test_serving_stages_follow_each_service_from_creation_to_the_serving_write():
    serving = [{"op": "test", "path": "/metadata/resourceVersion", "value": "1"},
               {"op": "add", "path": "/status", "value": {"phase": "Serving"}}]
    progressing = [{"op": "add", "path": "/status", "value": {"phase": "Progressing"}}]
    lines = [
        _write("patch", "bench", "specdecodeservices", "a", 0),
        _write("patch", "bench", "specdecodeservices", "b", 2),
        _write("patch", "op", "deployments", "a", 3),
        _write("patch", "op", "specdecodeservices", "a", 3, "status", progressing),
        _write("patch", "op", "deployments", "b", 7),
        _write("update", "kcm", "deployments", "a", 4, "status", {"status": {"replicas": 1}}),
        _write("update", "kcm", "deployments", "a", 9, "status", {"status": {"availableReplicas": 1}}),
        _write("update", "kcm", "deployments", "b", 12, "status", {"status": {"availableReplicas": 1}}),
        _write("patch", "op", "specdecodeservices", "a", 10, "status", serving, code=409),  # refused: not it
        _write("patch", "op", "specdecodeservices", "a", 11, "status", serving),
        _write("patch", "op", "specdecodeservices", "b", 20, "status", serving),
    ]
    stages = {s.name: s for s in live.serving_stages(lines, "ns", "op")}
    assert list(stages) == list(live.SERVING_STAGES)
    assert stages["created"].last_at_s == 2 and stages["created"].services == 2
    applied = stages["Deployment applied"]
    assert (applied.median_s, applied.p90_s, applied.last_at_s) == (3, 5, 7)
    assert stages["Deployment available"].last_at_s == 12
    assert stages["Serving written"].last_at_s == 20 and stages["Serving written"].p90_s == 8


def test_the_audit_log_is_read_across_a_rotation(tmp_path):
    """kube-apiserver renames its audit log to audit-<time>.log at 100 MB and starts a new
    one: the lines after a mark are the rest of the renamed file and the new file's."""
    path = tmp_path / "audit.log"
    path.write_text("old 1\n")
    log = live.AuditLog(path)
    mark = log.mark()
    with open(path, "a") as handle:
        handle.write("before the rotation\n")
    path.rename(tmp_path / "audit-2026-12-02T02-54-11.156.log")
    path.write_text("after the rotation\n")
    assert log.lines_since(mark) == ["before the rotation", "after the rotation"]
    later = log.mark()
    with open(path, "a") as handle:
        handle.write("last\n")
    assert log.lines_since(later) == ["last"]
    (tmp_path / "audit-2026-12-02T02-54-11.156.log").unlink()
    with pytest.raises(RuntimeError, match="rotated past the mark"):
        log.lines_since(mark)


def _fleet_figures(**overrides) -> fleet.FleetFigures:
    base = dict(services=500, serving_s=45.0, serving=500, steady_s=180.0, rss_mb=200.0, peak_rss_mb=230.0,
                cpu_s_per_min=10.0, prometheus_queries_per_tick=40.0, prometheus_queries_per_min=480.0,
                reads_per_tick=1.0, queries_per_read=40.0, evaluations_per_min=1000.0, decisions_per_min=0.0,
                writes_per_min=0.0)
    return fleet.FleetFigures(**{**base, **overrides})


def test_fleet_targets_hold_and_fall_short():
    assert all(t.holds for t in fleet.fleet_targets(_fleet_figures()))
    short = fleet.fleet_targets(_fleet_figures(serving_s=None, serving=480, rss_mb=290.0, reads_per_tick=3.4,
                                               writes_per_min=550.0))
    assert [t.holds for t in short] == [False, False, False, False]


def test_fleet_services_parse_and_hold_the_models_best_k():
    from specdecode import api

    k = fleet.steady_k()
    service = fleet.fleet_service(7, k)
    assert service["metadata"]["name"] == "svc-0007"
    spec = api.parse_spec(service["spec"])
    assert spec.speculation.num_speculative_tokens == k and spec.replicas == 1


def test_the_stack_floor_applies_the_deployments_and_services_the_operator_renders_with_no_owner():
    """The floor is only a floor if its objects are the operator's own for the same services
    (same pod template, same Service), applied in the operator's order, and none has an owner
    the garbage collector would look for. The Service is in it: the operator writes Serving
    after applying it, and a ClusterIP Service is the apiserver's slowest write of a fleet."""
    from specdecode import api
    from specdecode.control import state as cs
    from specdecode.render import workload as render

    k = fleet.steady_k()
    floor = fleet.floor_objects(3, k)
    assert [[o["kind"] for o in objects] for objects in floor] == [["Deployment", "Service"]] * 3
    assert [objects[0]["metadata"]["name"] for objects in floor] == ["svc-0000", "svc-0001", "svc-0002"]
    assert all(o["metadata"]["namespace"] == fleet.FLOOR_NAMESPACE for objects in floor for o in objects)
    assert not any("ownerReferences" in o["metadata"] for objects in floor for o in objects)
    # not the operator's: its Deployment handler must not take the floor's events for its own
    assert not any(C.LABEL_MANAGED_BY in o["metadata"]["labels"] for objects in floor for o in objects)
    assert C.LABEL_MANAGED_BY not in floor[0][0]["spec"]["template"]["metadata"]["labels"]
    service = api.parse_service(fleet.fleet_service(1, k))
    rendered = {o["kind"]: o for o in render.render_all(service, cs.choose(service.spec, None)[0], owner_uid="uid",
                                                        pod_monitor_served=False)}
    deployment, svc = floor[1]
    assert deployment["spec"]["template"]["spec"] == rendered["Deployment"]["spec"]["template"]["spec"]
    assert deployment["spec"]["selector"] == rendered["Deployment"]["spec"]["selector"]
    assert svc["spec"] == rendered["Service"]["spec"]


def test_every_kill_point_is_planned_and_the_plan_is_seeded():
    quick = faults.Plan.of(18, quick=True)
    assert sorted(quick.kills) == sorted(faults.KILL_POINTS)
    full = faults.Plan.of(18, quick=False)
    assert len(full.kills) == 20 and set(full.kills) == set(faults.KILL_POINTS)
    assert full == faults.Plan.of(18, quick=False) and full != faults.Plan.of(19, quick=False)
    assert set(crashpoints.POINTS) < set(faults.KILL_POINTS)


def _entry(t, action, from_k, to_k):
    return {"time": f"2026-12-01T00:00:{t:02d}Z", "action": action, "fromK": from_k, "toK": to_k, "applied": True}


def test_a_decision_repeated_from_a_stale_state_is_a_duplicate():
    history = [_entry(1, "disable", 3, None), _entry(5, "enable", None, 3), _entry(9, "set_k", 3, 4)]
    assert faults.duplicated(history) == 0
    assert faults.duplicated(history + [_entry(12, "set_k", 3, 4)]) == 1


def test_a_decision_seen_then_gone_is_lost_unless_the_bound_pushed_it_out():
    first, second = _entry(1, "disable", 3, None), _entry(5, "enable", None, 3)
    seen = {"svc-0": {faults.decision_key(e): e for e in (first, second)}}
    assert faults.lost(seen, {"svc-0": [first, second]}) == 0
    assert faults.lost(seen, {"svc-0": [first]}) == 1
    assert faults.lost(seen, {"svc-0": [second]}, bound=1) == 0


def test_extra_pod_starts_beyond_rollouts_and_the_benchs_own_deletions():
    assert faults.extra_pod_starts(2 * (1 + 3), replicas=2, rollouts=3, deployment_deletes=0, scaled_up=0) == 0
    assert faults.extra_pod_starts(2 * (1 + 3 + 1) + 2, 2, 3, 1, 2) == 0
    assert faults.extra_pod_starts(12, 2, 3, 0, 0) == 4


def _converged_objects():
    sds = {"metadata": {"name": "svc-0"}, "spec": {"replicas": 2},
           "status": {"phase": C.PHASE_SERVING, "speculation": {"configHash": "h1", "live": True},
                      "conditions": [{"type": C.COND_DEGRADED, "status": "False"},
                                     {"type": C.COND_METRICS_AVAILABLE, "status": "True"}]}}
    deployment = {"metadata": {"generation": 3, "labels": {C.LABEL_SERVICE: "svc-0"}},
                  "spec": {"replicas": 2, "template": {"metadata": {"labels": {C.LABEL_CONFIG_HASH: "h1"}}}},
                  "status": {"observedGeneration": 3, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2,
                             "availableReplicas": 2}}
    service = {"spec": {"ports": [{"name": "http", "port": 8000, "targetPort": "http"}]}}
    return sds, deployment, service


def test_converged_names_what_is_not():
    sds, deployment, service = _converged_objects()
    ports = faults.service_ports(service)
    assert faults.converged(sds, deployment, service, ports, need_metrics=True) is None
    scaled = {**deployment, "spec": {**deployment["spec"], "replicas": 4}}
    assert "replicas 4" in faults.converged(sds, scaled, service, ports)
    edited = {"spec": {"ports": [{"name": "http", "port": 8001, "targetPort": "http"}]}}
    assert "ports" in faults.converged(sds, deployment, edited, ports)
    assert faults.converged(sds, None, service, ports) == "no Deployment"
    stale = {**deployment, "spec": {**deployment["spec"], "template": {"metadata": {"labels": {C.LABEL_CONFIG_HASH: "h0"}}}}}
    assert "config h0" in faults.converged(sds, stale, service, ports)


def test_history_records_decisions_rollouts_and_pods_once():
    sds, deployment, _ = _converged_objects()
    sds["status"]["history"] = [_entry(1, "disable", 3, None)]
    pod = {"metadata": {"uid": "p1", "labels": {C.LABEL_SERVICE: "svc-0"}}}
    h = faults.History()
    h.observe(1.0, [sds], [deployment], [pod])
    h.observe(2.0, [sds], [deployment], [pod])
    assert len(h.seen["svc-0"]) == 1 and h.template_hashes["svc-0"] == [(1.0, "h1")] and h.pods["svc-0"] == {"p1"}


def test_fault_targets():
    figures = faults.FaultFigures(
        faults=[faults.FaultResult("operator SIGKILL", "mid-rollout", 8.0),
                faults.FaultResult("Service port edited", "", None, "Service ports ...")],
        kills=4, kill_points_reached={"mid-rollout": 1}, decisions=9, decisions_lost=0, decisions_duplicated=0,
        extra_pod_starts=0, changes_without_metrics=0, operator_exits=0, reconcile_interval_s=10.0, elapsed_s=600.0)
    verdicts = {t.name: t.holds for t in faults.fault_targets(figures)}
    assert verdicts["worst time to converge"] is False  # one fault never converged
    assert verdicts["decisions lost"] and verdicts["changes while metrics were missing"]


def test_the_fault_services_run_no_canary_experiments_so_the_figures_count_what_they_say():
    """Two replicas and maxSurge 1 would get a canary on every re-probe: pods and rollouts the
    fault figures (decisions, extra pod starts, convergence to spec.replicas) do not explain."""
    from specdecode import api

    spec = api.parse_spec(faults.service_manifest(0, "http://prometheus:9090")["spec"])
    assert spec.replicas == faults.REPLICAS == 2 and spec.rollout.max_surge == 1
    assert spec.autotune.experiments.enabled is False
