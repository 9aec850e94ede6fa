"""Performance model of a vLLM replica with speculative decoding: pure functions, no I/O.

One model serves three users, so they agree on what "better" means: the simulator (what a
pod emits), the benchmark's oracle (the best config per phase) and the policy (the predicted
speedup of each K at the observed load). Full derivation: PERFMODEL.md beside this file.

A *config* is an integer K: 0 means speculation off, K >= 1 means K drafted tokens per step.
Rates are per service (the whole SpecDecodeService); batches, KV usage and step times are
per replica, which is what one pod's gauges show.

Formulas (sources in brackets):

1. Acceptance per position [Leviathan et al. 2023, independent per-token acceptance; the
   decay is our optional extension]: drafted token i (0-based) is accepted, given token i-1
   was, with probability ``alpha * decay**i``; so P(pos i accepted) = prod_{j<=i} alpha*d^j,
   which is ``alpha**(i+1)`` when d = 1.
   - emitted tokens per step E = 1 + sum_i P(pos i)  (= (1 - alpha**(K+1)) / (1 - alpha))
   - acceptanceRate = sum_i P(pos i) / K             (= alpha(1-alpha^K) / ((1-alpha)K))
   - meanAcceptedLength = sum_i P(pos i)             (accepted tokens per draft)
2. Temperature [REFERENCE.md field numbers: T 0 -> 0.7 costs 20-30% of the gain]:
   ``alpha_T = alpha_0 * (1 - s*T)`` clipped to [0, alpha_0], s = 0.12 by default
   (0.8 -> 0.73 at T = 0.7, which costs 24-32% of the low-load gain for alpha_0 0.7-0.9).
3. Step time at decode batch B, mean resident context L, prefill tokens p in the step
   [defaults: a published H100 fit for an 8B target, quoted in issue 4]:
   ``t = f*(1 + K*c) + o + [K>0]*o_spec
        + B*(tau*(K+1) + kappa*L + K*c*(tau + kappa*L) + cpu)
        + p*tau*(1 + [K>0]*c)``
   with f = 5.9 ms fixed cost, tau = 21 us per batched token, kappa = 39 ns per KV token,
   o = 1.2 ms per-step overhead, c = the draft's cost per proposed token relative to a target
   step (a draft step at batch B costs c times the target's f + tau*B + kappa*B*L), o_spec a
   fixed bookkeeping cost whenever speculation is on (rejection sampling, proposer
   metadata), cpu the proposer's CPU lookup per sequence (n-gram, suffix). The target
   verifies B*(K+1) tokens; the KV of each sequence is read once per step.
4. Steady state, open loop [Little's law on the running batch]: a request stays
   n = max(1, P/budget) + (O-1)/E steps in the batch, so B = lambda*n*t(B). With chunked
   prefill the step also carries p = lambda*P'*t prompt tokens (P' includes recomputation
   after preemptions), so t = (A + b*B) / D with D = 1 - tau'*lambda*P', and the fixed point
   has the closed form ``B = lambda*n*A / (D - lambda*n*b)``: faster configs (larger E,
   smaller n) hold smaller batches. The batch is capped by max_num_seqs, by the token budget
   max_num_batched_tokens/(K+1) and by the KV cache: B_kv = capacity / (P + O/2 + K).
5. Capacity (maximum sustainable request rate of one replica): the rate at which B reaches
   its cap, ``mu = B_cap / (n*(A + b*B_cap) + B_cap*tau'*P')``; without a cap it tends to
   ``1 / (n*b + tau'*P')``. Above capacity the queue grows at lambda - mu and waits grow
   linearly over the phase (finite horizon, FIFO): ``wait(t) = Q(t) / mu``.
6. KV cache: capacity in target-KV tokens = (kv_capacity_tokens - draft weights) /
   (1 + draft_kv_ratio) when speculation is on (the draft's weights and its own KV share the
   pool); preemptions per request rise smoothly from 0 at usage ``preemption_onset`` to
   ``preemptions_per_request_max`` at a full cache, each one re-prefilling its context.
7. Latency distributions: output lengths are lognormal with CV ``output_tokens_cv``;
   e2e = wait + service, service ~ lognormal; per-request TPOT ~ lognormal with the CV of
   the per-step emission plus ``tpot_cv`` (prompt-to-prompt acceptance, batch jitter).
   P95s are quantiles of those mixtures (bisection on the mixture CDF).

What it reproduces (REFERENCE.md field numbers; asserted in tests/unit/test_perfmodel.py):
- matched draft (draft_model, c = 0.35, alpha 0.8-0.9, low load): 1.5-1.9x lower TPOT,
  best K 3-5, and K = 5 best among {3, 5, 7, 10} at alpha 0.9 (field: ~1.6x, K = 5 best);
- per-token acceptance below ~0.4 is a net loss for a draft model at any K and load;
- a poorly matched draft (alpha 0.4-0.45, K = 1-2) gives 0.96-1.09x;
- T 0 -> 0.7 costs 20-30% of the low-load gain;
- at tens of requests per second per replica (8B on H100, batches of hundreds) speculation
  off beats K = 5 on latency and capacity; the crossover sits near 8-12 req/s per replica
  for 1000-token prompts and 300-token outputs;
- a draft that squeezes the KV cache at long contexts loses capacity (0.7-0.8x).
It does not reproduce a crossover at batch 32 on an H100 8B (the field report was on other
hardware); on a slower GPU (``gpu-slow`` scenario) the crossover comes at ~9 req/s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from statistics import NormalDist
from typing import Any, Iterable, Literal, Mapping, Sequence, Union, get_args

from specdecode.control import memo

Method = Literal["draft_model", "eagle", "eagle3", "mtp", "ngram", "suffix"]
METHODS: tuple[str, ...] = get_args(Method)

OFF = 0
"""The config with speculation off (K = 0)."""

CPU_PROPOSERS: tuple[str, ...] = ("ngram", "suffix")
"""Methods that propose by a lookup on the host (vLLM's n-gram and suffix proposers) and run
no draft forward pass on the GPU: their cost is ``proposer_cpu_s_per_seq``."""

_NORMAL = NormalDist()
_SQRT2 = math.sqrt(2.0)


@memo.memoized(maxsize=65536)
def _lognormal_mu_sigma(mean: float, cv: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with this mean and CV (memoized: P95 bisections ask for
    the same component's CDF dozens of times)."""
    sigma2 = math.log1p(cv * cv)
    sigma = math.sqrt(sigma2)
    return math.log(mean) - sigma2 / 2.0, sigma


class EngineParamsError(ValueError):
    """A bad engine parameter: one line naming the field and the fix."""


# Per-method defaults. c: relative draft cost per proposed token (a small draft model of an
# 8B target ~0.35; EAGLE heads are a single decoder layer, ~0.08-0.1; n-gram and suffix
# proposers use no GPU but spend CPU per sequence). Draft memory, in target-KV tokens of
# 128 KiB: a 1B draft's ~2.4 GiB of weights displace ~20k tokens and its KV (16 layers, head
# dim 64) is a quarter of the target's per token; an EAGLE head is ~0.5 GiB and one layer of
# KV (1/32 of the target's); n-gram and suffix hold no GPU memory.
_METHOD_DEFAULTS: dict[str, dict[str, float]] = {
    "draft_model": {
        "draft_cost_ratio": 0.35,
        "proposer_cpu_s_per_seq": 0.0,
        "draft_weight_tokens": 20_000,
        "draft_kv_ratio": 0.25,
    },
    "eagle": {
        "draft_cost_ratio": 0.08,
        "proposer_cpu_s_per_seq": 0.0,
        "draft_weight_tokens": 4_000,
        "draft_kv_ratio": 1 / 32,
    },
    "eagle3": {
        "draft_cost_ratio": 0.10,
        "proposer_cpu_s_per_seq": 0.0,
        "draft_weight_tokens": 8_000,
        "draft_kv_ratio": 1 / 32,
    },
    "mtp": {
        "draft_cost_ratio": 0.10,
        "proposer_cpu_s_per_seq": 0.0,
        "draft_weight_tokens": 8_000,
        "draft_kv_ratio": 1 / 32,
    },
    "ngram": {
        "draft_cost_ratio": 0.0,
        "proposer_cpu_s_per_seq": 20e-6,
        "draft_weight_tokens": 0,
        "draft_kv_ratio": 0.0,
    },
    "suffix": {
        "draft_cost_ratio": 0.0,
        "proposer_cpu_s_per_seq": 30e-6,
        "draft_weight_tokens": 0,
        "draft_kv_ratio": 0.0,
    },
}


@dataclass(frozen=True)
class EngineParams:
    """True costs of one vLLM replica (target + proposer) and the service around it.

    Defaults: an 8B target on one H100 80 GB with a ~1B draft model. Build with
    ``EngineParams.for_method(method, overrides)`` to get the method's proposer defaults;
    scenario files override any field by name under ``model:``.
    """

    method: Method = "draft_model"
    """Proposer: draft_model, eagle, eagle3, mtp, ngram or suffix."""

    # --- target step cost (published H100 fit for an 8B target) ---
    step_fixed_s: float = 5.9e-3
    """Fixed cost of one target forward pass (weights read once), seconds."""
    per_batched_token_s: float = 21e-6
    """Cost of each token the step computes (decode, verification or prefill), seconds."""
    per_kv_token_s: float = 39e-9
    """Cost of each resident context token the step's attention reads, seconds."""
    step_overhead_s: float = 1.2e-3
    """Per-step CPU overhead (scheduling, sampling, output processing), seconds."""

    # --- proposer cost ---
    draft_cost_ratio: float = 0.35
    """c: one proposed token costs c times a target decode step at the same batch."""
    proposer_cpu_s_per_seq: float = 0.0
    """CPU lookup per sequence per step (n-gram/suffix proposers), seconds."""
    spec_overhead_s: float = 0.3e-3
    """Fixed cost per step whenever speculation is on (rejection sampler, metadata)."""

    # --- measured step times (a truth that is not this model's straight line) ---
    step_table: str = ""
    """A shipped step-time table (``h200-llama8b-1b``; see `steptime`): when set, a step
    costs the table's interpolated target forward of K+1 tokens per sequence, plus K draft
    forwards (the first of 2 tokens per sequence: the tokens accepted last step, then 1
    each; none for n-gram and suffix, `CPU_PROPOSERS`), times ``step_table_scale``, plus
    ``step_overhead_s`` (the host's per-step work) and, when speculating, ``spec_overhead_s``.
    ``step_fixed_s``, ``per_batched_token_s``, ``per_kv_token_s`` and ``draft_cost_ratio`` are
    then unused."""
    step_table_scale: float = 1.0
    """Multiplier on every table time (a slower or faster GPU than the table's)."""
    step_table_draft_scale: float = 1.0
    """Multiplier on the table's draft forwards (a costlier or cheaper draft)."""
    step_table_prefill_s: float = 0.0
    """On a step table: seconds one prompt token chunked into a step costs with speculation
    off (times ``step_table_scale``), in place of the table's marginal decode-token time at its
    largest batch; 0 keeps that. For a table of whole engine steps (``h100-vllm026-*``),
    whose token slope includes sampling and the draft, not what a prompt token costs."""
    step_table_draft_prefill_s: float = 0.0
    """With ``step_table_prefill_s`` set: seconds the draft model adds per prompt token when
    speculating (times ``step_table_draft_scale``; none for n-gram and suffix)."""

    # --- per-batch-size K schedules (vLLM 0.24+, num_speculative_tokens_per_batch_size) ---
    schedule_overhead_s: float = 0.5e-3
    """Per-step cost of running under a schedule, on every step (K 0 ranges included):
    the full-to-piecewise CUDA-graph downgrade and the per-step K lookup (one report: 14 %
    slower single-stream, ~1 ms of an 8B step). The policy calibrates it after a rollout."""
    schedule_penalty: float = 0.0
    """Relative slow-down of the steps under a schedule (0.2 = 20 % slower), beyond
    ``schedule_overhead_s``: a truth a scenario sets to play the reported regressions; the
    policy's prior is 0. Every step's, or from ``schedule_penalty_from_batch`` up."""
    schedule_penalty_from_batch: float = 0.0
    """The running batch from which ``schedule_penalty`` applies (0: at every batch). The
    reported MTP collapse: aggregate throughput fell only once concurrency crossed the
    schedule's threshold, so a check right after the rollout, at a calmer load, saw nothing."""
    schedule_ignored: bool = False
    """A truth a scenario sets to play vllm#51510: the engine's model runner ignores the table
    and every step drafts the table's largest K, at a plain K's cost. The policy's prior is
    False; it finds out from the drafts' length (`schedules`)."""
    batch_dispersion: float = 1.0
    """Variance / mean of the running batch around its mean (1: Poisson, as many requests
    in flight independently); sets how often a schedule's steps fall into each range."""

    # --- acceptance ---
    temperature_sensitivity: float = 0.12
    """s in alpha_T = alpha_0 * (1 - s*T): acceptance lost per unit of temperature."""
    acceptance_decay: float = 1.0
    """d: acceptance of position i given i-1 is alpha * d**i (1 = independent positions)."""

    # --- memory ---
    kv_capacity_tokens: int = 400_000
    """KV-cache tokens without a draft: (0.92*79.6 GiB - 15 GiB weights - ~5 GiB
    activations/graphs) / 128 KiB per token for a Llama-3-8B-like target, rounded down."""
    draft_weight_tokens: int = 20_000
    """KV tokens displaced by the draft's weights when speculation is on."""
    draft_kv_ratio: float = 0.25
    """The draft's KV bytes per token relative to the target's."""
    preemption_onset: float = 0.9
    """KV usage above which vLLM's greedy admission starts preempting running requests."""
    preemptions_per_request_max: float = 0.5
    """Preemptions per finished request when the KV cache is full."""

    # --- scheduler limits ---
    max_num_seqs: int = 1024
    """vLLM default on >= 70 GiB GPUs (256 on smaller ones)."""
    max_num_batched_tokens: int = 8192
    """vLLM default on >= 70 GiB GPUs (2048 on smaller ones)."""

    # --- workload shape ---
    output_tokens_cv: float = 0.6
    """Coefficient of variation of output lengths (lognormal); drives the e2e P95."""
    tpot_cv: float = 0.15
    """Per-request TPOT spread beyond the sampling of accepted tokens."""

    # --- service ---
    replicas: int = 2
    """Replicas of the service; request rates are split evenly across Ready ones."""
    rollout_s: float = 180.0
    """Time a restarted replica serves nothing (model load) on a change of K or method."""
    min_k: int = 1
    """Lower bound of K when speculation is on."""
    max_k: int = 8
    """Upper bound of K."""

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise EngineParamsError(
                f"model.method: unknown method {self.method!r}; use one of {', '.join(METHODS)}"
            )
        for name in (
            "step_fixed_s",
            "per_batched_token_s",
            "per_kv_token_s",
            "step_overhead_s",
            "draft_cost_ratio",
            "proposer_cpu_s_per_seq",
            "spec_overhead_s",
            "temperature_sensitivity",
            "draft_weight_tokens",
            "draft_kv_ratio",
            "output_tokens_cv",
            "tpot_cv",
            "rollout_s",
            "preemptions_per_request_max",
            "step_table_scale",
            "step_table_draft_scale",
            "step_table_prefill_s",
            "step_table_draft_prefill_s",
            "schedule_overhead_s",
            "schedule_penalty",
            "schedule_penalty_from_batch",
            "batch_dispersion",
        ):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise EngineParamsError(f"model.{name}: must be a number >= 0, got {value!r}")
        if not isinstance(self.schedule_ignored, bool):
            raise EngineParamsError(f"model.schedule_ignored: must be true or false, got {self.schedule_ignored!r}")
        if self.step_fixed_s + self.step_overhead_s <= 0:
            raise EngineParamsError("model.step_fixed_s: a step must cost more than 0 s")
        if not 0 < self.acceptance_decay <= 1:
            raise EngineParamsError(
                f"model.acceptance_decay: must be in (0, 1], got {self.acceptance_decay!r}"
            )
        if not 0 <= self.preemption_onset < 1:
            raise EngineParamsError(
                f"model.preemption_onset: must be in [0, 1), got {self.preemption_onset!r}"
            )
        for name in ("kv_capacity_tokens", "max_num_seqs", "max_num_batched_tokens", "replicas"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise EngineParamsError(f"model.{name}: must be an integer >= 1, got {value!r}")
        if self.draft_weight_tokens >= self.kv_capacity_tokens:
            raise EngineParamsError(
                "model.draft_weight_tokens: the draft leaves no KV cache; "
                "lower it below kv_capacity_tokens"
            )
        if self.step_table:
            from specdecode.control import steptable

            try:
                table = steptable.load(self.step_table)
            except steptable.StepTableError as err:
                raise EngineParamsError(str(err)) from None
            if self.max_k + 1 > table.tokens[-1]:
                raise EngineParamsError(
                    f"model.max_k: the step table {self.step_table} measured up to "
                    f"{table.tokens[-1]:g} tokens per sequence; set max_k <= {table.tokens[-1] - 1:g}"
                )
        if not (isinstance(self.min_k, int) and isinstance(self.max_k, int)):
            raise EngineParamsError("model.min_k, model.max_k: must be integers")
        if not 1 <= self.min_k <= self.max_k:
            raise EngineParamsError(
                f"model.min_k/max_k: need 1 <= min_k <= max_k, got {self.min_k}..{self.max_k}"
            )

    @classmethod
    def for_method(
        cls, method: str, overrides: Mapping[str, Any] | None = None
    ) -> "EngineParams":
        """Defaults for `method`'s proposer, then `overrides` by field name.

        Unknown keys raise EngineParamsError naming the key and the valid ones.
        """
        if method not in METHODS:
            raise EngineParamsError(
                f"method: unknown method {method!r}; use one of {', '.join(METHODS)}"
            )
        overrides = dict(overrides or {})
        if "method" in overrides and overrides["method"] != method:
            raise EngineParamsError(
                "model.method: set the method once, at the scenario's top level `method:`"
            )
        overrides.pop("method", None)
        _check_keys(overrides)
        values: dict[str, Any] = {**_METHOD_DEFAULTS[method], **overrides}
        # Integers in YAML may come as floats (4e5): accept them when they are whole.
        for f in fields(cls):
            if f.type in ("int",) and isinstance(values.get(f.name), float):
                if values[f.name].is_integer():
                    values[f.name] = int(values[f.name])
        return cls(method=method, **values)  # type: ignore[arg-type]

    def configs(self) -> tuple[int, ...]:
        """Every config a policy may choose: off, then K = min_k..max_k."""
        return (OFF, *range(self.min_k, self.max_k + 1))


def param_names() -> tuple[str, ...]:
    """Field names of EngineParams: the keys a scenario's `model:` mapping accepts."""
    return tuple(f.name for f in fields(EngineParams))


def _check_keys(overrides: Mapping[str, Any]) -> None:
    known = set(param_names())
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise EngineParamsError(
            f"model.{unknown[0]}: unknown parameter; valid keys are {', '.join(sorted(known))}"
        )


@dataclass(frozen=True)
class Workload:
    """Offered load to a service in one phase (scenario phase keys, same names)."""

    request_rate: float
    """Requests per second to the whole service (open loop: arrivals do not wait for us)."""
    prompt_tokens: float
    """Mean prompt length, tokens."""
    output_tokens: float
    """Mean output length, tokens."""
    temperature: float = 0.0
    """Sampling temperature of the requests."""
    acceptance: float = 0.0
    """True per-token acceptance alpha of the draft at temperature 0."""

    def __post_init__(self) -> None:
        if not (self.request_rate >= 0 and math.isfinite(self.request_rate)):
            raise ValueError(f"request_rate must be >= 0, got {self.request_rate!r}")
        if not self.prompt_tokens >= 1:
            raise ValueError(f"prompt_tokens must be >= 1, got {self.prompt_tokens!r}")
        if not self.output_tokens >= 1:
            raise ValueError(f"output_tokens must be >= 1, got {self.output_tokens!r}")
        if not 0 <= self.temperature <= 2:
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature!r}")
        if not 0 <= self.acceptance <= 1:
            raise ValueError(f"acceptance must be in [0, 1], got {self.acceptance!r}")


# --------------------------------------------------------------------------------------------
# Per-batch-size K schedules
# --------------------------------------------------------------------------------------------


class ScheduleError(ValueError):
    """A malformed schedule: one line naming what is wrong and the fix."""


@dataclass(frozen=True)
class Schedule:
    """A per-batch-size K schedule (vLLM's ``num_speculative_tokens_per_batch_size``).

    ``bands`` are inclusive ``(start, end, K)`` batch-size ranges, the first starting at 1,
    each starting right after the previous one; the last range extends past its end (vLLM
    carries the last row's K forward). K 0 turns speculation off for that range while the
    draft stays loaded: its memory (weights and KV) is held at every batch size, and every
    step pays ``schedule_overhead_s``. A config is an int K (0 = off) or a Schedule.
    """

    bands: tuple[tuple[int, int, int], ...]
    draft_tokens: int = 0
    """Tokens the proposer drafts on every step whatever the range's K, which is then the
    length verified: vLLM's adaptive verification drafts its whole block and verifies only
    what its budget admits (a peer in the benchmark; the operator renders only 0). 0: each
    range drafts its own K, as vLLM's table does."""

    def __post_init__(self) -> None:
        bands = tuple(tuple(int(x) for x in band) for band in self.bands)
        object.__setattr__(self, "bands", bands)
        if not bands:
            raise ScheduleError("schedule: needs at least one [start, end, K] range")
        if self.draft_tokens and self.draft_tokens < max(k for _, _, k in bands):
            raise ScheduleError(
                f"schedule: draft_tokens {self.draft_tokens} is below a range's K; it must cover every range"
            )
        expected = 1
        for start, end, k in bands:
            if start != expected:
                raise ScheduleError(
                    f"schedule: range [{start}, {end}, {k}] must start at batch size {expected}"
                )
            if end < start:
                raise ScheduleError(f"schedule: range [{start}, {end}, {k}] ends before it starts")
            if k < 0:
                raise ScheduleError(f"schedule: range [{start}, {end}, {k}] has K < 0")
            expected = end + 1
        if self.max_k <= 0:
            raise ScheduleError("schedule: every range has K 0; use speculation off (K 0) instead")

    @property
    def max_k(self) -> int:
        """The largest K of any range, or the drafted block: vLLM's num_speculative_tokens
        (buffers, memory)."""
        return max(self.draft_tokens, *(k for _, _, k in self.bands))

    def k_at(self, batch: float) -> int:
        """K of a step at this running batch size (rounded; the last range extends on)."""
        return self.band_at(batch)[2]

    def band_at(self, batch: float) -> tuple[int, int, int]:
        """The (start, end, K) range of this running batch size (rounded; the last range
        extends on)."""
        size = max(1, int(round(batch)))
        for band in self.bands:
            if size <= band[1]:
                return band
        return self.bands[-1]

    @property
    def label(self) -> str:
        """Short name: ``1-16:K4,17+:off`` (ranges and their K; the last is open)."""
        parts = []
        for i, (start, end, k) in enumerate(self.bands):
            span = f"{start}+" if i == len(self.bands) - 1 else f"{start}-{end}"
            parts.append(f"{span}:{'off' if k == 0 else f'K{k}'}")
        drafted = f"/draft{self.draft_tokens}" if self.draft_tokens else ""
        return ",".join(parts) + drafted

    @classmethod
    def from_label(cls, text: str, last_end: int = 1024) -> "Schedule":
        """The schedule a `label` names (``1-16:K4,17+:off``); the open last range ends at
        ``last_end`` (or its start), as vLLM carries its K on anyway."""
        bands = []
        try:
            for part in text.split(","):
                span, _, k_text = part.strip().partition(":")
                k = 0 if k_text == "off" else int(k_text.removeprefix("K"))
                if span.endswith("+"):
                    start = int(span[:-1])
                    end = max(start, last_end)
                else:
                    start_text, _, end_text = span.partition("-")
                    start, end = int(start_text), int(end_text)
                bands.append((start, end, k))
        except ValueError as err:
            raise ScheduleError(f"schedule {text!r}: expected ranges like 1-16:K4,17+:off") from err
        return cls(tuple(bands))

    def rows(self) -> tuple[tuple[int, int, int], ...]:
        """The table as vLLM takes it (the last range's end as given)."""
        return self.bands

    @classmethod
    def from_table(cls, rows: Iterable[Iterable[int]], num_speculative_tokens: int) -> "Schedule":
        """vLLM's dense reading of a rendered table: rows sorted by start, gaps carry the
        previous row's K forward, every K capped at ``num_speculative_tokens``."""
        table = sorted(tuple(int(x) for x in row) for row in rows)
        if not table:
            raise ScheduleError("schedule: empty table")
        bands: list[tuple[int, int, int]] = []
        k_prev = min(table[0][2], num_speculative_tokens)
        next_start = 1
        for start, end, k in table:
            if start > next_start:
                bands.append((next_start, start - 1, k_prev))
            k_prev = min(k, num_speculative_tokens)
            start = max(start, next_start)
            if end >= start:
                bands.append((start, end, k_prev))
                next_start = end + 1
        merged: list[tuple[int, int, int]] = []
        for band in bands:
            if merged and merged[-1][2] == band[2]:
                merged[-1] = (merged[-1][0], band[1], band[2])
            else:
                merged.append(band)
        return cls(tuple(merged))


Config = Union[int, Schedule]
"""A config: an int K (0 = speculation off) or a per-batch-size schedule."""


def config_max_k(config: Config) -> int:
    """K that sizes the engine (buffers, draft memory): K, or a schedule's largest K."""
    return config.max_k if isinstance(config, Schedule) else int(config)


def config_label(config: Config) -> str:
    """``off``, ``K=<k>`` or ``sched[<schedule label>]``: a config's name in reports."""
    if isinstance(config, Schedule):
        return f"sched[{config.label}]"
    return "off" if config == OFF else f"K={config}"


def config_order(config: Config) -> tuple:
    """A total order over configs (ties in comparisons): off, each K, then schedules."""
    if isinstance(config, Schedule):
        return (1, config.bands)
    return (0, int(config))


# --------------------------------------------------------------------------------------------
# Acceptance
# --------------------------------------------------------------------------------------------


def effective_alpha(alpha0: float, temperature: float, params: EngineParams) -> float:
    """Per-token acceptance at `temperature`: alpha_0 * (1 - s*T), clipped to [0, alpha_0]."""
    factor = min(1.0, max(0.0, 1.0 - params.temperature_sensitivity * temperature))
    return alpha0 * factor


def position_acceptance(alpha: float, k: int, decay: float = 1.0) -> tuple[float, ...]:
    """P(drafted position i is accepted), i = 0..k-1: prod_{j<=i} alpha * decay**j.

    This is what vLLM's per-position counter divided by the drafts counter estimates.
    """
    probs: list[float] = []
    p = 1.0
    for i in range(k):
        p *= alpha * decay**i
        probs.append(p)
    return tuple(probs)


def expected_tokens_per_step(alpha: float, k: int, decay: float = 1.0) -> float:
    """E: tokens emitted per verification step, 1 + sum of P(position accepted).

    With decay 1: (1 - alpha**(k+1)) / (1 - alpha) (Leviathan et al. 2023); K = 0 gives 1.
    """
    return 1.0 + sum(position_acceptance(alpha, k, decay))


def acceptance_rate(alpha: float, k: int, decay: float = 1.0) -> float:
    """accepted / drafted tokens, what vLLM's counters give: alpha(1-alpha^K)/((1-alpha)K)."""
    if k <= 0:
        return 0.0
    return sum(position_acceptance(alpha, k, decay)) / k


def mean_accepted_length(alpha: float, k: int, decay: float = 1.0) -> float:
    """Accepted tokens per draft (accepted_tokens_total / drafts_total)."""
    return sum(position_acceptance(alpha, k, decay))


# --------------------------------------------------------------------------------------------
# Step cost and KV cache
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _StepCost:
    """t = (fixed + per_seq * B) / (1 - per_prefill_token * prefill_tokens_per_s); with a
    step table the decode part is the piecewise-linear ``curve`` of (batch, seconds) instead
    of ``fixed + per_seq * B`` (flat below its first point, extended beyond its last)."""

    fixed: float
    per_seq: float
    per_prefill_token: float
    curve: tuple[tuple[float, float], ...] = ()
    slow_from_batch: float = math.inf
    """From this running batch up, every part of the step is ``slowdown`` times slower (a
    schedule's truth-only penalty past a threshold)."""
    slowdown: float = 1.0

    def _factor(self, batch: float) -> float:
        return self.slowdown if batch >= self.slow_from_batch else 1.0

    def decode(self, batch: float) -> float:
        """Seconds of a decode step at ``batch`` sequences, no prefill."""
        curve = self.curve
        if not curve:
            return (self.fixed + self.per_seq * batch) * self._factor(batch)
        if batch <= curve[0][0]:
            return curve[0][1] * self._factor(batch)
        for (b0, t0), (b1, t1) in zip(curve, curve[1:]):
            if batch <= b1:
                break
        return (t0 + (t1 - t0) * (batch - b0) / (b1 - b0)) * self._factor(batch)

    def prefill_per_token(self, batch: float) -> float:
        """Seconds per prompt token chunked into a step of ``batch`` sequences."""
        return self.per_prefill_token * self._factor(batch)


def _step_cost(params: EngineParams, k: int, context_tokens: float, drafted: int | None = None) -> _StepCost:
    """A step that verifies ``k`` tokens per sequence, drafted ``drafted`` of them (default
    ``k``: every drafted token is verified)."""
    drafted = k if drafted is None else drafted
    if params.step_table:
        return _table_step_cost(
            params.step_table, k, round(context_tokens, 1), params.step_table_scale,
            0.0 if params.method in CPU_PROPOSERS else params.step_table_draft_scale,
            params.step_overhead_s, params.spec_overhead_s,
            params.proposer_cpu_s_per_seq,
            params.step_table_prefill_s, params.step_table_draft_prefill_s, drafted,
        )
    spec = drafted > 0
    c = params.draft_cost_ratio if spec else 0.0
    tau, kappa = params.per_batched_token_s, params.per_kv_token_s
    fixed = params.step_fixed_s * (1 + drafted * c) + params.step_overhead_s
    if spec:
        fixed += params.spec_overhead_s
    per_seq = tau * (k + 1) + kappa * context_tokens + drafted * c * (tau + kappa * context_tokens)
    if spec:
        per_seq += params.proposer_cpu_s_per_seq
    return _StepCost(fixed=fixed, per_seq=per_seq, per_prefill_token=tau * (1 + c))


@memo.memoized(maxsize=4096)
def _table_step_cost(
    name: str, k: int, context: float, scale: float, draft_scale: float, host_s: float,
    spec_s: float, cpu_s_per_seq: float, prefill_s: float = 0.0, draft_prefill_s: float = 0.0,
    drafted: int | None = None,
) -> _StepCost:
    """The measured step (`steptable`) at each of the table's batch sizes, in seconds.

    Target: one forward of K+1 tokens per sequence. Draft (K > 0): K forwards, the first
    over 2 tokens per sequence (the tokens accepted in the last step), the others over 1,
    times ``draft_scale`` (0 for a proposer on the host, `CPU_PROPOSERS`).
    Prefill tokens cost the table's marginal per-token time at its largest batch, or
    ``prefill_s`` (+ ``draft_prefill_s`` times ``draft_scale`` when K > 0) when it is set.
    With ``drafted`` set, the draft forwards are ``drafted`` and the target verifies ``k``.
    """
    from specdecode.control import steptable

    drafted = k if drafted is None else drafted
    table = steptable.load(name)
    points = []
    for b in table.batches:
        ms = table.gpu_ms("target", b, k + 1, context)
        if drafted > 0:
            ms += draft_scale * (
                table.gpu_ms("draft", b, 2, context) + (drafted - 1) * table.gpu_ms("draft", b, 1, context)
            )
        seconds = scale * ms / 1000.0 + host_s + (spec_s + cpu_s_per_seq * b if drafted > 0 else 0.0)
        points.append((b, seconds))
    big, tokens = table.batches[-1], table.tokens
    span = big * (tokens[-1] - tokens[0])

    def per_token(model: str) -> float:
        hi = table.gpu_ms(model, big, tokens[-1], table.contexts[0])
        lo = table.gpu_ms(model, big, tokens[0], table.contexts[0])
        return (hi - lo) / span / 1000.0

    if prefill_s > 0:
        prefill = scale * (prefill_s + (draft_scale * draft_prefill_s if drafted > 0 else 0.0))
    else:
        prefill = scale * (per_token("target") + (draft_scale * per_token("draft") if drafted > 0 else 0.0))
    return _StepCost(fixed=points[0][1], per_seq=0.0, per_prefill_token=prefill, curve=tuple(points))


def _scheduled_step_cost(params: EngineParams, k: int, context_tokens: float, drafted: int = 0) -> _StepCost:
    """A step of K ``k`` under a schedule: the plain step of that K (a K 0 step also pays the
    speculation bookkeeping: the proposer stays configured), plus ``schedule_overhead_s``,
    times ``1 + schedule_penalty`` (from ``schedule_penalty_from_batch`` up, when set). With
    ``drafted`` (`Schedule.draft_tokens`), that many tokens are drafted and ``k`` verified."""
    cost = _step_cost(params, k, context_tokens, drafted or None)
    extra = params.schedule_overhead_s + (params.spec_overhead_s if max(k, drafted) == 0 else 0.0)
    return _StepCost(
        fixed=cost.fixed + extra,
        per_seq=cost.per_seq,
        per_prefill_token=cost.per_prefill_token,
        curve=tuple((b, t + extra) for b, t in cost.curve),
        slow_from_batch=params.schedule_penalty_from_batch if params.schedule_penalty > 0 else math.inf,
        slowdown=1.0 + params.schedule_penalty,
    )


def step_time(
    params: EngineParams,
    k: int,
    batch: float,
    context_tokens: float,
    prefill_tokens: float = 0.0,
) -> float:
    """Seconds of one engine step: verify batch*(k+1) tokens, draft k tokens, prefill chunk.

    `context_tokens` is the mean resident context per decoding sequence; `prefill_tokens`
    the prompt tokens chunked into this step. k = 0 is a plain decode step; a Schedule
    steps at the K its range gives ``batch``, with the schedule's own cost.
    """
    if isinstance(k, Schedule):
        cost = _scheduled_step_cost(params, k.k_at(batch), context_tokens, k.draft_tokens)
    else:
        cost = _step_cost(params, k, context_tokens)
    return cost.decode(batch) + cost.prefill_per_token(batch) * prefill_tokens


def kv_capacity(params: EngineParams, k: Config) -> float:
    """KV-cache capacity in target-KV tokens: the draft's weights and KV share the pool
    (under a schedule at every batch size, K 0 ranges included: the draft stays loaded)."""
    if config_max_k(k) <= 0:
        return float(params.kv_capacity_tokens)
    free = params.kv_capacity_tokens - params.draft_weight_tokens
    return free / (1.0 + params.draft_kv_ratio)


def _preemptions_per_request(params: EngineParams, kv_usage: float) -> float:
    """Smooth proxy for vLLM's recompute preemptions: 0 below the onset, max at a full cache."""
    excess = (kv_usage - params.preemption_onset) / (1.0 - params.preemption_onset)
    excess = min(1.0, max(0.0, excess))
    return params.preemptions_per_request_max * excess * excess


# --------------------------------------------------------------------------------------------
# Steady state
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SteadyState:
    """A replica set serving a workload at config k, long after any transient.

    Rates are per service; batch, KV usage and step time are per replica. When
    `saturated`, the replicas run at their batch cap and the queue grows at
    `queue_growth_rps`: e2e latency is unbounded in steady state (see `evaluate_phase`).
    """

    k: Config
    alpha: float
    """Per-token acceptance after temperature."""
    tokens_per_step: float
    """E: tokens emitted per sequence per step."""
    acceptance_rate: float
    mean_accepted_length: float
    batch: float
    """Running requests per replica (vllm:num_requests_running)."""
    batch_cap: float
    """Largest batch a replica can hold: max_num_seqs, token budget or KV cache."""
    step_time_s: float
    """Mean engine step (= mean vllm:inter_token_latency_seconds)."""
    tpot_s: float
    """Mean time per output token of a request (decode time / (tokens - 1))."""
    tpot_p95_s: float
    tpot_cv: float
    """Coefficient of variation of a request's TPOT (lognormal)."""
    ttft_s: float
    """Mean time to first token without queueing (scheduling delay + prefill)."""
    service_s: float
    """Mean time from admission to the last token."""
    service_cv: float
    e2e_s: float
    """Mean end-to-end latency (inf when saturated)."""
    e2e_p95_s: float
    capacity_rps: float
    """Maximum sustainable request rate of the service at this config."""
    utilization: float
    """Offered rate / capacity."""
    throughput_rps: float
    """Requests per second the service completes: min(offered, capacity)."""
    generation_tokens_per_s: float
    """Output tokens per second of the service."""
    kv_usage: float
    """Fraction of a replica's KV cache in use (vllm:kv_cache_usage_perc)."""
    preemptions_per_s: float
    """Preemptions per second of the service (rate of vllm:num_preemptions_total)."""
    queue_growth_rps: float
    """Requests per second added to the waiting queue (0 unless saturated)."""
    saturated: bool
    replicas: int
    step_mix: tuple[tuple[int, float], ...] = ()
    """Under a schedule: (K, share of sequence-steps) of each range the batch visits; empty
    for a plain config (every step at ``k``). See `step_shares`."""

    def step_shares(self) -> tuple[tuple[int, float], ...]:
        """(K, share of sequence-steps drafted at that K): what the per-position counters mix."""
        if self.step_mix:
            return self.step_mix
        return ((config_max_k(self.k), 1.0),)


@dataclass(frozen=True)
class _Solved:
    batch: float
    step_time: float
    preemptions_per_request: float
    kv_usage: float
    capacity_per_replica: float
    saturated: bool


_CAPACITY_GRID = 200


def _solve(
    params: EngineParams,
    k: int,
    rate_per_replica: float,
    prompt: float,
    steps_in_batch: float,
    context: float,
    kv_per_seq: float,
    batch_cap: float,
    kv_cap: float,
) -> _Solved:
    """Little's-law fixed point B = lambda * n * t(B), solved through its inverse.

    Writing the fixed point for the rate gives the rate that sustains batch B:
    ``lambda(B) = B / (n*(A + b*B) + B*tau'*P'(B))`` with P'(B) the prompt plus the
    recomputation of preemptions at that batch's KV usage. Without preemptions lambda(B)
    rises monotonically; preemptions make it fall again near a full cache. Capacity is its
    maximum over B <= cap; below capacity the batch is the smallest B with lambda(B) = rate.
    """
    rate_for, preemptions, _ = _rate_function(params, k, prompt, steps_in_batch, context, kv_per_seq, kv_cap)
    peak_batch, capacity = _peak(params, k, prompt, steps_in_batch, context, kv_per_seq, batch_cap, kv_cap)
    n = steps_in_batch

    lam = rate_per_replica
    if lam >= capacity:
        batch, saturated, lam_served = peak_batch, True, capacity
    else:
        lo, hi = 0.0, peak_batch
        for _ in range(80):
            mid = 0.5 * (lo + hi)
            if rate_for(mid) < lam:
                if mid == lo:
                    break  # lo and hi are adjacent floats: the rest of the 80 would not move them
                lo = mid
            else:
                if mid == hi:
                    break
                hi = mid
        batch, saturated, lam_served = hi, False, lam
    if lam_served > 0 and batch > 0:
        step = batch / (lam_served * n)
    else:
        step = _step_cost(params, k, context).decode(batch)  # (only an idle or dead service)
    return _Solved(
        batch=batch,
        step_time=step,
        preemptions_per_request=preemptions(batch),
        kv_usage=min(1.0, batch * kv_per_seq / kv_cap),
        capacity_per_replica=capacity,
        saturated=saturated,
    )


def _rate_function(
    params: EngineParams,
    k: int,
    prompt: float,
    steps_in_batch: float,
    context: float,
    kv_per_seq: float,
    kv_cap: float,
):
    """``lambda(B)`` of `_solve` (and the preemptions per request at batch B).

    The costliest lines of an evaluation: `_peak` and `_solve` call ``rate_for`` hundreds of
    times per configuration (about 4,000 times per evaluation), so it works on locals and
    inlines `_StepCost.decode` (straight line) and `_preemptions_per_request` with the same
    arithmetic in the same order: the same floats, in a third of the time."""
    cost = _step_cost(params, k, context)
    n = steps_in_batch
    straight = not cost.curve
    fixed, per_seq, decode = cost.fixed, cost.per_seq, cost.decode
    per_prefill_token = cost.per_prefill_token
    onset = params.preemption_onset
    onset_to_full = 1.0 - onset
    most = params.preemptions_per_request_max

    def preemptions(batch: float) -> float:
        return _preemptions_per_request(params, min(1.0, batch * kv_per_seq / kv_cap))

    def rate_for(batch: float) -> float:
        usage = batch * kv_per_seq / kv_cap
        if usage <= onset:
            prefill = prompt  # no preemptions below the onset (the same value, sooner)
        else:
            # _preemptions_per_request(params, min(1.0, usage)), inlined.
            excess = ((usage if usage < 1.0 else 1.0) - onset) / onset_to_full
            excess = excess if excess > 0.0 else 0.0
            excess = excess if excess < 1.0 else 1.0
            prefill = prompt + most * excess * excess * kv_per_seq
        step = fixed + per_seq * batch if straight else decode(batch)
        return batch / (n * step + batch * per_prefill_token * prefill)

    def first_peak_on_grid(lo: float, hi: float, points: int) -> float:
        """max(grid, key=rate_for) over lo + (hi - lo) * i / points, i = 0..points: the first
        batch of the highest rate, as max keeps it, without building the grid."""
        span = hi - lo
        peak_batch, peak_rate = lo, None
        for i in range(points + 1):
            batch = lo + span * i / points
            rate = rate_for(batch)
            if peak_rate is None or rate > peak_rate:
                peak_batch, peak_rate = batch, rate
        return peak_batch

    return rate_for, preemptions, first_peak_on_grid


@memo.memoized(maxsize=16384)
def _peak(
    params: EngineParams,
    k: int,
    prompt: float,
    steps_in_batch: float,
    context: float,
    kv_per_seq: float,
    batch_cap: float,
    kv_cap: float,
) -> tuple[float, float]:
    """(batch at the maximum of lambda(B) over B <= cap, that maximum = capacity per replica).

    Independent of the offered rate, so memoized: the grid search is the costliest part of
    the model and every evaluation at another rate of the same workload reuses it (pure
    function of frozen arguments, so caching changes no result).
    """
    rate_for, _, first_peak_on_grid = _rate_function(params, k, prompt, steps_in_batch, context, kv_per_seq, kv_cap)
    onset_batch = params.preemption_onset * kv_cap / kv_per_seq
    peak_batch = batch_cap
    if onset_batch < batch_cap:
        # lambda(B) rises up to the onset, so its maximum lies in [onset, cap].
        peak_batch = first_peak_on_grid(onset_batch, batch_cap, _CAPACITY_GRID)
    return peak_batch, rate_for(peak_batch)


def steady_state(
    params: EngineParams,
    workload: Workload,
    k: int,
    replicas: int | None = None,
) -> SteadyState:
    """Steady state of the service at config `k` under `workload` (open loop).

    `replicas` overrides params.replicas (e.g. one fewer during a rollout); 0 replicas serve
    nothing and are reported saturated with zero capacity.
    """
    if isinstance(k, Schedule):
        if params.schedule_ignored:
            return replace(steady_state(params, workload, k.max_k, replicas), k=k)
        return _schedule_steady_state(params, workload, k, replicas)
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    n_rep = params.replicas if replicas is None else replicas
    alpha = effective_alpha(workload.acceptance, workload.temperature, params)
    decay = params.acceptance_decay
    e = expected_tokens_per_step(alpha, k, decay)
    prompt, out = workload.prompt_tokens, workload.output_tokens
    context = prompt + out / 2.0
    kv_per_seq = context + k
    kv_cap = kv_capacity(params, k)
    batch_cap = max(
        1.0,
        min(
            float(params.max_num_seqs),
            params.max_num_batched_tokens / (k + 1),
            kv_cap / kv_per_seq,
        ),
    )
    prefill_steps = max(1.0, prompt / params.max_num_batched_tokens)
    decode_steps = max(0.0, out - 1.0) / e
    n = prefill_steps + decode_steps

    if n_rep <= 0:
        cost = _step_cost(params, k, context)
        step = cost.decode(batch_cap)
        return _saturated_nothing(params, workload, k, alpha, e, decay, step, batch_cap)

    lam = workload.request_rate / n_rep
    s = _solve(params, k, lam, prompt, n, context, kv_per_seq, batch_cap, kv_cap)
    return _serving(
        params, workload, k, alpha, e, s.step_time, prefill_steps, decode_steps, batch=s.batch, batch_cap=batch_cap,
        capacity=s.capacity_per_replica * n_rep, kv_usage=s.kv_usage, preemptions_per_request=s.preemptions_per_request,
        saturated=s.saturated, replicas=n_rep, tpot_k=k,
        acceptance_rate=acceptance_rate(alpha, k, decay), mean_accepted_length=mean_accepted_length(alpha, k, decay),
        decay=decay,
    )


# --- steady state under a schedule ----------------------------------------------------------

_SCHEDULE_GRID = 48


def _band_occupancy(
    schedule: Schedule, mean_batch: float, dispersion: float
) -> list[tuple[int, float, float]]:
    """(K, probability, mean batch given the range) of each range at a mean running batch:
    the batch is normal around its mean with variance ``dispersion * mean`` (a Poisson count
    when 1), cut at the ranges' edges (half-integers); the means sum back to ``mean_batch``."""
    sd = math.sqrt(max(1e-12, dispersion * mean_batch))
    out = []
    last = len(schedule.bands) - 1
    for i, (start, end, k) in enumerate(schedule.bands):
        z_lo = -math.inf if i == 0 else (start - 0.5 - mean_batch) / sd
        z_hi = math.inf if i == last else (end + 0.5 - mean_batch) / sd
        cdf_lo = 0.0 if z_lo == -math.inf else _NORMAL.cdf(z_lo)
        cdf_hi = 1.0 if z_hi == math.inf else _NORMAL.cdf(z_hi)
        prob = cdf_hi - cdf_lo
        if prob <= 1e-12:
            continue
        pdf_lo = 0.0 if z_lo == -math.inf else _NORMAL.pdf(z_lo)
        pdf_hi = 0.0 if z_hi == math.inf else _NORMAL.pdf(z_hi)
        mean = mean_batch + sd * (pdf_lo - pdf_hi) / prob
        out.append((k, prob, max(1e-9, mean)))
    return out


def mean_drafted_tokens(schedule: Schedule, mean_batch: float, dispersion: float = 1.0) -> float:
    """Tokens drafted per running request per step under ``schedule`` at a mean running batch
    (K 0 ranges count 0; the batch spread as `_band_occupancy` spreads it, each range weighed
    by the requests it holds)."""
    bands = _band_occupancy(schedule, mean_batch, dispersion)
    held = math.fsum(prob * batch for _, prob, batch in bands)
    return math.fsum(k * prob * batch for k, prob, batch in bands) / held if held > 0 else float(schedule.k_at(1))


@dataclass(frozen=True)
class _ScheduleShape:
    """What a schedule's steady state needs per range, for one workload (memoizable)."""

    bands: tuple[tuple[int, float, float, _StepCost], ...]
    """(K, E, steps in batch n, step cost) per K of the schedule."""
    prompt: float
    kv_per_seq: float
    kv_cap: float
    batch_cap: float


def _schedule_shape(params: EngineParams, workload: Workload, schedule: Schedule, alpha: float) -> _ScheduleShape:
    decay = params.acceptance_decay
    prompt, out = workload.prompt_tokens, workload.output_tokens
    context = prompt + out / 2.0
    kmax = schedule.max_k
    kv_per_seq = context + kmax
    kv_cap = kv_capacity(params, schedule)
    budget = params.max_num_batched_tokens
    budget_cap = math.inf
    for start, end, k in schedule.bands:
        limit = budget / (k + 1)
        if limit < start:
            budget_cap = start - 1
            break
        if limit < end or (start, end, k) == schedule.bands[-1]:
            budget_cap = limit
            break
    batch_cap = max(1.0, min(float(params.max_num_seqs), budget_cap, kv_cap / kv_per_seq))
    prefill_steps = max(1.0, prompt / budget)
    bands = []
    for k in sorted({k for _, _, k in schedule.bands}):
        e = expected_tokens_per_step(alpha, k, decay)
        n = prefill_steps + max(0.0, out - 1.0) / e
        bands.append((k, e, n, _scheduled_step_cost(params, k, context, schedule.draft_tokens)))
    return _ScheduleShape(tuple(bands), prompt, kv_per_seq, kv_cap, batch_cap)


def _schedule_flows(params: EngineParams, shape: _ScheduleShape, schedule: Schedule, batch: float):
    """At mean running batch ``batch`` per replica: (request rate sustained, sequence-steps
    per second, per K (K, sequence-steps/s, emitted tokens/s)), each range's steps at its
    conditional mean batch."""
    by_k = {k: (e, n, cost) for k, e, n, cost in shape.bands}
    prefill = shape.prompt
    usage = batch * shape.kv_per_seq / shape.kv_cap
    if usage > params.preemption_onset:
        prefill += _preemptions_per_request(params, min(1.0, usage)) * shape.kv_per_seq
    rate = steps = 0.0
    mix: dict[int, list[float]] = {}
    for k, prob, b in _band_occupancy(schedule, batch, params.batch_dispersion):
        e, n, cost = by_k[k]
        step = cost.decode(b) + b * cost.prefill_per_token(b) * prefill / n
        seq_steps = prob * b / step
        rate += seq_steps / n
        steps += seq_steps
        row = mix.setdefault(k, [0.0, 0.0])
        row[0] += seq_steps
        row[1] += seq_steps * e
    return rate, steps, tuple((k, v[0], v[1]) for k, v in sorted(mix.items()))


@memo.memoized(maxsize=4096)
def _schedule_capacity(params: EngineParams, workload: Workload, schedule: Schedule, alpha: float):
    """(shape, grid of (batch, rate), peak batch, capacity per replica) of a schedule: the
    rate a mean batch sustains need not rise monotonically (a costlier range above an edge),
    so capacity is the maximum over a grid of batches up to the cap, refined locally."""
    shape = _schedule_shape(params, workload, schedule, alpha)
    cap = shape.batch_cap
    grid = [(b, _schedule_flows(params, shape, schedule, b)[0])
            for b in (cap * (i / _SCHEDULE_GRID) ** 2 for i in range(1, _SCHEDULE_GRID + 1))]
    peak_batch, capacity = max(grid, key=lambda item: item[1])
    return shape, tuple(grid), peak_batch, capacity


def _schedule_steady_state(
    params: EngineParams, workload: Workload, schedule: Schedule, replicas: int | None
) -> SteadyState:
    """Steady state under a schedule: Little's law on the mean batch, with the steps of each
    range at that range's K and cost, weighted by how often the batch sits in it."""
    n_rep = params.replicas if replicas is None else replicas
    alpha = effective_alpha(workload.acceptance, workload.temperature, params)
    decay = params.acceptance_decay
    shape, grid, peak_batch, capacity_1 = _schedule_capacity(params, workload, schedule, alpha)
    out = workload.output_tokens
    prefill_steps = max(1.0, workload.prompt_tokens / params.max_num_batched_tokens)
    if n_rep <= 0:
        k1 = schedule.k_at(shape.batch_cap)
        step = _scheduled_step_cost(
            params, k1, workload.prompt_tokens + out / 2.0, schedule.draft_tokens
        ).decode(shape.batch_cap)
        return replace(
            _saturated_nothing(params, workload, k1, alpha, expected_tokens_per_step(alpha, k1, decay),
                               decay, step, shape.batch_cap),
            k=schedule,
        )
    lam = workload.request_rate / n_rep
    if lam >= capacity_1:
        batch, saturated, lam_served = peak_batch, True, capacity_1
    else:
        lo = 0.0
        hi = peak_batch
        for b, rate in grid:
            if rate >= lam:
                hi = b
                break
            lo = b
        for _ in range(50):
            mid = 0.5 * (lo + hi)
            if _schedule_flows(params, shape, schedule, mid)[0] < lam:
                lo = mid
            else:
                hi = mid
            if hi - lo < 1e-4 * max(1.0, hi):
                break
        batch, saturated, lam_served = hi, False, lam
    if lam_served > 0 and batch > 0:
        _, seq_steps, mix = _schedule_flows(params, shape, schedule, batch)
    else:
        seq_steps, mix = 0.0, ()
    if seq_steps > 0:
        step = batch / seq_steps
        e = sum(tokens for _, _, tokens in mix) / seq_steps
        shares = tuple((k, steps / seq_steps) for k, steps, _ in mix)
    else:
        k1 = schedule.k_at(1)
        step = _scheduled_step_cost(params, k1, workload.prompt_tokens + out / 2.0, schedule.draft_tokens).decode(1.0)
        e = expected_tokens_per_step(alpha, k1, decay)
        shares = ((k1, 1.0),)
    drafted = sum(share * k for k, share in shares)
    drafting = sum(share for k, share in shares if k > 0)
    accepted = e - 1.0
    main_k = max(shares, key=lambda item: item[1])[0]
    decode_steps = max(0.0, out - 1.0) / e
    usage = min(1.0, batch * shape.kv_per_seq / shape.kv_cap)
    return _serving(
        params, workload, schedule, alpha, e, step, prefill_steps, decode_steps, batch=batch,
        batch_cap=shape.batch_cap, capacity=capacity_1 * n_rep, kv_usage=usage,
        preemptions_per_request=_preemptions_per_request(params, usage), saturated=saturated,
        replicas=n_rep, tpot_k=main_k, acceptance_rate=accepted / drafted if drafted > 0 else 0.0,
        mean_accepted_length=accepted / drafting if drafting > 0 else 0.0, decay=decay, step_mix=shares,
    )


def _serving(params, workload, config, alpha: float, e: float, step: float, prefill_steps: float,
             decode_steps: float, *, batch: float, batch_cap: float, capacity: float, kv_usage: float,
             preemptions_per_request: float, saturated: bool, replicas: int, tpot_k: int,
             acceptance_rate: float, mean_accepted_length: float, decay: float,
             step_mix: tuple = ()) -> "SteadyState":
    """The steady state of replicas that run `step`-second steps emitting `e` tokens each: the
    latencies, rates and their spread, the same for a plain K and a per-batch-size schedule."""
    out = workload.output_tokens
    throughput = min(workload.request_rate, capacity)
    # Admission waits for the next step boundary: half a step on average.
    ttft = step * (0.5 + prefill_steps)
    service = ttft + decode_steps * step
    decode_share = decode_steps * step / service if service > 0 else 0.0
    service_cv = math.hypot(params.output_tokens_cv, params.tpot_cv) * decode_share
    tpot = step / e
    tpot_cv = _tpot_cv(params, alpha, tpot_k, decay, decode_steps)
    if saturated:
        e2e = e2e_p95 = math.inf
    else:
        e2e = service
        e2e_p95 = _lognormal_quantile(service, service_cv, 0.95)
    return SteadyState(
        k=config,
        alpha=alpha,
        tokens_per_step=e,
        acceptance_rate=acceptance_rate,
        mean_accepted_length=mean_accepted_length,
        batch=batch,
        batch_cap=batch_cap,
        step_time_s=step,
        tpot_s=tpot,
        tpot_p95_s=_lognormal_quantile(tpot, tpot_cv, 0.95),
        tpot_cv=tpot_cv,
        ttft_s=ttft,
        service_s=service,
        service_cv=service_cv,
        e2e_s=e2e,
        e2e_p95_s=e2e_p95,
        capacity_rps=capacity,
        utilization=workload.request_rate / capacity if capacity > 0 else math.inf,
        throughput_rps=throughput,
        generation_tokens_per_s=throughput * out,
        kv_usage=kv_usage,
        preemptions_per_s=throughput * preemptions_per_request,
        queue_growth_rps=max(0.0, workload.request_rate - capacity) if saturated else 0.0,
        saturated=saturated,
        replicas=replicas,
        step_mix=step_mix,
    )


def _saturated_nothing(
    params: EngineParams,
    workload: Workload,
    k: int,
    alpha: float,
    e: float,
    decay: float,
    step: float,
    batch_cap: float,
) -> SteadyState:
    return SteadyState(
        k=k,
        alpha=alpha,
        tokens_per_step=e,
        acceptance_rate=acceptance_rate(alpha, k, decay),
        mean_accepted_length=mean_accepted_length(alpha, k, decay),
        batch=0.0,
        batch_cap=batch_cap,
        step_time_s=step,
        tpot_s=step / e,
        tpot_p95_s=step / e,
        tpot_cv=0.0,
        ttft_s=math.inf,
        service_s=math.inf,
        service_cv=0.0,
        e2e_s=math.inf,
        e2e_p95_s=math.inf,
        capacity_rps=0.0,
        utilization=math.inf if workload.request_rate > 0 else 0.0,
        throughput_rps=0.0,
        generation_tokens_per_s=0.0,
        kv_usage=0.0,
        preemptions_per_s=0.0,
        queue_growth_rps=workload.request_rate,
        saturated=workload.request_rate > 0,
        replicas=0,
    )


def _tpot_cv(params: EngineParams, alpha: float, k: int, decay: float, steps: float) -> float:
    """CV of a request's TPOT: emission noise averaged over its steps, plus heterogeneity."""
    probs = position_acceptance(alpha, k, decay)
    e = 1.0 + sum(probs)
    # Tokens per step = 1 + number of accepted positions; positions are nested events, so
    # E[X^2] = 1 + 3*sum P_i + 2*sum_{i<j} P_j = 1 + sum_i (2*i + 3) * P_i.
    second = 1.0 + sum((2 * i + 3) * p for i, p in enumerate(probs))
    var = max(0.0, second - e * e)
    sampling_cv = math.sqrt(var / max(1.0, steps)) / e
    return math.hypot(sampling_cv, params.tpot_cv)


def capacity(params: EngineParams, workload: Workload, k: int) -> float:
    """Maximum sustainable request rate of the service at config k (requests/s)."""
    return steady_state(params, workload, k).capacity_rps


# --------------------------------------------------------------------------------------------
# Finite phase with queueing
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PhaseResult:
    """Latency of the requests that arrive during one phase at config k.

    Requests are attributed to the phase they arrive in; waiting for a queue that grows
    (or drains) during the phase is included. `queue_end` carries into the next phase.
    """

    k: Config
    duration_s: float
    arrivals: float
    """Requests arriving during the phase."""
    queue_start: float
    queue_end: float
    """Requests waiting at the end of the phase (service-wide)."""
    saturated_s: float
    """Seconds of the phase spent with a non-empty queue."""
    e2e_mean_s: float
    e2e_p95_s: float
    ttft_mean_s: float
    tpot_mean_s: float
    tpot_p95_s: float
    good_fraction: float
    """Fraction of arrivals meeting the SLO (1.0 when no SLO is given)."""
    goodput_tokens_per_s: float
    """Output tokens per second of requests that met the SLO."""
    generation_tokens_per_s: float
    """Output tokens per second the service produced during the phase."""
    steady: SteadyState
    """The steady state at the phase's load (batch, KV usage, capacity...)."""


@dataclass(frozen=True)
class _Component:
    weight: float
    wait_lo: float
    wait_hi: float
    service_mean: float
    service_cv: float
    ttft: float
    tpot_mean: float
    tpot_cv: float


_WAIT_POINTS = 16


def _e2e_cdf_function(c: _Component):
    """``x -> P(e2e <= x)`` of one component: its service lognormal shifted by a wait
    uniform on [wait_lo, wait_hi] (16-point midpoint rule).

    The same arithmetic as `_lognormal_cdf` term by term, with the wait points and the
    lognormal's (mu, sigma) computed once per component instead of once per call: a P95
    bisection evaluates the CDF dozens of times.
    """
    mean, cv = c.service_mean, c.service_cv
    if c.wait_hi - c.wait_lo <= 1e-12:
        waits: tuple[float, ...] = (c.wait_lo,)
        divisor = None
    else:
        waits = tuple(
            c.wait_lo + (c.wait_hi - c.wait_lo) * (j + 0.5) / _WAIT_POINTS
            for j in range(_WAIT_POINTS)
        )
        divisor = _WAIT_POINTS
    if not math.isfinite(mean) or cv <= 0 or mean <= 0:
        def cdf(x: float) -> float:
            total = 0.0
            for w in waits:
                total += _lognormal_cdf(x - w, mean, cv)
            return total if divisor is None else total / divisor

        return cdf
    mu, sigma = _lognormal_mu_sigma(mean, cv)
    log, erf = math.log, math.erf
    if divisor is None:
        (wait,) = waits

        def one_wait(x: float) -> float:
            # The loop below for a single wait (0.0 + F is F for F >= 0): no queue, the
            # usual case, without the loop.
            y = x - wait
            if y > 0:
                return 0.5 * (1.0 + erf((log(y) - mu) / sigma / _SQRT2))
            return 0.0

        return one_wait

    def cdf(x: float) -> float:
        total = 0.0
        for w in waits:
            y = x - w
            if y > 0:
                total += 0.5 * (1.0 + erf((log(y) - mu) / sigma / _SQRT2))
        return total if divisor is None else total / divisor

    return cdf


def _lognormal_cdf_function(mean: float, cv: float):
    """``x -> _lognormal_cdf(x, mean, cv)``, with (mu, sigma) looked up once instead of once
    per call (the same expression, so the same floats): P95 bisections call it dozens of times."""
    if not math.isfinite(mean) or cv <= 0 or mean <= 0:
        return lambda x: _lognormal_cdf(x, mean, cv)
    mu, sigma = _lognormal_mu_sigma(mean, cv)
    log, erf = math.log, math.erf

    def cdf(x: float) -> float:
        if x <= 0:
            return 0.0
        return 0.5 * (1.0 + erf((log(x) - mu) / sigma / _SQRT2))

    return cdf


def _mixture_cdf(weighted: list[tuple[float, Any]]):
    """``x -> sum(weight * cdf(x))`` over the components. A phase without a queue to drain
    has one component, of weight 1: its CDF itself (``0 + 1.0 * F(x)`` is ``F(x)`` for the
    non-negative F here, so the same floats, without the sum's generator)."""
    if len(weighted) == 1:
        (weight, only), = weighted
        if weight == 1.0:
            return only  # 1.0 * F(x) is F(x)
        return lambda x: weight * only(x)
    return lambda x: sum(weight * cdf(x) for weight, cdf in weighted)


def _mixture_quantile(components: list[_Component], q: float, cdf) -> float:
    hi = 1.0
    while cdf(hi) < q:
        hi *= 2.0
        if hi > 1e9:
            return math.inf
    lo = 0.0
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if cdf(mid) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-6 * (hi if hi > 1.0 else 1.0):  # max(1.0, hi) without the call
            break
    return hi


def evaluate_phase(
    params: EngineParams,
    workload: Workload,
    k: Config,
    duration_s: float,
    initial_queue: float = 0.0,
    replicas: int | None = None,
    slo_e2e_s: float | None = None,
    slo_tpot_s: float | None = None,
) -> PhaseResult:
    """Mean/P95 latency, TPOT and goodput of a phase of `duration_s` at config k.

    The queue starts at `initial_queue` requests. While arrivals exceed capacity it grows at
    lambda - mu and a request arriving at time t waits Q(t)/mu (FIFO); while capacity exceeds
    arrivals a backlog drains at mu - lambda with the replicas at their batch cap, after which
    requests see the steady state. An SLO (either bound) sets good_fraction and goodput.
    """
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s}")
    steady = steady_state(params, workload, k, replicas)
    lam = workload.request_rate
    mu = steady.capacity_rps
    q0 = max(0.0, initial_queue)
    out = workload.output_tokens
    arrivals = lam * duration_s

    comps: list[_Component] = []
    if mu <= 0:
        saturated_s = duration_s
        queue_end = q0 + arrivals
        comps.append(_Component(1.0, math.inf, math.inf, math.inf, 0.0, math.inf, math.inf, 0.0))
        produced = 0.0
    elif lam >= mu:
        # The replicas at their cap: what requests see while a queue exists.
        capped = _capped(params, workload, k, replicas, steady)
        saturated_s = duration_s if (q0 > 0 or lam > mu) else 0.0
        queue_end = q0 + (lam - mu) * duration_s
        comps.append(
            _Component(
                1.0,
                q0 / mu,
                queue_end / mu,
                capped.service_s,
                capped.service_cv,
                capped.ttft_s,
                capped.tpot_s,
                capped.tpot_cv,
            )
        )
        produced = mu * duration_s * out
    else:
        drain = min(duration_s, q0 / (mu - lam)) if q0 > 0 else 0.0
        saturated_s = drain
        # What the phase leaves of the backlog: none once it drained, else the rest (a backlog
        # longer than the phase carries into the next one: the benchmark cuts a scenario into
        # minutes, and a rollout's queue into its rounds).
        queue_end = max(0.0, q0 - (mu - lam) * duration_s)
        if drain > 0:
            # Only a queue to drain needs the capped state (a second steady state, skipped
            # by most phases: they start without a queue).
            capped = _capped(params, workload, k, replicas, steady)
            comps.append(
                _Component(
                    drain / duration_s,
                    queue_end / mu if drain >= duration_s else 0.0,
                    q0 / mu,
                    capped.service_s,
                    capped.service_cv,
                    capped.ttft_s,
                    capped.tpot_s,
                    capped.tpot_cv,
                )
            )
        if drain < duration_s:
            comps.append(
                _Component(
                    1.0 - drain / duration_s,
                    0.0,
                    0.0,
                    steady.service_s,
                    steady.service_cv,
                    steady.ttft_s,
                    steady.tpot_s,
                    steady.tpot_cv,
                )
            )
        produced = (mu * drain + lam * (duration_s - drain)) * out

    e2e_cdf = _mixture_cdf([(c.weight, _e2e_cdf_function(c)) for c in comps])
    tpot_cdf = _mixture_cdf([(c.weight, _lognormal_cdf_function(c.tpot_mean, c.tpot_cv)) for c in comps])

    finite = all(math.isfinite(c.service_mean) for c in comps)
    if finite:
        e2e_mean = sum(c.weight * (0.5 * (c.wait_lo + c.wait_hi) + c.service_mean) for c in comps)
        ttft_mean = sum(c.weight * (0.5 * (c.wait_lo + c.wait_hi) + c.ttft) for c in comps)
        tpot_mean = sum(c.weight * c.tpot_mean for c in comps)
        e2e_p95 = _mixture_quantile(comps, 0.95, e2e_cdf)
        tpot_p95 = _mixture_quantile(comps, 0.95, tpot_cdf)
    else:
        e2e_mean = e2e_p95 = ttft_mean = tpot_mean = tpot_p95 = math.inf

    if slo_e2e_s is None and slo_tpot_s is None:
        good = 1.0 if finite else 0.0
    elif not finite:
        good = 0.0
    else:
        # TPOT spread comes from acceptance and batch jitter, e2e spread from waiting and
        # output length: nearly independent, so the joint probability is their product.
        good = 0.0
        for c in comps:
            p_e2e = 1.0 if slo_e2e_s is None else _e2e_cdf_function(c)(slo_e2e_s)
            p_tpot = 1.0 if slo_tpot_s is None else _lognormal_cdf(slo_tpot_s, c.tpot_mean, c.tpot_cv)
            good += c.weight * p_e2e * p_tpot
    goodput = min(good * lam * out, produced / duration_s) if lam > 0 else 0.0
    return PhaseResult(
        k=k,
        duration_s=duration_s,
        arrivals=arrivals,
        queue_start=q0,
        queue_end=queue_end,
        saturated_s=saturated_s,
        e2e_mean_s=e2e_mean,
        e2e_p95_s=e2e_p95,
        ttft_mean_s=ttft_mean,
        tpot_mean_s=tpot_mean,
        tpot_p95_s=tpot_p95,
        good_fraction=good,
        goodput_tokens_per_s=goodput,
        generation_tokens_per_s=produced / duration_s,
        steady=steady,
    )


def outage(
    params: EngineParams, workload: Workload, k: Config, duration_s: float, initial_queue: float = 0.0
) -> tuple[float, float, float]:
    """(mean e2e, P95 e2e, queue at the end) of a stretch where no replica serves (a rollout
    of one replica without a surge): arrivals wait half the stretch on average, and the
    backlog ahead of them at one replica's capacity, then get one replica's service time."""
    one = steady_state(params, workload, k, 1)
    service = one.service_s if math.isfinite(one.service_s) else 0.0
    drain = initial_queue / one.capacity_rps if one.capacity_rps > 0 else duration_s
    return (duration_s / 2.0 + drain + service, duration_s + drain + service,
            initial_queue + workload.request_rate * duration_s)


def _capped(
    params: EngineParams, workload: Workload, k: int, replicas: int | None, steady: SteadyState
) -> SteadyState:
    """The state with a waiting queue: replicas at their batch cap, serving at capacity."""
    if steady.saturated or steady.capacity_rps <= 0:
        return steady
    at_capacity = replace(workload, request_rate=steady.capacity_rps * (1 + 1e-9))
    return steady_state(params, at_capacity, k, replicas)


# --------------------------------------------------------------------------------------------
# Comparing configs
# --------------------------------------------------------------------------------------------


DEFAULT_HORIZON_S = 600.0
"""Horizon for comparisons at loads above a config's capacity (its queue grows this long)."""


def compare_configs(
    params: EngineParams,
    workload: Workload,
    ks: Iterable[int] | None = None,
    horizon_s: float = DEFAULT_HORIZON_S,
) -> dict[int, PhaseResult]:
    """Every config (default: off and K = min_k..max_k) over a phase of `horizon_s`."""
    ks = params.configs() if ks is None else tuple(ks)
    return {k: evaluate_phase(params, workload, k, horizon_s) for k in ks}


def speedup(
    params: EngineParams, workload: Workload, k: int, horizon_s: float = DEFAULT_HORIZON_S
) -> float:
    """Mean e2e latency with speculation off divided by that at config k (>1: k is faster).

    Evaluated over a phase of `horizon_s` from an empty queue, so a config past its
    capacity is charged its queue growth instead of an infinite steady-state latency.
    """
    off = evaluate_phase(params, workload, OFF, horizon_s).e2e_mean_s
    mine = evaluate_phase(params, workload, k, horizon_s).e2e_mean_s
    if math.isinf(mine):
        return 0.0
    return off / mine


def best_config(
    params: EngineParams,
    workload: Workload,
    ks: Iterable[int] | None = None,
    horizon_s: float = DEFAULT_HORIZON_S,
) -> int:
    """The config with the lowest mean e2e latency (ties: the smaller K, off first)."""
    results = compare_configs(params, workload, ks, horizon_s)
    return min(results, key=lambda k: (results[k].e2e_mean_s, k))


# --------------------------------------------------------------------------------------------
# Lognormal helpers
# --------------------------------------------------------------------------------------------


def _lognormal_quantile(mean: float, cv: float, q: float) -> float:
    if not math.isfinite(mean):
        return math.inf
    if cv <= 0 or mean <= 0:
        return mean
    sigma2 = math.log1p(cv * cv)
    sigma = math.sqrt(sigma2)
    return mean * math.exp(sigma * _NORMAL.inv_cdf(q) - sigma2 / 2.0)


def _lognormal_cdf(x: float, mean: float, cv: float) -> float:
    if x <= 0:
        return 0.0
    if not math.isfinite(mean):
        return 0.0
    if cv <= 0 or mean <= 0:
        return 1.0 if x >= mean else 0.0
    mu, sigma = _lognormal_mu_sigma(mean, cv)
    # NormalDist().cdf(z) inlined (same expression, so the same float): this is the hot
    # loop of every P95 bisection.
    return 0.5 * (1.0 + math.erf((math.log(x) - mu) / sigma / _SQRT2))


# --------------------------------------------------------------------------------------------
# Choosing a schedule
# --------------------------------------------------------------------------------------------


SCHEDULE_EDGES: tuple[int, ...] = (4, 8, 16, 32, 64, 128, 256)
"""Batch sizes where a proposed schedule's ranges may end (a range ends at an edge and the
next starts right after it): coarse, a factor 2 apart, so a schedule stays right while the
batch wanders and few schedules exist."""
SCHEDULE_MAX_BANDS = 3
"""At most this many ranges in a proposed schedule."""
SCHEDULE_BAND_GAIN = 0.01
"""A schedule with more ranges must cut the time per token by this fraction more than the
best one with fewer ranges, or the fewer win (robustness over a last percent)."""
_UNSEEN_WEIGHT = 0.01
_UNSEEN_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


@dataclass(frozen=True)
class ScheduleProposal:
    """The schedule `propose_schedule` chose and the figures it chose it on."""

    schedule: Schedule
    tpot_s: float
    """Time-weighted mean time per output token under the schedule over the batches seen,
    schedule overhead included."""
    static_k: int
    """The best single plain config (0 = off) over the same batches, no schedule cost."""
    static_tpot_s: float
    """Its mean time per output token over the same batches."""
    crossover_batches: tuple[tuple[int, int], ...]
    """(batch size, best K there) where the best K changes on the batch-size grid 1..1024."""

    @property
    def gain(self) -> float:
        """Fraction of time per token the schedule saves against the best static config
        (negative: the static config is better, e.g. when the schedule's overhead outweighs
        what following the batch gives)."""
        return 1.0 - self.tpot_s / self.static_tpot_s if self.static_tpot_s > 0 else 0.0


def tokens_per_step_from_positions(acceptance: Sequence[float], k: int) -> float:
    """E at K from per-position conditional acceptance (``acceptance[i]`` = P(position i
    accepted | i-1 was), what ``accepted_per_pos[i] / accepted_per_pos[i-1]`` estimates);
    positions beyond the list repeat its last value."""
    if k <= 0 or not acceptance:
        return 1.0
    e, p = 1.0, 1.0
    for i in range(k):
        p *= min(1.0, max(0.0, acceptance[min(i, len(acceptance) - 1)]))
        e += p
    return e


def acceptance_from_counters(
    drafts: float, accepted_per_pos: Sequence[float], step_shares: Sequence[tuple[int, float]]
) -> tuple[float | None, ...]:
    """Per-position conditional acceptance from vLLM's counters when steps drafted different
    Ks (a schedule): position i is drafted only by steps with K > i, so
    ``accepted_per_pos[i] / accepted_per_pos[i-1]`` underestimates it by the share of drafts
    that stopped before i. ``step_shares`` (e.g. `SteadyState.step_shares` at the observed
    batch) says how the drafts split across Ks; with one K this is the plain ratio. None
    where no draft reached the position or none was accepted before it."""
    drafting = [(k, share) for k, share in step_shares if k > 0 and share > 0]
    total = math.fsum(share for _, share in drafting)
    out: list[float | None] = []
    previous: float | None = 1.0
    for i, accepted in enumerate(accepted_per_pos):
        reach = math.fsum(share for k, share in drafting if k > i) / total if total > 0 else 0.0
        drafted = drafts * reach
        if drafted <= 0 or previous is None or previous <= 0:
            out.append(None)
            previous = None
            continue
        rate = accepted / drafted
        out.append(min(1.0, rate / previous))
        previous = rate
    return tuple(out)


def propose_schedule(
    params: EngineParams,
    acceptance: Sequence[float],
    batches: Iterable[tuple[float, float]],
    context_tokens: float,
    ks: Iterable[int] | None = None,
    edges: Sequence[int] = SCHEDULE_EDGES,
    max_bands: int = SCHEDULE_MAX_BANDS,
    prompt_tokens: float = 0.0,
    output_tokens: float | None = None,
) -> ScheduleProposal:
    """The best schedule of the family for the batches a service runs. Pure.

    Inputs: the calibrated step-time model ``params`` (a policy's prior with its calibrated
    scale; ``schedule_overhead_s`` is charged on every step), per-position conditional
    acceptance ``acceptance`` (at the service's temperature), the running batch sizes seen
    as ``(batch, weight)`` pairs (e.g. `vllm:num_requests_running` samples, weight = time),
    and the mean resident context per sequence.

    The family: at most ``max_bands`` ranges whose ends lie on ``edges`` (a factor 2 apart),
    K per range from ``ks`` (default off and min_k..max_k), K not rising with the batch,
    at least one range with K > 0. Criterion: the time per output token of the step at each
    batch size, t_K(b) / E_K, weighted by the time spent at it (the benchmark's latency is a
    time-weighted mean too); batch sizes not
    seen also count, at 1 % of the weight, on a factor-2 grid 1..1024, so ranges the
    service has not visited get the K their batch size calls for and the edges land near
    the crossovers. More ranges must gain ``SCHEDULE_BAND_GAIN``. With the mean
    ``prompt_tokens`` and ``output_tokens`` of the requests, each step also carries its share
    of chunked prefill (b x prompt / steps per request at that K; the draft prefills too when
    K > 0), which is where speculation off wins at long prompts. The per-step criterion
    holds the batch fixed; `steady_state` with the schedule gives the full prediction
    (Little's law, ranges visited as the batch moves) for comparing it with plain configs.
    """
    ks = tuple(sorted(set(params.configs() if ks is None else ks)))
    if not any(k > 0 for k in ks):
        raise ScheduleError("propose_schedule: ks needs at least one K > 0")
    seen = [(float(b), float(w)) for b, w in batches if w > 0 and b > 0]
    total = math.fsum(w for _, w in seen)
    points = list(seen)
    unseen = _UNSEEN_WEIGHT * (total if total > 0 else 1.0) / len(_UNSEEN_BATCHES)
    points += [(float(b), unseen) for b in _UNSEEN_BATCHES]
    e = {k: tokens_per_step_from_positions(acceptance, k) for k in ks}
    costs = {k: _scheduled_step_cost(params, k, context_tokens) for k in ks}
    plain = {k: _step_cost(params, k, context_tokens) for k in ks}

    prefill_steps = max(1.0, prompt_tokens / params.max_num_batched_tokens)

    def per_token(k: int, b: float, scheduled: bool = True) -> float:
        cost = costs[k] if scheduled else plain[k]
        step = cost.decode(b)
        if output_tokens is not None and prompt_tokens > 0:
            steps_per_request = prefill_steps + max(0.0, output_tokens - 1.0) / e[k]
            step += cost.prefill_per_token(b) * prompt_tokens * b / steps_per_request
        return step / e[k]

    # Static: the best plain K over the batches seen (all points when none were seen).
    basis = seen or points
    weight_basis = math.fsum(w for _, w in basis)

    def static_cost(k: int) -> float:
        return math.fsum(w * per_token(k, b, False) for b, w in basis) / weight_basis

    static_k = min(ks, key=lambda k: (static_cost(k), k))
    grid_best = [(b, min(ks, key=lambda k: (per_token(k, b), -k))) for b in _UNSEEN_BATCHES]
    crossovers = tuple(
        (b, k) for i, (b, k) in enumerate(grid_best) if i == 0 or grid_best[i - 1][1] != k
    )

    # band cost[(lo, hi)][k]: sum of w*b*per_token over the points in the range.
    bounds = (0, *sorted(set(int(x) for x in edges)), math.inf)
    band_cost: dict[tuple, dict[int, float]] = {}

    def cost_of(lo: float, hi: float) -> dict[int, float]:
        key = (lo, hi)
        if key not in band_cost:
            inside = [(b, w) for b, w in points if lo < round(b) <= hi or (lo == 0 and b < 1)]
            band_cost[key] = {k: math.fsum(w * per_token(k, b) for b, w in inside) for k in ks}
        return band_cost[key]

    best: dict[int, tuple[float, tuple[tuple[int, int, int], ...]]] = {}
    inner = bounds[1:-1]
    from itertools import combinations

    for n_bands in range(1, max_bands + 1):
        for cut in combinations(inner, n_bands - 1):
            ends = (0, *cut, math.inf)
            ranges = list(zip(ends, ends[1:]))
            tables = [cost_of(lo, hi) for lo, hi in ranges]
            # K not rising with the batch: DP over ranges from the last, K <= previous K.
            options: dict[int, tuple[float, tuple[int, ...]]] = {}
            for j in reversed(range(len(ranges))):
                new: dict[int, tuple[float, tuple[int, ...]]] = {}
                for k in ks:
                    tail = min(
                        ((c, path) for kk, (c, path) in options.items() if kk <= k),
                        default=None, key=lambda item: item[0],
                    ) if options else (0.0, ())
                    if tail is None:
                        continue
                    new[k] = (tables[j][k] + tail[0], (k, *tail[1]))
                options = new
            # K does not rise, so a first range at K 0 is all K 0: not a schedule.
            total_cost, path = min(
                (v for k, v in options.items() if k > 0), key=lambda item: (item[0], item[1])
            )
            bands = []
            for (lo, hi), k in zip(ranges, path):
                start = int(lo) + 1
                end = int(hi) if math.isfinite(hi) else max(int(lo) + 1, params.max_num_seqs)
                if bands and bands[-1][2] == k:
                    bands[-1] = (bands[-1][0], end, k)
                else:
                    bands.append((start, end, k))
            n = len(bands)
            if n not in best or total_cost < best[n][0]:
                best[n] = (total_cost, tuple(bands))
    chosen_n = min(best)
    for n in sorted(best):
        if best[n][0] < best[chosen_n][0] * (1.0 - SCHEDULE_BAND_GAIN):
            chosen_n = n
    schedule = Schedule(best[chosen_n][1])
    tpot = math.fsum(w * per_token(schedule.k_at(b), b) for b, w in basis) / weight_basis
    return ScheduleProposal(
        schedule=schedule,
        tpot_s=tpot,
        static_k=static_k,
        static_tpot_s=static_cost(static_k),
        crossover_batches=crossovers,
    )
