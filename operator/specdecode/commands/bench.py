"""`specdecode bench policy`: the policy against static choices and the phase oracle;
`bench trace`: one scenario's decisions with their reasons; `bench peers`: the engine-side
peers' models against their published numbers; `bench fleet` and
`bench faults`: the operator's cost and reliability on the local stack."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from ..cli import UserError, add_output_flag, command


@command
def _bench(sub: argparse._SubParsersAction) -> None:
    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True, metavar="BENCHMARK")
    p = bench_sub.add_parser(
        "policy",
        help="replay scenarios in simulated time: the policy vs every static choice and the oracle",
        description="Replays scenario files in simulated time (no cluster, no Prometheus) and "
        "scores the operator's policy, speculation off, every static K within the bounds and "
        "the phase oracle (all starting at the declared K), then prints each target as holding "
        "or falling short. Default: the shipped suite.",
    )
    p.add_argument(
        "--scenario", action="append", default=[], metavar="FILE",
        help="a scenario file or a shipped scenario's name (repeatable; default: the suite)",
    )
    p.add_argument(
        "--generated", type=int, default=0, metavar="N",
        help="also run N scenarios drawn from --generated-seed (held back by construction: stationary "
        "and load swings, written to DIR/generated/); without --scenario, only those",
    )
    p.add_argument("--generated-seed", type=int, default=1, metavar="S",
                   help="seed of the generated scenarios (default: %(default)s)")
    p.add_argument("--generated-cycles", type=int, default=1, metavar="C",
                   help="times each generated load swing repeats its calm, peak and calm (4 hours each; "
                   "default: %(default)s)")
    p.add_argument("--generated-truth", choices=("mixed", "h100-vllm"), default="mixed",
                   help="the generated scenarios' engine: mixed (scaled step costs and measured H200 steps) or "
                   "h100-vllm (the same services on step times measured on a real vLLM 0.26 on an H100; "
                   "default: %(default)s)")
    add_output_flag(p, help="; json: every figure on stdout")
    p.add_argument("--out", default="bench-results", metavar="DIR",
                   help="directory for the CSV, the JSON and one PNG per scenario (default: %(default)s)")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="scenarios run in parallel (default: the number of CPUs)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNGs")
    p.add_argument(
        "--experiments", choices=("on", "off", "compare"), default="on",
        help="the policy with canary experiments (issue #15) on (the API's default), off, or both side by "
        "side (compare; the headline tables show experiments on) (default: %(default)s)",
    )
    p.add_argument(
        "--policy", choices=("rules", "planner"), default="rules",
        help="how the policy tunes: the rules (the default) or the receding-horizon planner "
        "(autotune's planner mode) (default: %(default)s)",
    )
    p.add_argument(
        "--safe-defaults", action="store_true",
        help="the policy under the API's own autotune.allowOutages (false): a change that would roll out "
        "below what carries the load stays a recommendation. Without it the benchmark judges the policy with "
        "restarts allowed (allowOutages true), as a user who opted in runs it; a scenario's own "
        "autotune.allowOutages wins either way",
    )
    p.set_defaults(func=run_bench_policy)

    t = bench_sub.add_parser(
        "trace",
        help="replay one scenario and print the policy's decisions with their reasons",
        description="Replays one scenario in simulated time as `bench policy` does and prints the policy's "
        "decision with its reason: one line every --every of simulated time, at every change of config "
        "(marked *), at every canary experiment started or ended, and the schedule's reason whenever it "
        "changes. What status.recommendation.reason would have said, minute by minute: why a move held "
        "(its restart priced against staying, refused at the peak, a canary still measuring).",
    )
    t.add_argument("scenario", metavar="SCENARIO", help="a scenario file or a shipped scenario's name")
    t.add_argument("--every", default="10m", metavar="TIME",
                   help="simulated time between lines when nothing changes (default: %(default)s)")
    t.add_argument("--experiments", choices=("on", "off"), default="on",
                   help="the policy with canary experiments on (the API's default) or off (default: %(default)s)")
    t.add_argument("--policy", choices=("rules", "planner"), default="rules",
                   help="the rules (the default) or the receding-horizon planner (default: %(default)s)")
    t.add_argument(
        "--safe-defaults", action="store_true",
        help="the policy under the API's own autotune.allowOutages (false): a change that would roll out "
        "below what carries the load stays a recommendation. Without it the benchmark judges the policy with "
        "restarts allowed (allowOutages true), as a user who opted in runs it; a scenario's own "
        "autotune.allowOutages wins either way",
    )
    t.set_defaults(func=run_bench_trace)

    r = bench_sub.add_parser(
        "peers",
        help="each engine-side peer's model against the numbers its project published",
        description="The benchmark's peers (vLLM's table and adaptive verification, SGLang's adaptive tiers, "
        "TensorRT-LLM's schedule, the per-step TurboSpec bound; `bench policy` scores them per scenario) are "
        "models of documented mechanisms. This prints every published figure REFERENCE.md gives for them beside "
        "what the peer's model gives on a reference engine, the band a figure must fall in, and whether it does. "
        "Rows marked fitted calibrated the model and check nothing. Exit code 0 either way: a miss is a "
        "finding to report, not a failure.",
    )
    add_output_flag(r, help="; json: one object per figure on stdout")
    r.set_defaults(func=run_bench_peers)

    f = bench_sub.add_parser(
        "fleet",
        help="what N services cost the operator on the local stack (time to Serving, RSS, CPU, queries, writes)",
        description="Starts a local control plane, Prometheus, the simulator and the operator; applies N "
        "services at once; measures the time until every one is Serving, then a steady stretch: operator "
        "RSS and CPU, Prometheus queries per evaluation tick and per minute, API writes per minute from the "
        "apiserver's audit log against the decisions made. Prints each target as holds / falls short.",
    )
    f.add_argument("--services", type=int, default=50, metavar="N", help="services to apply (default: %(default)s)")
    f.add_argument("--measure", default="3m", metavar="TIME", help="length of the steady stretch (default: %(default)s)")
    f.add_argument("--serve-timeout", default="5m", metavar="TIME",
                   help="give up waiting for every service to be Serving after this (default: %(default)s)")
    f.add_argument("--cluster-name", default="bench-fleet", help="local control plane to (re)create (default: %(default)s)")
    f.add_argument("--keep", action="store_true", help="leave the control plane running at the end")
    f.add_argument("--no-stack-floor", dest="stack_floor", action="store_false",
                   help="skip the stack's own floor (the same N Deployments and Services applied with no operator and "
                   "timed until available, before the operator starts; it takes as long again)")
    f.add_argument("--workdir", default=None, help="directory for logs (default: a new temporary one)")
    add_output_flag(f, help="; json: the figures and targets on stdout")
    f.set_defaults(func=run_bench_fleet)

    q = bench_sub.add_parser(
        "faults",
        help="the operator under faults on the local stack: kills, outages, drift; figures and targets",
        description="Starts a local control plane, Prometheus, the simulator (a scenario that keeps the policy "
        "deciding) and the operator with 3 services; SIGKILLs the operator at seeded points (a decision in "
        "status but not in the Deployment, the Deployment changed but not status, mid-rollout, a random "
        "moment), stops the apiserver and Prometheus, deletes and edits owned objects. Reports decisions lost "
        "and duplicated, extra vLLM pod starts, time to converge after each fault, changes while metrics were "
        "missing; each target as holds / falls short. Exit code 1 when a target falls short.",
    )
    q.add_argument("--quick", action="store_true",
                   help="each kill point once and short outages (about 10 minutes; what CI runs)")
    q.add_argument("--kills", type=int, default=None, metavar="N", help="operator SIGKILLs (default: 20; 4 with --quick)")
    q.add_argument("--seed", type=int, default=18, help="seed of the kill points and moments (default: %(default)s)")
    q.add_argument("--cluster-name", default="bench-faults", help="local control plane to (re)create (default: %(default)s)")
    q.add_argument("--keep", action="store_true", help="leave the control plane running at the end")
    q.add_argument("--workdir", default=None, help="directory for logs (default: a new temporary one)")
    add_output_flag(q, help="; json: the figures and targets on stdout")
    q.set_defaults(func=run_bench_faults)


def run_bench_policy(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..tools.bench import report, suite
    from ..tools.scenario import ScenarioError, benchmark_suite, load_scenario

    if args.generated < 0:
        raise UserError("--generated must be 0 or more (the number of scenarios to draw)")
    if args.generated_cycles < 1:
        raise UserError("--generated-cycles must be at least 1 (the times each load swing repeats)")
    paths: list[str] = []
    for item in args.scenario or ([] if args.generated else [str(p) for p in benchmark_suite()]):
        try:
            load_scenario(item)  # fail early, with the file and the field named
        except ScenarioError as err:
            raise UserError(str(err)) from None
        path = Path(item)
        if not path.exists():
            from ..tools.scenario import builtin_scenario_path

            path = builtin_scenario_path(item)
        paths.append(str(path))
    if args.jobs is not None and args.jobs < 1:
        raise UserError("--jobs must be at least 1")
    if args.generated:
        from ..tools.bench import generated

        documents = generated.generate(args.generated_seed, args.generated, args.generated_cycles,
                                       args.generated_truth)
        paths += [str(path) for path in generated.write(documents, Path(args.out) / "generated")]

    err_console = Console(stderr=True)
    with Progress(
        TextColumn("[bold]bench policy"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
        TimeElapsedColumn(), console=err_console, transient=args.output == "json",
    ) as progress:
        task = progress.add_task("", total=len(paths))

        def done(result) -> None:
            progress.update(task, advance=1, description=f"{result.name} ({result.elapsed_s:.0f}s)")

        results = suite.run_suite(paths, jobs=args.jobs, on_done=done, experiments=args.experiments,
                                  planner=args.policy == "planner", allow_outages=not args.safe_defaults)
    summary = suite.summarize(results)

    out = Path(args.out)
    if args.no_plots:
        out.mkdir(parents=True, exist_ok=True)
        report.write_csv(results, out / "bench-policy.csv")
        (out / "bench-policy.json").write_text(
            json.dumps(report.suite_json(results, summary), indent=2), encoding="utf-8"
        )
        written = [out / "bench-policy.csv", out / "bench-policy.json"]
    else:
        written = report.write_outputs(results, summary, out)
    if args.output == "json":
        json.dump(report.suite_json(results, summary), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        console = _wide_console()
        report.render_table(results, summary, console)
        console.print(f"wrote {len(written)} files to {out}/")
    return 0


def run_bench_peers(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from rich.table import Table

    from ..tools.bench import peers

    checks = peers.published_checks()
    if args.output == "json":
        json.dump([asdict(c) | {"within": c.within} for c in checks], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    table = Table(title="Peers against their published numbers (ratios as gains: +0.50 = 1.5x)",
                  caption="fitted: the model was calibrated on this figure. band: the published spread the model "
                  "must fall in. docs/peers.md says where each number comes from.")
    for column in ("peer", "source", "figure", "published", "band", "model", ""):
        table.add_column(column, justify="left" if column in ("peer", "source", "figure", "") else "right")
    for c in checks:
        verdict = "fitted" if c.fitted else ("[green]within[/green]" if c.within else "[red]outside[/red]")
        table.add_row(c.peer, c.source, c.claim, f"{c.published:+.3f}", f"{c.low:+.3f}..{c.high:+.3f}",
                      f"{c.modeled:+.3f}", verdict)
    console = _wide_console()
    console.print(table)
    checked = [c for c in checks if not c.fitted]
    console.print(f"{sum(c.within for c in checked)} of {len(checked)} checked figures within their band "
                  f"({len(checks) - len(checked)} fitted)")
    return 0


def run_bench_trace(args: argparse.Namespace) -> int:
    from ..tools.bench import run, trace
    from ..tools.scenario import ScenarioError, load_scenario

    every = _duration_arg("--every", args.every)
    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as err:
        raise UserError(str(err)) from None
    if every % 60:
        raise UserError(f"--every {args.every}: the policy evaluates once a minute; use whole minutes, e.g. 10m")
    lines = trace.DecisionTrace(every)
    print(f"{scenario.name}: {scenario.description}")

    def show(t: float, result) -> None:
        for line in lines.lines(t, result):
            print(line)

    settings = run.policy_settings(scenario, experiments=args.experiments == "on", planner=args.policy == "planner",
                                   allow_outages=not args.safe_defaults)
    policy = run.run_policy(scenario, settings, experiments=args.experiments == "on", on_evaluation=show)
    print(f"{len(policy.changes)} change(s) of config, {len(policy.experiments)} canary experiment(s)")
    return 0


def _wide_console():
    """A rich console; 160 columns when the output is not a terminal (a pipe, a CI log), so the
    benchmark's wide tables do not wrap at rich's default 80."""
    from rich.console import Console

    console = Console()
    return console if console.is_terminal else Console(width=160)


def _duration_arg(flag: str, text: str) -> float:
    from ..tools.scenario import ScenarioError, parse_duration

    try:
        seconds = parse_duration(text)
    except (ScenarioError, ValueError):
        seconds = -1.0
    if not seconds > 0:
        raise UserError(f"{flag} {text}: not a positive duration; use e.g. 3m or 90s")
    return seconds


def _workdir(path: str | None, prefix: str) -> Path:
    import tempfile

    if path:
        out = Path(path).resolve()
        out.mkdir(parents=True, exist_ok=True)
        return out
    return Path(tempfile.mkdtemp(prefix=prefix))


@contextlib.contextmanager
def _stack_errors(workdir: Path):
    """A part of the local stack that fails to start is one line naming it, not a traceback."""
    from ..tools.localstack.build import BuildError
    from ..tools.localstack.cluster import ClusterError
    from ..tools.localstack.install import InstallError
    from ..tools.localstack.prometheus import PrometheusError
    from ..tools.localstack.stack import StackError

    try:
        yield
    except (BuildError, ClusterError, InstallError, PrometheusError, StackError) as err:
        raise UserError(f"the local stack failed: {err} (logs in {workdir})") from None


def _report(args: argparse.Namespace, title: str, figures, targets) -> int:
    from ..tools.bench import live

    if args.output == "json":
        json.dump({"figures": figures.to_json(), "targets": [t.to_json() for t in targets]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        console = _wide_console()
        live.render_targets(console, title, figures.rows(), targets)
    return 0 if all(t.holds for t in targets) else 1


def run_bench_fleet(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ..tools.bench import fleet

    if args.services < 1:
        raise UserError("--services must be at least 1")
    measure_s = _duration_arg("--measure", args.measure)
    serve_timeout_s = _duration_arg("--serve-timeout", args.serve_timeout)
    workdir = _workdir(args.workdir, "specdecode-bench-fleet-")
    err = Console(stderr=True)
    err.print(f"bench fleet: {args.services} services; logs in {workdir}", markup=False)
    with _stack_errors(workdir):
        figures = fleet.run_fleet(args.services, workdir=workdir, cluster_name=args.cluster_name,
                                  measure_s=measure_s, serve_timeout_s=serve_timeout_s, keep=args.keep,
                                  floor=args.stack_floor, progress=lambda m: err.print(f"  {m}", markup=False))
    return _report(args, f"bench fleet: {args.services} services", figures, fleet.fleet_targets(figures))


def run_bench_faults(args: argparse.Namespace) -> int:
    from rich.console import Console

    from ..tools.bench import faults

    if args.kills is not None and args.kills < 0:
        raise UserError("--kills must be 0 or more")
    plan = faults.Plan.of(args.seed, args.quick, args.kills)
    workdir = _workdir(args.workdir, "specdecode-bench-faults-")
    err = Console(stderr=True)
    err.print(f"bench faults{' --quick' if args.quick else ''}: {len(plan.kills)} kills, apiserver down "
              f"{plan.apiserver_down_s:.0f} s, Prometheus down {plan.prometheus_down_s:.0f} s; logs in {workdir}",
              markup=False)
    with _stack_errors(workdir):
        figures = faults.run_faults(plan, seed=args.seed, workdir=workdir, cluster_name=args.cluster_name,
                                    keep=args.keep, progress=lambda m: err.print(f"  {m}", markup=False))
    return _report(args, "bench faults", figures, faults.fault_targets(figures))
