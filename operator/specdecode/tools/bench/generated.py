"""Generated scenarios: held back by construction.

A scenario written after seeing what the policy does there proves little, and a suite the
policy has been tuned on for months proves less every month. `generate` draws scenarios
nobody wrote: from a seed, each one a draft method, a GPU, a traffic mix, an acceptance and a
load placed against what the truth itself can carry. Half are stationary (3 hours at one
load: the figure is whether the policy leaves a config it should leave, and leaves alone
one it should keep), half a load swing (calm, a peak, calm again: what schedules are for).

The truth is as far from the policy's prior as the shipped suite's: step costs scaled for a
faster or a slower GPU, the draft's cost off the prior's, and, for draft models and n-gram, a
third of them on the step times measured on an H200 (`control/data/`), which the policy's
straight-line model never sees. Acceptance and load wander as in every scenario (the
default noise).

With ``truth="h100-vllm"`` every scenario keeps the services the seed draws (traffic,
acceptance, load against capacity) but runs a draft model on the step times measured on a real
vLLM 0.26 on an H100 (`control/data/h100-vllm026-*`, docs/real-vllm.md): its table, its KV
budget and the draft's share of it, its measured restart, and the K it measured up to. The
default draws are unchanged, so a seed judged before draws what it drew then.

Pure: the same seed gives the same documents (`specdecode bench policy --generated N
--generated-seed S` writes them beside its results, so a run can be read and repeated).
"""

from __future__ import annotations

import functools
import random
from pathlib import Path
from typing import Any

import yaml

from specdecode.control import perfmodel
from specdecode.tools.scenario import builtin_scenario_path, parse_scenario

METHODS = ("draft_model", "eagle", "eagle3", "ngram")
GPU_SCALES = (0.6, 1.0, 1.5, 2.5)
"""Step costs times the prior's H100 fit: a faster GPU, the same, and two slower ones
(`gpu-slow`'s L40S-class costs are about 3x)."""
TABLE_METHODS = ("draft_model", "ngram")
"""Methods whose truth may be the measured H200 table (a 1B draft's forwards, or none)."""
TABLE_SHARE = 1 / 3
PROMPT_TOKENS = (300, 1000, 2500)
OUTPUT_TOKENS = (150, 300, 800)
ACCEPTANCE = (0.3, 0.9)
STATIONARY_LOAD = (0.15, 0.85)
"""Load as a share of the capacity of the best config in the truth."""
SWING_LOW = (0.1, 0.3)
SWING_HIGH = (0.55, 0.95)
SWING_CYCLE_MIN = 240
"""One swing: calm for an hour, the peak for an hour and a half, calm again (a day compressed
into 4 hours); with ``cycles`` > 1 it repeats, so what one peak teaches can serve the next."""
TRUTHS = ("mixed", "h100-vllm")
"""``mixed``: the draws above; ``h100-vllm``: the same services on measured vLLM 0.26 H100 steps."""
H100_VLLM_SCENARIO = "h100-vllm-load-ramp"
"""The shipped scenario whose engine the h100-vllm truth takes whole (its ``model`` block):
the measured table with its prefill terms, the engine's KV budget with the draft's share, the
measured restart, K up to 5, and what a per-batch-size schedule measured."""
CONFIGS = tuple(range(0, 7))
"""Configs whose largest capacity places the load (off and K 1..6)."""


def generate(seed: int, count: int, cycles: int = 1, truth: str = "mixed") -> list[dict[str, Any]]:
    """``count`` scenario documents drawn from ``seed`` (alternately stationary and a swing
    whose calm, peak and calm repeat ``cycles`` times), on ``truth`` (`TRUTHS`). The draws do
    not depend on ``cycles`` or ``truth``: the same seed gives the same services, swinging
    once or several times, on any truth."""
    if count < 1:
        raise ValueError("count must be at least 1")
    if cycles < 1:
        raise ValueError("cycles must be at least 1")
    if truth not in TRUTHS:
        raise ValueError(f"truth must be one of {', '.join(TRUTHS)}, got {truth!r}")
    rng = random.Random(seed)
    return [_one(rng, seed, i, cycles, truth) for i in range(count)]


def write(documents: list[dict[str, Any]], directory: Path) -> list[Path]:
    """One YAML file per document in ``directory`` (created); their paths, in order."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for doc in documents:
        path = directory / f"{doc['name']}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
        paths.append(path)
    return paths


def _one(rng: random.Random, seed: int, index: int, cycles: int, truth: str = "mixed") -> dict[str, Any]:
    kind = "stationary" if index % 2 == 0 else "swing"
    method = rng.choice(METHODS)
    prompt, output = rng.choice(PROMPT_TOKENS), rng.choice(OUTPUT_TOKENS)
    alpha = round(rng.uniform(*ACCEPTANCE), 2)
    prior = perfmodel.EngineParams.for_method(method)
    if method in TABLE_METHODS and rng.random() < TABLE_SHARE:
        gpu = "H200 (measured steps)"
        model: dict[str, Any] = {
            "step_table": "h200-llama8b-1b", "step_overhead_s": 1.0e-3, "spec_overhead_s": 1.5e-3,
            "kv_capacity_tokens": 850_000,
        }
    else:
        scale = rng.choice(GPU_SCALES)
        gpu = f"{scale}x the H100 fit's step costs"
        model = {
            "step_fixed_s": round(prior.step_fixed_s * scale, 7),
            "per_batched_token_s": round(prior.per_batched_token_s * scale, 9),
            "per_kv_token_s": round(prior.per_kv_token_s * scale, 12),
            "step_overhead_s": round(prior.step_overhead_s * scale, 7),
        }
    if method != "ngram":
        model["draft_cost_ratio"] = round(prior.draft_cost_ratio * rng.uniform(0.7, 1.4), 3)
    if truth == "h100-vllm":
        # Every draw above is made all the same, so the rest of the seed's services match.
        method, gpu, model = "draft_model", "H100, vLLM 0.26 (measured steps)", _h100_vllm_model()
    prefix = "gen" if truth == "mixed" else f"gen-{truth}"
    name = f"{prefix}-{seed}-{index:02d}-{kind}" + (f"-x{cycles}" if kind == "swing" and cycles > 1 else "")
    doc: dict[str, Any] = {
        "name": name,
        "description": "",
        "duration": "3h" if kind == "stationary" else f"{SWING_CYCLE_MIN * cycles // 60}h",
        "seed": rng.randrange(1_000_000),
        "held_back": True,
        "method": method,
        "model": model,
        "slo": {},
        "phases": [{"at": 0, "request_rate": 1.0, "prompt_tokens": prompt, "output_tokens": output,
                    "temperature": 0, "acceptance": alpha}],
    }
    params = parse_scenario(doc, name).params
    probe = perfmodel.Workload(1.0, prompt, output, 0.0, alpha)
    best = max((perfmodel.steady_state(params, probe, k) for k in CONFIGS if k <= model.get("max_k", k)), key=lambda state: state.capacity_rps)
    capacity = best.capacity_rps
    # The SLO a user of this service would set: a few times the best config's calm TPOT,
    # and an end-to-end bound its calm requests meet with room.
    doc["slo"] = {"p95_e2e_s": round(max(5.0, 3.0 * best.e2e_p95_s), 1),
                  "p95_tpot_s": round(max(0.01, 3.0 * best.tpot_s), 3)}
    if kind == "stationary":
        share = rng.uniform(*STATIONARY_LOAD)
        doc["phases"][0]["request_rate"] = round(share * capacity, 2)
        loads = f"{share:.0%} of capacity"
    else:
        low, high = rng.uniform(*SWING_LOW), rng.uniform(*SWING_HIGH)
        doc["phases"][0]["request_rate"] = round(low * capacity, 2)
        for cycle in range(cycles):
            start = cycle * SWING_CYCLE_MIN
            if cycle:
                doc["phases"].append({"at": f"{start}m", "request_rate": round(low * capacity, 2)})
            doc["phases"] += [{"at": f"{start + 60}m", "request_rate": round(high * capacity, 2)},
                              {"at": f"{start + 150}m", "request_rate": round(low * capacity, 2)}]
        loads = f"{low:.0%} -> {high:.0%} -> {low:.0%} of capacity" + (f", {cycles} times" if cycles > 1 else "")
    doc["description"] = (
        f"Generated (seed {seed}, #{index}): {method} at acceptance {alpha}, {gpu}, prompts {prompt} "
        f"and outputs {output} tokens, {kind} at {loads} (the truth's largest: "
        f"{capacity:.1f} req/s, {perfmodel.config_label(best.k)})."
    )
    return doc


def _h100_vllm_model() -> dict[str, Any]:
    """The engine of `H100_VLLM_SCENARIO` (a copy: each document owns its own), read from the
    scenario itself so that the two cannot drift apart."""
    return dict(_read_h100_vllm_model())


@functools.cache
def _read_h100_vllm_model() -> dict[str, Any]:
    document = yaml.safe_load(builtin_scenario_path(H100_VLLM_SCENARIO).read_text(encoding="utf-8"))
    return document["model"]
