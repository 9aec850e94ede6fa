"""`specdecode bench policy`: the policy against static choices and the phase oracle."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..cli import UserError, command


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
    p.add_argument("--json", action="store_true", help="print every figure as JSON on stdout")
    p.add_argument("--out", default="bench-results", metavar="DIR",
                   help="directory for the CSV, the JSON and one PNG per scenario (default: %(default)s)")
    p.add_argument("--jobs", type=int, default=None, metavar="N",
                   help="scenarios run in parallel (default: the number of CPUs)")
    p.add_argument("--no-plots", action="store_true", help="skip the PNGs")
    p.set_defaults(func=run_bench_policy)


def run_bench_policy(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ..bench import report, suite
    from ..scenario import ScenarioError, benchmark_suite, load_scenario

    paths: list[str] = []
    for item in args.scenario or [str(p) for p in benchmark_suite()]:
        try:
            load_scenario(item)  # fail early, with the file and the field named
        except ScenarioError as err:
            raise UserError(str(err)) from None
        path = Path(item)
        if not path.exists():
            from ..scenario import builtin_scenario_path

            path = builtin_scenario_path(item)
        paths.append(str(path))
    if args.jobs is not None and args.jobs < 1:
        raise UserError("--jobs must be at least 1")

    err_console = Console(stderr=True)
    with Progress(
        TextColumn("[bold]bench policy"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
        TimeElapsedColumn(), console=err_console, transient=args.json,
    ) as progress:
        task = progress.add_task("", total=len(paths))

        def done(result) -> None:
            progress.update(task, advance=1, description=f"{result.name} ({result.elapsed_s:.0f}s)")

        results = suite.run_suite(paths, jobs=args.jobs, on_done=done)
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
    if args.json:
        json.dump(report.suite_json(results, summary), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        console = Console()
        if not console.is_terminal:
            console = Console(width=160)
        report.render_table(results, summary, console)
        console.print(f"wrote {len(written)} files to {out}/")
    return 0
