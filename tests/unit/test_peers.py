"""The engine-side peers in the yardstick (issue #54): each mechanism as documented, scored
like the policy, and each model beside the numbers its project published."""

from __future__ import annotations

import json

import pytest
import yaml

from specdecode import cli
from specdecode.control import perfmodel
from specdecode.control.perfmodel import OFF, EngineParams, Schedule
from specdecode.tools.bench import peers, run, suite
from specdecode.tools.scenario import parse_scenario

COLLAPSE_AND_RECOVERY = {
    "name": "collapse-and-recovery",
    "duration": "40m",
    "seed": 5,
    "method": "eagle3",
    "slo": {"p95_e2e_s": 6, "p95_tpot_s": 0.02},
    "phases": [
        {"at": 0, "request_rate": 4, "acceptance": 0.8},
        {"at": "15m", "acceptance": 0.1},
        {"at": "25m", "acceptance": 0.8},
    ],
}


def test_a_schedule_that_drafts_a_block_pays_for_the_block_and_verifies_its_range():
    params = EngineParams.for_method("draft_model")
    plain_one = perfmodel.step_time(params, 1, 32, 600.0)
    plain_five = perfmodel.step_time(params, 5, 32, 600.0)
    drafted = perfmodel.step_time(params, Schedule(((1, 1024, 1),), draft_tokens=5), 32, 600.0)
    # Drafting five tokens costs more than drafting one; verifying one costs less than five.
    assert plain_one < drafted < plain_five + params.schedule_overhead_s
    assert Schedule(((1, 1024, 1),), draft_tokens=5).max_k == 5


def test_a_drafted_block_shorter_than_a_range_is_refused_naming_the_fix():
    with pytest.raises(perfmodel.ScheduleError, match="draft_tokens 2 is below a range's K"):
        Schedule(((1, 16, 3), (17, 1024, 0)), draft_tokens=2)


def test_the_per_step_choice_speculates_less_as_the_batch_grows_and_not_at_all_when_nothing_pays():
    params = EngineParams.for_method("draft_model")
    schedule = peers.per_step_schedule(params, 0.8, 600.0, range(0, params.max_k + 1))
    ks = [k for *_, k in schedule.bands]
    assert ks == sorted(ks, reverse=True) and ks[0] > ks[-1]
    assert peers.per_step_schedule(params, 0.05, 600.0, range(0, params.max_k + 1)) == OFF


def test_sglang_climbs_on_high_acceptance_drops_on_low_and_its_hysteresis_remembers_the_path():
    tiers = peers.SGLANG_TIERS
    assert peers.sglang_tier(0.95, 1.0, tiers, 3) == 7
    assert peers.sglang_tier(0.2, 1.0, tiers, 3) == 1
    # At 0.8 three steps accept too few to climb, seven accept enough to stay.
    assert peers.sglang_tier(0.8, 1.0, tiers, 3) == 3
    assert peers.sglang_tier(0.8, 1.0, tiers, 7) == 7


def _peer_runs(data) -> tuple[dict[str, peers.PeerRun], run.Yardstick]:
    scenario = parse_scenario(data)
    measure = run.yardstick(scenario, schedules=True)
    best = run.engine.best_axes(f.axes for f in measure.figures().values())
    runs = peers.run_peers(
        scenario, measure.evaluator, measure.declared, measure.statics, measure.schedule_statics,
        lambda segs: run.engine.headline(run.engine.axes_of(list(segs)), best)[0],
    )
    return runs, measure


def test_tensorrt_llms_off_switch_is_for_good_and_sglang_tracks_the_acceptance_back():
    runs, _ = _peer_runs(COLLAPSE_AND_RECOVERY)
    trt = runs[peers.TRTLLM_SCHEDULE]
    assert "off for good" in trt.note
    after_collapse = [s for s in trt.segments if s.start >= 15 * 60]
    assert after_collapse and all(s.config == OFF for s in after_collapse)
    sglang = runs[peers.SGLANG_ADAPTIVE]
    tiers = {s.start // 60: s.config for s in sglang.segments}
    assert tiers[20] == 1 and tiers[30] > 1


def test_sglangs_adaptive_mode_does_not_apply_to_a_draft_model_and_says_why():
    runs, _ = _peer_runs({**COLLAPSE_AND_RECOVERY, "method": "draft_model"})
    sglang = runs[peers.SGLANG_ADAPTIVE]
    assert not sglang.applies and "EAGLE, EAGLE-3 and MTP only, not draft_model" in sglang.note
    assert all(r.applies for name, r in runs.items() if name != peers.SGLANG_ADAPTIVE)


def test_a_table_with_a_k0_range_costs_the_acceptance_of_requests_that_cross_it_on_tensorrt_llm():
    params = EngineParams.for_method("eagle3")
    busy = perfmodel.Workload(request_rate=60.0, prompt_tokens=500, output_tokens=300, acceptance=0.8)
    straddling = Schedule(((1, 32, 3), (33, 1024, 0)))
    assert peers.intact_share(params, busy, straddling, 2) < 0.5
    assert peers.intact_share(params, busy, Schedule(((1, 32, 3), (33, 1024, 1))), 2) == 1.0


def test_peers_are_scored_like_the_policy_and_the_bound_is_never_the_best_peer(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(COLLAPSE_AND_RECOVERY))
    result = run.run_scenario(path)
    assert set(result.peers) == set(peers.PEERS)
    assert not set(result.peers) & set(result.strategies)  # a peer never sets a denominator
    summary = suite.summarize([result])["peers"]
    row = summary["scenarios"][result.name]
    assert row["best_peer"] not in peers.BOUNDS
    assert row["best_peer_score"] == max(
        f.score for n, f in result.peers.items() if n not in peers.BOUNDS
    )
    assert row["policy_margin_over_best_peer"] == pytest.approx(
        result.strategies[run.POLICY].score - row["best_peer_score"]
    )
    assert [t["name"] for t in summary["targets"]] == [
        f"policy mean >= best single peer + {suite.TARGET_MARGIN_OVER_PEER}",
        f"no scenario where a peer beats the policy by more than {suite.TARGET_PEER_LEAD}",
    ]


def test_every_fitted_figure_is_met_and_every_published_figure_is_reported():
    checks = peers.published_checks()
    assert {c.peer for c in checks} == {
        peers.VLLM_ADAPTIVE_VERIFY, peers.SGLANG_ADAPTIVE, peers.VLLM_TABLE, peers.TURBOSPEC_BOUND
    }
    by_claim = {c.claim: c for c in checks}
    # The calibrations hold exactly where they were fitted.
    assert by_claim["accept length at steps 1"].modeled == pytest.approx(1.85, abs=1e-3)
    assert by_claim["steps 1 vs no speculation, concurrency 2"].modeled == pytest.approx(594.7 / 447.2 - 1, abs=1e-3)
    assert by_claim["fixed K=7 vs no speculation, concurrency 4"].modeled == pytest.approx(
        970.33 / 381.53 - 1, abs=1e-3
    )
    assert sum(1 for c in checks if c.peer == peers.VLLM_ADAPTIVE_VERIFY) == 21


def test_bench_peers_prints_each_figure_with_its_verdict(capsys):
    assert cli.main(["bench", "peers", "-o", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows and {"peer", "source", "claim", "published", "low", "high", "modeled", "fitted", "within"} <= set(rows[0])
    assert cli.main(["bench", "peers"]) == 0
    out = capsys.readouterr().out
    assert "vllm#52362" in out and "checked figures within their band" in out
