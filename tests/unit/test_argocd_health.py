"""GitOps health of a SpecDecodeService: the Argo CD Lua check run through real Lua (lupa, the
5.1 dialect Argo CD's gopher-lua speaks, and a current one), and the Flux CEL expressions run
through a CEL interpreter, on the same statuses: hand-written edge cases and statuses produced
by the operator's own status logic."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from specdecode import api, constants as C
from specdecode.control import status as st
from specdecode.render.workload import SpeculationChoice

REPO = Path(__file__).resolve().parents[2]
LUA_PATH = REPO / "manifests" / "argocd" / "health-specdecodeservice.lua"
ARGOCD_CM_PATCH = REPO / "manifests" / "argocd" / "argocd-cm-patch.yaml"
FLUX_PATH = REPO / "manifests" / "flux" / "specdecode-operator.yaml"
HEALTH_KEY = f"resource.customizations.health.{C.GROUP}_{C.KIND}"
T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=timezone.utc)
GENERATION = 3


# --------------------------------------------------------------------------- the statuses

def _spec() -> api.SpecDecodeServiceSpec:
    return api.parse_spec({"model": {"name": "m"}, "speculation": {"method": "ngram", "numSpeculativeTokens": 3}})


def _rollout(**overrides) -> st.RolloutState:
    live = dict(exists=True, desired=2, replicas=2, updated=2, ready=2, available=2, observed=True, config_matches=True)
    return st.RolloutState(**{**live, **overrides})


def _status_after(rollout: st.RolloutState, **outcome) -> dict:
    """The status the operator writes after one reconcile that found `rollout`."""
    result = st.ReconcileOutcome(rollout=rollout, choice=SpeculationChoice(k=3), choice_reason="declared in spec",
                                 config_hash="abc", method="ngram", selector="x=y", **outcome)
    return st.next_status(api.SpecDecodeServiceStatus(), result, _spec(), GENERATION, T0).to_wire()


def _invalid_spec_status() -> dict:
    serving = st.next_status(api.SpecDecodeServiceStatus(), st.ReconcileOutcome(
        rollout=_rollout(), choice=SpeculationChoice(k=3), config_hash="abc", method="ngram"), _spec(), GENERATION - 1, T0)
    bad = st.next_status(serving, st.ReconcileOutcome(invalid_spec="spec.engine.version: not a vLLM version"),
                         None, GENERATION, T0)
    return bad.to_wire()


def _sds(status: dict | None, generation: int = GENERATION) -> dict:
    body = {
        "apiVersion": C.API_VERSION,
        "kind": C.KIND,
        "metadata": {"name": "llama", "namespace": "team-a", "generation": generation},
        "spec": {"model": {"name": "m"}, "speculation": {"method": "ngram"}},
    }
    if status is not None:
        body["status"] = status
    return body


def _condition(type_: str, status: str, reason: str, message: str = "") -> dict:
    return {"type": type_, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": "2026-11-30T12:00:00Z", "observedGeneration": GENERATION}


# (case id, object, expected health, a fragment the message must contain)
CASES = [
    ("just-created", _sds(None), "Progressing", "Waiting for the operator"),
    ("empty-status", _sds({}), "Progressing", "Waiting for the operator"),
    ("edit-not-yet-observed", _sds({
        "phase": "Degraded", "observedGeneration": GENERATION - 1,
        "conditions": [_condition("Degraded", "True", C.REASON_INVALID_SPEC, "an old mistake")],
    }), "Progressing", f"observe generation {GENERATION}"),
    ("serving", _sds(_status_after(_rollout())), "Healthy", "2/2 replicas available"),
    ("rolling-out", _sds(_status_after(_rollout(updated=1, available=1))), "Progressing", "rolling out"),
    ("deployment-being-created", _sds(_status_after(st.RolloutState(exists=False))), "Progressing", "creating the Deployment"),
    ("rollout-deadline-exceeded", _sds(_status_after(_rollout(updated=1, available=1, deadline_exceeded=True))),
     "Degraded", "ProgressDeadlineExceeded"),
    ("apply-failed", _sds(_status_after(_rollout(), apply_error="applying children failed: forbidden")),
     "Degraded", "ApplyFailed: applying children failed"),
    ("invalid-spec", _sds(_invalid_spec_status()), "Degraded", "InvalidSpec: spec.engine.version"),
    ("scaled-to-zero", _sds(_status_after(_rollout(desired=0, replicas=0, updated=0, ready=0, available=0))),
     "Healthy", "Scaled to zero"),
    ("pods-lost-after-rollout", _sds({
        "phase": "Progressing", "observedGeneration": GENERATION,
        "conditions": [_condition("Degraded", "False", "AsExpected"),
                       _condition("Progressing", "False", C.REASON_ROLLOUT_COMPLETE),
                       _condition("Ready", "False", C.REASON_UNAVAILABLE, "0/2 replicas available")],
    }), "Progressing", "0/2 replicas available"),
    # A canary experiment runs beside the main Deployment, which keeps serving: still Healthy.
    ("experimenting", _sds({**_status_after(_rollout()), "conditions": _status_after(_rollout())["conditions"] + [
        _condition(C.COND_EXPERIMENTING, "True", C.REASON_CANARY_RUNNING, "ngram K=5 on 1 canary replica")]}),
     "Healthy", "2/2 replicas available"),
    ("phase-degraded-without-condition", _sds({"phase": "Degraded", "observedGeneration": GENERATION, "conditions": []}),
     "Degraded", "phase Degraded"),
]


def test_the_generated_statuses_are_what_the_cases_say():
    """Guards the fixtures: the statuses built from the status logic have the phase we assume."""
    phases = {case_id: (obj.get("status") or {}).get("phase") for case_id, obj, _, _ in CASES}
    assert phases["serving"] == C.PHASE_SERVING
    assert phases["rolling-out"] == C.PHASE_PROGRESSING
    assert phases["rollout-deadline-exceeded"] == C.PHASE_DEGRADED
    assert phases["invalid-spec"] == C.PHASE_DEGRADED
    assert phases["scaled-to-zero"] == C.PHASE_PENDING


# --------------------------------------------------------------------------- Argo CD (Lua)

LUA_RUNTIMES = ["lua51", "lua54"]


def run_lua_health(obj: dict, runtime: str) -> dict:
    module = pytest.importorskip(f"lupa.{runtime}")
    lua = module.LuaRuntime(unpack_returned_tuples=True)
    lua.globals().obj = lua.table_from(obj, recursive=True)
    result = lua.execute(LUA_PATH.read_text())
    return dict(result)


@pytest.mark.parametrize("runtime", LUA_RUNTIMES)
@pytest.mark.parametrize("case_id, obj, expected, fragment", CASES, ids=[c[0] for c in CASES])
def test_argocd_health(runtime, case_id, obj, expected, fragment):
    health = run_lua_health(obj, runtime)
    assert health["status"] == expected, health
    assert fragment in health["message"], health


def test_argocd_health_returns_only_argo_statuses():
    for _, obj, _, _ in CASES:
        assert set(run_lua_health(obj, "lua51")) == {"status", "message"}


def test_argocd_cm_patch_embeds_the_same_lua():
    patch = yaml.safe_load(ARGOCD_CM_PATCH.read_text())
    assert patch["kind"] == "ConfigMap" and patch["metadata"]["name"] == "argocd-cm"
    assert patch["data"][HEALTH_KEY] == LUA_PATH.read_text()
    ignore = yaml.safe_load(patch["data"][f"resource.customizations.ignoreResourceUpdates.{C.GROUP}_{C.KIND}"])
    assert ignore == {"jsonPointers": ["/status"]}


# --------------------------------------------------------------------------- Flux (CEL)

def flux_expressions() -> dict:
    docs = [d for d in yaml.safe_load_all(FLUX_PATH.read_text()) if d]
    checks = [check for d in docs if d["kind"] == "Kustomization"
              for check in d["spec"].get("healthCheckExprs", [])]
    (check,) = [c for c in checks if c["kind"] == C.KIND]
    assert check["apiVersion"] == C.API_VERSION
    return check


def run_flux_health(obj: dict) -> str:
    """kustomize-controller's order: inProgress, then failed, then current; the first that is
    true decides. An expression that cannot be evaluated (a field not there yet) keeps Flux
    waiting, as does no expression being true."""
    celpy = pytest.importorskip("celpy")
    check = flux_expressions()
    env = celpy.Environment()
    activation = {key: celpy.json_to_cel(value) for key, value in obj.items()}
    for field, verdict in (("inProgress", "Progressing"), ("failed", "Degraded"), ("current", "Healthy")):
        program = env.program(env.compile(check[field]))
        try:
            result = program.evaluate(activation)
        except celpy.CELEvalError:
            return "Progressing"
        if isinstance(result, celpy.CELEvalError):
            return "Progressing"
        if bool(result):
            return verdict
    return "Progressing"


@pytest.mark.parametrize("case_id, obj, expected, fragment", CASES, ids=[c[0] for c in CASES])
def test_flux_health_check_agrees_with_argocd(case_id, obj, expected, fragment):
    assert run_flux_health(obj) == expected


def test_flux_kustomizations_wait_for_health():
    docs = {d["metadata"]["name"]: d for d in yaml.safe_load_all(FLUX_PATH.read_text()) if d and d["kind"] == "Kustomization"}
    services = docs["llm-services"]["spec"]
    assert services["wait"] is True and services["dependsOn"] == [{"name": "specdecode-operator"}]
    operator = docs["specdecode-operator"]["spec"]
    assert (REPO / operator["path"]).is_dir()


def test_docs_show_the_checks_as_shipped():
    """The snippets users copy from the GitOps page are the tested files."""
    readme = (REPO / "docs" / "operations" / "gitops.md").read_text()
    assert LUA_PATH.read_text() in readme
    flux = FLUX_PATH.read_text()
    services = flux[flux.index("apiVersion: kustomize.toolkit.fluxcd.io/v1\nkind: Kustomization\nmetadata:\n  name: llm-services"):]
    assert services in readme
