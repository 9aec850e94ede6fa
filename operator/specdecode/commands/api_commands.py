"""`specdecode crd`, `specdecode validate` and `specdecode render`: the API offline.

GitOps users run these in CI: validate what they commit, render what the operator would
apply, and pin the CRD. None of them needs a cluster.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import yaml

from ..cli import UserError, command


def read_documents(path: str) -> list[Any]:
    """The YAML documents of a file (`-` for standard input), empty documents dropped."""
    try:
        text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
    except OSError as err:
        raise UserError(f"{path}: cannot read the file ({err.strerror}); check the path") from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or "malformed YAML"
        raise UserError(f"{path}: not valid YAML{where}: {problem}") from None
    if not docs:
        raise UserError(f"{path}: no YAML document found; expected a SpecDecodeService")
    return docs


def load_service(path: str):
    """The one SpecDecodeService in a file, validated; UserError naming the field otherwise."""
    from .. import api

    docs = read_documents(path)
    services = [d for d in docs if isinstance(d, dict) and d.get("kind") == "SpecDecodeService"]
    if len(services) != 1:
        if not services and len(docs) == 1:
            doc = docs[0]
            kind = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
            raise UserError(f"{path}: kind: expected SpecDecodeService, got {kind!r}")
        raise UserError(f"{path}: expected exactly one SpecDecodeService, found {len(services)}")
    try:
        return api.parse_service(services[0])
    except api.SpecError as err:
        raise UserError(f"{path}: {err}") from None


@command
def _crd(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("crd", help="print the SpecDecodeService CRD (the content of crds/specdecodeservices.yaml)")
    p.set_defaults(func=run_crd)


def run_crd(args: argparse.Namespace) -> int:
    from ..crd import crd_yaml

    sys.stdout.write(crd_yaml())
    return 0


@command
def _validate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "validate",
        help="check a SpecDecodeService file as the apiserver and the operator would",
        description="Check a SpecDecodeService file as the apiserver and the operator would. With "
        "--vllm, also run the installed vLLM's own `vllm serve` argument parser and speculative-config "
        "checks on every config the operator may render (off, K = minK..maxK): exit 2 when vLLM would "
        "refuse one, 1 when it would silently drop part of it.",
    )
    p.add_argument("-f", "--filename", required=True, help="YAML file, or - for standard input")
    p.add_argument("--vllm", action="store_true",
                   help="also check with the installed vLLM (pip install 'specdecode-operator[vllm]')")
    p.set_defaults(func=run_validate)


def run_validate(args: argparse.Namespace) -> int:
    from ..render import RenderError, initial_choice, render_all

    service = load_service(args.filename)
    try:
        render_all(service, initial_choice(service.spec))
    except RenderError as err:
        raise UserError(f"{args.filename}: {err}") from None
    if args.vllm:
        return _validate_with_vllm(args.filename, service)
    print(f"{args.filename}: SpecDecodeService {service.namespace}/{service.name} is valid")
    return 0


def _validate_with_vllm(filename: str, service) -> int:
    from .. import vllm_check
    from ..render import RenderError

    try:
        installed = vllm_check.installed_version()
        findings = vllm_check.check_service(service)
    except vllm_check.VllmMissing as err:
        raise UserError(str(err)) from None
    except RenderError as err:
        raise UserError(f"{filename}: {err}") from None
    declared = service.spec.engine.version
    note = "" if installed.lstrip("v") == declared.lstrip("v") else (
        f" (spec.engine.version says {declared}: the image's vLLM is what counts)"
    )
    if findings and note:
        print(f"{filename}: checked with the installed vLLM {installed}{note}", file=sys.stderr)
    for line in vllm_check.describe(findings):
        print(f"{filename}: {line}", file=sys.stderr)
    if any(f.kind == vllm_check.REFUSED for f in findings):
        return 2
    if findings:
        return 1
    checked = len(vllm_check.configs_to_check(service.spec))
    print(f"{filename}: SpecDecodeService {service.namespace}/{service.name} is valid; vLLM {installed}{note} "
          f"accepts all {checked} configs the operator may render")
    return 0


@command
def _render(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "render",
        help="print the objects the operator would apply for a SpecDecodeService",
        description="Print the Deployment, Service, PodDisruptionBudget and PodMonitor for a "
        "SpecDecodeService as a stream ready for `kubectl apply -f -`.",
    )
    p.add_argument("-f", "--filename", required=True, help="YAML file, or - for standard input")
    choice = p.add_mutually_exclusive_group()
    choice.add_argument("--k", type=int, metavar="N", help="render with K=N instead of spec.speculation.numSpeculativeTokens")
    choice.add_argument("--off", action="store_true", help="render with speculation off")
    p.add_argument("--vllm-version", metavar="V", help="override spec.engine.version (the argument dialect)")
    p.add_argument("-o", "--output", choices=["yaml", "json"], default="yaml", help="output format (default yaml)")
    p.add_argument("--no-pod-monitor", action="store_true", help="leave out the PodMonitor (no Prometheus Operator)")
    p.set_defaults(func=run_render)


def run_render(args: argparse.Namespace) -> int:
    from ..render import RenderError, SpeculationChoice, initial_choice, render_all

    service = load_service(args.filename)
    if args.vllm_version:
        engine = service.spec.engine.model_copy(update={"version": args.vllm_version})
        service = service.model_copy(update={"spec": service.spec.model_copy(update={"engine": engine})})
    spec = service.spec
    if args.off:
        choice = SpeculationChoice.off()
    elif args.k is not None:
        if not spec.speculation.min_k <= args.k <= spec.speculation.max_k:
            raise UserError(
                f"--k {args.k}: must lie within spec.speculation [minK, maxK] = "
                f"[{spec.speculation.min_k}, {spec.speculation.max_k}]"
            )
        choice = SpeculationChoice(k=args.k)
    else:
        choice = initial_choice(spec)
    try:
        objects = render_all(service, choice, pod_monitor_served=not args.no_pod_monitor)
    except RenderError as err:
        raise UserError(f"{args.filename}: {err}") from None
    if args.output == "json":
        json.dump({"apiVersion": "v1", "kind": "List", "items": objects}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(yaml.safe_dump_all(objects, sort_keys=False, width=1000))
    return 0
