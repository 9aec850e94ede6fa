"""Bad input held both ways: every spec of the corpus goes through `specdecode validate` and
through the real apiserver (server-side dry run, strict field validation, as `kubectl apply`
does), and the two verdicts agree case by case.

The corpus: every CEL rule's violation, every bound, zero durations, invalid Prometheus label
names, unknown fields, wrong types, huge strings, a spec over 256 KiB, the shipped samples
and hypothesis-generated specs. The dry runs go out in parallel: the whole module takes
seconds, not minutes.

Two kinds of disagreement are by design, and checked for exactly that: admitted, refused by
`validate`, and reported by the operator as Degraded/InvalidSpec with an Event, nothing
applied. A spec the schema cannot judge (a speculation method the declared vLLM version
lacks: refused when it renders; test_operator covers the operator's side), and a spec over
api.SPEC_MAX_BYTES made large by pass-through Kubernetes objects, which CEL cannot see into
(api.SPEC_MAX_BYTES says why they are not typed in the CRD; the last test here covers the
operator's side).
"""

from __future__ import annotations

import contextlib
import io
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Optional

import pytest
import yaml
from kubernetes import client

from specdecode import api
from specdecode import constants as C
from specdecode.cli import main as specdecode_main

from ..spec_corpus import (BROKEN, SAMPLES, VALID, document, generated_changes, sample_documents, spec_over,
                           spec_with)
from .operator_harness import kubectl, wait_namespace_usable

pytestmark = pytest.mark.e2e

HYPOTHESIS_EXAMPLES = 150


@dataclass
class Verdict:
    case: str
    doc: dict[str, Any]
    validate_ok: bool = False
    validate_message: str = ""
    admission_ok_python: bool = False  # schema and rules, before rendering
    too_large: bool = False  # over api.SPEC_MAX_BYTES: refused beyond admission
    apiserver_ok: bool = False
    apiserver_message: str = ""


def run_validate(doc: dict[str, Any], tmp_path, index: int) -> tuple[bool, str]:
    """`specdecode validate -f FILE`, in-process (its exit code and its message)."""
    path = tmp_path / f"case-{index}.yaml"
    path.write_text(yaml.safe_dump(doc))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = specdecode_main(["validate", "-f", str(path)])
    return code == 0, (err.getvalue() or out.getvalue()).strip()


def dry_run(kube_api, doc: dict[str, Any]) -> tuple[bool, str]:
    """Server-side dry run of a create, with strict field validation (kubectl's default)."""
    try:
        client.CustomObjectsApi(kube_api).create_namespaced_custom_object(
            C.GROUP, C.VERSION, doc["metadata"]["namespace"], C.PLURAL, doc, dry_run="All", field_validation="Strict"
        )
    except client.ApiException as err:
        try:
            message = json.loads(err.body).get("message", "")
        except (TypeError, ValueError):
            message = str(err.body)[:500]
        return False, f"{err.status}: {message}"
    return True, ""


def judge(cases: list[tuple[str, dict[str, Any]]], kube_api, tmp_path) -> list[Verdict]:
    verdicts = [Verdict(case, doc) for case, doc in cases]
    for index, verdict in enumerate(verdicts):
        verdict.validate_ok, verdict.validate_message = run_validate(verdict.doc, tmp_path, index)
        try:
            api.parse_service(verdict.doc)
            verdict.admission_ok_python = True
        except api.SpecTooLarge:
            verdict.admission_ok_python = verdict.too_large = True
        except api.SpecError:
            verdict.admission_ok_python = False
    with ThreadPoolExecutor(max_workers=8) as pool:
        for verdict, (ok, message) in zip(verdicts, pool.map(lambda v: dry_run(kube_api, v.doc), verdicts)):
            verdict.apiserver_ok, verdict.apiserver_message = ok, message
    return verdicts


def disagreements(verdicts: list[Verdict]) -> list[str]:
    """Cases where the apiserver and validate disagree, beyond the render-only errors."""
    found = []
    for v in verdicts:
        if v.apiserver_ok != v.admission_ok_python or (v.validate_ok and not v.apiserver_ok):
            found.append(f"{v.case}: apiserver {'accepts' if v.apiserver_ok else 'refuses'} "
                         f"({v.apiserver_message[:300]}); validate {'accepts' if v.validate_ok else 'refuses'} "
                         f"({v.validate_message[:300]})")
    return found


def test_every_corpus_case_gets_the_same_verdict_from_validate_and_the_apiserver(cluster, kube_api, operator,
                                                                                 namespace, tmp_path):
    cases = [(f"broken/{case}", document(spec_with(change), f"c{i}", namespace))
             for i, (case, change, _, _) in enumerate(BROKEN)]
    cases += [(f"valid/{case}", document(spec_with(change), f"v{i}", namespace))
              for i, (case, change, _, _) in enumerate(VALID)]
    cases.append(("valid/pass-through-240KiB", document(spec_over(240 * 1024), "big", namespace)))
    cases.append(("too-large/pass-through-300KiB", document(spec_over(300 * 1024), "bigger", namespace)))
    for name, doc in sample_documents():
        doc = {**doc, "metadata": {**doc["metadata"], "namespace": namespace}}
        cases.append((f"sample/{name}", doc))

    verdicts = judge(cases, kube_api, tmp_path)
    assert disagreements(verdicts) == []
    by_case = {v.case: v for v in verdicts}
    for i, (case, _, field, words) in enumerate(BROKEN):
        verdict = by_case[f"broken/{case}"]
        assert not verdict.validate_ok and not verdict.apiserver_ok, case
        # Both name the field: validate by its path, the apiserver by its own.
        assert verdict.validate_message.split(": ", 2)[2].startswith(field), (case, verdict.validate_message)
        leaf = field.rsplit(".", 1)[-1].split("[")[0]
        assert leaf in verdict.apiserver_message, (case, verdict.apiserver_message)
    too_large = by_case["too-large/pass-through-300KiB"]
    assert too_large.apiserver_ok and too_large.too_large and not too_large.validate_ok
    assert "spec.pod.volumes: " in too_large.validate_message and "256 KiB" in too_large.validate_message
    for case in [c for c in by_case if c.startswith(("valid/", "sample/"))]:
        assert by_case[case].validate_ok and by_case[case].apiserver_ok, (case, by_case[case])


def test_every_shipped_sample_passes_a_server_side_dry_run_with_kubectl(cluster, operator):
    """The README's install step: `kubectl apply -f manifests/samples/...` (client-side apply,
    strict validation) into the samples' own namespaces."""
    namespaces = sorted({yaml.safe_load(p.read_text())["metadata"].get("namespace", "default") for p in SAMPLES})
    created = []
    for ns in namespaces:
        wait_namespace_usable(cluster, ns)
        if kubectl(cluster, "get", "namespace", ns, check=False).returncode != 0:
            kubectl(cluster, "create", "namespace", ns)
            created.append(ns)
    try:
        for path in SAMPLES:
            done = kubectl(cluster, "apply", "--dry-run=server", "-f", str(path), check=False)
            assert done.returncode == 0, f"{path.name}: {done.stderr.strip()}"
            assert "(server dry run)" in done.stdout
    finally:
        for ns in created:
            kubectl(cluster, "delete", "namespace", ns, "--wait=false", check=False)


# ------------------------------------------------------------------------- generated specs


def test_generated_specs_get_the_same_verdict_from_validate_and_the_apiserver(cluster, kube_api, operator,
                                                                              namespace, tmp_path):
    changes = generated_changes(HYPOTHESIS_EXAMPLES)
    cases = [(f"generated/{i}: {json.dumps(change)[:200]}", document(spec_with(change), f"g{i}", namespace))
             for i, change in enumerate(changes)]
    verdicts = judge(cases, kube_api, tmp_path)
    assert disagreements(verdicts) == []
    # The generator reaches both sides of the line, not only one.
    accepted = sum(v.apiserver_ok for v in verdicts)
    assert 10 <= accepted <= len(verdicts) - 10, accepted


def test_a_spec_over_the_size_bound_is_reported_and_nothing_is_applied(cluster, kube_api, operator, namespace):
    """A spec whose pass-through objects take it over 256 KiB (the bounds keep every typed
    field under 120 KiB) is admitted by the apiserver; the operator refuses it as `validate`
    does: Degraded/InvalidSpec naming the field, an InvalidSpec Event, no Deployment. And kopf
    writes no copy of it into the annotations (before, its patch of one failed with 422 and it
    retried forever): it holds a digest in the operator, and its handler finished."""
    from .conftest import wait_for

    doc = document(spec_over(300 * 1024), "big", namespace)
    done = kubectl(cluster, "apply", "--server-side", "-f", "-", input=yaml.safe_dump(doc))
    assert "serverside-applied" in done.stdout

    def reported() -> Optional[dict]:
        sds = client.CustomObjectsApi(kube_api).get_namespaced_custom_object(C.GROUP, C.VERSION, namespace, C.PLURAL, "big")
        degraded = [c for c in (sds.get("status") or {}).get("conditions") or [] if c["type"] == C.COND_DEGRADED]
        invalid = degraded and degraded[0]["reason"] == C.REASON_INVALID_SPEC
        return sds if invalid else None

    sds = wait_for(reported, 60, "the big service to be Degraded/InvalidSpec")
    [degraded] = [c for c in sds["status"]["conditions"] if c["type"] == C.COND_DEGRADED]
    assert degraded["message"].startswith("spec.pod.volumes: ") and "256 KiB" in degraded["message"]

    def invalid_spec_events() -> list[dict]:
        listed = client.CoreV1Api(kube_api).list_namespaced_event(
            namespace, field_selector=f"involvedObject.name=big,reason={C.EVENT_INVALID_SPEC}")
        return listed.items

    wait_for(invalid_spec_events, 20, "an InvalidSpec Event")
    deployments = client.AppsV1Api(kube_api).list_namespaced_deployment(namespace).items
    assert [d.metadata.name for d in deployments] == []
    # kopf's bookkeeping on the service: none once its handler has succeeded (a failed one
    # leaves its progress and retries). Read again: the handler may finish after the status.
    def kopf_bookkeeping() -> Optional[bool]:
        annotations = client.CustomObjectsApi(kube_api).get_namespaced_custom_object(
            C.GROUP, C.VERSION, namespace, C.PLURAL, "big")["metadata"].get("annotations") or {}
        kept = {k: len(v) for k, v in annotations.items() if k.startswith(C.ANNOTATION_PREFIX)}
        return None if kept else True

    wait_for(kopf_bookkeeping, 20, "no kopf bookkeeping left on the service")
