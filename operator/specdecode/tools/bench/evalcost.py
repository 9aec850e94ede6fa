"""The CPU of one evaluation of one service, measured without a cluster (issue #18).

`specdecode bench fleet` measures the operator's CPU on the local stack; this measures the
part that grows with the fleet, one service's evaluation, alone: the shell's
`Evaluator.evaluate_if_due` (parsing the object kopf passes, this service's series from the
tick's batched read, the policy's step, the new status, whether to write it) on a fleet of
services whose statuses and observations are realistic, because the policy benchmark made
them: it replays scenarios (`run.run_policy`) and every few evaluations keeps what the
policy was given (status, spec, observations, the canary's), as the apiserver and a
Prometheus read would hand it to the operator.

    python -m specdecode.tools.bench.evalcost --repeat 5       # ms of CPU per evaluation
    python -m specdecode.tools.bench.evalcost --profile 30     # and cProfile's top 30

The Kubernetes API and the controller are stand-ins that count (a status write or an Event
costs the shell only the call); Prometheus is one prebuilt snapshot holding every service's
series, so each evaluation pays its own extraction from the batched read, as in production.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import hashlib
import io
import json
import pstats
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from typing import Any, Iterator, Optional

from specdecode import api
from specdecode import constants as C
from specdecode.control import evaluation, memo, metrics
from specdecode.control.metrics import ConfigKey
from specdecode.control.settings import PolicySettings
from specdecode.shell.evaluator import Evaluator, ServiceMemory
from specdecode.shell.settings import OperatorSettings
from specdecode.tools.bench import run
from specdecode.tools.scenario import builtin_scenario_path, load_scenario

SCENARIOS = ("diurnal-load", "bursty-ngram", "collapse-recovery", "heldback-ngram-phases", "gpu-slow")
NAMESPACE = "evalcost"


@dataclass(frozen=True)
class Sample:
    """What one evaluation of the policy benchmark was given."""

    at: float
    spec: api.SpecDecodeServiceSpec
    status: api.SpecDecodeServiceStatus
    observed: Any  # estimates.PolicyObservations
    canary: Optional[metrics.Observation]


@contextlib.contextmanager
def _recording(samples: list[Sample], every: int, after_s: float) -> Iterator[None]:
    """Keep every ``every``-th evaluation's input from ``after_s`` on (run_policy calls
    `evaluation.evaluate` through the module: the recorder stands in for it, then calls it)."""
    original = evaluation.evaluate
    seen = [0]

    def recorder(status, spec, settings, observed, generation, now, canary=None):
        t = now.timestamp()
        if t >= after_s:
            seen[0] += 1
            if seen[0] % every == 0:
                samples.append(Sample(t, spec, status, observed, canary))
        return original(status, spec, settings, observed, generation, now, canary=canary)

    evaluation.evaluate = recorder
    try:
        yield
    finally:
        evaluation.evaluate = original


def capture(names: tuple[str, ...], per_scenario: int, hours: float, planner: bool = False) -> list[Sample]:
    """About ``per_scenario`` evaluation inputs from each scenario's first ``hours`` (after
    its first half hour, so that every service has history, memory and observations), the
    policy by the rules or, with ``planner``, by the planner (its load history in status)."""
    samples: list[Sample] = []
    for name in names:
        scenario = load_scenario(builtin_scenario_path(name))
        duration = min(scenario.duration, hours * 3600.0)
        scenario = scenario.model_copy(update={"duration": duration})
        settings = run.policy_settings(scenario, planner=planner)
        evaluations = (duration - 1800.0) / settings.evaluation_interval_s
        every = max(1, int(evaluations // per_scenario))
        found: list[Sample] = []
        with _recording(found, every, 1800.0):
            run.run_policy(scenario, settings)
        samples.extend(found[:per_scenario])
    return samples


class CountingKube:
    """The shell's API boundary, counting what an evaluation writes."""

    def __init__(self) -> None:
        self.written: list[list[Any]] = []
        """Every status written and Event posted, in order (serialized for the digest after
        the clock stops: the API client's cost is not the evaluation's)."""

    def replace_status(self, body: dict, status: dict) -> None:
        self.written.append([body["metadata"]["name"], status])

    def post_event(self, body: dict, type_: str, reason: str, message: str, now: datetime) -> None:
        self.written.append([body["metadata"]["name"], type_, reason, message, now.isoformat()])


class CountingController:
    def __init__(self) -> None:
        self.locks: dict[tuple[str, str], threading.RLock] = defaultdict(threading.RLock)
        self.reconciles = 0

    def lock_for(self, namespace: str, name: str) -> threading.RLock:
        return self.locks[(namespace, name)]

    def reconcile(self, namespace: str, name: str) -> None:
        self.reconciles += 1


@dataclass(frozen=True)
class Fleet:
    """One object per sample, as kopf hands it to the timer, and one read holding them all."""

    bodies: tuple[dict, ...]
    times: tuple[float, ...]
    stored: tuple[Optional[api.Observations], ...]
    """Each service's observations as its last evaluation left them in the process's memory."""
    snapshot: metrics.MetricsSnapshot


def fleet(samples: list[Sample]) -> Fleet:
    observations: dict[metrics.QueryScope, dict[ConfigKey, metrics.Observation]] = defaultdict(dict)
    bodies = []
    for i, sample in enumerate(samples):
        name = f"svc-{i:04d}"
        settings = PolicySettings.from_spec(
            sample.spec, restart_s=evaluation.measured_restart_s(sample.status, sample.spec))
        long_scope, guard_scope, trend_scope = evaluation.scopes_for(sample.spec, settings)
        effective = sample.status.speculation
        config_hash = effective.config_hash if effective and effective.config_hash else ""
        window, trend_rate = sample.observed.window, sample.observed.trend_rate
        # The trend scope reads finished requests alone: the long window's, over its window.
        trend = (replace(window, window_s=trend_scope.window_s, requests=trend_rate * trend_scope.window_s)
                 if window is not None and trend_rate is not None else None)
        for scope, obs in ((long_scope, window), (guard_scope, sample.observed.guard), (trend_scope, trend)):
            if obs is not None:
                key = ConfigKey(NAMESPACE, name, config_hash)
                observations[scope][key] = replace(obs, key=key)
        record = next((r for r in sample.status.experiments or [] if r.running), None)
        if record is not None and sample.canary is not None:
            key = ConfigKey(NAMESPACE, name, record.candidate_hash)
            observations[long_scope][key] = replace(sample.canary, key=key)
        bodies.append({
            "apiVersion": C.API_VERSION, "kind": C.KIND,
            "metadata": {"namespace": NAMESPACE, "name": name, "generation": 1, "uid": f"uid-{i}",
                         "resourceVersion": str(i + 1)},
            "spec": sample.spec.to_wire(),
            "status": sample.status.to_wire(),
        })
    snapshot = metrics.MetricsSnapshot(evaluated_at=0.0, observations=dict(observations), queries=1)
    return Fleet(tuple(bodies), tuple(s.at for s in samples), tuple(s.status.observations for s in samples), snapshot)


class _SnapshotReader:
    def __init__(self, snapshot: metrics.MetricsSnapshot):
        self.snapshot = snapshot

    def __call__(self, access: metrics.PrometheusAccess) -> "_SnapshotReader":
        return self

    def read(self, scopes, at: float) -> metrics.MetricsSnapshot:
        return self.snapshot


@dataclass
class Outcome:
    evaluations: int
    decisions: list[tuple[str, Any]]
    written: list[list[Any]]

    def digest(self) -> str:
        """Of every decision (its repr: each float of its predictions in full), status written
        and Event posted: a change of CPU that changes any of them is a change of behaviour."""
        lines = [f"{name}: {decision!r}" for name, decision in self.decisions]
        lines += [json.dumps(item, sort_keys=True) for item in self.written]
        return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:12]


def evaluate_fleet(the_fleet: Fleet, rounds: int, policy: str = "rules") -> Outcome:
    """Every service evaluated once per round (a fresh process memory each round, holding
    the stored observations, as an earlier evaluation leaves it)."""
    now = [datetime.fromtimestamp(0.0, timezone.utc)]
    kube, controller = CountingKube(), CountingController()
    evaluator = Evaluator(kube, controller, OperatorSettings(evaluation_tick=5.0, policy=policy), clock=lambda: now[0],  # type: ignore[arg-type]
                          reader_factory=_SnapshotReader(the_fleet.snapshot))
    decisions: list[tuple[str, Any]] = []
    evaluations = 0
    for _ in range(rounds):
        for body, at, stored in zip(the_fleet.bodies, the_fleet.times, the_fleet.stored):
            now[0] = datetime.fromtimestamp(at, timezone.utc)
            memory = ServiceMemory()
            memory.remember(at - 3600.0, stored, "")
            # The operator empties the model's memos every tick, and the services of one tick
            # share no arguments (each its own measurements): nothing an evaluation finds
            # there comes from another service's, so none here either.
            memo.clear()
            decision = evaluator.evaluate_if_due(body, memory)
            evaluations += decision is not None
            decisions.append((body["metadata"]["name"], decision))
    return Outcome(evaluations, decisions, kube.written)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specdecode.tools.bench.evalcost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-scenario", type=int, default=40, help="services made from each scenario (default: 40)")
    parser.add_argument("--hours", type=float, default=2.0, help="of each scenario replayed to make them (default: 2)")
    parser.add_argument("--rounds", type=int, default=3, help="evaluations of every service (default: 3)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="times the rounds run; the least CPU is the figure (a shared machine adds noise, never removes it)")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="print cProfile's top N by cumulative time")
    parser.add_argument("--sort", default="cumulative", help="cProfile's sort key (default: cumulative)")
    parser.add_argument("--policy", choices=("rules", "planner"), default="rules",
                        help="the operator's SPECDECODE_POLICY (default: %(default)s)")
    args = parser.parse_args(argv)

    samples = capture(SCENARIOS, args.per_scenario, args.hours, planner=args.policy == "planner")
    the_fleet = fleet(samples)
    evaluate_fleet(the_fleet, 1, args.policy)  # warm: imports, first-use caches
    profiler = cProfile.Profile() if args.profile else None
    cpus, digests = [], set()
    for _ in range(args.repeat):
        started = time.process_time()
        if profiler:
            profiler.enable()
        outcome = evaluate_fleet(the_fleet, args.rounds, args.policy)
        if profiler:
            profiler.disable()
        cpus.append((time.process_time() - started) / max(1, outcome.evaluations))
        digests.add(outcome.digest())
    print(f"{len(the_fleet.bodies)} services x {args.rounds} rounds: {outcome.evaluations} evaluations; "
          f"ms CPU per evaluation: {1000 * min(cpus):.2f} (least of {args.repeat}: "
          f"{', '.join(f'{1000 * c:.2f}' for c in cpus)}){' under cProfile' if profiler else ''}; "
          f"digest of decisions and writes {', '.join(sorted(digests))}")
    if profiler:
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats(args.sort).print_stats(args.profile)
        print(out.getvalue())


if __name__ == "__main__":
    main()
