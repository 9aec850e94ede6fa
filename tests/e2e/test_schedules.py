"""Per-batch-size K schedules end to end: the operator with `autotune.schedules: Auto` on the
real control plane, reading a real Prometheus scraping the simulator.

Run with your own cluster name: `SPECDECODE_E2E_CLUSTER=sched pytest -q tests/e2e/test_schedules.py`.
"""

from __future__ import annotations

import pytest
import yaml

from .conftest import poll_until
from .operator_harness import kubectl
from .test_control_loop import (
    EVALUATION_S, WINDOW_S, WORKLOAD, deployment_args, scenario_file, service, simulated, speculation, status,
    wait_evaluations, wait_live,
)

pytestmark = pytest.mark.e2e


def test_a_version_without_tables_runs_plain_k_and_says_why(cluster, kube_api, operator, namespace, tmp_path):
    """vLLM 0.23.0 has no num_speculative_tokens_per_batch_size: with schedules Auto the
    service runs plain K, status says why, and a load surge past the crossover is met the
    plain way (no table is ever rendered)."""
    phases = [{"at": 0, "request_rate": 4, "acceptance": 0.8, **WORKLOAD}]
    with simulated(cluster, tmp_path, namespace, scenario_file(tmp_path, "old-vllm", phases)) as sim:
        doc = service(namespace, sim.prometheus_url, schedules="Auto")
        doc["spec"]["engine"] = {"version": "0.23.0"}
        kubectl(cluster, "apply", "-f", "-", input=yaml.safe_dump(doc))
        wait_live(kube_api, namespace)
        st = poll_until(
            lambda: "0.23.0" in ((s := status(kube_api, namespace)).get("speculation") or {}).get("scheduleReason", "")
            and s, WINDOW_S + 6 * EVALUATION_S + 60, "status.speculation.scheduleReason to name the version",
        )
        assert "plain K" in st["speculation"]["scheduleReason"]
        assert "schedule" not in st["speculation"]
        assert speculation(st) == (True, 3)
        args = " ".join(deployment_args(kube_api, namespace))
        assert "num_speculative_tokens_per_batch_size" not in args
        steady = wait_evaluations(kube_api, operator, namespace, 3, 3 * EVALUATION_S + 60)
        assert steady.get("history", []) == [], steady["history"]
        # kubectl get shows the Schedule column, empty for plain K.
        table = kubectl(cluster, "get", "sds", "-n", namespace)
        assert "SCHEDULE" in table.stdout.splitlines()[0]
