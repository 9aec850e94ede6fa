"""What the H100 measurement of vLLM 0.26.0 (issue 55) gives the simulator: the truth step
table and the figures the scenarios on it take, all derived from the committed CSVs.

    python -m specdecode.tools.gpu.vllm026            # print the derived figures
    python -m specdecode.tools.gpu.vllm026 --write    # (re)write the truth step table

Inputs (``control/data/``, see its README): ``h100-vllm026-measured-steps.csv`` (one row per
config and concurrency, steady-window whole engine steps) and ``h100-vllm026-startup.csv``.
Output: ``h100-vllm026-llama8b-1b-steptime.csv``, a table `specdecode.control.steptable`
loads. Rules (the data README says why):

- target rows: tokens per sequence K+1 for the measured configs off (1) and draft-k1 ..
  draft-k5 (2 .. 6), at the measured batches, ``gpu_ms`` = the measured whole step
  (``step_ms``). Every K 0..5 is measured (K 2 and K 4 in a later call than the others, on
  a fresh machine of the same kind); nothing is interpolated in K. No K above 5
  (``max_k`` <= 5).
- draft rows: 0 (the draft's forwards are inside the measured steps).
- one context, the measured mean mid-window context (about 1,100 tokens): flat in context.
- scenarios on it set ``step_overhead_s`` and ``spec_overhead_s`` to 0 (they are inside the
  steps too) and ``step_table_prefill_s`` / ``step_table_draft_prefill_s`` to the prefill
  estimates printed here.
"""

from __future__ import annotations

import argparse
import csv
import io
import statistics
from importlib import resources
from pathlib import Path

TABLE = "h100-vllm026-llama8b-1b"
MEASURED = "h100-vllm026-measured-steps.csv"
STARTUP = "h100-vllm026-startup.csv"
TABLE_CONFIGS = {"off": 1, "draft-k1": 2, "draft-k2": 3, "draft-k3": 4, "draft-k4": 5, "draft-k5": 6}
"""Config -> tokens per sequence (K+1) of the truth table's target rows."""
PROMPT_TOKENS = 1000
"""Prompt tokens per request in the measurement (measure_vllm.py)."""
OUTPUT_TOKENS = 200
BYTES_PER_KV_TOKEN = 128 * 1024
"""The target's KV bytes per token (32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes)."""


def _data(name: str):
    return resources.files("specdecode.control") / "data" / name


def read_csv(name: str) -> list[dict[str, str]]:
    with _data(name).open(encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def measured_steps() -> list[dict[str, str]]:
    return read_csv(MEASURED)


def step_ms(rows: list[dict[str, str]]) -> dict[tuple[str, int], float]:
    """(config, running batch) -> measured steady-window step in ms."""
    return {(r["config"], round(float(r["running_batch"]))): float(r["step_ms"]) for r in rows}


def table_context(rows: list[dict[str, str]]) -> int:
    """The table's one context: mean mid-window context of the table's configs, rounded to 10."""
    ctx = [float(r["context_tokens_mid"]) for r in rows if r["config"] in TABLE_CONFIGS]
    return int(round(statistics.fmean(ctx), -1))


def truth_table(rows: list[dict[str, str]]) -> str:
    """The truth step table's CSV text, derived from the measured rows."""
    steps = step_ms(rows)
    batches = sorted({b for (c, b) in steps if c == "off"})
    context = table_context(rows)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["model", "batch_size", "tokens_per_sequence", "context_tokens", "gpu_ms"])
    for model in ("target", "draft"):
        for b in batches:
            for config, tokens in sorted(TABLE_CONFIGS.items(), key=lambda kv: kv[1]):
                ms = steps[(config, b)] if model == "target" else 0.0
                writer.writerow([model, b, tokens, context, f"{ms:.4f}"])
    return out.getvalue()


def prefill_per_token_s(rows: list[dict[str, str]], min_batch: int = 64) -> dict[str, float]:
    """Seconds per prompt token, per config: (point wall - decode steps x steady step) /
    prompt tokens, median over concurrencies >= ``min_batch`` (at small ones the 0.2 s polls
    and the request start dominate). A rough estimate: prefill chunks share steps with decode."""
    per: dict[str, list[float]] = {}
    for r in rows:
        c = int(r["concurrency"])
        if c < min_batch:
            continue
        decode_s = OUTPUT_TOKENS / float(r["gen_tokens_per_req_step"]) * float(r["step_ms"]) / 1000.0
        per.setdefault(r["config"], []).append((float(r["point_wall_s"]) - decode_s) / (c * PROMPT_TOKENS))
    return {config: statistics.median(v) for config, v in per.items()}


def prefill_figures(rows: list[dict[str, str]]) -> tuple[float, float]:
    """(``step_table_prefill_s``, ``step_table_draft_prefill_s``): off's estimate, and the
    median of the draft-model configs' (k1 .. k5) minus off's. (With k1, k3, k5 alone, as
    before k2 and k4 were measured, the median is the same, draft-k3's.)"""
    per = prefill_per_token_s(rows)
    off = per["off"]
    drafts = statistics.median(per[f"draft-k{k}"] for k in range(1, 6))
    return off, drafts - off


def schedule_ratios(rows: list[dict[str, str]]) -> list[tuple[int, int, float]]:
    """(batch, band K, measured table step / the plain config's step at that K) per point of
    ``table-k3-0`` (bands [1,16] K 3, [17,1024] K 0)."""
    steps = step_ms(rows)
    out = []
    for (config, b), ms in sorted(steps.items(), key=lambda kv: kv[0][1]):
        if config != "table-k3-0":
            continue
        k = 3 if b <= 16 else 0
        out.append((b, k, ms / steps[("draft-k3" if k else "off", b)]))
    return out


def kv_figures(startup: list[dict[str, str]]) -> dict[str, float]:
    """KV capacity with and without the draft and the draft's memory in target-KV tokens."""
    by = {r["config"]: r for r in startup}
    off = float(by["off"]["kv_cache_tokens"])
    draft = float(by["draft-k3"]["kv_cache_tokens"])
    weights_gib = float(by["draft-k3"]["model_load_gib"]) - float(by["off"]["model_load_gib"])
    weight_tokens = weights_gib * 2**30 / BYTES_PER_KV_TOKEN
    return {
        "kv_off": off,
        "kv_draft": draft,
        "change": draft / off - 1.0,
        "draft_weight_gib": weights_gib,
        "draft_weight_tokens_from_weights": weight_tokens,
        # with draft_kv_ratio 0.25 (architecture), the tokens the draft displaces in all
        "draft_weight_tokens_at_ratio_0_25": off - 1.25 * draft,
        "draft_kv_ratio_at_weight_tokens": (off - weight_tokens) / draft - 1.0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdecode.tools.gpu.vllm026", description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write control/data/{TABLE}-steptime.csv")
    args = parser.parse_args(argv)
    rows = measured_steps()
    if args.write:
        path = Path(str(_data(f"{TABLE}-steptime.csv")))
        path.write_text(truth_table(rows), encoding="utf-8")
        print(f"wrote {path}")
    print(f"table context: {table_context(rows)} tokens")
    for config, s in sorted(prefill_per_token_s(rows).items()):
        print(f"prefill per prompt token, {config}: {s * 1e6:.1f} us")
    off, draft = prefill_figures(rows)
    print(f"step_table_prefill_s: {off:.3g}  step_table_draft_prefill_s: {draft:.3g}")
    for b, k, ratio in schedule_ratios(rows):
        print(f"table-k3-0 at batch {b} (band K {k}): {ratio:.3f} x the plain config")
    ratios = [r for _, _, r in schedule_ratios(rows)]
    print(f"table-k3-0 / plain: median {statistics.median(ratios):.3f}, K 0 band median "
          f"{statistics.median(r for _, k, r in schedule_ratios(rows) if k == 0):.3f}")
    for name, value in kv_figures(read_csv(STARTUP)).items():
        print(f"{name}: {value:.4g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
