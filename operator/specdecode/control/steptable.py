"""Measured step times: a table of forward-pass times, interpolated (pure, no I/O but the
package's own data files).

A table maps (model, batch size, tokens per sequence, context tokens) to GPU milliseconds of
one forward pass (``data/<name>-steptime.csv``; ``data/README.md`` says what the shipped one
measured and what it does not). Scenarios use it as a truth that is not the performance
model's straight line (``model.step_table`` in a scenario file, see `perfmodel`).

Interpolation: piecewise linear in tokens per sequence (clamped to the measured range),
piecewise linear in batch size (flat below the first point, extended along the last segment
above the last), linear in context (extended beyond the two measured contexts: reading the
KV cache grows linearly with it).
"""

from __future__ import annotations

import csv
import functools
from bisect import bisect_right
from dataclasses import dataclass
from importlib import resources
from typing import Sequence

MODELS = ("target", "draft")


class StepTableError(ValueError):
    """A step table that does not exist or cannot be read."""


@dataclass(frozen=True)
class StepTable:
    """One table: ``ms[model][(batch, tokens, context)]`` on a full grid."""

    name: str
    batches: tuple[float, ...]
    tokens: tuple[float, ...]
    contexts: tuple[float, ...]
    ms: dict[str, dict[tuple[float, float, float], float]]

    def gpu_ms(self, model: str, batch: float, tokens: float, context: float) -> float:
        """Interpolated GPU milliseconds of one forward of ``model`` (target or draft)."""
        grid = self.ms[model]
        tokens = min(max(tokens, self.tokens[0]), self.tokens[-1])
        batch = max(batch, self.batches[0])

        def at_context(b: float, t: float) -> float:
            c0, c1 = self.contexts[0], self.contexts[-1]
            v0, v1 = grid[(b, t, c0)], grid[(b, t, c1)]
            if c1 == c0:
                return v0
            return v0 + (v1 - v0) * (context - c0) / (c1 - c0)

        def at_tokens(b: float) -> float:
            i = _segment(self.tokens, tokens)
            t0, t1 = self.tokens[i], self.tokens[i + 1]
            w = (tokens - t0) / (t1 - t0)
            return at_context(b, t0) * (1 - w) + at_context(b, t1) * w

        i = _segment(self.batches, batch)
        b0, b1 = self.batches[i], self.batches[i + 1]
        w = (batch - b0) / (b1 - b0)  # > 1 above the last batch: extended
        return at_tokens(b0) * (1 - w) + at_tokens(b1) * w


def _segment(points: Sequence[float], x: float) -> int:
    """Index i of the segment [points[i], points[i+1]] holding x (the last one beyond it)."""
    return min(max(bisect_right(points, x) - 1, 0), len(points) - 2)


def table_names() -> list[str]:
    """Names of the shipped tables (file stem without ``-steptime``)."""
    folder = resources.files("specdecode.control") / "data"
    return sorted(
        p.name[: -len("-steptime.csv")] for p in folder.iterdir() if p.name.endswith("-steptime.csv")
    )


@functools.lru_cache(maxsize=8)
def load(name: str) -> StepTable:
    """The shipped table ``name`` (e.g. ``h200-llama8b-1b``)."""
    path = resources.files("specdecode.control") / "data" / f"{name}-steptime.csv"
    if not path.is_file():
        raise StepTableError(
            f"model.step_table: no table {name!r}; use one of {', '.join(table_names()) or 'none'}"
        )
    with path.open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    ms: dict[str, dict[tuple[float, float, float], float]] = {m: {} for m in MODELS}
    for row in rows:
        key = (float(row["batch_size"]), float(row["tokens_per_sequence"]), float(row["context_tokens"]))
        ms[row["model"]][key] = float(row["gpu_ms"])
    axes = [sorted({k[i] for k in ms["target"]}) for i in range(3)]
    for model in MODELS:
        missing = [(b, t, c) for b in axes[0] for t in axes[1] for c in axes[2] if (b, t, c) not in ms[model]]
        if missing or len(axes[0]) < 2 or len(axes[1]) < 2:
            raise StepTableError(f"step table {name}: {model} rows do not cover the full grid")
    return StepTable(name, tuple(axes[0]), tuple(axes[1]), tuple(axes[2]), ms)
