"""Scenario files: the traffic and acceptance a simulated service sees over time.

One YAML file drives both the simulator (`specdecode sim`) and the policy benchmark
(`specdecode bench policy`); any file with these keys runs without code changes:

```yaml
name: collapse-recovery           # identifier used in reports
description: free text            # optional
duration: 90m                     # seconds (number) or a string: 90s, 30m, 6h, 1h30m
seed: 7                           # every random draw derives from it
method: draft_model               # draft_model | eagle | eagle3 | mtp | ngram | suffix
model:                            # optional: perfmodel.EngineParams overrides by name
  replicas: 2
  draft_cost_ratio: 0.5
  rollout_s: 3m                   # keys ending in _s also take duration strings
slo:                              # optional; either bound may be left out
  p95_e2e_s: 10
  p95_tpot_s: 0.02
phases:                           # each holds until the next; unset keys carry over
  - {at: 0, request_rate: 6, prompt_tokens: 1000, output_tokens: 300,
     temperature: 0, acceptance: 0.8}
  - {at: 20m, acceptance: 0.2}
noise:                            # optional (defaults shown): the truth wanders around
  acceptance_sd: 0.02             #   the phase values: sd of the per-token acceptance and
  request_rate_cv: 0.1            #   relative sd of the request rate, redrawn every period;
  period: 1m                      #   `noise: off` keeps them exact
  request_acceptance_sd: 0.15     # sd of one request's own acceptance (beta per request)
metrics_outage:                   # optional: Prometheus unreachable (scrapes fail)
  - {at: 40m, duration: 10m}
```

`request_rate` is requests per second to the whole service (split across its Ready
replicas); `acceptance` is the draft's true per-token acceptance alpha at temperature 0
(temperature lowers it through the performance model). The first phase starts at 0 and sets
`request_rate` and `acceptance`; `prompt_tokens`, `output_tokens` and `temperature` default to
1000, 300 and 0 there.

Everything here is pure: `phase_at(scenario, t)`, `Scenario.compressed(factor)` and the noise
draws (`true_conditions`) depend only on the scenario and the time passed in.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any, Iterator, Mapping

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from specdecode.cli import UnreadableInput
from specdecode.documents import parse_documents, read_text
from specdecode import api
from specdecode.control.perfmodel import METHODS, EngineParams, EngineParamsError, Method, Workload


class ScenarioError(ValueError):
    """A scenario file that cannot be used: one line naming the file, the field and the fix."""


# --------------------------------------------------------------------------------------------
# Durations
# --------------------------------------------------------------------------------------------

def parse_duration(value: Any) -> float:
    """Seconds from a number or a string such as `90s`, `30m`, `6h`, `1h 30m`, `1d`: the API's
    durations (`api.parse_duration`), plus days and spaces between the parts."""
    return api.parse_duration(value.replace(" ", "") if isinstance(value, str) else value, days=True)


def format_duration(seconds: float) -> str:
    """Compact rendering for reports: 90 -> `1m30s`, 3600 -> `1h`."""
    if 0 < seconds < 1:
        return f"{seconds * 1000:g}ms"
    out, rest = "", seconds
    for unit in ("h", "m"):
        size = api.DURATION_UNIT_SECONDS[unit]
        if rest >= size:
            whole = int(rest // size)
            out += f"{whole}{unit}"
            rest -= whole * size
    if rest > 1e-9 or not out:
        out += f"{rest:g}s"
    return out


# --------------------------------------------------------------------------------------------
# The model of a scenario file
# --------------------------------------------------------------------------------------------

_PHASE_KEYS = ("request_rate", "prompt_tokens", "output_tokens", "temperature", "acceptance")
_FIRST_PHASE_DEFAULTS = {"prompt_tokens": 1000.0, "output_tokens": 300.0, "temperature": 0.0}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Phase(_Strict):
    """One stretch of constant conditions; holds from `at` until the next phase."""

    at: float = Field(ge=0, description="Start, seconds from the scenario's start.")
    request_rate: float = Field(ge=0, description="Requests per second to the whole service.")
    prompt_tokens: float = Field(ge=1, description="Mean prompt length, tokens.")
    output_tokens: float = Field(ge=1, description="Mean output length, tokens.")
    temperature: float = Field(ge=0, le=2, description="Sampling temperature of the requests.")
    acceptance: float = Field(ge=0, le=1, description="True per-token acceptance at T = 0.")

    @field_validator("at", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float:
        return parse_duration(value)

    def workload(self) -> Workload:
        """The phase as the performance model's input."""
        return Workload(
            request_rate=self.request_rate,
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            temperature=self.temperature,
            acceptance=self.acceptance,
        )


class Slo(_Strict):
    """Latency objectives: a request is good when it meets every bound that is set."""

    p95_e2e_s: float | None = Field(default=None, gt=0)
    p95_tpot_s: float | None = Field(default=None, gt=0)

    @field_validator("p95_e2e_s", "p95_tpot_s", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float | None:
        return None if value is None else parse_duration(value)


DEFAULT_ACCEPTANCE_SD = 0.02
DEFAULT_REQUEST_RATE_CV = 0.1
DEFAULT_NOISE_PERIOD_S = 60.0
DEFAULT_REQUEST_ACCEPTANCE_SD = 0.15


class Noise(_Strict):
    """The truth wandering around each phase's values, and how much acceptance differs
    between requests (not the counters' sampling noise: the simulator adds that anyway).

    The truth wanders in every scenario unless its file says otherwise: `noise: off` (or
    zero `acceptance_sd` and `request_rate_cv`) keeps each phase's values exact.
    """

    acceptance_sd: float = Field(default=DEFAULT_ACCEPTANCE_SD, ge=0, le=0.5)
    request_rate_cv: float = Field(default=DEFAULT_REQUEST_RATE_CV, ge=0, le=2)
    period: float = Field(default=DEFAULT_NOISE_PERIOD_S, gt=0, description="Seconds between redraws.")
    request_acceptance_sd: float = Field(
        default=DEFAULT_REQUEST_ACCEPTANCE_SD, ge=0, le=0.45,
        description="Standard deviation of one request's own acceptance around the truth "
        "(beta-distributed per request): a window's acceptance is then as uncertain as its "
        "number of requests makes it, not a binomial of its tokens. The benchmark's pods use "
        "it; 0 turns it off.",
    )

    @property
    def wanders(self) -> bool:
        return self.acceptance_sd > 0 or self.request_rate_cv > 0

    @field_validator("period", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float:
        return parse_duration(value)


class MetricsOutage(_Strict):
    """A window in which Prometheus cannot scrape or be queried."""

    at: float = Field(ge=0)
    duration: float = Field(gt=0)

    @field_validator("at", "duration", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float:
        return parse_duration(value)

    @property
    def end(self) -> float:
        return self.at + self.duration


class Scenario(_Strict):
    """A parsed, validated scenario: phases resolved (carry-over applied) and sorted."""

    name: str = Field(min_length=1, max_length=80)
    description: str = ""
    duration: float = Field(gt=0)
    seed: int = 0
    method: Method
    model: dict[str, Any] = Field(default_factory=dict)
    slo: Slo = Field(default_factory=Slo)
    phases: tuple[Phase, ...] = Field(min_length=1)
    noise: Noise = Field(default_factory=Noise)
    metrics_outage: tuple[MetricsOutage, ...] = ()
    held_back: bool = False
    """A held-back scenario: written for an issue's benchmark and never used to tune the
    policy (a test set); reports mark it."""
    autotune: dict[str, Any] = Field(default_factory=dict)
    """The service's `spec.autotune` beside the API's defaults, as a user writes it (camelCase:
    ``{experiments: {controlInterval: 6h}}``); the benchmark's policy runs with it."""

    @field_validator("noise", mode="before")
    @classmethod
    def _noise_off(cls, value: Any) -> Any:
        """`noise: off` (YAML false) or `noise: null`: the truth holds each phase's values."""
        if value is None or value is False or value == "off":
            return {"acceptance_sd": 0.0, "request_rate_cv": 0.0}
        return value

    @field_validator("duration", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> float:
        return parse_duration(value)

    @field_validator("model", mode="before")
    @classmethod
    def _model_durations(cls, value: Any) -> Any:
        if not isinstance(value, Mapping):
            return value
        return {
            k: parse_duration(v) if k.endswith("_s") and isinstance(v, str) else v
            for k, v in value.items()
        }

    @field_validator("phases", mode="before")
    @classmethod
    def _carry_over(cls, value: Any) -> Any:
        """Fill each phase's unset keys from the previous phase (the first from defaults)."""
        if not isinstance(value, (list, tuple)):
            return value
        resolved: list[Any] = []
        previous: dict[str, Any] = dict(_FIRST_PHASE_DEFAULTS)
        for i, raw in enumerate(value):
            if not isinstance(raw, Mapping):
                raise ValueError(f"phase {i} must be a mapping of {', '.join(_PHASE_KEYS)}")
            if i == 0:
                missing = [k for k in ("request_rate", "acceptance") if k not in raw]
                if missing:
                    raise ValueError(f"the first phase must set {' and '.join(missing)}")
            phase = {**previous, **raw}
            resolved.append(phase)
            previous = {k: phase[k] for k in _PHASE_KEYS if k in phase}
        return resolved

    @model_validator(mode="after")
    def _check(self) -> "Scenario":
        if self.phases[0].at != 0:
            raise ValueError("phases[0].at: the first phase must start at 0")
        for i in range(1, len(self.phases)):
            prev, cur = self.phases[i - 1].at, self.phases[i].at
            if cur <= prev:
                raise ValueError(
                    f"phases[{i}].at: {format_duration(cur)} is not after phases[{i - 1}].at "
                    f"{format_duration(prev)}; list phases in time order"
                )
        last = self.phases[-1].at
        if last >= self.duration:
            raise ValueError(
                f"phases[{len(self.phases) - 1}].at: {format_duration(last)} is not within "
                f"duration {format_duration(self.duration)}; lengthen duration or drop the phase"
            )
        for i, outage in enumerate(self.metrics_outage):
            if outage.at >= self.duration:
                raise ValueError(
                    f"metrics_outage[{i}].at: {format_duration(outage.at)} is past duration "
                    f"{format_duration(self.duration)}"
                )
        try:
            EngineParams.for_method(self.method, self.model)
        except EngineParamsError as err:
            raise ValueError(str(err)) from None
        if self.autotune:
            try:
                api.Autotune.model_validate(self.autotune)
            except ValidationError as err:
                first = err.errors()[0]
                where = ".".join(str(part) for part in first.get("loc", ()))
                raise ValueError(
                    f"autotune.{where}: {first.get('msg', 'invalid')}; write it as in the API's spec.autotune "
                    f"(`kubectl explain specdecodeservice.spec.autotune`)"
                ) from None
        return self

    # --- derived views -------------------------------------------------------------------

    @cached_property
    def params(self) -> EngineParams:
        """The scenario's true engine: the method's defaults with `model:` overrides."""
        return EngineParams.for_method(self.method, self.model)

    def phase_at(self, t: float) -> Phase:
        """The phase in force at `t` seconds (clamped to [0, duration))."""
        return phase_at(self, t)

    def phase_index_at(self, t: float) -> int:
        index = 0
        for i, phase in enumerate(self.phases):
            if phase.at <= t:
                index = i
            else:
                break
        return index

    def phase_spans(self) -> Iterator[tuple[float, float, Phase]]:
        """(start, end, phase) for every phase; the last ends at `duration`."""
        for i, phase in enumerate(self.phases):
            end = self.phases[i + 1].at if i + 1 < len(self.phases) else self.duration
            yield phase.at, end, phase

    def metrics_outage_at(self, t: float) -> bool:
        """Whether Prometheus is out at `t`."""
        return any(o.at <= t < o.end for o in self.metrics_outage)

    def compressed(self, factor: float) -> "Scenario":
        """The same scenario played `factor` times faster.

        The time axis shrinks (duration, phase starts, outages, noise period); request
        rates, token counts and the engine model do not (a pod's batch and metrics look the
        same, only sooner). Restarts take what the cluster takes, so `model.rollout_s` is
        kept: compress it yourself under `model:` if the replay must match.
        """
        if not (factor > 0 and math.isfinite(factor)):
            raise ScenarioError(f"compression factor must be a number > 0, got {factor!r}")
        data = self.model_dump()
        data["duration"] = self.duration / factor
        for phase in data["phases"]:
            phase["at"] = phase["at"] / factor
        for outage in data["metrics_outage"]:
            outage["at"] /= factor
            outage["duration"] /= factor
        data["noise"]["period"] /= factor
        return Scenario.model_validate(data)

    def true_conditions(self, t: float) -> "Conditions":
        """What the service truly sees at `t`: the phase plus the scenario's noise."""
        return true_conditions(self, t)


@dataclass(frozen=True)
class Conditions:
    """The truth at one instant: the phase's workload after noise, and whether metrics are out."""

    phase_index: int
    workload: Workload
    metrics_outage: bool


def phase_at(scenario: Scenario, t: float) -> Phase:
    """The phase in force at `t` seconds from the start (before 0: the first; after the end:
    the last)."""
    return scenario.phases[scenario.phase_index_at(t)]


def true_conditions(scenario: Scenario, t: float) -> Conditions:
    """The phase at `t` with the scenario's noise applied, deterministic in (seed, t).

    Noise is piecewise constant over `noise.period`; each period's draw comes from its own
    generator seeded by (seed, period index), so any t can be evaluated in any order.
    """
    index = scenario.phase_index_at(t)
    phase = scenario.phases[index]
    rate, alpha = phase.request_rate, phase.acceptance
    noise = scenario.noise
    if noise.wanders:
        period = math.floor(max(0.0, t) / noise.period)
        rng = random.Random(f"{scenario.seed}/noise/{period}")
        alpha = min(0.99, max(0.0, alpha + rng.gauss(0.0, noise.acceptance_sd)))
        # Lognormal multiplier with mean 1 so the phase's mean rate is kept.
        if noise.request_rate_cv > 0:
            sigma = math.sqrt(math.log1p(noise.request_rate_cv**2))
            rate *= math.exp(rng.gauss(-sigma * sigma / 2.0, sigma))
    workload = Workload(
        request_rate=rate,
        prompt_tokens=phase.prompt_tokens,
        output_tokens=phase.output_tokens,
        temperature=phase.temperature,
        acceptance=alpha,
    )
    return Conditions(index, workload, scenario.metrics_outage_at(t))


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def parse_scenario(data: Any, source: str = "<scenario>") -> Scenario:
    """Validate a mapping (already parsed YAML) into a Scenario; errors are ScenarioError."""
    if not isinstance(data, Mapping):
        raise ScenarioError(f"{source}: expected a mapping with name, duration, phases...")
    try:
        return Scenario.model_validate(dict(data))
    except ValidationError as err:
        raise ScenarioError(f"{source}: {_one_line(err)}") from None


def load_scenario(path: str | Path) -> Scenario:
    """Load a scenario file from any path, or a built-in one by name (`demo`, `diurnal-load`)."""
    file = Path(path)
    if not file.exists() and not file.suffix and str(path) in builtin_scenario_names():
        file = builtin_scenario_path(str(path))
    if not file.is_file():
        names = ", ".join(builtin_scenario_names())
        raise ScenarioError(
            f"{path}: no such file; give a path or a built-in scenario ({names})"
        )
    try:  # the CLI's one strict reader: UTF-8, YAML, no repeated key
        documents = parse_documents(read_text(str(file)), str(file))
    except UnreadableInput as err:
        raise ScenarioError(str(err)) from None
    if len(documents) > 1:
        raise ScenarioError(f"{file}: {len(documents)} YAML documents; a scenario file holds one")
    data = documents[0].body if documents else None
    return parse_scenario(data, source=str(file))


def _builtin_dir() -> Path:
    return Path(str(resources.files("specdecode.tools") / "scenarios"))


def builtin_scenario_names() -> list[str]:
    """Names of the scenarios shipped with the package, sorted."""
    return sorted(p.stem for p in _builtin_dir().glob("*.yaml"))


def builtin_scenario_path(name: str) -> Path:
    """Path of a shipped scenario by name."""
    path = _builtin_dir() / f"{name}.yaml"
    if not path.exists():
        names = ", ".join(builtin_scenario_names())
        raise ScenarioError(f"scenario {name!r}: not shipped; use one of {names}")
    return path


def benchmark_suite() -> list[Path]:
    """The benchmark's default suite: every shipped scenario but the demo."""
    return [builtin_scenario_path(n) for n in builtin_scenario_names() if n != "demo"]


def _one_line(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = _format_loc(first.get("loc", ()))
    kind = first.get("type", "")
    msg = first.get("msg", "invalid")
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if kind == "extra_forbidden":
        field = loc.rsplit(".", 1)[-1]
        valid = ", ".join(_valid_keys(first.get("loc", ())))
        return f"{loc}: unknown key {field!r}; valid keys here: {valid}"
    if kind == "missing":
        return f"{loc}: required key missing"
    if kind == "too_short" and loc == "phases":
        return "phases: list at least one phase, starting at 0"
    if kind == "literal_error" and loc == "method":
        return f"method: {first.get('input')!r} is not a method; use one of {', '.join(METHODS)}"
    if msg.startswith(("phases[", "metrics_outage[", "model.", "method:")) or not loc:
        return msg
    got = first.get("input")
    shown = got is not None and not isinstance(got, (dict, list)) and "got" not in msg
    suffix = f" (got {got!r})" if shown else ""
    return f"{loc}: {msg}{suffix}"


def _valid_keys(loc: tuple[Any, ...]) -> list[str]:
    """The keys allowed at the level of an error's location (the last element is the key)."""
    sections: dict[str, type[BaseModel]] = {
        "phases": Phase,
        "slo": Slo,
        "noise": Noise,
        "metrics_outage": MetricsOutage,
    }
    model: type[BaseModel] = Scenario
    if len(loc) > 1 and loc[0] in sections:
        model = sections[str(loc[0])]
    return list(model.model_fields)


def _format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out
