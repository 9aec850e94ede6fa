"""Benchmark outputs: the terminal table, JSON, CSV and one PNG per scenario."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Any, Sequence

from specdecode.tools.bench.run import ORACLE, POLICY, ScenarioResult
from specdecode.tools.bench.suite import policy_events, static_names

CSV_FIELDS = (
    "scenario", "strategy", "score", "goodput_ratio", "latency_ratio", "goodput_tokens_per_s",
    "e2e_mean_s", "e2e_p95_s", "tpot_mean_s", "tpot_p95_s", "slo_violation_min", "changes",
)
CSV_EVENT_FIELDS = (
    "fallback_s_max", "fallback_intervals_max", "reenable_s_max", "stationary_changes",
    "exploration_changes",
)
"""Policy rows only (see `suite.policy_events`): empty when nothing happened, inf when a
fallback or re-enable never came."""


def _clean(value: Any) -> Any:
    """JSON has no NaN or Infinity: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def scenario_json(result: ScenarioResult) -> dict[str, Any]:
    return _clean(
        {
            "name": result.name,
            "description": result.description,
            "path": result.path,
            "duration_s": result.duration_s,
            "method": result.method,
            "slo": result.slo,
            "best_static": result.best_static,
            "policy_margin_over_best_static": (
                result.strategies[POLICY].score - result.strategies[result.best_static].score
            ),
            "day_long_stationary": result.day_long_stationary,
            "held_back": result.held_back,
            "oracle_source": result.oracle_source,
            "strategies": {name: asdict(f) for name, f in result.strategies.items()},
            "with_schedules": None if result.schedules is None else {
                "family": list(result.schedules.family),
                "best_static_schedule": result.schedules.best_static_schedule,
                "oracle_source": result.schedules.oracle_source,
                "oracle_plan": list(result.schedules.oracle_plan),
                "strategies": {name: asdict(f) for name, f in result.schedules.strategies.items()},
            },
            "peers": {name: asdict(f) for name, f in result.peers.items()},
            "peer_notes": dict(result.peer_notes),
            "experiments": {
                mode: {
                    "experiments_enabled": v.experiments_enabled,
                    "figures": asdict(v.figures),
                    "restarts": v.restarts,
                    "experiments": v.experiments,
                    "promotions": v.promotions,
                    "aborts": v.aborts,
                    "cancelled": v.cancelled,
                    "probe_cost": {**asdict(v.probe_cost), "replica_minutes": v.probe_cost.replica_minutes},
                    "spans": [asdict(span) for span in v.spans],
                    "changes": [asdict(c) for c in v.changes],
                }
                for mode, v in result.variants.items()
            },
            "phases": result.phases,
            "events": result.events,
            "policy_events": policy_events(result),
            "policy_changes": [asdict(c) for c in result.changes],
            "policy_rules": result.rules,
            "elapsed_s": result.elapsed_s,
            "model_evaluations": result.evaluations,
        }
    )


def suite_json(results: Sequence[ScenarioResult], summary: dict[str, Any]) -> dict[str, Any]:
    return {"scenarios": [scenario_json(r) for r in results], "summary": _clean(summary)}


def write_csv(results: Sequence[ScenarioResult], path: Path) -> None:
    """One row per scenario and strategy; the policy's rows also carry its event figures."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_FIELDS + CSV_EVENT_FIELDS)
        writer.writeheader()
        for r in results:
            events = policy_events(r)
            rows = [*r.strategies.items(), *((f"peer:{name}", f) for name, f in r.peers.items())]
            for name, f in rows:
                row: dict[str, Any] = {"scenario": r.name, "strategy": name}
                for key in CSV_FIELDS[2:]:
                    value = getattr(f, key)
                    row[key] = "" if isinstance(value, float) and not math.isfinite(value) else (
                        round(value, 6) if isinstance(value, float) else value
                    )
                if name == POLICY:
                    for key in CSV_EVENT_FIELDS:
                        value = events[key]
                        row[key] = "" if value is None else (
                            "inf" if isinstance(value, float) and math.isinf(value) else
                            round(value, 3) if isinstance(value, float) else value
                        )
                writer.writerow(row)


def _minutes(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if math.isinf(seconds):
        return "never"
    return f"{seconds / 60:.0f}m"


def render_table(results: Sequence[ScenarioResult], summary: dict[str, Any], console: Any) -> None:
    """The terminal tables (rich): scores per scenario of the policy and every static choice,
    the policy's events, the suite's strategies, then each target as holding or falling
    short."""
    from rich.table import Table

    statics = static_names(results)
    single = summary.get("best_single_static", "")
    scores = Table(
        title="Policy benchmark: headline score (min of goodput and latency ratios to the best "
        "of the oracle and every static choice)",
        caption="Every strategy starts at the declared K=3 and pays every restart. green: the "
        "best static choice of the scenario; margin: the policy minus the best static choice.",
    )
    scores.add_column("scenario", no_wrap=True)
    scores.add_column("policy", justify="right", no_wrap=True)
    scores.add_column("oracle", justify="right", no_wrap=True)
    for name in statics:
        scores.add_column(name, justify="right", no_wrap=True)
    scores.add_column("best static", justify="right", no_wrap=True)
    scores.add_column("margin", justify="right", no_wrap=True)
    for r in results:
        cells = [f"[bold]{r.strategies[POLICY].score:.3f}[/bold]", f"{r.strategies[ORACLE].score:.3f}"]
        for name in statics:
            text = f"{r.strategies[name].score:.3f}"
            cells.append(f"[green]{text}[/green]" if name == r.best_static else text)
        margin = r.strategies[POLICY].score - r.strategies[r.best_static].score
        cells += [r.best_static, f"{margin:+.3f}"]
        scores.add_row(r.name, *cells)
    means = summary["mean_score_by_strategy"]
    worsts = summary.get("worst_score_by_strategy", {})
    for label, values in (("mean", means), ("worst", worsts)):
        cells = [f"{values.get(POLICY, math.nan):.3f}", f"{values.get(ORACLE, math.nan):.3f}"]
        for name in statics:
            text = f"{values.get(name, math.nan):.3f}"
            cells.append(f"[green]{text}[/green]" if label == "mean" and name == single else text)
        cells += [single if label == "mean" else "", ""]
        scores.add_row(f"[bold]{label}[/bold]", *cells)
    console.print(scores)

    events_table = Table(
        title="The policy's figures per scenario",
        caption="goodput / latency: ratios to the best on each axis. restarts, SLO min(utes of "
        "P95 above the SLO): policy/oracle. fallback / re-enable: the policy's slowest after a "
        "collapse / recovery ('off' / 'on': speculation already was). stationary: policy "
        "changes in settled phases. day-long: a day-long stationary scenario (its figure is "
        "the restarts).",
    )
    for column in ("scenario", "goodput", "latency", "restarts", "SLO min", "fallback",
                   "re-enable", "stationary", "oracle plan"):
        events_table.add_column(column, justify="left" if column == "scenario" else "right", no_wrap=True)
    for r in results:
        p, o = r.strategies[POLICY], r.strategies[ORACLE]
        events = policy_events(r)
        fallback = _minutes(events["fallback_s_max"])
        if events["fallback_s_max"] is None and events["collapses_already_off"]:
            fallback = "off"
        reenable = _minutes(events["reenable_s_max"])
        if events["reenable_s_max"] is None and events["recoveries"]:
            reenable = "on"
        name = f"{r.name} (day-long)" if r.day_long_stationary else r.name
        events_table.add_row(
            name, f"{p.goodput_ratio:.3f}", f"{p.latency_ratio:.3f}", f"{p.changes}/{o.changes}",
            f"{p.slo_violation_min:.0f}/{o.slo_violation_min:.0f}", fallback, reenable,
            str(events["stationary_changes"]), r.oracle_source,
        )
    overall = summary.get("overall", {})
    strategies = overall.get("strategies", {})
    policy, oracle = strategies.get(POLICY, {}), strategies.get(ORACLE, {})
    events = overall.get("policy_events", {})
    events_table.add_row(
        "[bold]mean / total[/bold]",
        f"{policy.get('mean_goodput_ratio', math.nan):.3f}",
        f"{policy.get('mean_latency_ratio', math.nan):.3f}",
        f"{policy.get('restarts', 0)}/{oracle.get('restarts', 0)}",
        f"{policy.get('slo_violation_min', 0):.0f}/{oracle.get('slo_violation_min', 0):.0f}",
        _minutes(events.get("fallback_s_max")),
        _minutes(events.get("reenable_s_max")),
        str(events.get("stationary_changes", 0)),
        "",
    )
    console.print(events_table)

    _render_schedules(results, summary, console)
    render_peers(summary, console)
    render_experiments(results, summary, console)

    suite_table = Table(title="The suite: mean and worst score per strategy")
    for column in ("strategy", "mean", "worst", "restarts", "SLO min"):
        suite_table.add_column(column, justify="left" if column == "strategy" else "right", no_wrap=True)
    rows = [POLICY, ORACLE, single] + [n for n in statics if n != single]
    for name in rows:
        if name not in means:
            continue
        label = {POLICY: "policy", ORACLE: "oracle", single: f"{name} (best single static)"}.get(name, name)
        figs = strategies.get(name, {})
        suite_table.add_row(
            label, f"{means[name]:.3f}", f"{worsts.get(name, math.nan):.3f}",
            str(figs.get("restarts", "")), f"{figs.get('slo_violation_min', 0):.0f}",
        )
    console.print(suite_table)
    print_targets(summary["targets"], console)


def print_targets(targets: Sequence[dict[str, Any]], console: Any) -> None:
    """Each target of a summary as holding or falling short, with its detail."""
    for target in targets:
        mark = "[green]holds[/green]" if target["met"] else "[red]falls short[/red]"
        console.print(f"  {mark}  {target['name']}: {target['detail']}")


def render_peers(summary: dict[str, Any], console: Any) -> None:
    """Issue #54's table: per scenario the policy, each engine-side peer (n/a where it does
    not apply), the best one a user can switch on and the policy's margin over it; then each
    peer's mean and the targets."""
    from rich.table import Table

    view = summary.get("peers") or {}
    if not view:
        return
    names = list(view["by_peer"])
    table = Table(
        title="Peers: what a user gets by switching on an engine's own adaptive speculation",
        caption="Scored like the policy (against the best static choice and the oracle); each peer starts at the "
        "declared config and pays one rollout to switch on. turbospec-bound: per-step K with perfect knowledge, an "
        "upper bound on per-step choice, never the best peer. n/a: the mechanism does not run this method. How each "
        "peer is modelled and which published number each figure comes from: docs/peers.md.",
    )
    for column in ("scenario", "policy", *names, "best peer", "margin"):
        table.add_column(column, justify="left" if column in ("scenario", "best peer") else "right", no_wrap=True)
    for name, row in view["scenarios"].items():
        cells = [f"{row['scores'][n]:.3f}" if n in row["scores"] else "n/a" for n in names]
        margin = row["policy_margin_over_best_peer"]
        text = f"{margin:+.3f}"
        table.add_row(name, f"{row['policy']:.3f}", *cells, row["best_peer"],
                      f"[red]{text}[/red]" if margin < -0.05 else text)
    table.add_row("mean", f"{view['policy_mean']:.3f}",
                  *(f"{view['by_peer'][n]['mean']:.3f}" for n in names),
                  f"{view['best_peer_per_scenario_mean']:.3f}", "")
    console.print(table)
    print_targets(view["targets"], console)


EXPERIMENTS_LEGEND = (
    "Cells: experiments MODES; restarts also / the oracle's. experiments (with them on): canary experiments "
    "started (promoted/aborted/cancelled). restarts: rollouts of "
    "the main Deployment (every replica restarts); a canary's pod starts are not restarts: "
    "they are priced in the score (the canary's replicas serve the candidate, a capacity-neutral canary's "
    "borrowed replica serves nothing while the canary starts and again when it comes back) and in the cost. "
    "failed-probe cost: replica-minutes that probes not kept took from the incumbent: served at the probe's "
    "config while the truth says it was slower end to end than the config it was tested against, plus "
    "replicas without capacity because of it (start-ups there and back); (failed/probes): their count. A probe is an experiment (a Calibrate's "
    "measurement too: never promoted, it counts as not kept), or without one a re-probe or tune change; not kept: no promotion, or the change undone within the "
    "rollout plus 30 minutes. collapse: the true acceptance falls below the floor in the scenario. "
    "held back: a scenario written with issue #15 and never used to tune the policy."
)


def render_experiments(results: Sequence[ScenarioResult], summary: dict[str, Any], console: Any) -> None:
    """Issue #15's table: per scenario and mode (experiments on / off, side by side),
    experiments, restarts against the oracle's, the failed-probe cost and the score; then
    the issue's targets."""
    from rich.table import Table

    section = summary.get("experiments") or {}
    modes = section.get("modes") or []
    if not modes:
        return
    table = Table(title="Canary experiments (issue #15): " + " vs ".join(f"experiments {m}" for m in modes),
                  caption=EXPERIMENTS_LEGEND.replace("MODES", " / ".join(modes)))
    for column in ("scenario", "score", "experiments", "restarts", "failed-probe cost"):
        table.add_column(column, justify="left" if column == "scenario" else "right", no_wrap=True)
    rows = section["scenarios"]

    def cells(values: dict[str, Any], oracle_restarts: Any) -> list[str]:
        def joined(render) -> str:
            return " / ".join(render(values[m]) if m in values else "-" for m in modes)

        running = [m for m in modes if m == "on" and m in values]
        return [
            joined(lambda m: f"{m['score']:.3f}"),
            " / ".join(f"{values[m]['experiments']:.0f} ({values[m]['promotions']:.0f}/{values[m]['aborts']:.0f}/"
                       f"{values[m]['cancelled']:.0f})" for m in running) or "-",
            joined(lambda m: f"{m['restarts']:.0f}") + f" / {oracle_restarts}",
            joined(lambda m: f"{m['failed_probe_cost_replica_min']:.1f} ({m['failed_probes']:.0f}/{m['probes']:.0f})"),
        ]

    for r in results:
        row = rows.get(r.name, {})
        marks = [m for m, on in (("collapse", row.get("collapse")), ("held back", r.held_back)) if on]
        table.add_row(f"{r.name}{' (' + ', '.join(marks) + ')' if marks else ''}",
                      *cells({m: row[m] for m in modes if m in row}, row.get("oracle_restarts", "")))
    totals = section.get("totals", {})
    table.add_row("[bold]mean / total[/bold]",
                  *cells({m: {"score": totals[m]["mean_score"], **totals[m]} for m in modes if m in totals},
                         totals.get("oracle_restarts", "")))
    console.print(table)
    print_targets(section.get("targets", []), console)


def plot_scenario(result: ScenarioResult, path: Path) -> None:
    """K, acceptance, load, goodput and P95 e2e over time: the policy against the oracle."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(5, 1, figsize=(11, 12), sharex=True)
    minutes = 60.0

    def steps(timeline, index):
        xs, ys = [], []
        for seg in timeline:
            xs += [seg[0] / minutes, seg[1] / minutes]
            ys += [seg[index], seg[index]]
        return xs, ys

    colors = {POLICY: "tab:blue", ORACLE: "tab:orange"}
    for name in (ORACLE, POLICY):
        timeline = result.timelines[name]
        axes[0].plot(*steps(timeline, 2), label=name, color=colors[name], lw=1.6 if name == POLICY else 2.5,
                     alpha=1.0 if name == POLICY else 0.6)
        axes[3].plot(*steps(timeline, 3), label=name, color=colors[name], lw=1.2)
        xs, ys = steps(timeline, 4)
        axes[4].plot(xs, [y if math.isfinite(y) else float("nan") for y in ys], label=name,
                     color=colors[name], lw=1.2)
    for change in result.changes:
        axes[0].axvline(change.time / minutes, color="tab:blue", alpha=0.25, lw=0.8)
    axes[0].set_ylabel("K (0 = off)")
    from matplotlib.ticker import MaxNLocator

    axes[0].yaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].legend(loc="upper right")
    truth = result.truth
    xs, alpha = [], []
    rate = []
    for start, end, request_rate, a in truth:
        xs += [start / minutes, end / minutes]
        alpha += [a, a]
        rate += [request_rate, request_rate]
    axes[1].plot(xs, alpha, color="black", lw=1, label="true alpha")
    if result.alpha_trace:
        axes[1].plot([t / minutes for t, _ in result.alpha_trace], [a for _, a in result.alpha_trace],
                     ".", ms=3, color="tab:blue", label="policy's estimate")
    axes[1].set_ylabel("acceptance")
    axes[1].set_ylim(0, 1)
    axes[1].legend(loc="lower right")
    axes[2].plot(xs, rate, color="tab:green", lw=1)
    axes[2].set_ylabel("requests/s")
    axes[3].set_ylabel("goodput (tok/s)")
    axes[4].set_ylabel("P95 e2e (s)")
    slo = result.slo.get("p95_e2e_s")
    if slo:
        axes[4].axhline(slo, color="red", ls="--", lw=1, label="SLO")
    axes[4].set_yscale("log")
    axes[4].legend(loc="upper right")
    axes[4].set_xlabel("minutes")
    p, o = result.strategies[POLICY], result.strategies[ORACLE]
    fig.suptitle(
        f"{result.name}: policy score {p.score:.3f} (goodput {p.goodput_ratio:.3f}, latency "
        f"{p.latency_ratio:.3f}), restarts {p.changes} vs oracle {o.changes}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def write_outputs(results: Sequence[ScenarioResult], summary: dict[str, Any], out: Path) -> list[Path]:
    """CSV, JSON and PNGs under ``out``; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    csv_path = out / "bench-policy.csv"
    write_csv(results, csv_path)
    written.append(csv_path)
    json_path = out / "bench-policy.json"
    json_path.write_text(json.dumps(suite_json(results, summary), indent=2), encoding="utf-8")
    written.append(json_path)
    for r in results:
        png = out / f"{r.name}.png"
        plot_scenario(r, png)
        written.append(png)
    return written


def _render_schedules(results: Sequence[ScenarioResult], summary: dict[str, Any], console: Any) -> None:
    """Scores with per-batch-size schedules in the yardstick, beside the oracle without."""
    from rich.table import Table

    view = summary.get("schedules") or {}
    rows = view.get("scenarios", {})
    if not rows:
        return
    table = Table(
        title="With per-batch-size schedules: scores against the best of everything, "
        "schedules included",
        caption="oracle: K only; oracle+sched: may also run the scenario's schedule family "
        "(proposed by perfmodel.propose_schedule from the truth); best sched: the family's "
        "best schedule chosen once. policy: autotune.schedules Auto (the API's default); "
        "sched Off: the policy with autotune.schedules Off (plain K). "
        "restarts: policy/sched Off/oracle/oracle+sched.",
    )
    for column in ("scenario", "policy", "sched Off", "oracle", "oracle+sched", "best static", "best sched",
                   "restarts", "oracle+sched plan"):
        table.add_column(column, justify="left" if column in ("scenario", "oracle+sched plan") else "right",
                         no_wrap=column != "oracle+sched plan")
    for r in results:
        row = rows.get(r.name)
        if row is None:
            continue
        sched = (
            f"{row['best_static_schedule_score']:.3f} {row['best_static_schedule']}"
            if row["best_static_schedule"] else "-"
        )
        restarts = row["restarts"]
        plan = row["oracle_schedules_plan"]
        table.add_row(
            r.name, f"{row['policy']:.3f}", f"{row.get('policy_plain', math.nan):.3f}",
            f"{row['oracle']:.3f}", f"{row['oracle_schedules']:.3f}",
            f"{row['best_static_score']:.3f} {row['best_static']}", sched,
            f"{restarts['policy']}/{restarts.get('policy_plain')}/{restarts['oracle']}/"
            f"{restarts['oracle_schedules']}",
            _runs(plan) if any(c.startswith("sched[") for c in plan) else "(no schedule)",
        )
    means = view["mean"]
    table.add_row(
        "[bold]mean[/bold]", f"{means['policy']:.3f}", f"{means.get('policy_plain', math.nan):.3f}",
        f"{means['oracle']:.3f}", f"{means['oracle_schedules']:.3f}", f"{means['best_static_score']:.3f}",
        "", "", "",
    )
    console.print(table)
    if view.get("best_single_static"):
        console.print(
            f"  margin over the best single static choice ({view['best_single_static']}, "
            f"{view['best_single_static_mean']:.3f}): policy "
            f"{view['policy_margin_over_best_single_static']:+.3f} (target +0.04), with schedules Off "
            f"{view['policy_plain_margin_over_best_single_static']:+.3f}"
        )
    for name, swing in view.get("load_swing", {}).items():
        console.print(
            f"  load swing {name}: policy {swing['policy']:.3f} vs oracle+sched "
            f"{swing['oracle_schedules']:.3f} ({swing['gap']:+.3f}, target >= -0.02), restarts "
            f"{swing['restarts']} vs {swing['oracle_restarts']}: {'met' if swing['met'] else 'missed'}"
        )
    console.print(
        f"  schedules: the oracle gains {view['oracle_schedules_gain']:+.3f} mean score with them "
        f"({view['scenarios_with_a_family']} scenarios have a family; the oracle runs a schedule "
        f"in {len(view['scenarios_where_the_oracle_runs_a_schedule'])})"
    )


def _runs(plan: Sequence[str]) -> str:
    """'K=3 > sched[...] x4 > off': a per-phase plan with repeats folded."""
    parts: list[list[Any]] = []
    for config in plan:
        if parts and parts[-1][0] == config:
            parts[-1][1] += 1
        else:
            parts.append([config, 1])
    return " > ".join(c if n == 1 else f"{c} x{n}" for c, n in parts)
