"""`specdecode bench faults --quick`, run as a user would: the operator killed at each crash
point, mid-rollout and at a random moment, the apiserver and Prometheus stopped, owned objects
deleted and edited, on a local control plane of its own. What a user relies on must hold:
no decision lost or repeated, no vLLM pod restarted for nothing, nothing changed while the
metrics were missing, and the operator back in control after every kill."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .conftest import E2E_CLUSTER_NAME

pytestmark = pytest.mark.e2e


def test_quick_fault_bench_loses_and_repeats_nothing(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "specdecode", "bench", "faults", "--quick", "--json",
         "--cluster-name", f"{E2E_CLUSTER_NAME}-faults", "--workdir", str(tmp_path)],
        capture_output=True, text=True, timeout=1500, env={**os.environ},
    )
    assert done.returncode in (0, 1), f"bench faults failed ({done.returncode}):\n{done.stderr[-4000:]}"
    report = json.loads(done.stdout)
    sys.stderr.write(done.stderr[-3000:])
    figures = report["figures"]
    verdicts = {t["name"]: t for t in report["targets"]}
    for name in ("decisions lost", "decisions duplicated in history", "extra vLLM pod starts",
                 "changes while metrics were missing"):
        assert verdicts[name]["holds"], (name, verdicts[name], figures)
    assert figures["decisions"] > 0, "the scenario must make the policy decide, or the kills prove nothing"
    assert figures["operator_exits"] == 0, figures
    # Back in control after every kill and outage. (The bench's own target is stricter, two
    # reconcile intervals, and reported as holds / falls short: a shared CI machine's load
    # says more about that one than the operator does.)
    kills = [f for f in figures["faults"] if f["fault"] == "operator SIGKILL"]
    assert sorted(f["detail"] for f in kills) == sorted(
        ["decision-in-status", "deployment-applied", "mid-rollout", "random-moment"]), kills
    for fault in figures["faults"]:
        if fault["fault"].startswith(("operator SIGKILL", "kube-apiserver", "Prometheus", "Deployment deleted",
                                      "Service deleted")):
            assert fault["converge_s"] is not None, (fault, figures)
