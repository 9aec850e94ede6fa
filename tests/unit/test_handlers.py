"""The kopf registrations: the operator's state in kopf's memo, and how each handler turns
what the controller and the evaluator raise into kopf's retry semantics and log lines. The
API is the in-memory stand-in (tests/unit/memory_kube.py); kopf itself runs in the e2e suite."""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import logging
import threading
from datetime import datetime, timezone

import kopf
import pytest
from kubernetes.client.exceptions import ApiException

from specdecode import constants as C
from specdecode.shell import handlers
from specdecode.shell.kube import Conflict
from specdecode.shell.settings import OperatorSettings

from ..spec_corpus import spec_with
from .memory_kube import MemoryKube


def _started(kube: MemoryKube, **settings) -> handlers.Memo:
    memo = handlers.Memo(OperatorSettings(**settings), kube_factory=lambda: kube)
    handlers.operator_startup(settings=kopf.OperatorSettings(), memo=memo, logger=logging.getLogger("test"))
    return memo


def _per_object(memo: handlers.Memo) -> handlers.Memo:
    """What kopf hands an object's handlers: a shallow copy of the operator's memo."""
    return copy.copy(memo)


def test_startup_configures_kopf_and_fills_the_memo():
    kube = MemoryKube()
    memo = handlers.Memo(OperatorSettings(peering_name="team-peering", namespaces=["team-a"]), kube_factory=lambda: kube)
    settings = kopf.OperatorSettings()
    handlers.operator_startup(settings=settings, memo=memo, logger=logging.getLogger("test"))
    assert settings.peering.name == "team-peering" and settings.peering.clusterwide is False
    assert settings.persistence.finalizer == C.KOPF_FINALIZER
    assert settings.posting.level == logging.WARNING
    assert memo.controller.kube is kube and memo.evaluator.kube is kube and memo.evaluator.controller is memo.controller


class _NotCopyable:
    def __deepcopy__(self, memo):
        raise AssertionError("the essence deep-copied status or managedFields")


def test_kopfs_change_detection_digests_spec_labels_and_annotations_without_copying_status():
    """kopf builds the essence on every watch event of every service: it must not deep-copy
    status (its history) or managedFields, and the digest must stay what it was, or every
    service would look changed to an upgraded operator and be reconciled at once."""
    storage = handlers.DigestDiffBaseStorage(prefix=C.ANNOTATION_PREFIX, key="last-handled-configuration")
    body = {
        "apiVersion": f"{C.GROUP}/{C.VERSION}", "kind": C.KIND,
        "metadata": {"name": "llama", "namespace": "team-a", "resourceVersion": "7", "labels": {"team": "a"},
                     "annotations": {"note": "x", f"{C.ANNOTATION_PREFIX}/last-handled-configuration": "{}"},
                     "managedFields": [_NotCopyable()]},
        "spec": spec_with({}),
        "status": {"history": [_NotCopyable()]},
    }
    digest = storage.build(body=kopf.Body(body))
    plain = {key: value for key, value in body.items() if key != "status"}
    plain["metadata"] = {key: value for key, value in body["metadata"].items() if key != "managedFields"}
    stock = kopf.AnnotationsDiffBaseStorage(prefix=C.ANNOTATION_PREFIX).build(body=kopf.Body(plain))
    assert digest == {"digest": hashlib.sha256(json.dumps(stock, sort_keys=True, separators=(",", ":"),
                                                          default=str).encode()).hexdigest()}
    relabelled = dict(body, metadata=dict(body["metadata"], labels={"team": "b"}))
    assert storage.build(body=kopf.Body(relabelled)) != digest
    restatused = dict(body, status={"phase": "Serving"}, metadata=dict(body["metadata"], resourceVersion="8"))
    assert storage.build(body=kopf.Body(restatused)) == digest


def _kopf_pass(storage: handlers.HeldDiffBaseStorage, body: dict) -> tuple[object, object, dict]:
    """What kopf does with the diff-base on one watch event: fetch the stored one, build the
    new one, store it after the handlers; returns (old, new, the patch it would send)."""
    from kopf._cogs.structs.patches import Patch

    kopf_body, patch = kopf.Body(body), Patch()
    old, new = storage.fetch(body=kopf_body), storage.build(body=kopf_body)
    if old != new:
        storage.store(body=kopf_body, patch=patch, essence=new)
    return old, new, dict(patch)


def test_kopf_keeps_its_last_handled_state_in_the_operator_not_in_a_write_to_the_service():
    """kopf patched its diff-base into each service after every handled change: a write per
    new service (500 of the 3,800 the operator made while 500 services came up) and per spec
    edit. Held in the process, a handled service costs kopf no write, an edit is still seen
    as one, and the annotation an older operator left goes with kopf's next write."""
    storage = handlers.HeldDiffBaseStorage(prefix=C.ANNOTATION_PREFIX, key=handlers.DIFFBASE_KEY)
    body = {"apiVersion": C.API_VERSION, "kind": C.KIND,
            "metadata": {"name": "llama", "namespace": "team-a", "uid": "uid-1", "resourceVersion": "7"},
            "spec": spec_with({})}

    old, new, patch = _kopf_pass(storage, body)
    assert old is None and patch == {}  # new to kopf (create), and nothing written for it
    old, _, patch = _kopf_pass(storage, dict(body, status={"phase": "Serving"}))
    assert old == new and patch == {}  # a status write is no change
    edited = dict(body, spec=spec_with({"replicas": 3}))
    old, newer, patch = _kopf_pass(storage, edited)
    assert old == new != newer and patch == {}  # an edit is one, still with no write

    recreated = dict(body, metadata=dict(body["metadata"], uid="uid-2"))
    assert _kopf_pass(storage, recreated)[0] is None  # the same name again is a new service

    legacy_key = f"{C.ANNOTATION_PREFIX}/{handlers.DIFFBASE_KEY}"
    upgraded = dict(body, metadata=dict(body["metadata"], uid="uid-3", annotations={legacy_key: "{}", "note": "x"}))
    _, _, patch = _kopf_pass(storage, upgraded)
    assert patch == {"metadata": {"annotations": {legacy_key: None}}}

    deleting = dict(edited, metadata=dict(body["metadata"], deletionTimestamp="2026-12-03T06:00:00Z"))
    _kopf_pass(storage, deleting)
    assert storage.held() == 2  # uid-1 dropped as its deletion is seen; uid-2 and uid-3 remain


def test_a_handler_that_succeeds_at_once_leaves_kopf_nothing_to_write():
    """kopf stores a handler's progress and, once every handler succeeded, purges it in the
    same patch: with the digest held in memory that patch must come out empty (kopf's branding
    marker alone kept it, a write to every new service), while a handler that failed keeps
    its progress for its retry, through a restart too."""
    from kopf._cogs.structs.patches import Patch

    settings = kopf.OperatorSettings()
    handlers.operator_startup(settings=settings, memo=handlers.Memo(OperatorSettings(), kube_factory=MemoryKube),
                              logger=logging.getLogger("test"))
    storage = settings.persistence.progress_storage
    body = kopf.Body({"metadata": {"name": "llama", "namespace": "team-a", "uid": "uid-1"}})
    succeeded, patch = {"started": "2026-12-03T06:00:00Z", "success": True, "retries": 1}, Patch()
    storage.store(key="sds_create", record=succeeded, body=body, patch=patch)
    storage.purge(key="sds_create", body=body, patch=patch)
    assert dict(patch) == {}

    failed, patch = {"started": "2026-12-03T06:00:00Z", "failure": False, "retries": 1, "delay": 1.0}, Patch()
    storage.store(key="sds_create", record=failed, body=body, patch=patch)
    [kept] = patch["metadata"]["annotations"]
    assert kept.startswith(C.ANNOTATION_PREFIX) and storage.fetch(
        key="sds_create", body=kopf.Body({"metadata": {"annotations": dict(patch["metadata"]["annotations"])}}))


def test_a_service_with_a_status_gets_a_full_pass_from_the_create_handler():
    """A restarted operator holds no diff-bases, so kopf calls every existing service new:
    the create handler must then read the children as a resume would, not apply blind."""
    kube = MemoryKube()
    kube.create_service(spec_with({}))
    memo = _started(kube)
    handlers.sds_create(body=kube.service(), namespace="team-a", name="llama", memo=_per_object(memo), retry=0)
    assert kube.reads == 0  # new: applied without a read
    assert kube.service()["status"]["phase"] == "Progressing"

    applied, events = list(kube.writes.applied), list(kube.writes.events)
    restarted = _started(kube)
    handlers.sds_create(body=kube.service(), namespace="team-a", name="llama", memo=_per_object(restarted), retry=0)
    assert ("get", "Deployment") in kube.read_log  # read, found as rendered:
    assert kube.writes.applied == applied and kube.writes.events == events  # nothing applied or posted again


@pytest.mark.parametrize("pass_seconds", [1.0, 30.0])
def test_a_service_deleted_while_its_timers_are_mid_pass_is_released_within_seconds(pass_seconds):
    """kopf holds the finalizer of a deleted service (and so its children, which the garbage
    collector takes only after it) until the service's timers exit, and a timer exits when the
    pass it is running ends. With kopf's defaults it looked again a minute later: `kubectl
    delete` and the Deployment's collection waited a minute whenever a deletion caught a pass.
    Here kopf's own stopping code runs on the operator's settings and timers: a pass that ends
    soon releases the service at once, a long one is looked at again within seconds."""
    from kopf._core.engines import daemons
    from kopf._core.intents import stoppers
    from kopf._core.intents.handlers import TimerHandler

    settings = kopf.OperatorSettings()
    handlers.operator_startup(settings=settings, memo=handlers.Memo(OperatorSettings(), kube_factory=MemoryKube),
                              logger=logging.getLogger("test"))
    registry = handlers.register(kopf.OperatorRegistry(), OperatorSettings())
    timers = [h for h in registry._spawning.get_all_handlers() if isinstance(h, TimerHandler)]
    assert {t.fn for t in timers} == {handlers.sds_timer, handlers.sds_evaluate}

    async def delete_mid_pass() -> tuple[float, list[float]]:
        loop = asyncio.get_running_loop()
        running = {timer.id: daemons.Daemon(task=asyncio.create_task(asyncio.sleep(pass_seconds)),
                                            logger=logging.getLogger("test"), handler=timer,
                                            stopper=stoppers.DaemonStopper())
                   for timer in timers}
        started = loop.time()
        delays = list(await daemons.stop_daemons(settings=settings, daemons=running))
        waited = loop.time() - started
        for daemon in running.values():
            daemon.task.cancel()
        return waited, delays

    waited, delays = asyncio.run(delete_mid_pass())
    if pass_seconds < handlers.TIMER_EXIT_WAIT_S:
        assert delays == [] and waited < pass_seconds + 1  # released as the pass ends
    else:
        # kopf waits for each timer in turn, then looks again; its default: another look in 60 s.
        assert delays and waited + max(delays) < 10


def test_each_object_shares_the_controller_and_keeps_its_own_evaluation_memory():
    memo = _started(MemoryKube())
    a, b = _per_object(memo), _per_object(memo)
    assert a.controller is b.controller is memo.controller and a.evaluator is memo.evaluator
    assert a.service_memory() is a.service_memory()
    assert a.service_memory() is not b.service_memory() and memo.service is None


def test_handlers_before_startup_ask_kopf_to_retry():
    memo = handlers.Memo(OperatorSettings())
    with pytest.raises(kopf.TemporaryError, match="still starting"):
        handlers.sds_reconcile(body={"metadata": {}}, namespace="team-a", name="llama", memo=_per_object(memo),
                               retry=0)


def test_a_reconcile_creates_the_children_through_the_memo():
    kube = MemoryKube()
    kube.create_service(spec_with({}))
    handlers.sds_reconcile(body=kube.service(), namespace="team-a", name="llama", memo=_per_object(_started(kube)),
                           retry=0)
    assert kube.get("apps/v1", "Deployment", "llama", "team-a") is not None
    assert kube.service()["status"]["phase"] == "Progressing"


class _DeploymentForbidden(MemoryKube):
    def get(self, api_version, kind, name, namespace):
        if kind == "Deployment":
            raise ApiException(status=403, reason="Forbidden")
        return super().get(api_version, kind, name, namespace)


def test_a_child_that_cannot_be_written_is_reported_in_status_and_retried():
    kube = _DeploymentForbidden()
    kube.create_service(spec_with({}))
    with pytest.raises(kopf.TemporaryError, match=r"some children could not be written .* retry 3 in"):
        handlers.sds_reconcile(body=kube.service(), namespace="team-a", name="llama",
                               memo=_per_object(_started(kube)), retry=2)
    degraded = next(c for c in kube.service()["status"]["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and "applying Deployment failed: 403 Forbidden" in degraded["message"]


class _Down(MemoryKube):
    def get(self, api_version, kind, name, namespace):
        raise ApiException(status=403, reason="Forbidden")


def test_a_forbidden_read_of_the_service_logs_the_fix(caplog):
    memo = _per_object(_started(_Down()))
    with caplog.at_level(logging.ERROR, logger="specdecode.shell.handlers"):
        with pytest.raises(kopf.TemporaryError, match=r"reconcile failed \(403 Forbidden\); retry 1 in"):
            handlers.sds_reconcile(body={"metadata": {"namespace": "team-a", "name": "llama"}}, namespace="team-a",
                                   name="llama", memo=memo, retry=0)
    [record] = caplog.records
    assert "ClusterRole" in record.getMessage() and "manifests/base/rbac.yaml" in record.getMessage()


def test_a_deployment_event_reconciles_its_service_and_never_raises(caplog):
    kube = MemoryKube()
    kube.create_service(spec_with({}))
    memo = _started(kube)
    handlers.deployment_event(type="MODIFIED", body={}, namespace="team-a", labels={C.LABEL_SERVICE: "llama"},
                              memo=_per_object(memo))
    assert kube.service()["status"]["phase"] == "Progressing"
    down = _started(_Down())
    with caplog.at_level(logging.WARNING, logger="specdecode.shell.handlers"):
        handlers.deployment_event(type="MODIFIED", body={}, namespace="team-a", labels={C.LABEL_SERVICE: "llama"},
                                  memo=_per_object(down))
    assert any("team-a/llama: reconcile failed (403 Forbidden)" in r.getMessage() for r in caplog.records)


class _Raising:
    """An evaluator that fails as the API can make it fail, and notes what it was given."""

    def __init__(self, error):
        self.error, self.calls, self.threads = error, [], []
        self.clock = lambda: datetime.now(timezone.utc)

    def evaluate_if_due(self, body, memory):
        self.calls.append((body, memory))
        self.threads.append(threading.current_thread().name)
        if self.error:
            raise self.error


@pytest.mark.parametrize("error, delay, message", [
    (Conflict("team-a/llama changed while its status was computed"), 1, "changed while its status was computed"),
    (ApiException(status=503, reason="Service Unavailable"), None, r"evaluation failed \(503 Service Unavailable\); retry 1 in"),
])
def test_a_failed_evaluation_is_retried_by_kopf(error, delay, message):
    obj = _per_object(_started(MemoryKube()))
    obj.evaluator = _Raising(error)
    with pytest.raises(kopf.TemporaryError, match=message) as raised:
        asyncio.run(handlers.sds_evaluate(body={"metadata": {}}, memo=obj, retry=0))
    assert delay is None or raised.value.delay == delay


def test_each_tick_evaluates_the_object_kopf_passes_with_the_objects_own_memory():
    obj = _per_object(_started(MemoryKube()))
    evaluator = obj.evaluator = _Raising(None)
    bodies = [{"metadata": {"generation": 1}}, {"metadata": {"generation": 2}}]
    for body in bodies:
        asyncio.run(handlers.sds_evaluate(body=body, memo=obj, retry=0))
    # in the evaluations' own threads, not kopf's (waiting evaluations held all of kopf's)
    assert [b for b, _ in evaluator.calls] == bodies
    assert all(name.startswith("evaluate") for name in evaluator.threads)
    assert evaluator.calls[0][1] is evaluator.calls[1][1] is obj.service


def test_a_tick_before_the_service_is_due_is_answered_without_a_thread():
    obj = _per_object(_started(MemoryKube()))
    evaluator = obj.evaluator = _Raising(None)
    obj.service_memory().quiet_until(1, evaluator.clock().timestamp() + 30)
    asyncio.run(handlers.sds_evaluate(body={"metadata": {"generation": 1}}, memo=obj, retry=0))
    assert evaluator.calls == []
    asyncio.run(handlers.sds_evaluate(body={"metadata": {"generation": 2}}, memo=obj, retry=0))  # a spec edit
    assert len(evaluator.calls) == 1


def test_the_periodic_pass_reconciles_in_the_repairs_own_threads():
    """Not in kopf's: at N=500 the timers held all of kopf's threads while the Deployment
    events that turn new services Serving waited."""
    obj = _per_object(_started(MemoryKube()))
    threads = []

    class Recording:
        def follow(self, body):
            pass

        def reconcile(self, namespace, name, children=None):
            threads.append((namespace, name, threading.current_thread().name))
            return "ok"

    obj.controller = Recording()
    asyncio.run(handlers.sds_timer(body={"metadata": {}}, namespace="team-a", name="llama", memo=obj, retry=0))
    [(namespace, name, thread)] = threads
    assert (namespace, name) == ("team-a", "llama") and thread.startswith("repair")
