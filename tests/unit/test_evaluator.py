"""The evaluator's cost: one Prometheus read per tick whatever the number of services and
callers, no API read per tick, and no status write for an evaluation that changes nothing a
user or a restarted operator reads; and what an evaluation writes (status, Events, a
re-render) when it does change something, including after an operator restart.

The Kubernetes API and Prometheus are replaced here by in-memory stand-ins that count calls
(the e2e suite and `specdecode bench fleet` measure the same on the real parts)."""

from __future__ import annotations

import logging
import random
import threading
from collections import defaultdict
from datetime import datetime, timedelta, timezone

import pytest

from specdecode import api
from specdecode import constants as C
from specdecode.control import evaluation, metrics, perfmodel
from specdecode.control import status as st
from specdecode.shell.evaluator import Evaluator, ServiceMemory, next_schedule
from specdecode.shell.kube import Conflict
from specdecode.control.metrics import ConfigKey
from specdecode.shell.settings import OperatorSettings
from specdecode.timestamps import rfc3339

from .memory_kube import MemoryKube
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


def test_a_new_ticks_read_drops_the_models_memos_and_a_cached_read_keeps_them():
    """The memos hold the last tick's measurements, which no later evaluation asks for: an
    operator that kept them grew to their bound (tens of MB) whatever the fleet."""
    from specdecode.control import memo, perfmodel

    ev = _evaluator(CountingReader())
    scopes = _scopes(1)
    params = perfmodel.EngineParams.for_method("draft_model", {"replicas": 1, "min_k": 1, "max_k": 4})
    perfmodel.best_config(params, perfmodel.Workload(request_rate=2.0, prompt_tokens=900, output_tokens=250,
                                                     acceptance=0.7))
    ev._read(ACCESS, scopes, T0.timestamp())
    assert memo.entries() == 0
    perfmodel.best_config(params, perfmodel.Workload(request_rate=2.0, prompt_tokens=900, output_tokens=250,
                                                     acceptance=0.7))
    held = memo.entries()
    assert held > 0
    ev._read(ACCESS, scopes, T0.timestamp() + 1.0)  # the same tick: served from the cached read
    assert memo.entries() == held


def test_a_read_slower_than_a_tick_serves_the_tick_after_it_finished():
    """A read of a large fleet takes longer than the tick: evaluations that come due just
    after it finished use it instead of each starting another (one read every tick or so,
    not one per handful of evaluations)."""
    clock = {"now": T0.timestamp()}

    def slow(scopes, at):
        clock["now"] += 8.0  # the read takes 8 s of a 5 s tick
        return metrics.MetricsSnapshot(evaluated_at=at, observations={}, queries=0)

    reader = CountingReader(snapshot=slow)
    ev = _evaluator(reader, clock=lambda: datetime.fromtimestamp(clock["now"], tz=timezone.utc))
    scopes = _scopes(1)
    ev._read(ACCESS, scopes, T0.timestamp())
    for later in (0.5, 2.0, 4.5):  # due after the read finished at T0 + 8 s
        ev._read(ACCESS, scopes, T0.timestamp() + 8.0 + later)
    assert len(reader.reads) == 1
    ev._read(ACCESS, scopes, T0.timestamp() + 8.0 + 5.0)
    assert len(reader.reads) == 2


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


def _steady_service(mode: str = "Auto") -> tuple[dict, int]:
    best = perfmodel.best_config(TRUTH, WORKLOAD)
    spec = {"model": {"name": "m"}, "speculation": {"method": "draft_model", "draftModel": "d",
                                                     "numSpeculativeTokens": best},
            "autotune": {"mode": mode, "evaluationInterval": "30s"},
            # A surge pod keeps the one replica serving through a change (no outage to hold it).
            "rollout": {"maxSurge": 1, "maxUnavailable": 0}}
    parsed = api.parse_spec(spec)
    status = api.SpecDecodeServiceStatus(
        phase="Serving", ready_replicas=1,
        speculation=api.EffectiveSpeculation(
            enabled=True, k=best, method="draft_model", since=rfc3339(T0 - timedelta(hours=2)),
            live_since=rfc3339(T0 - timedelta(hours=2)), config_hash="abc", live=True,
            spec_hash=st.declared_speculation_hash(parsed)))
    return {"spec": spec, "status": status.to_wire()}, best


def _kube(service: dict) -> MemoryKube:
    kube = MemoryKube()
    kube.create_service(service["spec"], name="llama", namespace="ns", status=service["status"])
    return kube


def _tick(ev: Evaluator, kube: MemoryKube, memory: ServiceMemory):
    """One timer tick: kopf hands over the object as it last saw it."""
    return ev.evaluate_if_due(kube.service("llama", "ns"), memory)


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
    service, best = _steady_service()
    kube = _kube(service)
    now = [T0]
    ev, memory = _evaluator(CountingReader(snapshot=_noisy_snapshots(best)), kube, clock=lambda: now[0]), ServiceMemory()
    decisions = []
    for minute in range(60):
        for half in range(2):
            now[0] = T0 + timedelta(minutes=minute, seconds=30 * half)
            decision = _tick(ev, kube, memory)
            if decision is not None and decision.changes:
                decisions.append(decision)
    assert decisions == []
    # The first evaluation writes the observations and conditions; the next 119 say nothing new.
    assert len(kube.writes.status) <= 2, kube.writes.status
    assert kube.writes.events == []
    assert kube.reads == 0  # every tick works on the object kopf passes
    stored = kube.service("llama", "ns")["status"]
    assert abs(stored["observations"]["alpha"] - 0.8) < evaluation.ALPHA_WRITE_DELTA


def test_a_material_change_is_written():
    service, best = _steady_service()
    kube = _kube(service)
    now = [T0]
    shift = {"alpha": 0.8}

    def snapshot(scopes, at):
        observations = {scope: {ConfigKey("ns", "llama", "abc"): observe(WORKLOAD, best, scope.window_s, alpha=shift["alpha"])}
                        for scope in scopes}
        return metrics.MetricsSnapshot(evaluated_at=at, observations=observations, queries=1)

    ev, memory = _evaluator(CountingReader(snapshot=snapshot), kube, clock=lambda: now[0]), ServiceMemory()
    _tick(ev, kube, memory)
    written = len(kube.writes.status)
    shift["alpha"] = 0.74  # acceptance fell by more than the noise band
    now[0] = T0 + timedelta(seconds=30)
    _tick(ev, kube, memory)
    assert len(kube.writes.status) == written + 1
    assert kube.service("llama", "ns")["status"]["observations"]["alpha"] < 0.76


def test_a_restarted_operator_evaluates_at_its_first_tick_and_decides_the_same():
    """No status field says when the last evaluation was (status moves only materially), so a
    new process evaluates at once: the policy's pacing comes from status, so it decides what
    the old process would have decided then; after that it keeps the interval."""
    service, best = _steady_service()
    kube = _kube(service)
    now = [T0]
    reader = CountingReader(snapshot=_noisy_snapshots(best))
    first, memory = _evaluator(reader, kube, clock=lambda: now[0]), ServiceMemory()
    _tick(first, kube, memory)
    now[0] = T0 + timedelta(seconds=30)
    before = _tick(first, kube, memory)
    # The old process would wait until T0+60s; a new one (empty memory) evaluates at T0+35s.
    now[0] = T0 + timedelta(seconds=35)
    assert _tick(first, kube, memory) is None
    restarted, fresh = _evaluator(reader, kube, clock=lambda: now[0]), ServiceMemory()
    after = _tick(restarted, kube, fresh)
    assert after is not None
    assert (after.action, after.enabled, after.k, after.rule) == (before.action, before.enabled, before.k, before.rule)
    for seconds in (40, 60):
        now[0] = T0 + timedelta(seconds=seconds)
        assert _tick(restarted, kube, fresh) is None  # within the interval of its own evaluation
    now[0] = T0 + timedelta(seconds=65)
    assert _tick(restarted, kube, fresh) is not None


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


def test_ticks_that_are_not_due_cost_no_read_and_a_new_generation_is_looked_at_once():
    service, best = _steady_service()
    kube = _kube(service)
    now = [T0]
    reader = CountingReader(snapshot=_noisy_snapshots(best))
    ev, memory = _evaluator(reader, kube, clock=lambda: now[0]), ServiceMemory()
    evaluated = 0
    for tick in range(24):  # two minutes of 5 s ticks, evaluationInterval 30 s
        now[0] = T0 + timedelta(seconds=5 * tick)
        evaluated += _tick(ev, kube, memory) is not None
    assert evaluated == 4 and kube.reads == 0
    # The spec changed (a new generation): its shorter interval holds from the next tick.
    kube.edit_spec({"autotune": {"mode": "Auto", "evaluationInterval": "10s"}}, "llama", "ns")
    now[0] += timedelta(seconds=5)  # T0+120s, 30 s after the last evaluation
    assert _tick(ev, kube, memory) is not None
    now[0] += timedelta(seconds=5)
    assert _tick(ev, kube, memory) is None
    now[0] += timedelta(seconds=5)
    assert _tick(ev, kube, memory) is not None


def test_late_ticks_keep_the_evaluation_interval_on_average_and_never_bunch():
    """kopf fires a timer a tick after its last handler ended: on a busy event loop every
    tick comes late. Evaluations keep the evaluationInterval (30 s) on average all the same,
    not an interval plus a tick's lateness (at 500 services: 753 a minute of the 1,000 due),
    and none follows another by much less than the interval."""
    service, best = _steady_service()
    kube = _kube(service)
    now = [T0]
    ev, memory = _evaluator(CountingReader(snapshot=_noisy_snapshots(best)), kube, clock=lambda: now[0]), ServiceMemory()
    period_s, minutes = 5.8, 20  # 5 s ticks, each 0.8 s late
    evaluated_at = []
    for tick in range(int(minutes * 60 / period_s)):
        now[0] = T0 + timedelta(seconds=tick * period_s)
        if _tick(ev, kube, memory) is not None:
            evaluated_at.append(tick * period_s)
    assert len(evaluated_at) >= minutes * 2 - 1, evaluated_at  # dated from when they ran: 35
    gaps = [b - a for a, b in zip(evaluated_at, evaluated_at[1:])]
    assert min(gaps) >= 30 - 2 * 5.0, gaps


def test_a_short_interval_is_kept_on_average_and_never_halved():
    """With an evaluationInterval of a few ticks (5 s against 2 s ticks, each a little late),
    evaluations keep the interval on average, none closer than half of it."""
    service, best = _steady_service()
    service["spec"]["autotune"]["evaluationInterval"] = "5s"
    kube = _kube(service)
    now = [T0]
    ev = Evaluator(kube, FakeController(), OperatorSettings(evaluation_tick=2.0), clock=lambda: now[0],
                   reader_factory=CountingReader(snapshot=_noisy_snapshots(best)))
    memory, period_s, evaluated_at = ServiceMemory(), 2.1, []
    for tick in range(int(600 / period_s)):
        now[0] = T0 + timedelta(seconds=tick * period_s)
        if _tick(ev, kube, memory) is not None:
            evaluated_at.append(tick * period_s)
    gaps = [b - a for a, b in zip(evaluated_at, evaluated_at[1:])]
    assert 4.9 <= sum(gaps) / len(gaps) <= 5.3, sum(gaps) / len(gaps)  # dated from when they ran: 6.3
    assert min(gaps) >= 2.5, gaps


@pytest.mark.parametrize("late_s, counts_from", [(1.0, "due"), (2.4, "due"), (2.6, "now"), (9.0, "now")])
def test_an_evaluation_late_by_more_than_half_an_interval_starts_the_schedule_again(late_s, counts_from):
    """Interval 5 s, ticks of 2 s: two ticks late would be 4 s, but a late evaluation counted
    from when it was due would be followed by another within a second."""
    due = 100.0 + 5.0
    scheduled = next_schedule(100.0, due + late_s, interval=5.0, tick=2.0)
    assert scheduled == (due if counts_from == "due" else due + late_s)
    assert scheduled + 5.0 - (due + late_s) >= 2.5


def test_an_evaluation_more_than_two_ticks_late_starts_the_schedule_again():
    """After a pause (kopf's peering, a process restarted) the next evaluation is one interval
    after the late one, not a burst to catch up on the ones missed."""
    service, best = _steady_service()
    kube = _kube(service)
    now = [T0]
    ev, memory = _evaluator(CountingReader(snapshot=_noisy_snapshots(best)), kube, clock=lambda: now[0]), ServiceMemory()
    assert _tick(ev, kube, memory) is not None
    now[0] = T0 + timedelta(seconds=95)  # due at 30 s; paused until 95 s
    assert _tick(ev, kube, memory) is not None
    for seconds in (100, 105, 120):
        now[0] = T0 + timedelta(seconds=seconds)
        assert _tick(ev, kube, memory) is None
    now[0] = T0 + timedelta(seconds=125)
    assert _tick(ev, kube, memory) is not None


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


# ------------------------------------------------------- what an evaluation writes, and when


def _snapshots(k: int, alpha: dict):
    def snapshot(scopes, at):
        return metrics.MetricsSnapshot(evaluated_at=at, queries=1, observations={
            scope: {ConfigKey("ns", "llama", "abc"): observe(WORKLOAD, k, scope.window_s, alpha=alpha["alpha"])}
            for scope in scopes})
    return snapshot


def _collapsed(mode: str):
    service, best = _steady_service(mode)
    kube = _kube(service)
    controller = FakeController()
    ev = Evaluator(kube, controller, OperatorSettings(evaluation_tick=5.0), clock=lambda: T0,
                   reader_factory=CountingReader(snapshot=_snapshots(best, {"alpha": 0.1})))
    return kube, controller, ev


def test_auto_turns_a_collapsed_speculation_off_says_so_and_rerenders():
    kube, controller, ev = _collapsed("Auto")
    decision = _tick(ev, kube, ServiceMemory())
    assert decision.applied and not decision.enabled
    status = kube.service("llama", "ns")["status"]
    assert status["speculation"]["enabled"] is False and status["speculation"]["live"] is False
    assert status["history"][-1]["action"] == "disable"
    [(type_, reason, message)] = kube.writes.events
    assert (type_, reason) == ("Warning", C.EVENT_SPECULATION_CHANGED) and message.startswith("disable:")
    assert controller.reconciles == 1


def test_recommend_reports_the_advice_once_and_changes_nothing():
    kube, controller, ev = _collapsed("Recommend")
    memory = ServiceMemory()
    before = kube.service("llama", "ns")["status"]["speculation"]
    decision = _tick(ev, kube, memory)
    assert decision.changes and not decision.applied
    status = kube.service("llama", "ns")["status"]
    # The speculation runs as it did; only the collapse guard's evidence is remembered with it.
    assert {k: v for k, v in status["speculation"].items() if k != "belowFloorSince"} == before
    assert status["speculation"]["belowFloorSince"]
    assert (status["recommendation"]["action"], status["recommendation"]["enabled"]) == ("disable", False)
    [(type_, reason, message)] = kube.writes.events
    assert (type_, reason) == ("Normal", C.EVENT_RECOMMENDATION) and message.startswith("recommend disable:")
    assert controller.reconciles == 0
    # The same advice at the next evaluation is news to nobody: no write, no Event.
    writes = kube.writes.count()
    ev.clock = lambda: T0 + timedelta(seconds=30)
    assert _tick(ev, kube, memory) is not None
    assert kube.writes.count() == writes


def test_a_status_write_that_conflicts_is_evaluated_again_with_the_newer_object():
    kube, controller, ev = _collapsed("Auto")
    memory = ServiceMemory()
    stale = kube.service("llama", "ns")
    kube.set_child_status(C.API_VERSION, C.KIND, "llama", "ns", stale["status"])  # written since kopf saw it
    with pytest.raises(Conflict):
        ev.evaluate_if_due(stale, memory)
    assert kube.writes.count() == 0 and controller.reconciles == 0
    # kopf retries the timer a second later with the object it has now.
    decision = _tick(ev, kube, memory)
    assert decision.applied and kube.service("llama", "ns")["status"]["speculation"]["enabled"] is False
    assert controller.reconciles == 1


def test_autotune_off_reads_no_metrics_and_drops_the_services_evaluation_series():
    from prometheus_client import REGISTRY

    service, best = _steady_service("Auto")
    kube = _kube(service)
    now = [T0]
    reader = CountingReader(snapshot=_noisy_snapshots(best))
    ev, memory = _evaluator(reader, kube, clock=lambda: now[0]), ServiceMemory()
    _tick(ev, kube, memory)
    labels = {"namespace": "ns", "specdecode_service": "llama"}
    assert REGISTRY.get_sample_value("specdecode_metrics_available", labels) == 1
    kube.edit_spec({"autotune": {"mode": "Off", "evaluationInterval": "30s"}}, "llama", "ns")
    for seconds in (5, 40, 80):
        now[0] = T0 + timedelta(seconds=seconds)
        assert _tick(ev, kube, memory) is None
    assert len(reader.reads) == 1
    assert REGISTRY.get_sample_value("specdecode_metrics_available", labels) is None
    assert REGISTRY.get_sample_value("specdecode_acceptance_floor", labels) is None


def test_a_service_being_deleted_is_not_evaluated():
    service, best = _steady_service()
    kube = _kube(service)
    reader = CountingReader(snapshot=_noisy_snapshots(best))
    body = kube.service("llama", "ns")
    body["metadata"]["deletionTimestamp"] = rfc3339(T0)
    assert _evaluator(reader, kube).evaluate_if_due(body, ServiceMemory()) is None
    assert reader.reads == [] and kube.writes.count() == 0


# --------------------------------------------------------------------------- canary experiments


def test_a_reprobe_runs_on_a_canary_read_from_the_same_prometheus_read_and_is_counted_once_written():
    """Speculation off for two hours on three replicas: the re-probe starts a canary experiment
    (a reconcile creates the canary), each window reads the canary's own config hash from the
    same batched read, and the promotion is written, rerendered and counted by its verdict."""
    from prometheus_client import REGISTRY

    spec = {"model": {"name": "/models/m"}, "speculation": {"method": "draft_model", "draftModel": "/models/d",
                                                              "numSpeculativeTokens": 3},
            "replicas": 3, "autotune": {"evaluationInterval": "60s"}}
    parsed = api.parse_spec(spec)
    status = api.SpecDecodeServiceStatus(
        phase="Serving", ready_replicas=3,
        speculation=api.EffectiveSpeculation(
            enabled=False, method="draft_model", since=rfc3339(T0 - timedelta(hours=2)),
            live_since=rfc3339(T0 - timedelta(hours=2)), config_hash="abc", live=True, cause="Policy",
            spec_hash=st.declared_speculation_hash(parsed)))
    kube = _kube({"spec": spec, "status": status.to_wire()})
    rng = random.Random(5)
    canary_reads = []

    def snapshot(scopes, at):
        stored = kube.service("llama", "ns")["status"]
        running = [e for e in stored.get("experiments", []) if e["verdict"] == "Running"]
        observations = {}
        for scope in scopes:
            arms = {ConfigKey("ns", "llama", "abc"): observe(WORKLOAD, 0, scope.window_s, rate_factor=1 + rng.uniform(-0.02, 0.02))}
            if running:
                record = running[-1]
                arms[ConfigKey("ns", "llama", record["candidateHash"])] = observe(
                    WORKLOAD, record["candidateK"], scope.window_s, rate_factor=1 + rng.uniform(-0.02, 0.02))
                canary_reads.append(record["candidateHash"])
            observations[scope] = arms
        return metrics.MetricsSnapshot(evaluated_at=at, observations=observations, queries=1)

    def counted(outcome: str) -> float:
        return REGISTRY.get_sample_value("specdecode_experiments_total", {
            "namespace": "ns", "specdecode_service": "llama", "purpose": "Reprobe", "outcome": outcome}) or 0.0

    now = [T0]
    reader = CountingReader(snapshot=snapshot)
    ev, memory = _evaluator(reader, kube, clock=lambda: now[0]), ServiceMemory()
    controller = ev.controller
    promoted_before = counted("Promote")
    _tick(ev, kube, memory)
    stored = kube.service("llama", "ns")["status"]
    assert stored["experiments"][-1]["verdict"] == "Running" and stored["speculation"]["enabled"] is False
    assert [c["status"] for c in stored["conditions"] if c["type"] == C.COND_EXPERIMENTING] == ["True"]
    assert C.EVENT_EXPERIMENT_STARTED in [reason for _, reason, _ in kube.writes.events]
    assert controller.reconciles == 1  # the canary is created now
    for minute in range(1, 45):
        now[0] = T0 + timedelta(minutes=minute)
        _tick(ev, kube, memory)
        if kube.service("llama", "ns")["status"]["speculation"]["enabled"]:
            break
    stored = kube.service("llama", "ns")["status"]
    assert stored["speculation"]["enabled"] and stored["experiments"][-1]["verdict"] == "Promote"
    assert canary_reads and len(reader.reads) == minute + 1  # the canary arm costs no extra read
    assert counted("Promote") == promoted_before + 1
    assert C.EVENT_EXPERIMENT_PROMOTED in [reason for _, reason, _ in kube.writes.events]
    assert controller.reconciles == 2  # the promotion rolls the main Deployment, the canary goes


def test_a_new_service_is_evaluated_once_its_first_rollout_is_live_not_before():
    """Nothing runs yet: no read, no status write (at fleet scale, two writes per new service
    that conflicted with the reconcile's Serving write). Live, it is evaluated at the next tick."""
    service, best = _steady_service()
    rolling = dict(service["status"])
    rolling["speculation"] = {k: v for k, v in rolling["speculation"].items() if k != "liveSince"}
    rolling["speculation"]["live"] = False
    kube = _kube({**service, "status": rolling})
    reader = CountingReader(snapshot=_noisy_snapshots(best))
    now = [T0]
    ev, memory = _evaluator(reader, kube, clock=lambda: now[0]), ServiceMemory()
    for tick in range(12):
        now[0] = T0 + timedelta(seconds=5 * tick)
        assert _tick(ev, kube, memory) is None
    assert reader.reads == [] and kube.writes.status == []
    live = _kube(service)  # the reconcile found every replica Ready
    ev.kube = live
    now[0] += timedelta(seconds=5)
    assert _tick(ev, live, memory) is not None and len(reader.reads) == 1
