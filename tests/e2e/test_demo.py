"""`specdecode demo` end to end, as a newcomer runs it (plain output: not a terminal).

A short scenario with a collapse and a recovery plays on a control plane of the demo's own;
the summary must show speculation turned off after the collapse and back on after the
recovery, the PNG must be a real picture, and nothing the demo started may outlive it, also
when it is interrupted.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specdecode.tools.demo import FAST_AUTOTUNE
from specdecode.tools.localstack import LocalCluster
from specdecode.tools.scenario import parse_duration

from .conftest import wait_for

pytestmark = pytest.mark.e2e

# A name of its own per session: other sessions (another e2e run in the same tree, a
# developer's demo) keep theirs.
CLUSTER = os.environ.get("SPECDECODE_DEMO_TEST_CLUSTER") or f"demo-test-{os.getpid()}"

# 35 s good, 50 s collapsed, 85 s recovered, in real time: the fast autotune settings turn
# speculation off within seconds of the collapse, or within a minute when it is met by a
# lower K first (the collapse guard then waits for that K's warm-up and a second window), and
# re-probe it 60 s later (reprobeInterval), in the recovery.
SCENARIO = """\
name: demo-short
description: good draft, collapse, recovery, in under three minutes
duration: 170s
seed: 7
method: draft_model
phases:
  - {at: 0, request_rate: 4, acceptance: 0.8}
  - {at: 35s, acceptance: 0.2}
  - {at: 85s, acceptance: 0.8}
"""


def demo_command(tmp_path: Path, *extra: str) -> list[str]:
    scenario = tmp_path / "short.yaml"
    scenario.write_text(SCENARIO)
    return [sys.executable, "-m", "specdecode", "demo", "--scenario", str(scenario), "--time-scale", "1",
            "--cluster-name", CLUSTER, "--workdir", str(tmp_path / "work"), "--out", str(tmp_path / "demo.png"),
            "--summary-json", str(tmp_path / "summary.json"), *extra]


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that mention `text` (the demo's workdir)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{entry.name}: {cmdline}")
    return found


def assert_nothing_left(tmp_path: Path) -> None:
    wait_for(lambda: not processes_mentioning(str(tmp_path / "work")), 30,
             "every process of the demo to exit")
    assert LocalCluster(CLUSTER).status().state == "absent", "the demo's control plane is stopped and removed"


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "a PNG file"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 800 and height >= 600, (width, height)
    assert 20_000 < len(data) < 400_000, len(data)


@pytest.fixture
def no_leftover_cluster():
    local = LocalCluster(CLUSTER)
    local.down(progress=False)
    yield
    local.down(progress=False)  # only acts if a failed demo left it
    (local.state_dir.parent / f"{CLUSTER}.demo.lock").unlink(missing_ok=True)  # the demo's per-name lock


@pytest.mark.timeout(600)
def test_demo_plays_a_collapse_and_a_recovery_and_cleans_up(tmp_path, no_leftover_cluster):
    started = time.monotonic()
    process = subprocess.Popen(demo_command(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = process.communicate(timeout=480)
    except subprocess.TimeoutExpired:
        process.terminate()  # the demo stops its stack on SIGTERM; SIGKILL would orphan it
        output, _ = process.communicate(timeout=90)
        pytest.fail(f"the demo did not end within 8 minutes:\n{output[-6000:]}")
    assert process.returncode == 0, output[-6000:]

    # The plain output a CI log shows: the stack's steps, the story, the decisions, the summary.
    for expected in ("starting the local control plane", "starting the operator", "applying SpecDecodeService",
                     "scenario: collapse: acceptance 0.8 -> 0.2", "disable K=", "Summary", "collapse at",
                     f"timeline: {tmp_path / 'demo.png'}"):
        assert expected in output, f"{expected!r} missing from:\n{output[-6000:]}"

    summary = json.loads((tmp_path / "summary.json").read_text())
    (service,) = summary["services"]
    assert service["counts"].get("disable", 0) >= 1 and service["counts"].get("enable", 0) >= 1, service
    assert service["collapse_at"] == pytest.approx(35)
    # The first response lowers speculation within a few evaluations of the collapse; it may be
    # `disable` at once, or `set_k` down first (speculation hurting at that load) and `disable`
    # once that change's cooldown and warm-up have passed (the README shows both paths).
    assert service.get("collapse_response_after_s") is not None and service["collapse_response_after_s"] < 25, service
    settle = parse_duration(FAST_AUTOTUNE["cooldown"]) + parse_duration(FAST_AUTOTUNE["warmup"])
    evaluation = parse_duration(FAST_AUTOTUNE["evaluationInterval"])
    assert service["off_decided_after_s"] is not None, service
    assert service["off_decided_after_s"] <= service["collapse_response_after_s"] + settle + 3 * evaluation, service
    assert service["recovery_at"] == pytest.approx(85)
    assert service["on_decided_after_s"] is not None, "speculation came back on after the recovery"
    assert service["final_config"].startswith("K="), service

    assert_png(tmp_path / "demo.png")
    assert_nothing_left(tmp_path)
    sys.stderr.write(f"demo test took {time.monotonic() - started:.0f}s\n")


@pytest.mark.timeout(300)
def test_ctrl_c_stops_everything_the_demo_started(tmp_path, no_leftover_cluster):
    log = tmp_path / "demo.log"
    with open(log, "w") as out:
        process = subprocess.Popen(demo_command(tmp_path), stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: process.poll() is not None or "llama31-8b: Serving" in log.read_text(), 180,
                 "the demo's service to serve")
        assert process.poll() is None, log.read_text()[-4000:]
        process.send_signal(signal.SIGINT)
        returncode = process.wait(timeout=120)
    finally:
        if process.poll() is None:
            # A failed wait: let the demo stop its stack (SIGTERM) before giving up on it;
            # SIGKILL would leave its children (own sessions) behind.
            process.terminate()
            try:
                process.wait(timeout=90)
            except subprocess.TimeoutExpired:
                process.kill()
    output = log.read_text()
    assert returncode == 130, output[-4000:]
    assert "interrupted" in output and "Summary (interrupted)" in output, output[-4000:]
    assert_png(tmp_path / "demo.png")
    assert_nothing_left(tmp_path)
