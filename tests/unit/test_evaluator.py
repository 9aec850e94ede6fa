"""The evaluator shell's log: which spelling of vLLM's names Prometheus stores, said once."""

from __future__ import annotations

import logging

from specdecode import api
from specdecode.evaluator import Evaluator
from specdecode.settings import OperatorSettings


def status(names: str | None) -> api.SpecDecodeServiceStatus:
    observations = {"metricNames": names} if names else None
    return api.SpecDecodeServiceStatus.model_validate({"observations": observations} if observations else {})


def test_the_spelling_found_is_logged_when_it_first_shows_and_when_it_changes(caplog):
    evaluator = Evaluator(kube=None, controller=None, settings=OperatorSettings())
    with caplog.at_level(logging.INFO, logger="specdecode.evaluator"):
        evaluator._log_metric_names("team-a", "llama", status(None), status("vllm_"))
        evaluator._log_metric_names("team-a", "llama", status("vllm_"), status("vllm_"))
        evaluator._log_metric_names("team-a", "llama", status("vllm_"), status("vllm:"))
        evaluator._log_metric_names("team-a", "llama", status("vllm:"), status(None))
    assert [r.getMessage() for r in caplog.records] == [
        "team-a/llama: Prometheus stores vLLM's series as vllm_... (status.observations.metricNames)",
        "team-a/llama: Prometheus stores vLLM's series as vllm:... (status.observations.metricNames)",
    ]
