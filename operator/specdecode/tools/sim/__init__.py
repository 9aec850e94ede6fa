"""A vLLM engine simulator that speaks vLLM 0.33's `/metrics` exactly.

No GPU and no vLLM engine run here, so tests and the demo use this instead: one process
stands for the vLLM pods of one or many SpecDecodeServices, reads each pod's speculative
config from its container args (so a rollout by the operator changes what it emits once the
new pods are Ready), and emits the metrics `specdecode.control.perfmodel` predicts under a scenario
(`specdecode.tools.scenario`), with the sampling noise of real counters, deterministic under the
scenario's seed.

- `sim.exposition`: metric names, labels, buckets and HELP texts read from the vLLM wheel;
  `PodMetrics`, one pod's counters, a prometheus_client collector.
- `sim.engine`: the pure core: `engine_config_from_args`, `PodEngine.advance(dt, ...)`.
- `sim.fleet`: the shell: `Simulator` (per-pod HTTP servers, ticker, file_sd targets).
- `sim.kube`: the Kubernetes pod watcher that feeds the simulator.
"""

from specdecode.tools.sim.engine import EngineConfig, PodEngine, engine_config_from_args
from specdecode.tools.sim.fleet import PodInfo, Simulator

__all__ = ["EngineConfig", "PodEngine", "PodInfo", "Simulator", "engine_config_from_args"]
