"""The receding-horizon planner: which config to run in each slot of a horizon, restarts
included. One planner serves two users with different inputs:

- the policy (`control.planning`): the performance model calibrated on the metrics, over a
  forecast made from the service's own load history;
- the benchmark's oracle (`tools.bench.engine.phase_oracle`): the scenario's truth, over the
  scenario's real future.

The gap between the two is therefore model error plus forecast error, and nothing else.

Pure: no clock, no I/O. What a slot costs comes from a ``run_slot`` callable, so each user
brings its own evaluator; the planner owns the search (a dynamic program over slots x configs
that carries each path's queue into the next slot), the objective (the benchmark's headline
score: the lower of the goodput ratio and the latency ratio to the best of every candidate),
and the shape of a transition (`rollout_pieces`: what serves while a Deployment rolls).

Must not import the shell, the API or the tools: both users import it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

from specdecode.control.perfmodel import Config, config_label, config_order

ORACLE_WEIGHTS = (0.0, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 100.0)
"""Goodput weights mu of the scalarised DPs (see `plan`). Each is one candidate plan."""


# --- transitions -----------------------------------------------------------------------------


@dataclass(frozen=True)
class RolloutShape:
    """How a change of config reaches the replicas: a Deployment's rolling update."""

    replicas: int
    max_surge: int = 0
    max_unavailable: int = 1
    restart_s: float = 180.0
    """How long a new pod serves nothing (model load, engine start; a download on an empty
    cache included by whoever builds the shape)."""

    @property
    def keeps_capacity(self) -> bool:
        """Surge pods start before old ones go (maxSurge >= 1, maxUnavailable 0)."""
        return self.max_surge >= 1 and self.max_unavailable == 0


@dataclass(frozen=True)
class Piece:
    """What serves during one stretch of a transition: ``config`` on ``serving`` replicas
    from ``offset`` seconds after the change began."""

    offset: float
    config: Config
    serving: int


def rollout_pieces(old: Config, new: Config, shape: RolloutShape) -> tuple[Piece, ...]:
    """The serving of a rolling update from ``old`` to ``new``, ending with ``new`` on every
    replica. Each round replaces ``maxUnavailable + maxSurge`` pods and lasts a restart;
    during a round, the pods taken down (maxUnavailable) serve nothing and the replicas left
    run the config most of them run (ties: the old one). With one replica and no surge the
    round is an outage: arrivals wait."""
    replicas = max(1, shape.replicas)
    if shape.keeps_capacity:
        # Every old pod serves until its replacement is Ready; the last round ends on new.
        per_round = max(1, shape.max_surge)
        rounds = math.ceil(replicas / per_round)
        pieces = []
        for j in range(rounds):
            on_new = min(replicas, j * per_round)
            pieces.append(Piece(j * shape.restart_s, new if on_new * 2 > replicas else old, replicas))
        return (*pieces, Piece(rounds * shape.restart_s, new, replicas))
    down = max(1, min(shape.max_unavailable, replicas))
    per_round = min(replicas, down + max(0, shape.max_surge))
    serving = replicas - down
    rounds = math.ceil(replicas / per_round)
    pieces = []
    for j in range(rounds):
        on_new = min(serving, j * per_round)
        # An outage serves nothing: what waits is served by the new config once it is up.
        config = new if serving == 0 or on_new * 2 > serving else old
        pieces.append(Piece(j * shape.restart_s, config, serving))
    return (*pieces, Piece(rounds * shape.restart_s, new, replicas))


def rollout_s(shape: RolloutShape) -> float:
    """How long a rollout takes, start to every replica on the new config."""
    return rollout_pieces(0, 1, shape)[-1].offset


def serving_during_rollout(shape: RolloutShape) -> int:
    """The fewest replicas that serve while a rollout runs."""
    return min(p.serving for p in rollout_pieces(0, 1, shape)[:-1])


# --- the search -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SlotRun:
    """One slot of a path: time-integrated mean e2e latency (s x s), good output tokens, and
    the queue the slot leaves. ``detail`` is the evaluator's own record (segments)."""

    latency: float
    good_tokens: float
    queue_end: float
    detail: tuple = ()


RunSlot = Callable[[int, Config, Config, float], SlotRun]
"""``run_slot(i, previous, config, queue)``: slot i run at ``config``, entered with ``queue``
requests waiting; a change from ``previous`` rolls out at the slot's start."""


@dataclass(frozen=True)
class Axes:
    """A plan's two headline axes: time-averaged goodput (tokens/s) and time-averaged mean
    e2e latency (s) over the horizon."""

    goodput: float
    latency: float


def best_axes(items: Iterable[Axes]) -> Axes:
    """The score's denominators: the highest goodput and the lowest latency among ``items``."""
    items = list(items)
    return Axes(max(a.goodput for a in items), min(a.latency for a in items))


def headline(axes: Axes, best: Axes) -> tuple[float, float, float]:
    """(score, goodput ratio, latency ratio) against the denominators ``best``
    (BENCHMARK.md: score = min(goodput / best goodput, best latency / latency))."""
    good = axes.goodput / best.goodput if best.goodput > 0 else 1.0
    fast = best.latency / axes.latency if axes.latency > 0 and math.isfinite(axes.latency) else 0.0
    return min(good, fast), good, fast


@dataclass(frozen=True)
class Path:
    """One candidate plan: a config per slot and what each slot costs along it."""

    configs: tuple[Config, ...]
    runs: tuple[SlotRun, ...]
    source: str
    """"dp:mu=<weight>" or "static:<config>"."""

    def axes(self, duration: float) -> Axes:
        if duration <= 0:
            return Axes(0.0, math.inf)
        latency = math.fsum(r.latency for r in self.runs)
        return Axes(math.fsum(r.good_tokens for r in self.runs) / duration, latency / duration)

    def changes(self, start: Config) -> int:
        return sum(1 for prev, c in zip((start, *self.configs), self.configs) if prev != c)


@dataclass(frozen=True)
class Plan:
    """The planner's answer: the chosen path, the path that keeps the start config all along
    (what changing nothing is worth), and every candidate's score against the best of all."""

    chosen: Path
    stay: Path
    score: float
    stay_score: float
    candidates: tuple[tuple[Path, float], ...]
    duration: float

    @property
    def first(self) -> Config:
        """The config the plan runs now."""
        return self.chosen.configs[0]

    @property
    def gain(self) -> float:
        """How much better the chosen plan scores than keeping the start config all along (the
        policy's hysteresis applies to it)."""
        if self.stay_score <= 0:
            return math.inf if self.score > 0 else 0.0
        return self.score / self.stay_score - 1.0


def _dp(
    n: int, configs: Sequence[Config], start: Config, run_slot: RunSlot, mu: float, l0: float, g0: float,
) -> tuple[tuple[Config, ...], tuple[SlotRun, ...]]:
    """The path minimising sum(latency / l0 - mu * good / g0), each path's queue carried
    into its next slot."""
    value: dict[Config, tuple[float, float, tuple[Config, ...], tuple[SlotRun, ...]]] = {}
    for i in range(n):
        new_value = {}
        for c in configs:
            best = None
            before = [(start, 0.0, 0.0, (), ())] if i == 0 else [(p, *value[p]) for p in value]
            for prev, cost, queue, path, runs in before:
                run = run_slot(i, prev, c, queue)
                total = cost + run.latency / l0 - mu * run.good_tokens / g0
                if best is None or total < best[0]:
                    best = (total, run.queue_end, path + (c,), runs + (run,))
            new_value[c] = best  # type: ignore[assignment]
        value = new_value
    best_c = min(value, key=lambda c: (value[c][0], config_order(c)))
    return value[best_c][2], value[best_c][3]


def plan(
    durations: Sequence[float],
    configs: Sequence[Config],
    start: Config,
    run_slot: RunSlot,
    weights: Sequence[float] = ORACLE_WEIGHTS,
    statics: dict[Config, Path] | None = None,
) -> Plan:
    """The plan over slots of ``durations`` that maximises the headline score.

    The score is min(goodput / G*, L* / latency) over the horizon, with G* and L* the best
    values among all candidates: a min of two ratios of sums, which no per-slot recursion
    maximises directly. Both axes are sums over slots, though, so for each weight mu a DP
    minimises the scalarisation latency / L0 - mu * goodput / G0 (L0, G0: the best static
    values), every change paying its rollout inside its slot; each DP's best path is a
    candidate, and so is every static choice (switch to it now, keep it); keeping ``start``
    all along is what the plan's gain is measured against.

    The chosen plan is, among candidates that score at least every static choice against
    their own denominators (best of the candidate and the statics on each axis), the one with
    the best score against the best of all candidates (ties: fewer changes). The best static
    choice always qualifies, so the plan scores at least every static choice.

    ``statics``: precomputed static paths (the benchmark scores them anyway); missing ones are
    run here.
    """
    n = len(durations)
    if n == 0:
        raise ValueError("a plan needs at least one slot")
    duration = math.fsum(durations)
    statics = dict(statics or {})
    for c in configs:
        if c not in statics:
            runs, queue, prev = [], 0.0, start
            for i in range(n):
                run = run_slot(i, prev, c, queue)
                runs.append(run)
                queue, prev = run.queue_end, c
            statics[c] = Path(tuple(c for _ in range(n)), tuple(runs), f"static:{config_label(c)}")
    static_axes = {c: p.axes(duration) for c, p in statics.items()}
    reference = best_axes(static_axes.values())
    g0 = reference.goodput if reference.goodput > 0 else 1.0
    l0 = reference.latency if 0 < reference.latency < math.inf else 1.0

    candidates: list[Path] = []
    for mu in weights:
        path, runs = _dp(n, configs, start, run_slot, mu, l0, g0)
        candidates.append(Path(path, runs, f"dp:mu={mu:g}"))
    candidates += [statics[c] for c in configs if c in statics]
    axes_of = [p.axes(duration) for p in candidates]
    ideal = best_axes(axes_of)

    def feasible(i: int) -> bool:
        best = best_axes([axes_of[i], *static_axes.values()])
        own = headline(axes_of[i], best)[0]
        return all(own >= headline(a, best)[0] - 1e-12 for a in static_axes.values())

    def rank(i: int) -> tuple[float, int]:
        return headline(axes_of[i], ideal)[0], -candidates[i].changes(start)

    scores = [headline(a, ideal)[0] for a in axes_of]
    chosen = max((i for i in range(len(candidates)) if feasible(i)), key=rank)
    stay = next((i for i, p in enumerate(candidates) if p.source.startswith("static:") and p.configs[0] == start),
                chosen)
    return Plan(
        chosen=candidates[chosen],
        stay=candidates[stay],
        score=scores[chosen],
        stay_score=scores[stay],
        candidates=tuple(zip(candidates, scores)),
        duration=duration,
    )
