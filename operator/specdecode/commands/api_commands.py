"""`specdecode crd`, `specdecode validate` and `specdecode render`: the API offline.

GitOps users run these in CI: validate what they commit, render what the operator would
apply, and pin the CRD. None of them needs a cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .. import constants as C
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
        help="check SpecDecodeService files as the apiserver and the operator would",
        description="Check every SpecDecodeService in the given files (multi-document YAML) and "
        "directories (every *.yaml / *.yml below, as in a GitOps repository; other kinds are "
        "skipped). Every error names its file and document. With --vllm, also run the installed vLLM's "
        "own `vllm serve` argument parser and speculative-config checks on every config the operator "
        "may render (off, K = minK..maxK). Exit 0 when all are valid, 2 when any is invalid or vLLM "
        "would refuse a config, 1 when vLLM would only silently drop part of one.",
    )
    p.add_argument("-f", "--filename", required=True, action="append", metavar="PATH",
                   help="YAML file, directory, or - for standard input (repeatable)")
    p.add_argument("--vllm-version", metavar="V", help="check against this vLLM version instead of spec.engine.version")
    p.add_argument("-o", "--output", choices=["text", "json"], default="text", help="output format (default text)")
    p.add_argument("--vllm", action="store_true",
                   help="also check with the installed vLLM (pip install 'specdecode-operator[vllm]')")
    p.set_defaults(func=run_validate)


def _yaml_files(path: str) -> list[str]:
    """`path` itself, or every YAML file below a directory (sorted, hidden ones skipped)."""
    if path == "-" or not os.path.isdir(path):
        return [path]
    found = sorted(
        str(f) for f in Path(path).rglob("*")
        if f.suffix in (".yaml", ".yml") and f.is_file()
        and not any(part.startswith(".") for part in f.relative_to(path).parts)
    )
    if not found:
        raise UserError(f"{path}: no *.yaml or *.yml file in the directory")
    return found


@dataclass
class DocumentResult:
    """What `specdecode validate` found in one document (document counts from 1)."""

    file: str
    document: int
    documents_in_file: int
    kind: str | None = None
    namespace: str | None = None
    name: str | None = None
    error: str | None = None
    service: Any = field(default=None, repr=False)  # the parsed service, when valid
    vllm_findings: list = field(default_factory=list)  # vllm_check.Finding, with --vllm

    @property
    def where(self) -> str:
        return self.file if self.documents_in_file == 1 else f"{self.file}: document {self.document}"

    def as_json(self) -> dict:
        return {"file": self.file, "document": self.document, "kind": self.kind, "namespace": self.namespace,
                "name": self.name, "valid": self.error is None, "error": self.error,
                "vllm": [{"kind": f.kind, "config": f.config, "check": f.check, "message": f.message}
                         for f in self.vllm_findings]}


def validate_document(doc: Any, result: DocumentResult, vllm_version: str | None) -> DocumentResult:
    """Validate one SpecDecodeService document and render it (pure: no cluster, no files)."""
    from .. import api
    from ..render.workload import RenderError, initial_choice, render_all

    metadata = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
    result.namespace, result.name = metadata.get("namespace"), metadata.get("name")
    try:
        service = api.parse_service(doc)
    except api.SpecError as err:
        result.error = str(err)
        return result
    result.namespace, result.name, result.service = service.namespace, service.name, service
    if vllm_version:
        service = with_vllm_version(service, vllm_version)
    try:
        render_all(service, initial_choice(service.spec))
    except RenderError as err:
        result.error = str(err)
    return result


def validate_paths(paths: list[str], vllm_version: str | None) -> list[DocumentResult]:
    """Every SpecDecodeService in `paths`; a file given by name must hold at least one."""
    results: list[DocumentResult] = []
    for given in paths:
        explicit = given == "-" or not os.path.isdir(given)
        for path in _yaml_files(given):
            try:
                docs = read_documents(path)
            except UserError as err:
                if explicit or "no YAML document" not in str(err):
                    results.append(DocumentResult(file=path, document=0, documents_in_file=1, error=str(err).removeprefix(f"{path}: ")))
                continue
            services = [(i, d) for i, d in enumerate(docs, 1) if isinstance(d, dict) and d.get("kind") == C.KIND]
            if not services and explicit:
                doc = docs[0]
                kind = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
                error = (f"kind: expected SpecDecodeService, got {kind!r}" if len(docs) == 1
                         else f"no SpecDecodeService among its {len(docs)} documents")
                results.append(DocumentResult(file=path, document=1, documents_in_file=1, kind=kind, error=error))
            for index, doc in services:
                results.append(validate_document(doc, DocumentResult(path, index, len(docs), kind=C.KIND), vllm_version))
    return results


def run_validate(args: argparse.Namespace) -> int:
    if args.vllm_version:
        check_vllm_version(args.vllm_version)
    results = validate_paths(args.filename, args.vllm_version)
    if not results:
        raise UserError(f"{', '.join(args.filename)}: no SpecDecodeService found")
    installed = _check_with_vllm(results) if args.vllm else None
    invalid = [r for r in results if r.error]
    refused = [r for r in results if any(f.refused for f in r.vllm_findings)]
    ignored = [r for r in results if r.vllm_findings and r not in refused]
    if args.output == "json":
        json.dump({"valid": not invalid and not refused, "errors": len(invalid), "vllm": installed,
                   "vllmRefused": len(refused), "vllmIgnored": len(ignored),
                   "documents": [r.as_json() for r in results]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for result in results:
            if result.error:
                print(f"error: {result.where}: {result.error}", file=sys.stderr)
            elif result.vllm_findings:
                _print_vllm_findings(result, installed)
            else:
                also = ""
                if installed:
                    from ..render.vllm_check import configs_to_check

                    checked = len(configs_to_check(result.service.spec))
                    also = f"; vLLM {installed} accepts all {checked} configs the operator may render"
                print(f"{result.where}: SpecDecodeService {result.namespace}/{result.name} is valid{also}")
        if len(results) > 1:
            print(f"{len(results) - len(invalid)} valid, {len(invalid)} invalid", file=sys.stderr if invalid else sys.stdout)
    if invalid or refused:
        return 2
    return 1 if ignored else 0


def _check_with_vllm(results: list[DocumentResult]) -> str:
    """Run the installed vLLM's own checks on every valid service; its version."""
    from ..render import vllm_check
    from ..render.workload import RenderError

    try:
        installed = vllm_check.installed_version()
    except vllm_check.VllmMissing as err:
        raise UserError(str(err)) from None
    for result in results:
        if result.error:
            continue
        try:
            result.vllm_findings = vllm_check.check_service(result.service)
        except RenderError as err:
            result.error = str(err)
    return installed


def _print_vllm_findings(result: DocumentResult, installed: str) -> None:
    from ..render import vllm_check

    declared = result.service.spec.engine.version
    if installed.lstrip("v") != declared.lstrip("v"):
        print(f"{result.where}: checked with the installed vLLM {installed} (spec.engine.version says "
              f"{declared}: the image's vLLM is what counts)", file=sys.stderr)
    for line in vllm_check.describe(result.vllm_findings):
        print(f"{result.where}: {line}", file=sys.stderr)


def check_vllm_version(version: str) -> None:
    """Refuse a --vllm-version that is not a release the support table was read from."""
    from ..render.features import KNOWN_VERSIONS, known_version

    if not known_version(version):
        raise UserError(f"--vllm-version {version}: unknown vLLM version; known: {', '.join(KNOWN_VERSIONS)} "
                        "and their patch releases, or a release before 0.8.2 (the legacy flags)")


def with_vllm_version(service, version: str):
    engine = service.spec.engine.model_copy(update={"version": version})
    return service.model_copy(update={"spec": service.spec.model_copy(update={"engine": engine})})


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
    from ..render.workload import RenderError, SpeculationChoice, initial_choice, render_all

    if args.vllm_version:
        check_vllm_version(args.vllm_version)
    service = load_service(args.filename)
    if args.vllm_version:
        service = with_vllm_version(service, args.vllm_version)
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
