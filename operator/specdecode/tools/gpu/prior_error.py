"""The performance model's prior against real vLLM 0.26.0 on an H100: one row per measured
point (config x running batch), from the committed CSV.

    python -m specdecode.tools.gpu.prior_error [--csv PATH] [-o markdown|csv]

Measured: ``step_ms`` of ``control/data/h100-vllm026-measured-steps.csv`` (steady window: every
request decoding, none prefilling). Predicted: `perfmodel.step_time` of the policy's prior
(``EngineParams.for_method(method)``: its defaults are an 8B target on an H100 with a ~1B
draft, the card and shapes measured) at the same K, running batch and mid-window context,
no prefill in the step; the table config as the `Schedule` it ran
(``[[1,16,3],[17,1024,0]]``). Error = (predicted - measured) / measured.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from specdecode.control import perfmodel
from specdecode.control.perfmodel import EngineParams, Schedule
from specdecode.tools.gpu import vllm026

TABLE_SCHEDULE = Schedule(((1, 16, 3), (17, 1024, 0)))
"""The measured ``table-k3-0``'s ``num_speculative_tokens_per_batch_size``."""


@dataclass(frozen=True)
class Point:
    config: str
    batch: int
    measured_ms: float
    predicted_ms: float

    @property
    def error(self) -> float:
        return (self.predicted_ms - self.measured_ms) / self.measured_ms


def prior_config(row: dict[str, str]) -> tuple[EngineParams, int | Schedule]:
    """The prior and the config it is asked about for one measured row."""
    method = row["method"]
    if row["config"] == "table-k3-0":
        return EngineParams.for_method("draft_model"), TABLE_SCHEDULE
    if method == "off":
        return EngineParams.for_method("draft_model"), 0
    return EngineParams.for_method(method), int(row["k"])


def points(rows: list[dict[str, str]]) -> list[Point]:
    out = []
    for row in rows:
        params, config = prior_config(row)
        batch = float(row["running_batch"])
        predicted = perfmodel.step_time(params, config, batch, float(row["context_tokens_mid"]))
        out.append(Point(row["config"], round(batch), float(row["step_ms"]), predicted * 1000.0))
    return out


def summary(pts: list[Point]) -> dict[str, tuple[float, float, float]]:
    """config -> (mean error, min error, max error)."""
    by: dict[str, list[float]] = {}
    for p in pts:
        by.setdefault(p.config, []).append(p.error)
    return {c: (statistics.fmean(e), min(e), max(e)) for c, e in by.items()}


def markdown(pts: list[Point]) -> str:
    lines = ["| config | batch | measured step ms | prior ms | error |", "| --- | ---: | ---: | ---: | ---: |"]
    for p in pts:
        lines.append(f"| {p.config} | {p.batch} | {p.measured_ms:.2f} | {p.predicted_ms:.2f} | {p.error:+.0%} |")
    lines += ["", "| config | mean error | min | max |", "| --- | ---: | ---: | ---: |"]
    for c, (mean, lo, hi) in summary(pts).items():
        lines.append(f"| {c} | {mean:+.0%} | {lo:+.0%} | {hi:+.0%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specdecode.tools.gpu.prior_error",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--csv", type=Path, help="a measured-steps CSV (default: the committed one)")
    parser.add_argument("-o", "--output", choices=("markdown", "csv"), default="markdown")
    args = parser.parse_args(argv)
    if args.csv:
        with args.csv.open(encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
    else:
        rows = vllm026.measured_steps()
    pts = points(rows)
    if args.output == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(["config", "batch", "measured_ms", "prior_ms", "error"])
        for p in pts:
            writer.writerow([p.config, p.batch, f"{p.measured_ms:.4f}", f"{p.predicted_ms:.4f}", f"{p.error:.4f}"])
    else:
        print(markdown(pts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
