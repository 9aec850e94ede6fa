"""`specdecode demo`: the operator at work in a few minutes, without a GPU or a cluster.

Starts the local control plane with fake GPU nodes (or uses the current kubectl context),
a real Prometheus, the operator and the vLLM simulator, all through `localstack.Stack`;
applies a sample SpecDecodeService with fast autotune settings; plays a scenario compressed
into minutes while showing what the operator sees and decides; then prints a summary, writes
a PNG timeline and stops every process it started (also on Ctrl-C or SIGTERM).

The pure parts (the service, timeline, summary, view and plot) live in `specdecode.tools.demo`.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from .. import api
from ..cli import UnreadableInput, UserError, command


def kubectl_run(*args, **kwargs):
    """The local stack's kubectl (imported when used: the tools are an extra)."""
    from ..tools.localstack.install import kubectl

    return kubectl(*args, **kwargs)


DEFAULT_DURATION = "5m"
DEFAULT_NAMESPACE = "specdecode-demo"
DEFAULT_CLUSTER = "demo"
POLL_INTERVAL_S = 1.0
PLAIN_STATUS_EVERY_S = 15.0


@command
def _demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="watch the operator tune speculative decoding on a local stack (a few minutes)",
        description=(
            "Start a local Kubernetes control plane with fake GPU nodes, a real Prometheus, the "
            "vLLM simulator and the operator; apply a sample SpecDecodeService; play a scenario "
            "(good acceptance, collapse, recovery, load surge) compressed into minutes with a "
            "live view of what the operator sees and decides; print a summary and write a PNG "
            "timeline. Every process it started stops at the end, also on Ctrl-C."
        ),
    )
    p.add_argument("--scenario", default="demo", metavar="FILE",
                   help="scenario YAML, or the name of a shipped one (default: %(default)s)")
    pace = p.add_mutually_exclusive_group()
    pace.add_argument("--duration", default=None, metavar="TIME",
                      help=f"play the scenario in this wall time, e.g. 3m (default: {DEFAULT_DURATION})")
    pace.add_argument("--time-scale", type=float, default=None, metavar="X",
                      help="play the scenario X times faster (instead of --duration)")
    p.add_argument("--sample", action="append", metavar="FILE",
                   help="SpecDecodeService to apply (repeatable; default: the manifests/samples/ "
                        "one matching the scenario's method)")
    p.add_argument("--out", default="specdecode-demo.png", metavar="PNG",
                   help="where to write the timeline picture (default: %(default)s)")
    p.add_argument("--summary-json", default=None, metavar="FILE", help="also write the summary as JSON")
    p.add_argument("--keep", action="store_true",
                   help="leave the control plane (and the service) running at the end and print how "
                        "to use it with kubectl")
    p.add_argument("--use-current-context", action="store_true",
                   help="use the cluster of $KUBECONFIG's current context instead of a local control "
                        "plane (Prometheus, the simulator and the operator still run locally)")
    p.add_argument("--cluster-name", default=DEFAULT_CLUSTER,
                   help="name of the local control plane (default: %(default)s)")
    p.add_argument("--namespace", "-n", default=DEFAULT_NAMESPACE,
                   help="namespace of the demo's service (default: %(default)s)")
    p.add_argument("--workdir", default=None,
                   help="directory for logs, Prometheus data and kubeconfigs (default: a new temporary one)")
    p.add_argument("--plain", action="store_true",
                   help="periodic plain lines instead of the live view (the default when not a terminal)")
    p.set_defaults(func=run_demo)


# --------------------------------------------------------------------------- the settings


def _time_scale(args: argparse.Namespace, scenario_duration_s: float) -> float:
    from ..tools.scenario import ScenarioError, parse_duration

    if args.time_scale is not None:
        if not args.time_scale > 0:
            raise UserError(f"--time-scale: must be > 0, got {args.time_scale:g}")
        return args.time_scale
    try:
        wall = parse_duration(args.duration or DEFAULT_DURATION)
    except (ScenarioError, ValueError) as err:
        raise UserError(f"--duration {args.duration}: {err}; use e.g. 3m or 90s") from None
    if not wall > 0:
        raise UserError(f"--duration: must be > 0, got {args.duration}")
    return scenario_duration_s / wall


def _samples(args: argparse.Namespace, method: str) -> list[dict]:
    from ..documents import read_documents
    from ..tools.demo import DEFAULT_SAMPLE, SAMPLE_FOR_METHOD
    from ..tools.localstack.install import REPO

    paths = [Path(p) for p in args.sample] if args.sample else [
        REPO / "manifests" / "samples" / SAMPLE_FOR_METHOD.get(method, DEFAULT_SAMPLE)]
    services = []
    for path in paths:
        try:  # the CLI's one strict reader (UTF-8, YAML, no repeated key)
            documents = [d.body for d in read_documents(str(path))]
        except UnreadableInput as err:
            raise UnreadableInput(f"--sample {err}") from None
        found = [d for d in documents if isinstance(d, dict) and d.get("kind") == "SpecDecodeService"]
        if not found:
            raise UserError(f"--sample {path}: no SpecDecodeService in it; pass a file like "
                            "manifests/samples/llama-3.1-8b-draft-model.yaml")
        services += found
    names = [s.get("metadata", {}).get("name") for s in services]
    if len(set(names)) != len(names):
        raise UserError(f"--sample: two services named alike ({', '.join(map(str, names))}); rename one")
    return services


def _claim_cluster(name: str):
    """One demo per local control plane: a second one would reuse the first's cluster and
    stop it when it ends. The lock (beside the cluster's state directory) goes with the
    process, however it ends."""
    import fcntl

    from ..tools.localstack.cluster import ClusterError, LocalCluster

    try:
        state_dir = LocalCluster(name).state_dir
    except ClusterError as err:
        raise UserError(f"--cluster-name: {err}") from None
    state_dir.parent.mkdir(parents=True, exist_ok=True)
    handle = open(state_dir.parent / f"{name}.demo.lock", "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise UserError(f"another specdecode demo runs on the local control plane {name!r}; wait for it to "
                        "end or pass --cluster-name OTHER") from None
    return handle


def _current_context_kubeconfig(workdir: Path) -> Path:
    """The current context of $KUBECONFIG (or ~/.kube/config), flattened into one file: its
    cluster, credentials and CA inline, so the stack can mint the operator's token for it."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise UserError("--use-current-context: kubectl is not on PATH; install it or drop the flag")
    done = subprocess.run([kubectl, "config", "view", "--minify", "--flatten", "--raw"], capture_output=True,
                          text=True, timeout=30)
    if done.returncode != 0 or "clusters:" not in done.stdout:
        raise UserError("--use-current-context: no current context in $KUBECONFIG or ~/.kube/config "
                        f"({done.stderr.strip() or 'empty config'}); set one with kubectl config use-context")
    path = workdir / "current-context.kubeconfig"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        handle.write(done.stdout)
    return path


# ------------------------------------------------------------------------ start-up display


class Steps:
    """Start-up progress: a spinner and elapsed time per step on a terminal, timestamped lines
    elsewhere. Each message of the stack starts a step and completes the one before."""

    def __init__(self, console, interactive: bool):
        self.console = console
        self.interactive = interactive
        self.started = time.monotonic()
        self._progress = None
        self._task = None

    def _ensure(self):
        if self._progress is None and self.interactive:
            from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._progress = Progress(SpinnerColumn(finished_text="[green]✓"),
                                      TextColumn("{task.description}", markup=False), TimeElapsedColumn(),
                                      console=self.console)
            self._progress.start()
        return self._progress

    def __call__(self, message: str) -> None:
        self._complete()
        progress = self._ensure()
        if progress is None:
            self.console.print(f"[{time.monotonic() - self.started:6.1f}s] {message}", markup=False)
            return
        self._task = progress.add_task(message, total=1)

    def _complete(self) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=1)
            self._task = None

    def pause(self) -> None:
        """Stop the display (another live display, the Go build's, takes over)."""
        self._complete()
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    close = pause


# ------------------------------------------------------------------------------- the run


def run_demo(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.text import Text

    from ..tools import demo as view
    from ..tools.localstack.build import BuildError, cached_binaries
    from ..tools.localstack.cluster import ClusterError
    from ..tools.localstack.install import InstallError
    from ..tools.localstack.prometheus import PrometheusError
    from ..tools.localstack.stack import Stack, StackError
    from ..tools.scenario import ScenarioError, builtin_scenario_path, load_scenario

    try:
        scenario = load_scenario(args.scenario)
    except ScenarioError as err:
        raise UserError(str(err)) from None
    scenario_arg = args.scenario if Path(args.scenario).exists() else str(builtin_scenario_path(args.scenario))
    scenario_arg = str(Path(scenario_arg).resolve())
    scale = _time_scale(args, scenario.duration)
    played = scenario.compressed(scale)
    total_s = played.duration
    services = _samples(args, scenario.method)
    lock = None if args.use_current_context else _claim_cluster(args.cluster_name)
    out = Path(args.out).resolve()
    if args.workdir:
        workdir = Path(args.workdir).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
    else:
        workdir = Path(tempfile.mkdtemp(prefix="specdecode-demo-"))

    console = Console(highlight=False)
    interactive = console.is_terminal and not args.plain
    if not console.is_terminal:
        console.soft_wrap = True  # whole lines in logs and pipes, never wrapped at 80 columns
    steps = Steps(console, interactive)
    stack = Stack(workdir, progress=steps)
    console.print(Text.assemble(("specdecode demo", "bold"), f": scenario {scenario.name} "
                                f"({view.clock(scenario.duration)}) played x{scale:.3g} in {view.clock(total_s)}; "
                                f"logs in {workdir}"))

    previous_term = signal.signal(signal.SIGTERM, _interrupt)
    # Ctrl-C must stop the demo even when it was started from a non-interactive shell's
    # background job, which hands its children SIGINT ignored (Python then installs no handler).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    applied: list[dict] = []
    interrupted = False
    try:
        # 1. The cluster.
        if args.use_current_context:
            kubeconfig = _current_context_kubeconfig(workdir)
            stack.use_existing_cluster(kubeconfig, kubectl=shutil.which("kubectl") or "kubectl")
            steps(f"using the current context's cluster ({kubeconfig})")
        else:
            cached = cached_binaries() is not None
            if not cached:
                steps.pause()
                console.print("building Kubernetes, etcd and kwok from Go modules (the first time only, "
                              "about 15 minutes)")
            stack.start_cluster(args.cluster_name, keep=args.keep, build_progress=not cached)
        kubectl = stack.kubectl_command
        # 2. Prometheus, then the operator pointed at it.
        prometheus = stack.start_prometheus(label="demo", scrape_interval_s=1.0)
        extra = ["--namespace", args.namespace, "--standalone"] if args.use_current_context else []
        operator = stack.start_operator(prometheus_url=prometheus.url, reconcile_interval_s=2.0,
                                        evaluation_tick_s=1.0, extra_args=extra)
        # 3. A clean namespace for the service (a kept cluster may still run the last one).
        steps(f"preparing namespace {args.namespace}")
        _prepare_namespace(kubectl, args.namespace, services)
        # 4. The simulator: the scenario's clock starts when it writes its (empty) targets.
        targets = workdir / "demo" / "targets.json"
        targets.unlink(missing_ok=True)
        simulated = stack.start_simulator(scenario_arg, prometheus, label="demo", namespaces=[args.namespace],
                                          time_scale=scale)
        t0, started_at = _scenario_clock(simulated.simulator, targets, 60)
        # 5. The service.
        manifests = [view.demo_service(s, namespace=args.namespace, prometheus_url=prometheus.url)
                     for s in services]
        names = ", ".join(m["metadata"]["name"] for m in manifests)
        steps(f"applying SpecDecodeService {names} ({args.namespace})")
        kubectl_run(kubectl, "apply", "--server-side", "--field-manager=specdecode-demo", "-f", "-",
                 input="\n".join(json.dumps(m) for m in manifests))
        applied = manifests
        steps.close()

        floor = min(api.parse_service(m).spec.acceptance_floor for m in manifests)
        events = view.scenario_events(played, floor)
        timelines: dict = {}
        reader = _ServiceReader(stack.kubeconfig, args.namespace)
        title = f"{scenario.name} x{scale:.3g}"
        try:
            _watch(console, interactive, reader, timelines, played, events, t0, started_at, total_s, title,
                   [operator.managed, simulated.simulator], view)
        except KeyboardInterrupt:
            interrupted = True
            console.print("[yellow]interrupted: summarising what was seen, then stopping everything[/]")
        end = min(time.monotonic() - t0, total_s)
        ordered = [timelines[key] for key in sorted(timelines)]
        # 6. Summary and picture.
        summaries = [view.summarize(timeline, events, end) for timeline in ordered]
        console.print()
        console.print("[bold]Summary[/]" + (" (interrupted)" if interrupted else ""))
        for summary in summaries:
            for line in summary.lines():
                console.print(line, highlight=False, markup=False)
        slo_e2e_s, slo_tpot_s = view.latency_slo(manifests[0])
        view.plot_timeline(ordered, played, events, out, end=max(end, 1.0), title=title, floor=floor,
                           slo_e2e_s=slo_e2e_s, slo_tpot_s=slo_tpot_s)
        console.print(f"timeline: {out}", markup=False)
        if args.summary_json:
            Path(args.summary_json).write_text(json.dumps({
                "scenario": scenario.name, "time_scale": scale, "played_s": end, "interrupted": interrupted,
                "events": [vars(e) for e in events],
                "services": [s.to_json() for s in summaries],
            }, indent=2))
        return 130 if interrupted else 0
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopping everything the demo started[/]")
        return 130
    except (StackError, InstallError, PrometheusError) as err:
        headline, _, details = str(err).partition("\n")
        if details:
            console.print(details, highlight=False, markup=False)
        raise UserError(headline) from None
    except (BuildError, ClusterError) as err:
        headline, _, details = str(err).partition("\n")
        if details:
            console.print(details, highlight=False, markup=False)
        raise UserError(f"the local control plane did not start: {headline}") from None
    finally:
        steps.close()
        # A second Ctrl-C must not leave half the stack behind.
        previous_int = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            _shut_down(console, stack, args, applied)
        finally:
            signal.signal(signal.SIGINT, previous_int)
            signal.signal(signal.SIGTERM, previous_term)
            if lock is not None:
                lock.close()


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _shut_down(console, stack, args: argparse.Namespace, applied: list[dict]) -> None:
    if args.use_current_context and applied and not args.keep:
        # Someone else's cluster: take the service away while the operator still runs (it
        # removes its finalizer); its Deployment follows by garbage collection.
        for manifest in applied:
            kubectl_run(stack.kubectl_command, "delete", "specdecodeservice", manifest["metadata"]["name"],
                     "-n", args.namespace, "--ignore-not-found", "--wait=true", "--timeout=60s", check=False)
    stack.close()
    if args.keep and stack.kubeconfig is not None:
        kubeconfig = shlex.quote(str(stack.kubeconfig))
        console.print()
        if args.use_current_context:
            console.print(f"the service stays in namespace {args.namespace} of your cluster; remove it with:",
                          markup=False)
            console.print(f"  kubectl delete namespace {args.namespace}", markup=False)
        else:
            console.print(f"the control plane '{args.cluster_name}' keeps running with the service "
                          "(the simulator, Prometheus and the operator stopped). Look at it with:", markup=False)
            console.print(f"  export KUBECONFIG={kubeconfig}", markup=False)
            console.print("  kubectl get sds -A")
            console.print(f"  kubectl describe sds -n {args.namespace}", markup=False)
            console.print(f"stop it with: specdecode cluster down --cluster-name {args.cluster_name}", markup=False)


# ---------------------------------------------------------------------------- the helpers


def _prepare_namespace(kubectl: list[str], namespace: str, services: list[dict]) -> None:
    """The namespace exists, and holds none of the demo's services nor their pods from an
    earlier run (the simulator would start counting for them)."""
    from .. import constants as C

    if kubectl_run(kubectl, "get", "namespace", namespace, check=False).returncode != 0:
        kubectl_run(kubectl, "create", "namespace", namespace)
        return
    for service in services:
        name = service["metadata"]["name"]
        kubectl_run(kubectl, "delete", "specdecodeservice", name, "-n", namespace, "--ignore-not-found",
                 "--wait=true", "--timeout=60s")
        deadline = time.monotonic() + 60
        while kubectl_run(kubectl, "get", "pods", "-n", namespace, "-l", f"{C.LABEL_SERVICE}={name}", "-o", "name",
                       check=False).stdout.strip():
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)


def _scenario_clock(process, targets: Path, timeout_s: float) -> tuple[float, datetime]:
    """When the simulator's scenario clock started, on this process's monotonic clock and as
    wall time: the simulator writes its targets file as it starts its clock, before it
    connects to the cluster."""
    from ..tools.localstack.stack import StackError, log_tail

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not process.alive():
            raise StackError(f"{process.name} exited ({process.process.returncode}):\n{log_tail(process.log_path)}")
        try:
            written = targets.stat().st_mtime
        except FileNotFoundError:
            time.sleep(0.05)
            continue
        now_wall, now_monotonic = time.time(), time.monotonic()
        age = max(0.0, now_wall - written)
        return now_monotonic - age, datetime.fromtimestamp(written, timezone.utc)
    raise StackError(f"{process.name} did not start within {timeout_s:.0f}s:\n{log_tail(process.log_path)}")


class _ServiceReader:
    """Lists the demo namespace's SpecDecodeServices with the kubernetes client."""

    def __init__(self, kubeconfig: Path, namespace: str):
        from kubernetes import client, config

        self._api = config.new_client_from_config(config_file=str(kubeconfig))
        self._custom = client.CustomObjectsApi(self._api)
        self.namespace = namespace

    def list(self) -> list[dict]:
        from .. import constants as C

        listed = self._custom.list_namespaced_custom_object(C.GROUP, C.VERSION, self.namespace, C.PLURAL,
                                                            _request_timeout=5)
        return listed.get("items", [])


def _watch(console, interactive: bool, reader: _ServiceReader, timelines: dict, played, events, t0: float,
           started_at: datetime, total_s: float, title: str, processes, view) -> None:
    """Poll the services every second until the scenario has played; draw the live view, or
    print a line per decision and event and a status line now and then."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    from ..tools.localstack.stack import StackError, log_tail

    live = None
    if interactive:
        from rich.live import Live

        live = Live(console=console, auto_refresh=False, transient=False, redirect_stdout=False)
        live.start()
    announced = 0
    last_plain = -PLAIN_STATUS_EVERY_S
    read_error = None
    try:
        while True:
            t = time.monotonic() - t0
            for process in processes:
                if not process.alive():
                    raise StackError(f"{process.name} exited ({process.process.returncode}) during the demo:\n"
                                     f"{log_tail(process.log_path)}")
            try:
                objects = reader.list()
                read_error = None
            except (ApiException, HTTPError, OSError) as err:
                objects, read_error = [], f"cannot read the services: {err}"
            new = view.record_all(timelines, objects, t, started_at)
            ordered = [timelines[key] for key in sorted(timelines)]
            if live is not None:
                scenario_line = view.scenario_now(played, events, t)
                if read_error:
                    scenario_line += f"  [{read_error}]"
                live.update(view.render_view(ordered, t=t, total=total_s, scenario_line=scenario_line,
                                             title=title), refresh=True)
            else:
                while announced < len(events) and events[announced].t <= t:
                    event = events[announced]
                    console.print(f"[{view.clock(event.t):>6}] scenario: {event.label}", markup=False)
                    announced += 1
                for timeline, decision in new:
                    console.print(view.decision_line(timeline, decision), highlight=False, markup=False)
                if t - last_plain >= PLAIN_STATUS_EVERY_S:
                    last_plain = t
                    for timeline in ordered:
                        console.print(view.status_line(timeline, t), highlight=False, markup=False)
                    if read_error:
                        console.print(f"[{view.clock(t):>6}] {read_error}", highlight=False, markup=False)
            if t >= total_s:
                return
            time.sleep(max(0.0, min(POLL_INTERVAL_S, total_s - t)))
    finally:
        if live is not None:
            live.stop()
