"""The canary Deployment of an experiment: what a user sees with `kubectl get deploy,pods`."""

from __future__ import annotations

import pytest

from specdecode import api
from specdecode import constants as C
from specdecode.control.experiments import CanaryPlan
from specdecode.render.workload import (
    Canary, SpeculationChoice, canary_name, render_all, render_canary, render_deployment,
)


def service(**spec_overrides) -> api.SpecDecodeService:
    spec = {
        "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
        "speculation": {"method": "ngram", "numSpeculativeTokens": 3},
        "replicas": 3,
        **spec_overrides,
    }
    return api.parse_service({"apiVersion": C.API_VERSION, "kind": C.KIND,
                              "metadata": {"name": "llama", "namespace": "team-a"}, "spec": spec})


def test_the_canary_runs_the_candidate_on_its_own_replicas_behind_the_same_service():
    sds = service()
    canary = render_canary(sds, SpeculationChoice(k=5), owner_uid="uid-1")
    main = render_deployment(sds, SpeculationChoice(k=3), owner_uid="uid-1")
    assert canary["metadata"]["name"] == canary_name("llama") == "llama-canary"
    assert canary["spec"]["replicas"] == 1
    assert canary["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    pod_labels = canary["spec"]["template"]["metadata"]["labels"]
    service_selector = render_all(sds, SpeculationChoice(k=3))[1]["spec"]["selector"]
    assert service_selector.items() <= pod_labels.items()  # the Service sends it traffic
    assert pod_labels[C.LABEL_CONFIG_HASH] != main["spec"]["template"]["metadata"]["labels"][C.LABEL_CONFIG_HASH]
    assert canary["spec"]["template"]["metadata"]["annotations"][C.ANNOTATION_SPECULATION] == "ngram K=5"


def test_the_deployments_select_disjoint_pods():
    sds = service()
    canary = render_canary(sds, SpeculationChoice(k=5))
    main = render_deployment(sds, SpeculationChoice(k=3))
    main_pod_labels = main["spec"]["template"]["metadata"]["labels"]
    canary_selector = canary["spec"]["selector"]["matchLabels"]
    assert not canary_selector.items() <= main_pod_labels.items()
    assert C.LABEL_CANARY not in main_pod_labels


def test_a_capacity_neutral_canary_needs_a_replica_to_borrow():
    assert CanaryPlan().blocker(service(replicas=2).spec) is None
    message = CanaryPlan().blocker(service(replicas=1).spec)
    assert "spec.replicas >= 2" in message and "spec.rollout.maxSurge > 0" in message


def test_a_surge_budget_lets_a_single_replica_service_run_an_extra_canary():
    spec = service(replicas=1, rollout={"maxSurge": 1, "maxUnavailable": 0}).spec
    assert CanaryPlan(max_extra_replicas=1).blocker(spec) is None
    assert not CanaryPlan(max_extra_replicas=1).borrows_replicas(spec)


def test_the_canary_has_the_plans_replicas():
    canary = render_canary(service(replicas=4), SpeculationChoice(k=5), replicas=2)
    assert canary["spec"]["replicas"] == 2


def _selects(selector: dict, labels: dict) -> bool:
    """A label selector (matchLabels, matchExpressions with Exists/DoesNotExist) on pod labels."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for term in selector.get("matchExpressions", []):
        present = term["key"] in labels
        if (term["operator"] == "Exists") != present:
            return False
    return True


def test_while_an_experiment_runs_the_main_deployment_gives_the_canary_its_replicas():
    sds = service(replicas=3)
    objects = render_all(sds, SpeculationChoice(k=3), owner_uid="uid-1",
                         canary=Canary(candidate=SpeculationChoice(k=5), replicas=1, main_replicas=2))
    by_name = {(o["kind"], o["metadata"]["name"]): o for o in objects}
    main, canary = by_name[("Deployment", "llama")], by_name[("Deployment", "llama-canary")]
    assert main["spec"]["replicas"] + canary["spec"]["replicas"] == 3
    assert canary["spec"]["template"]["metadata"]["annotations"][C.ANNOTATION_SPECULATION] == "ngram K=5"
    assert canary["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert C.ANNOTATION_APPLIED_HASH in canary["metadata"]["annotations"]
    # Without an experiment: no canary, every replica in the main Deployment, nothing else moves.
    plain = render_all(sds, SpeculationChoice(k=3), owner_uid="uid-1")
    assert [o["metadata"]["name"] for o in plain if o["kind"] == "Deployment"] == ["llama"]
    assert plain[0]["spec"]["replicas"] == 3
    assert [o for o in plain if o["kind"] != "Deployment"] == [o for o in objects if o["kind"] != "Deployment"]


def test_the_pdb_protects_the_main_deployments_pods_and_not_the_canarys():
    sds = service(replicas=3)
    objects = render_all(sds, SpeculationChoice(k=3), canary=Canary(SpeculationChoice(k=5), 1, 2))
    pdb = next(o for o in objects if o["kind"] == "PodDisruptionBudget")
    main, canary = (o for o in objects if o["kind"] == "Deployment")
    main_pods = main["spec"]["template"]["metadata"]["labels"]
    canary_pods = canary["spec"]["template"]["metadata"]["labels"]
    assert _selects(pdb["spec"]["selector"], main_pods)
    assert not _selects(pdb["spec"]["selector"], canary_pods)
    # The main Deployment's own selector (immutable) still matches both; the canary's only its own.
    assert _selects(main["spec"]["selector"], canary_pods)
    assert not _selects(canary["spec"]["selector"], main_pods)


def test_a_schedule_on_trial_renders_its_table_on_the_canary_and_the_promoted_main_deployment_hashes_alike():
    """A schedule the operator chose runs on the canary with its table (vLLM's
    num_speculative_tokens_per_batch_size) under the hash its record names; once promoted,
    the main Deployment renders the same config from status.speculation, so the promotion
    is the config the canary measured."""
    from specdecode.control import state as cs
    from specdecode.control.experiments import Experiment, ExperimentPolicy, Purpose
    from specdecode.control.perfmodel import Schedule
    from specdecode.shell.experiments import canary_for

    sds = service(engine={"version": "0.33.0"}, autotune={"schedules": "Auto"})
    policy = ExperimentPolicy.from_spec(sds.spec)
    schedule = Schedule(((1, 32, 4), (33, 1024, 0)))
    record = Experiment(Purpose.CHANGE, policy.describe(4, schedule), policy.config_hash(4, schedule),
                        policy.config_hash(3), started_at=1_800_000_000.0, candidate_k=4,
                        candidate_schedule=schedule).to_record()
    assert record.candidate == "ngram 1-32:K4,33+:off"
    canary = canary_for(sds.spec, record)
    rendered = render_canary(sds, canary.candidate, owner_uid="uid-1")
    args = " ".join(rendered["spec"]["template"]["spec"]["containers"][0]["args"])
    assert '"num_speculative_tokens":4,"num_speculative_tokens_per_batch_size":[[1,32,4],[33,1024,0]]' in args
    assert rendered["spec"]["template"]["metadata"]["labels"][C.LABEL_CONFIG_HASH] == record.candidate_hash
    promoted = api.EffectiveSpeculation(enabled=True, method="ngram", k=4, since="2027-01-15T08:00:00Z",
                                        schedule=record.candidate_schedule,
                                        spec_hash=cs.declared_speculation_hash(sds.spec))
    choice, _, _ = cs.choose(sds.spec, api.SpecDecodeServiceStatus(speculation=promoted))
    main = render_deployment(sds, choice, owner_uid="uid-1")
    assert main["spec"]["template"]["metadata"]["labels"][C.LABEL_CONFIG_HASH] == record.candidate_hash
