"""`specdecode cluster`: build, start, inspect and stop the local control plane.

The cluster is real Kubernetes (kube-apiserver, etcd, controller-manager, scheduler) with
fake GPU nodes run by kwok, all on 127.0.0.1, built from Go modules on first use.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys

from specdecode.cli import UserError, add_cluster_name_flag, add_output_flag, command


def _add_target_arguments(parser: argparse.ArgumentParser) -> None:
    add_cluster_name_flag(parser, "specdecode", help="cluster name (default: %(default)s)")
    parser.add_argument("--state-dir", default=None,
                        help="directory of the cluster's state (default: "
                             "$SPECDECODE_STATE_DIR/NAME or ~/.local/state/specdecode/cluster/NAME)")


@command
def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("cluster", help="run a local Kubernetes control plane with fake GPU nodes",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    actions = parser.add_subparsers(dest="cluster_command", required=True, metavar="ACTION")

    build = actions.add_parser("build", help="build (or find cached) kube-apiserver, etcd, kwok and friends")
    build.add_argument("--rebuild", action="store_true", help="ignore the cache and build everything again")
    build.add_argument("--quiet", action="store_true", help="no progress output")
    build.set_defaults(func=_build)

    up = actions.add_parser("up", help="start the cluster (reuses it when already running with the same settings)")
    _add_target_arguments(up)
    up.add_argument("--nodes", type=int, default=4, help="fake GPU nodes (default: %(default)s)")
    up.add_argument("--gpus-per-node", type=int, default=8, help="nvidia.com/gpu per node (default: %(default)s)")
    up.add_argument("--ready-delay", default="2s",
                    help="time a pod runs before it turns Ready, simulating model loading (default: %(default)s)")
    up.add_argument("--fail-after", default="1s",
                    help="time before a pod annotated sim.specdecode.io/fail-startup crashes (default: %(default)s)")
    up.add_argument("--crash-backoff", default="1s",
                    help="back-off between crash-loop restarts (default: %(default)s)")
    up.add_argument("--port", type=int, default=0, help="kube-apiserver port on 127.0.0.1 (default: a free one)")
    up.add_argument("--recreate", action="store_true", help="delete a running cluster of this name first")
    up.add_argument("--quiet", action="store_true", help="no progress output")
    up.set_defaults(func=_up)

    down = actions.add_parser("down", help="stop every process of the cluster and delete its state")
    _add_target_arguments(down)
    down.set_defaults(func=_down)

    status = actions.add_parser("status", help="show whether the cluster runs (exit 0 running, 3 otherwise)")
    _add_target_arguments(status)
    add_output_flag(status)
    status.set_defaults(func=_status)

    kubeconfig = actions.add_parser("kubeconfig", help="print the kubeconfig path (export KUBECONFIG=$(...))")
    _add_target_arguments(kubeconfig)
    kubeconfig.set_defaults(func=_kubeconfig)

    env = actions.add_parser(
        "env", help="print the exports that put the stack's kubectl and helm first on PATH (eval \"$(...)\")")
    _add_target_arguments(env)
    env.set_defaults(func=_env)

    kubectl = actions.add_parser(
        "kubectl", help="run the stack's own kubectl (the control plane's version) against the cluster",
        description="Everything after `kubectl` is passed to kubectl, with --kubeconfig set to the cluster's.")
    _add_target_arguments(kubectl)
    kubectl.add_argument("kubectl_args", nargs=argparse.REMAINDER, metavar="ARGS", help="kubectl's arguments")
    kubectl.set_defaults(func=_kubectl)


def _cluster(args: argparse.Namespace):
    from specdecode.tools.localstack.cluster import ClusterError, LocalCluster

    try:
        return LocalCluster(args.name, args.state_dir)
    except ClusterError as err:
        raise UserError(str(err)) from err


def _fail(err: Exception) -> UserError:
    """Print the evidence lines (logs, go output) and turn the headline into a UserError."""
    headline, _, details = str(err).partition("\n")
    if details:
        print(details, file=sys.stderr)
    return UserError(headline)


def _build(args: argparse.Namespace) -> int:
    from specdecode.tools.localstack.build import BuildError, ensure_binaries

    try:
        binaries = ensure_binaries(progress=not args.quiet, rebuild=args.rebuild)
    except BuildError as err:
        raise _fail(err) from err
    for name, value in binaries.as_dict().items():
        print(f"{name}: {value}")
    return 0


def _up(args: argparse.Namespace) -> int:
    from specdecode.tools.localstack.build import BuildError
    from specdecode.tools.localstack.cluster import ClusterError

    cluster = _cluster(args)
    try:
        info = cluster.up(nodes=args.nodes, gpus_per_node=args.gpus_per_node, ready_delay=args.ready_delay,
                          fail_after=args.fail_after, crash_backoff=args.crash_backoff,
                          apiserver_port=args.port, recreate=args.recreate, progress=not args.quiet)
    except (BuildError, ClusterError) as err:
        raise _fail(err) from err
    kubeconfig = shlex.quote(str(info.kubeconfig))
    print(f"cluster {info.name!r} is up: {info.server} (Kubernetes {info.kubernetes_version}, "
          f"{info.spec.nodes} nodes x {info.spec.gpus_per_node} GPUs, pods Ready after {info.spec.ready_delay})")
    print("use it with:")
    print(f"  export KUBECONFIG={kubeconfig}")
    print(f"  {shlex.quote(str(info.kubectl))} --kubeconfig {kubeconfig} get nodes")
    print(f"audit log: {info.audit_log}")
    print(f"component logs: {info.log_dir}")
    print(f"stop it with: specdecode cluster down --cluster-name {info.name}")
    return 0


def _down(args: argparse.Namespace) -> int:
    from specdecode.tools.localstack.cluster import ClusterError

    try:
        _cluster(args).down()
    except ClusterError as err:
        raise _fail(err) from err
    return 0


def _status(args: argparse.Namespace) -> int:
    from specdecode.tools.localstack.cluster import ClusterError

    try:
        status = _cluster(args).status()
    except ClusterError as err:
        raise _fail(err) from err
    if args.output == "json":
        print(json.dumps({
            "name": status.name,
            "state": status.state,
            "detail": status.detail,
            "components": status.components,
            "info": status.info.to_json() if status.info else None,
        }, indent=2))
    else:
        print(f"cluster {status.name!r}: {status.state}" + (f" ({status.detail})" if status.detail else ""))
        if status.info:
            print(f"  server: {status.info.server}")
            print(f"  kubeconfig: {status.info.kubeconfig}")
            print(f"  audit log: {status.info.audit_log}")
        for component, pid in status.components.items():
            print(f"  {component}: " + (f"running (pid {pid})" if pid else "not running"))
    return 0 if status.state == "running" else 3


def _kubeconfig(args: argparse.Namespace) -> int:
    from specdecode.tools.localstack.cluster import ClusterError

    try:
        print(_cluster(args).kubeconfig())
    except ClusterError as err:
        raise _fail(err) from err
    return 0


def env_exports(kubeconfig: str, bin_dirs: list[str]) -> list[str]:
    """Shell lines that point kubectl/helm at the cluster and put the stack's binaries first."""
    path = ":".join(shlex.quote(d) for d in dict.fromkeys(bin_dirs))
    return [f"export KUBECONFIG={shlex.quote(kubeconfig)}", f'export PATH={path}:"$PATH"']


def _binaries_and_kubeconfig(args: argparse.Namespace):
    """The cached binaries and the kubeconfig of a running cluster; a UserError otherwise."""
    from specdecode.tools.localstack.build import cached_binaries
    from specdecode.tools.localstack.cluster import ClusterError

    binaries = cached_binaries()
    if binaries is None:
        raise UserError("the local stack's binaries are not built: run `specdecode cluster build` first")
    try:
        return binaries, _cluster(args).kubeconfig()
    except ClusterError as err:
        raise _fail(err) from err


def _env(args: argparse.Namespace) -> int:
    binaries, kubeconfig = _binaries_and_kubeconfig(args)
    print(f"# kubectl {binaries.kubernetes_version} and helm {binaries.helm_version} of the local stack; "
          f"run: eval \"$(specdecode cluster env --cluster-name {args.name})\"")
    for line in env_exports(str(kubeconfig), [str(binaries.kubectl.parent), str(binaries.helm.parent)]):
        print(line)
    return 0


def _kubectl(args: argparse.Namespace) -> int:
    binaries, kubeconfig = _binaries_and_kubeconfig(args)
    sys.stdout.flush()
    return subprocess.run([str(binaries.kubectl), "--kubeconfig", str(kubeconfig), *args.kubectl_args],
                          env=dict(os.environ)).returncode
