"""The evaluator's cost: one Prometheus read per tick whatever the number of services and
callers, and no status write for an evaluation that changes nothing a user or a restarted
operator reads.

The Kubernetes API and Prometheus are replaced here by in-memory stand-ins that count calls
(the e2e suite and `specdecode bench fleet` measure the same on the real parts)."""

from __future__ import annotations

import copy
import logging
import random
import threading
from collections import defaultdict
from datetime import datetime, timedelta, timezone

from specdecode import api, evaluation
from specdecode.control import metrics, perfmodel
from specdecode import status as st
from specdecode.shell.evaluator import Evaluator
from specdecode.control.metrics import ConfigKey
from specdecode.shell.settings import OperatorSettings
from specdecode.timestamps import rfc3339

from .test_policy import TRUTH, observe

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=timezone.utc)
WORKLOAD = perfmodel.Workload(4, 1000, 300, 0, 0.8)
ACCESS = metrics.PrometheusAccess(url="http://prometheus.test:9090")


class CountingReader:
    """A Prometheus reader that counts reads and can hold them open (a slow Prometheus)."""

    def __init__(self, snapshot=None, gate: threading.Event | None = None):
        self.reads: list[frozenset] = []
        self.lock = threading.Lock()
        self.snapshot = snapshot
        self.gate = gate

    def __call__(self, access):
        return self

    def read(self, scopes, at):
        with self.lock:
            self.reads.append(frozenset(scopes))
        if self.gate is not None:
            self.gate.wait(5)
        if self.snapshot is not None:
            return self.snapshot(scopes, at)
        return metrics.MetricsSnapshot(evaluated_at=at, observations={}, queries=0)


class FakeController:
    def __init__(self):
        self.locks = defaultdict(threading.RLock)
        self.reconciles = 0

    def lock_for(self, namespace, name):
        return self.locks[(namespace, name)]

    def reconcile(self, namespace, name):
        self.reconciles += 1


class FakeKube:
    """Holds one SpecDecodeService and counts the reads and writes the evaluator sends."""

    def __init__(self, body):
        self.body = body
        self.gets = 0
        self.status_writes = 0
        self.events: list[tuple] = []

    def get(self, api_version, kind, name, namespace):
        self.gets += 1
        return copy.deepcopy(self.body)

    def replace_status(self, obj, status):
        self.status_writes += 1
        self.body["status"] = copy.deepcopy(status)
        return self.body

    def post_event(self, owner, type_, reason, message, now):
        self.events.append((type_, reason, message))


def _scopes(n: int) -> tuple[metrics.QueryScope, ...]:
    return tuple(metrics.QueryScope.of(60.0 * (i + 1), {}) for i in range(n))


def _evaluator(reader, kube=None, clock=lambda: T0) -> Evaluator:
    return Evaluator(kube, FakeController(), OperatorSettings(evaluation_tick=5.0), clock=clock,
                     reader_factory=reader)


def _concurrently(count: int, call) -> list:
    results: list = [None] * count
    start = threading.Barrier(count)

    def run(i):
        start.wait()
        results[i] = call(i)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return results


def test_concurrent_misses_share_one_read():
    gate = threading.Event()
    reader = CountingReader(gate=gate)
    ev = _evaluator(reader)
    scopes = _scopes(2)
    at = T0.timestamp()
    threading.Timer(0.3, gate.set).start()  # the read is slow: every caller misses while it is in flight
    results = _concurrently(50, lambda i: ev._read(ACCESS, scopes, at + i * 0.01))
    assert len(reader.reads) == 1
    assert all(r is results[0] for r in results)


def test_one_read_per_tick_whatever_the_number_of_services():
    reader = CountingReader()
    ev = _evaluator(reader)
    scopes = _scopes(2)
    for tick in range(10):
        at = T0.timestamp() + tick * 5.0
        _concurrently(20, lambda i: ev._read(ACCESS, scopes, at + i * 0.1))
    assert len(reader.reads) == 10


def test_a_caller_with_a_new_scope_waits_then_reads_everything_once():
    gate = threading.Event()
    reader = CountingReader(gate=gate)
    ev = _evaluator(reader)
    a, b = _scopes(2)
    at = T0.timestamp()
    threading.Timer(0.3, gate.set).start()
    _concurrently(20, lambda i: ev._read(ACCESS, (a,) if i % 2 else (b,), at))
    # The first flight covers one scope; callers of the other wait for it and then read both:
    # two reads in all, never one per caller.
    assert len(reader.reads) <= 2
    assert reader.reads[-1] == frozenset({a, b})


def test_a_failed_read_is_retried_by_a_waiting_caller():
    calls = []

    class Flaky(CountingReader):
        def read(self, scopes, at):
            calls.append(at)
            if len(calls) == 1:
                raise RuntimeError("connection reset")
            return super().read(scopes, at)

    ev = _evaluator(Flaky())
    results = _concurrently(5, lambda i: _safe(lambda: ev._read(ACCESS, _scopes(1), T0.timestamp())))
    assert len(calls) == 2  # the failed read, then one retry shared by the rest
    assert sum(isinstance(r, metrics.MetricsSnapshot) for r in results) == 4


def _safe(call):
    try:
        return call()
    except RuntimeError as err:
        return err


# --------------------------------------------------------------------------- status writes


def _steady_service() -> tuple[dict, int]:
    best = perfmodel.best_config(TRUTH, WORKLOAD)
    spec = {"model": {"name": "m"}, "speculation": {"method": "draft_model", "draftModel": "d",
                                                     "numSpeculativeTokens": best},
            "autotune": {"mode": "Auto", "evaluationInterval": "30s"}}
    parsed = api.parse_spec(spec)
    status = api.SpecDecodeServiceStatus(
        phase="Serving", ready_replicas=1,
        speculation=api.EffectiveSpeculation(
            enabled=True, k=best, method="draft_model", since=rfc3339(T0 - timedelta(hours=2)),
            live_since=rfc3339(T0 - timedelta(hours=2)), config_hash="abc", live=True,
            spec_hash=st.declared_speculation_hash(parsed)))
    body = {"apiVersion": "serving.specdecode.io/v1alpha1", "kind": "SpecDecodeService",
            "metadata": {"namespace": "ns", "name": "llama", "generation": 1, "uid": "u"},
            "spec": spec, "status": status.to_wire()}
    return body, best


def _noisy_snapshots(k: int, seed: int = 3):
    rng = random.Random(seed)

    def snapshot(scopes, at):
        observations = {}
        for scope in scopes:
            alpha = 0.8 + rng.uniform(-0.005, 0.005)
            obs = observe(WORKLOAD, k, scope.window_s, alpha=alpha, rate_factor=1 + rng.uniform(-0.05, 0.05))
            observations[scope] = {ConfigKey("ns", "llama", "abc"): obs}
        return metrics.MetricsSnapshot(evaluated_at=at, observations=observations, queries=1)

    return snapshot


def test_a_steady_service_costs_no_status_writes():
    body, best = _steady_service()
    kube = FakeKube(body)
    now = [T0]
    ev = _evaluator(CountingReader(snapshot=_noisy_snapshots(best)), kube, clock=lambda: now[0])
    decisions = []
    for minute in range(60):
        for half in range(2):
            now[0] = T0 + timedelta(minutes=minute, seconds=30 * half)
            decision = ev.evaluate_if_due("ns", "llama")
            if decision is not None and decision.changes:
                decisions.append(decision)
    assert decisions == []
    # The first evaluation writes the observations and conditions; the next 119 say nothing new.
    assert kube.status_writes <= 2, kube.status_writes
    assert kube.events == []
    stored = kube.body["status"]
    assert abs(stored["observations"]["alpha"] - 0.8) < evaluation.ALPHA_WRITE_DELTA


def test_a_material_change_is_written():
    body, best = _steady_service()
    kube = FakeKube(body)
    now = [T0]
    shift = {"alpha": 0.8}

    def snapshot(scopes, at):
        observations = {scope: {ConfigKey("ns", "llama", "abc"): observe(WORKLOAD, best, scope.window_s, alpha=shift["alpha"])}
                        for scope in scopes}
        return metrics.MetricsSnapshot(evaluated_at=at, observations=observations, queries=1)

    ev = _evaluator(CountingReader(snapshot=snapshot), kube, clock=lambda: now[0])
    ev.evaluate_if_due("ns", "llama")
    written = kube.status_writes
    shift["alpha"] = 0.74  # acceptance fell by more than the noise band
    now[0] = T0 + timedelta(seconds=30)
    ev.evaluate_if_due("ns", "llama")
    assert kube.status_writes == written + 1
    assert kube.body["status"]["observations"]["alpha"] < 0.76


def test_a_restarted_operator_evaluates_from_the_stored_status():
    body, best = _steady_service()
    kube = FakeKube(body)
    now = [T0]
    reader = CountingReader(snapshot=_noisy_snapshots(best))
    first = _evaluator(reader, kube, clock=lambda: now[0])
    first.evaluate_if_due("ns", "llama")
    now[0] = T0 + timedelta(seconds=40)
    first.evaluate_if_due("ns", "llama")
    # A new process knows nothing in memory: it reads the last written evaluation time and
    # evaluates once at most early, and decides the same (hold) from the stored observations.
    now[0] = T0 + timedelta(seconds=45)
    restarted = _evaluator(reader, kube, clock=lambda: now[0])
    decision = restarted.evaluate_if_due("ns", "llama")
    assert decision is not None and not decision.changes
    assert restarted.evaluate_if_due("ns", "llama") is None  # not due again within the interval


def test_write_needed_ignores_numbers_in_messages_and_times():
    body, _ = _steady_service()
    stored = api.SpecDecodeServiceStatus.model_validate(body["status"])
    cond = st.set_condition([], "MetricsAvailable", True, "MetricsOK", "1200 drafts, 3s old", T0, 1)
    a = stored.model_copy(update={"conditions": cond})
    b = stored.model_copy(update={"conditions": st.set_condition(cond, "MetricsAvailable", True, "MetricsOK",
                                                                   "1300 drafts, 4s old", T0 + timedelta(minutes=1), 1)})
    assert not evaluation.status_write_needed(a, b)
    c = stored.model_copy(update={"conditions": st.set_condition(cond, "MetricsAvailable", False, "PrometheusUnreachable",
                                                                   "down", T0, 1)})
    assert evaluation.status_write_needed(a, c)


def test_ticks_that_are_not_due_do_not_read_the_service():
    body, best = _steady_service()
    kube = FakeKube(body)
    now = [T0]
    ev = _evaluator(CountingReader(snapshot=_noisy_snapshots(best)), kube, clock=lambda: now[0])
    evaluated = 0
    for tick in range(24):  # two minutes of 5 s ticks, evaluationInterval 30 s
        now[0] = T0 + timedelta(seconds=5 * tick)
        evaluated += ev.evaluate_if_due("ns", "llama", generation=1) is not None
    assert evaluated == 4 and kube.gets == 4
    # A new generation (the spec changed, maybe the interval) is read at once.
    now[0] += timedelta(seconds=5)
    ev.evaluate_if_due("ns", "llama", generation=2)
    assert kube.gets == 5


def _status_with_names(names: str | None) -> api.SpecDecodeServiceStatus:
    return api.SpecDecodeServiceStatus.model_validate({"observations": {"metricNames": names}} if names else {})


def test_the_spelling_found_is_logged_when_it_first_shows_and_when_it_changes(caplog):
    evaluator = Evaluator(kube=None, controller=None, settings=OperatorSettings())
    with caplog.at_level(logging.INFO, logger="specdecode.shell.evaluator"):
        evaluator._log_metric_names("team-a", "llama", _status_with_names(None), _status_with_names("vllm_"))
        evaluator._log_metric_names("team-a", "llama", _status_with_names("vllm_"), _status_with_names("vllm_"))
        evaluator._log_metric_names("team-a", "llama", _status_with_names("vllm_"), _status_with_names("vllm:"))
        evaluator._log_metric_names("team-a", "llama", _status_with_names("vllm:"), _status_with_names(None))
    assert [r.getMessage() for r in caplog.records] == [
        "team-a/llama: Prometheus stores vLLM's series as vllm_... (status.observations.metricNames)",
        "team-a/llama: Prometheus stores vLLM's series as vllm:... (status.observations.metricNames)",
    ]
