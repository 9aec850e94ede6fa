"""`specdecode crd`, `specdecode validate` and `specdecode render`: the API offline.

GitOps users run these in CI: validate what they commit, render what the operator would
apply, and pin the CRD. None of them needs a cluster.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from typing import Any

import yaml

from .. import constants as C
from ..cli import ExitCode, InvalidInput, UnreadableInput, UserError, add_output_flag, command
from ..documents import Document, find_files, read_documents

# The first word of the part of a message that says what to do (`minK must not exceed maxK:
# lower minK or raise maxK`): how the messages of api.py and the renderer are worded.
FIX_VERBS = frozenset(
    "add check choose declare delete drop give install keep leave lower make mount move name pass pick "
    "point put quote raise reduce remove rename run save set shorten split start turn upgrade use write".split()
)
_FIELD = re.compile(r"[A-Za-z][\w.\[\]/-]*")
_FIX_SPLIT = re.compile(r"(: |; )(?=([a-z]+)\b)")
DURATION_EXAMPLE = "a duration such as 30s, 5m, 1h30m or 250ms"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a document: the field it is about, what is wrong, and what to do."""

    field: str | None
    message: str
    fix: str | None = None
    separator: str = ": "

    @classmethod
    def of(cls, text: str) -> "Problem":
        """A problem from a message worded `field: what is wrong: what to do`."""
        field_name, sep, rest = text.partition(": ")
        if not sep or not _FIELD.fullmatch(field_name):
            field_name, rest = None, text
        for split in _FIX_SPLIT.finditer(rest):
            if split.group(2) in FIX_VERBS:
                return cls(field_name, rest[:split.start()], rest[split.end():], split.group(1))
        return cls(field_name, rest)

    def __str__(self) -> str:
        head = f"{self.field}: " if self.field else ""
        return head + self.message + (f"{self.separator}{self.fix}" if self.fix else "")

    def as_json(self) -> dict:
        return {"field": self.field, "message": self.message, "fix": self.fix}


def spec_problems(err: Exception) -> list[Problem]:
    """Every problem of a spec api.parse_service refused (its message names only the first).

    Each pydantic error is worded by api.describe_validation_error, one at a time; a duration
    that fails the API's pattern says what a duration looks like instead of the pattern.
    """
    from pydantic import ValidationError

    from .. import api

    cause = err.__cause__ or err.__context__
    if not isinstance(err, api.SpecError) or not isinstance(cause, ValidationError):
        return [Problem.of(str(err))]
    problems = []
    for error in cause.errors(include_url=False):
        line = {key: error[key] for key in ("type", "loc", "input", "ctx") if key in error}
        try:
            text = api.describe_validation_error(ValidationError.from_exception_data(cause.title, [line]))
        except KeyError:  # a custom error type pydantic cannot rebuild: its own words
            text = f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}"
        if error["type"] == "string_pattern_mismatch" and error.get("ctx", {}).get("pattern") == api.DURATION_PATTERN:
            field_name = text.partition(": ")[0]
            problems.append(Problem(field_name, f"{error['input']!r} is not a duration", f"write {DURATION_EXAMPLE}"))
        else:
            problems.append(Problem.of(text))
    if not str(err).startswith(str(problems[0]).partition(": ")[0]):
        return [Problem.of(str(err))]  # the context is not this error's source: keep its message
    return problems


def load_service(path: str):
    """The one SpecDecodeService in a file, validated; InvalidInput naming every problem otherwise."""
    results = validate_paths([path], None).results
    if len(results) != 1:
        raise InvalidInput(f"{path}: expected exactly one SpecDecodeService, found {len(results)}")
    result = results[0]
    if result.problems:
        raise result.as_error()
    return result.service


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
        "folders (every *.yaml / *.yml below, as in a GitOps repository; other kinds, hidden folders and "
        "Helm charts are skipped). Every problem of every document is reported, with its file and "
        "document. With --vllm, also run the installed vLLM's own `vllm serve` argument parser and "
        "speculative-config checks on every config the operator may render (off, K = minK..maxK). "
        "Exit 0 when all are valid, 4 when any is invalid, 5 when a file cannot be read, 2 when vLLM "
        "would refuse a config, 1 when vLLM would only silently drop part of one.",
    )
    _add_filename_flag(p)
    p.add_argument("--vllm-version", metavar="V", help="check against this vLLM version instead of spec.engine.version")
    add_output_flag(p)
    p.add_argument("--vllm", action="store_true",
                   help="also check with the installed vLLM (pip install 'specdecode-operator[vllm]')")
    p.set_defaults(func=run_validate)


def _add_filename_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--filename", required=True, action="append", metavar="PATH",
                        help="YAML file (multi-document allowed), folder, or - for standard input (repeatable)")


@dataclass
class DocumentResult:
    """What `validate` found in one document (document counts from 1; 0: the file was unreadable)."""

    file: str
    document: int
    documents_in_file: int
    kind: str | None = None
    namespace: str | None = None
    name: str | None = None
    problems: list[Problem] = field(default_factory=list)
    unreadable: bool = False  # the file could not be read (no document in it was looked at)
    service: Any = field(default=None, repr=False)  # the parsed service, when valid
    vllm_findings: list = field(default_factory=list)  # vllm_check.Finding, with --vllm
    warnings: list[Problem] = field(default_factory=list)  # valid, but worth knowing (exit code unchanged)

    @property
    def where(self) -> str:
        return self.file if self.documents_in_file == 1 else f"{self.file}: document {self.document}"

    @property
    def error(self) -> str | None:
        return "; ".join(str(p) for p in self.problems) or None

    @property
    def exit_code(self) -> ExitCode:
        if self.unreadable:
            return ExitCode.UNREADABLE
        return ExitCode.INVALID if self.problems else ExitCode.OK

    def as_error(self) -> UserError:
        kind = UnreadableInput if self.unreadable else InvalidInput
        return kind("\n".join(f"{self.where}: {p}" for p in self.problems))

    def problems_json(self) -> list[dict]:
        return [{"file": self.file, "document": self.document, "kind": self.kind, "namespace": self.namespace,
                 "name": self.name, **p.as_json()} for p in self.problems]

    def as_json(self) -> dict:
        return {"file": self.file, "document": self.document, "kind": self.kind, "namespace": self.namespace,
                "name": self.name, "valid": not self.problems, "error": self.error,
                "problems": [p.as_json() for p in self.problems],
                "warnings": [p.as_json() for p in self.warnings],
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
        result.problems = spec_problems(err)
        return result
    result.namespace, result.name, result.service = service.namespace, service.name, service
    if vllm_version:
        service = with_vllm_version(service, vllm_version)
    try:
        render_all(service, initial_choice(service.spec))
    except RenderError as err:
        result.problems = [Problem.of(str(err))]
        return result
    result.warnings = disruption_warnings(service.spec)
    return result


def disruption_warnings(spec: Any) -> list[Problem]:
    """What autotune may do to the running service that its owner should know before applying
    it: the OutageRisk condition the operator will set (`control.disruption.outage_risk`), as
    a warning when changes may take the service down or when they can only be recommendations."""
    from .. import api
    from ..control import disruption
    from ..control.settings import PolicySettings

    risk = disruption.outage_risk(PolicySettings.from_spec(spec), spec.autotune.mode == api.AutotuneMode.AUTO)
    if risk.status:
        return [Problem("spec.autotune.allowOutages", f"autotune may take the service down: {risk.what}", risk.fix)]
    if risk.reason == "ChangesAreRecommendations":
        return [Problem("spec.rollout", f"autotune will only recommend changes: {risk.what}", risk.fix)]
    return []


@dataclass
class Validation:
    """Every SpecDecodeService the paths hold, checked, and the Helm charts skipped on the way."""

    results: list[DocumentResult]
    skipped_charts: list[str]

    @property
    def exit_code(self) -> ExitCode:
        return max((r.exit_code for r in self.results), default=ExitCode.OK)

    def problems_json(self) -> list[dict]:
        return [item for r in self.results for item in r.problems_json()]


def validate_paths(paths: list[str], vllm_version: str | None) -> Validation:
    """Every SpecDecodeService in `paths` (the reader of both `validate` and `render`); a file
    named on the command line must hold at least one."""
    found = find_files(paths)
    results: list[DocumentResult] = []
    for path in found.files:
        explicit = path in found.explicit
        try:
            docs = read_documents(path)
        except UnreadableInput as err:
            message = str(err).removeprefix(f"{path}: ")
            results.append(DocumentResult(path, 0, 1, problems=[Problem.of(message)], unreadable=True))
            continue
        services = [d for d in docs if isinstance(d.body, dict) and d.body.get("kind") == C.KIND]
        if not services and explicit:
            results.append(_not_a_service(path, docs))
        for doc in services:
            results.append(validate_document(doc.body, DocumentResult(path, doc.index, doc.count, kind=C.KIND), vllm_version))
    if not results:
        skipped = f" (Helm charts skipped: {', '.join(found.skipped_charts)})" if found.skipped_charts else ""
        raise InvalidInput(f"{', '.join(paths)}: no SpecDecodeService found{skipped}")
    return Validation(results, found.skipped_charts)


def _not_a_service(path: str, docs: list[Document]) -> DocumentResult:
    if not docs:
        return DocumentResult(path, 0, 1, problems=[Problem(None, "no YAML document found", "expected a SpecDecodeService", "; ")])
    body = docs[0].body
    kind = body.get("kind") if isinstance(body, dict) else type(body).__name__
    problem = (Problem("kind", f"expected SpecDecodeService, got {kind!r}") if len(docs) == 1
               else Problem(None, f"no SpecDecodeService among its {len(docs)} documents"))
    return DocumentResult(path, 1, 1, kind=kind, problems=[problem])


def print_skipped_charts(validation: Validation) -> None:
    for chart in validation.skipped_charts:
        print(f"{chart}: skipped: a Helm chart (its templates are not plain YAML); check what it renders "
              "with `helm template ... | specdecode validate -f -`", file=sys.stderr)


def print_problems(validation: Validation, output: str) -> None:
    """Every problem of every document on stderr: one line each, or one JSON object."""
    if output == "json":
        json.dump({"valid": False, "problems": validation.problems_json()}, sys.stderr, indent=2)
        sys.stderr.write("\n")
        return
    for result in validation.results:
        for problem in result.problems:
            print(f"error: {result.where}: {problem}", file=sys.stderr)


def run_validate(args: argparse.Namespace) -> int:
    if args.vllm_version:
        check_vllm_version(args.vllm_version)
    validation = validate_paths(args.filename, args.vllm_version)
    results = validation.results
    installed = _check_with_vllm(results) if args.vllm else None
    invalid = [r for r in results if r.problems]
    refused = [r for r in results if any(f.refused for f in r.vllm_findings)]
    ignored = [r for r in results if r.vllm_findings and r not in refused]
    if args.output == "json":
        json.dump({"valid": not invalid and not refused, "errors": len(invalid), "vllm": installed,
                   "vllmRefused": len(refused), "vllmIgnored": len(ignored),
                   "skippedCharts": validation.skipped_charts, "problems": validation.problems_json(),
                   "documents": [r.as_json() for r in results]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print_skipped_charts(validation)
        for result in results:
            if result.problems:
                for problem in result.problems:
                    print(f"error: {result.where}: {problem}", file=sys.stderr)
            elif result.vllm_findings:
                _print_vllm_findings(result, installed)
                _print_warnings(result)
            else:
                also = ""
                if installed:
                    from ..render.vllm_check import configs_to_check

                    checked = len(configs_to_check(result.service.spec))
                    also = f"; vLLM {installed} accepts all {checked} configs the operator may render"
                print(f"{result.where}: SpecDecodeService {result.namespace}/{result.name} is valid{also}")
                _print_warnings(result)
        if len(results) > 1:
            print(f"{len(results) - len(invalid)} valid, {len(invalid)} invalid", file=sys.stderr if invalid else sys.stdout)
    if invalid:
        return validation.exit_code
    if refused:
        return ExitCode.INVALID  # vLLM's own parser refuses a config the operator would render
    return ExitCode.FINDING if ignored else ExitCode.OK


def _print_warnings(result: DocumentResult) -> None:
    for warning in result.warnings:
        print(f"warning: {result.where}: {warning}", file=sys.stderr)


def _check_with_vllm(results: list[DocumentResult]) -> str:
    """Run the installed vLLM's own checks on every valid service; its version."""
    from ..render import vllm_check
    from ..render.workload import RenderError

    try:
        installed = vllm_check.installed_version()
    except vllm_check.VllmMissing as err:
        raise UserError(str(err)) from None
    for result in results:
        if result.problems:
            continue
        try:
            result.vllm_findings = vllm_check.check_service(result.service)
        except RenderError as err:
            result.problems = [Problem.of(str(err))]
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
        help="print the objects the operator would apply for SpecDecodeServices",
        description="Print the Deployment, Service, PodDisruptionBudget and PodMonitor of every "
        "SpecDecodeService in the given files and folders (read as `validate` reads them) as one stream "
        "ready for `kubectl apply -f -`. When any is invalid, print every problem and nothing else.",
    )
    _add_filename_flag(p)
    choice = p.add_mutually_exclusive_group()
    choice.add_argument("--k", type=int, metavar="N", help="render with K=N instead of spec.speculation.numSpeculativeTokens")
    choice.add_argument("--off", action="store_true", help="render with speculation off")
    p.add_argument("--vllm-version", metavar="V", help="override spec.engine.version (the argument dialect)")
    add_output_flag(p, choices=("yaml", "json"), default="yaml")
    p.add_argument("--no-pod-monitor", action="store_true", help="leave out the PodMonitor (no Prometheus Operator)")
    p.set_defaults(func=run_render)


def _choice(result: DocumentResult, args: argparse.Namespace):
    from ..render.workload import SpeculationChoice, initial_choice

    speculation = result.service.spec.speculation
    if args.off:
        return SpeculationChoice.off()
    if args.k is None:
        return initial_choice(result.service.spec)
    if not speculation.min_k <= args.k <= speculation.max_k:
        raise UserError(f"--k {args.k}: must lie within spec.speculation [minK, maxK] = "
                        f"[{speculation.min_k}, {speculation.max_k}] of {result.where}")
    return SpeculationChoice(k=args.k)


def run_render(args: argparse.Namespace) -> int:
    from ..render.workload import RenderError, render_all

    if args.vllm_version:
        check_vllm_version(args.vllm_version)
    validation = validate_paths(args.filename, args.vllm_version)
    if validation.exit_code:
        print_problems(validation, args.output)
        return validation.exit_code
    if args.output != "json":
        print_skipped_charts(validation)
    objects: list[dict] = []
    for result in validation.results:
        service = with_vllm_version(result.service, args.vllm_version) if args.vllm_version else result.service
        try:
            objects += render_all(service, _choice(result, args), pod_monitor_served=not args.no_pod_monitor)
        except RenderError as err:
            raise InvalidInput(f"{result.where}: {err}") from None
    if args.output == "json":
        json.dump({"apiVersion": "v1", "kind": "List", "items": objects}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(yaml.safe_dump_all(objects, sort_keys=False, width=1000))
    return ExitCode.OK
