"""Start-up failures: fall back, report, or degrade; remember; forget when the spec changes."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from specdecode import api, constants as C, fallback
from specdecode.control import failures
from specdecode import status as st
from specdecode.render.workload import SpeculationChoice

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=timezone.utc)
VOCAB = ("ValueError: Target and draft model should have the same vocabulary size. Target model vocab_size=152064. "
         "Draft model vocab_size=151936. Using models with different tokenizers can cause out-of-bounds errors during "
         "speculative decoding.")


def _spec(mode="Auto", allow_disable=True) -> api.SpecDecodeServiceSpec:
    return api.parse_spec({"model": {"name": "Qwen/Qwen2.5-7B-Instruct"},
                           "speculation": {"method": "draft_model", "draftModel": "Qwen/Qwen2.5-0.5B-Instruct",
                                           "numSpeculativeTokens": 3, "allowDisable": allow_disable},
                           "autotune": {"mode": mode}})


def _failure(message=VOCAB) -> failures.PodFailure:
    return failures.PodFailure(pod="llama-abc", config_hash="h1", kind=failures.FailureKind.CRASH_LOOP,
                               detail="container vllm restarted 3 times", container="vllm", previous_log=True,
                               reason="Error", exit_code=1, restart_count=3, message=message)


def _outcome(spec, message=VOCAB, choice=SpeculationChoice(k=3)):
    failure = _failure(message)
    diagnosis = failures.diagnose_pod_failure(failure, "", failures.PodSpeculation.of(spec, choice.enabled))
    return fallback.apply_startup_failure(api.SpecDecodeServiceStatus(), spec, choice, "h1", failure, diagnosis, 4, T0)


def test_auto_mode_falls_back_and_remembers_why():
    result = _outcome(_spec())
    assert result.rerender is True
    assert result.status.speculation.enabled is False
    (failed,) = result.status.failed_configs
    assert (failed.cause, failed.k, failed.spec_generation, failed.classified) == ("VocabMismatch", 3, 4, True)
    cond = st.get_condition(result.status.conditions, C.COND_SPECULATION_EFFECTIVE)
    assert cond.reason == C.REASON_STARTUP_FAILURE
    assert "vocab_size=152064" in cond.message and "useHeterogeneousVocab" in cond.message
    assert result.status.history[-1].action == "fallback"
    assert result.events[0][:2] == ("Warning", C.REASON_STARTUP_FAILURE)


def test_current_choice_follows_the_fallback():
    spec = _spec()
    choice, reason = st.current_choice(spec, _outcome(spec).status)
    assert choice == SpeculationChoice.off() and reason.startswith(fallback.STARTUP_FAILURE_PREFIX)


@pytest.mark.parametrize("mode", ["Recommend", "Off"])
def test_other_modes_report_and_leave_speculation_alone(mode):
    result = _outcome(_spec(mode))
    assert result.rerender is False and result.status.speculation is None
    assert st.get_condition(result.status.conditions, C.COND_DEGRADED).status == "True"
    assert st.get_condition(result.status.conditions, C.COND_SPECULATION_EFFECTIVE).reason == C.REASON_STARTUP_FAILURE


def test_no_fallback_allowed_means_degraded():
    result = _outcome(_spec(allow_disable=False))
    assert result.rerender is False
    assert st.get_condition(result.status.conditions, C.COND_DEGRADED).reason == C.REASON_STARTUP_FAILURE


def test_a_crash_without_speculation_is_not_a_speculation_problem():
    result = _outcome(_spec(), message="ImportError: libcuda.so.1: cannot open shared object file",
                      choice=SpeculationChoice.off())
    assert result.rerender is False and result.status.failed_configs == []
    assert st.get_condition(result.status.conditions, C.COND_DEGRADED).status == "True"


def test_the_memory_lasts_until_the_spec_changes():
    spec = _spec()
    failed = _outcome(spec).status
    assert fallback.forget_stale_failures(failed, spec, 4, T0 + timedelta(days=3)) == failed
    fixed = fallback.forget_stale_failures(failed, spec, 5, T0 + timedelta(minutes=1))
    assert fixed.failed_configs == [] and fixed.speculation is None
    assert st.current_choice(spec, fixed)[0] == SpeculationChoice(k=3)


def test_unknown_causes_are_retried_after_the_back_off():
    spec = _spec()
    failed = _outcome(spec, message="Segmentation fault (core dumped)").status
    assert failed.failed_configs[0].classified is False
    assert fallback.active_failures(failed, spec, 4, T0 + timedelta(hours=1)) != []
    assert fallback.active_failures(failed, spec, 4, T0 + timedelta(hours=7)) == []


def test_an_incompatible_draft_is_not_rolled_out_in_auto_mode():
    spec = _spec()
    choice, reason = fallback.preflight_choice(spec, SpeculationChoice(k=3), "declared in spec", False, "vocab 152064 vs 151936")
    assert choice == SpeculationChoice.off() and reason.startswith(fallback.DRAFT_INCOMPATIBLE_PREFIX)
    # Recommend mode and allowDisable=false keep what runs; the condition reports it.
    assert fallback.preflight_choice(_spec("Recommend"), SpeculationChoice(k=3), "x", False, "m")[0] == SpeculationChoice(k=3)
    assert fallback.preflight_choice(_spec(allow_disable=False), SpeculationChoice(k=3), "x", False, "m")[0] == SpeculationChoice(k=3)


def test_a_passing_preflight_restores_the_declared_speculation():
    spec = _spec()
    choice, _ = fallback.preflight_choice(spec, SpeculationChoice.off(), fallback.DRAFT_INCOMPATIBLE_PREFIX + "x", True, "ok")
    assert choice == SpeculationChoice(k=3)
    # Off for another reason (the policy's) stays off.
    assert fallback.preflight_choice(spec, SpeculationChoice.off(), "alpha 0.2 < floor", True, "ok")[0] == SpeculationChoice.off()
