"""Compare a real vLLM /metrics text with the simulator's exposition for the same config.

    python -m specdecode.tools.gpu.compare_exposition REAL.txt [--k 3] [--method draft_model]

The simulator side is what tests/unit/test_sim_exposition.py checks (vLLM 0.33's names,
labels and buckets): a PodEngine built from the same `vllm serve` arguments, advanced a little,
scraped in the classic text format. Printed: families only one side has, type differences,
label-name differences per family, bucket-bound differences, and the per-position counter's
positions. Exit status 0; it reports, it does not judge.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specdecode.control.perfmodel import EngineParams, Workload
from specdecode.render import vllm_args as vllm
from specdecode.tools.sim.engine import PodEngine, engine_config_from_args


def families(text: str) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for fam in text_string_to_metric_families(text):
        labels: set[str] = set()
        buckets: list[str] = []
        positions: list[str] = []
        first_bucket_labels = None
        for s in fam.samples:
            labels |= set(s.labels) - {"le"}
            if s.name.endswith("_bucket"):
                key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                if first_bucket_labels is None:
                    first_bucket_labels = key
                if key == first_bucket_labels:
                    buckets.append(s.labels["le"])
            if "position" in s.labels:
                positions.append(s.labels["position"])
        out[fam.name] = {"type": fam.type, "labels": labels, "buckets": buckets,
                         "positions": sorted(set(positions), key=int),
                         "samples": {s.name for s in fam.samples}}
    return out


def simulator_text(method: str, k: int, model: str) -> str:
    args = ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--served-model-name", "llama"]
    if k:
        args += vllm.speculative_args(
            vllm.SpeculativeConfig(method=method, num_speculative_tokens=k, model=model), "0.33.0")
    e = PodEngine(engine_config_from_args(args), EngineParams(), np.random.default_rng(1))
    w = Workload(request_rate=8, prompt_tokens=1000, output_tokens=200, acceptance=0.8)
    for _ in range(4):
        e.advance(0.5, w, 2)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(e.metrics)
    return generate_latest(registry).decode()


def _bounds(b: list[str]) -> list[float]:
    return [float(x) for x in b]


def compare(real_text: str, sim_text: str) -> list[str]:
    real, sim = families(real_text), families(sim_text)
    lines = []
    only_sim = sorted(set(sim) - set(real))
    only_real = sorted(n for n in set(real) - set(sim) if n.startswith("vllm"))
    lines.append(f"families: real {sum(n.startswith('vllm') for n in real)} vllm:*, simulator {len(sim)}, "
                 f"both {len(set(real) & set(sim))}")
    lines.append(f"in the simulator, not in real vLLM ({len(only_sim)}): {' '.join(only_sim) or '-'}")
    lines.append(f"in real vLLM, not in the simulator ({len(only_real)}): {' '.join(only_real) or '-'}")
    for name in sorted(set(real) & set(sim)):
        r, s = real[name], sim[name]
        if r["type"] != s["type"]:
            lines.append(f"type {name}: real {r['type']}, simulator {s['type']}")
        if r["labels"] != s["labels"]:
            lines.append(f"labels {name}: real {sorted(r['labels'])}, simulator {sorted(s['labels'])}")
        if r["buckets"] or s["buckets"]:
            if _bounds(r["buckets"]) != _bounds(s["buckets"]):
                lines.append(f"buckets {name}: real {' '.join(r['buckets'])} | simulator {' '.join(s['buckets'])}")
        if r["positions"] != s["positions"]:
            lines.append(f"positions {name}: real {r['positions']}, simulator {s['positions']}")
        created_r = any(x.endswith("_created") for x in r["samples"])
        created_s = any(x.endswith("_created") for x in s["samples"])
        if created_r != created_s:
            lines.append(f"_created {name}: real {created_r}, simulator {created_s}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("real", type=Path)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--method", default="draft_model")
    ap.add_argument("--model", default="meta-llama/Llama-3.2-1B-Instruct")
    a = ap.parse_args(argv)
    for line in compare(a.real.read_text(), simulator_text(a.method, a.k, a.model)):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
