"""`specdecode sim`: stand for the vLLM pods of a cluster, driven by a scenario.

Watches the Kubernetes API for the pods the operator manages, serves each Ready one on its
own 127.0.0.1 port with vLLM 0.33's `/metrics` and `/health`, and writes the Prometheus
file_sd targets file. Runs until interrupted (SIGINT or SIGTERM).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from ..cli import UserError, command


@command
def _sim(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sim",
        help="simulate the vLLM pods the operator manages (metrics from a scenario)",
        description=(
            "Serve vLLM 0.33 metrics for every Ready pod labelled "
            "app.kubernetes.io/managed-by=specdecode-operator, each on its own 127.0.0.1 "
            "port, driven by a scenario and the pod's speculative config; write Prometheus "
            "file_sd targets with the labels a PodMonitor gives."
        ),
    )
    p.add_argument("--kubeconfig", required=True, help="kubeconfig of the cluster to watch")
    p.add_argument(
        "--scenario",
        required=True,
        metavar="FILE",
        help="scenario YAML (a path, or the name of a shipped one such as demo)",
    )
    p.add_argument(
        "--targets-file",
        required=True,
        metavar="FILE",
        help="file_sd JSON to write (replaced atomically on every change)",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        help="play the scenario this many times faster (rates and latencies stay real)",
    )
    p.add_argument("--seed", type=int, default=None, help="override the scenario's seed")
    p.add_argument(
        "--namespace",
        "-n",
        action="append",
        dest="namespaces",
        metavar="NS",
        help="watch this namespace (repeatable; default: all namespaces)",
    )
    p.add_argument(
        "--tick",
        type=float,
        default=0.5,
        metavar="SECONDS",
        help="how often the engines advance (default 0.5)",
    )
    p.add_argument("--verbose", "-v", action="store_true", help="log every pod change")
    p.set_defaults(func=run_sim)


def run_sim(args: argparse.Namespace) -> int:
    from ..tools.scenario import ScenarioError, load_scenario
    from ..tools.sim.fleet import Simulator
    from ..tools.sim.kube import start_watchers

    if not args.time_scale > 0:
        raise UserError(f"--time-scale: must be > 0, got {args.time_scale}")
    if not args.tick > 0:
        raise UserError(f"--tick: must be > 0, got {args.tick}")
    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as err:
        raise UserError(str(err)) from None
    try:
        open(args.kubeconfig, encoding="utf-8").close()
    except OSError as err:
        raise UserError(f"--kubeconfig {args.kubeconfig}: {err.strerror}; check the path") from None

    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    simulator = Simulator(
        scenario, args.targets_file, seed=args.seed, time_scale=args.time_scale
    )
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stop.set()

    from kubernetes.config.config_exception import ConfigException

    previous = signal.signal(signal.SIGTERM, on_signal)
    try:
        try:
            start_watchers(args.kubeconfig, simulator, args.namespaces, stop)
        except ConfigException as err:
            raise UserError(f"--kubeconfig {args.kubeconfig}: {err}") from None
        print(
            f"simulating {scenario.name} ({scenario.method}) at x{args.time_scale:g}; "
            f"targets in {args.targets_file}",
            file=sys.stderr,
        )
        simulator.run(stop, interval_s=args.tick)
    except KeyboardInterrupt:
        stop.set()
    finally:
        signal.signal(signal.SIGTERM, previous)
        stop.set()
        simulator.close()
    return 0
