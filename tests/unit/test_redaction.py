"""Redaction: planted secrets never reach status, Events, start-up diagnoses or the log."""

from __future__ import annotations

import io
import logging
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest
from hypothesis import given, settings, strategies as st

from specdecode import api, fallback
from specdecode.control import failures
from specdecode.shell import kube
from specdecode import status as status_module
from specdecode.render.workload import SpeculationChoice
from specdecode.redaction import MARK, RedactingFilter, install_log_redaction, redact

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)

# Each planted secret with the text around it that a pod, a log or an HTTP client produces.
PLANTED = [
    ("hf_AbCdEfGhIjKlMnOpQrStUvWx12", "huggingface_hub.errors: 401 for token {}"),
    ("hf_AbCdEfGhIjKlMnOpQrStUvWx12", "HF_TOKEN={} vllm serve"),
    ("s3cr3t-Bearer-Value-9f8e7d", "Authorization: Bearer {}"),
    ("c2VjcmV0LXZhbHVlLWluLWJhc2U2NA", "curl -H 'authorization: {}' http://x"),
    ("p4ssw0rd!", "http://admin:{}@prometheus.monitoring.svc:9090/api"),
    ("hunter2xyz", "password={} in the config"),
    ("tok-12345-abcde", "\"api_key\": \"{}\""),
    ("tok-12345-abcde", "access_token: {}"),
    ("eyJhbGciOiJSUzI1NiIsImtpZCI6IjEifQ.eyJzdWIiOiJzeXN0ZW06c2EifQ.c2lnbmF0dXJl", "token {} expired"),
    ("QmFzZTY0RW5jb2RlZFNlY3JldFZhbHVlMTIzNDU2Nzg5MA==", "key material {} loaded"),
]

# Text that must survive: the operator's own messages name models, flags, paths and hashes.
KEPT = [
    "Qwen/Qwen2-7B-Instruct-GPTQ-Int8-draft-model-v2",
    "--speculative-config {\"num_speculative_tokens\": 3, \"method\": \"eagle3\"}",
    "num_speculative_tokens=4",
    "/usr/lib/python3/dist-packages/vllm/model_executor/models/llama_eagle3",
    "config 3f2a9c1d0e4b5a6978f1e2d3c4b5a6978f1e2d3c4b5a6978f1e2d3c4b5a69781",
    "spec.metrics.auth.bearerTokenSecret (Secret team-a/prom, key token) cannot be read",
    'secret "hf-token" not found',
    "Fix: set modelCache.hfTokenSecret",
]


@pytest.mark.parametrize("secret, template", PLANTED)
def test_planted_secrets_are_removed(secret, template):
    text = template.format(secret)
    out = redact(text)
    assert secret not in out and MARK in out


@pytest.mark.parametrize("text", KEPT)
def test_the_operators_own_words_survive(text):
    assert redact(text) == text


def test_a_url_keeps_its_host():
    assert redact("http://u:p4ss@prom.x:9090/api") == f"http://{MARK}@prom.x:9090/api"


_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=80)


@settings(max_examples=200, deadline=None)
@given(before=_text, after=_text, planted=st.sampled_from(PLANTED))
def test_secrets_are_removed_whatever_surrounds_them(before, after, planted):
    secret, template = planted
    out = redact(before + " " + template.format(secret) + " " + after)
    assert secret not in out


@settings(max_examples=300, deadline=None)
@given(text=_text)
def test_redaction_is_idempotent(text):
    """Status read back must compare equal to status computed anew (no write loop)."""
    once = redact(text)
    assert redact(once) == once


# --- every surface ---------------------------------------------------------------------------

SECRET = "hf_PlantedTokenAbCdEfGh123456"
LEAKY = f"OSError: 401 Client Error for https://huggingface.co (token {SECRET}); Authorization: Bearer {SECRET}"


def test_status_condition_messages_are_redacted():
    conds = status_module.set_condition([], "Degraded", True, "StartupFailure", LEAKY, NOW, 1)
    wire = api.SpecDecodeServiceStatus(conditions=conds).to_wire()
    assert SECRET not in str(wire)
    # Read back from the apiserver it is the same: no status write on every pass.
    again = api.SpecDecodeServiceStatus.model_validate(wire).to_wire()
    assert again == wire


def test_every_status_text_is_redacted():
    status = api.SpecDecodeServiceStatus.model_validate(
        {
            "speculation": {"enabled": False, "reason": LEAKY},
            "recommendation": {"action": "hold", "enabled": False, "reason": LEAKY},
            "history": [{"time": "t", "action": "fallback", "reason": LEAKY}],
            "failedConfigs": [{"configHash": "abc", "specGeneration": 1, "cause": "Unknown", "message": LEAKY, "at": "t"}],
        }
    )
    assert SECRET not in str(status.to_wire())


@pytest.mark.parametrize("mode", ["Auto", "Recommend"])
def test_startup_failure_status_and_events_are_redacted(mode):
    """A failing pod's termination message and log carry a token: the diagnosis, the
    Degraded / SpeculationEffective conditions, the history and the Events do not."""
    spec = api.parse_spec({"model": {"name": "Qwen/Qwen2.5-7B-Instruct"},
                           "speculation": {"method": "draft_model", "draftModel": "Qwen/Qwen2.5-0.5B-Instruct",
                                           "numSpeculativeTokens": 3},
                           "autotune": {"mode": mode}})
    failure = failures.PodFailure(
        pod="svc-abc", config_hash="h1", kind=failures.FailureKind.CRASH_LOOP, detail=f"exit 1 ({SECRET})",
        container="vllm", previous_log=True, reason="Error", exit_code=1, restart_count=3,
        message=f"ValueError: invalid token {SECRET}",
    )
    diagnosis = failures.diagnose_pod_failure(failure, LEAKY, failures.PodSpeculation.of(spec, True))
    assert SECRET not in diagnosis.line and SECRET not in diagnosis.summary()
    outcome = fallback.apply_startup_failure(
        api.SpecDecodeServiceStatus(), spec, SpeculationChoice(k=3), "h1", failure, diagnosis, 1, NOW
    )
    assert outcome.events and any("svc-abc" in message for _, _, message in outcome.events)
    assert SECRET not in str(outcome.status.to_wire())
    assert all(SECRET not in redact(message) for _, _, message in outcome.events)  # post_event's step


def test_events_are_redacted():
    posted = []
    fake = kube.Kube.__new__(kube.Kube)
    fake.core = SimpleNamespace(create_namespaced_event=lambda ns, event: posted.append(event))
    owner = {"metadata": {"name": "svc", "namespace": "team-a", "uid": "u1"}}
    fake.post_event(owner, "Warning", "StartupFailure", LEAKY, NOW)
    assert posted and SECRET not in posted[0].message


def test_log_records_are_redacted_on_every_handler():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("specdecode.test-redaction")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        install_log_redaction()
        assert any(isinstance(f, RedactingFilter) for f in handler.filters)
        logger.warning("pod said: %s", LEAKY)
        try:
            raise RuntimeError(f"boom {SECRET}")
        except RuntimeError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    written = stream.getvalue()
    assert "pod said" in written and "RuntimeError" in written
    assert SECRET not in written


def test_kopfs_event_poster_redacts_too():
    """kopf posts handler warnings as Events through a log handler of its own."""
    from kopf._core.engines.posting import K8sPoster

    install_log_redaction()
    posters = [h for h in logging.getLogger("kopf.objects").handlers if isinstance(h, K8sPoster)]
    assert posters
    assert all(any(isinstance(f, RedactingFilter) for f in h.filters) for h in posters)
