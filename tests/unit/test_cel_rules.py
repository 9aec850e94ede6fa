"""Every CEL rule of the generated CRD and its Python twin agree, rule by rule, on generated
specs.

The rules are read from the CRD (`x-kubernetes-validations`, generated from api.py), so a
new rule takes part without an edit here. Each rule runs in cel-python, the way the apiserver
runs it: on the object after the CRD's defaults, with `duration()` as Kubernetes has it (Go's
time.ParseDuration: int64 nanoseconds, fractions truncated per part, overflow an error; see
`go_duration`). Its Python twin is the validation `specdecode validate` runs (api.parse_spec),
with every other cross-field rule switched off so that the twin of this rule alone answers:
refused, at the rule's object, with the rule's message.

The examples come from the corpus generators (tests/spec_corpus.py, shared with the
admission test against the real apiserver), drawn for the sections of the spec the rule reads.
An example that breaks the schema under the rule's object (a type, a bound, a pattern) is not
a judgement of the rule (pydantic stops before the rule, the apiserver too) and is left out;
every rule must still be seen both satisfied and violated.
"""

from __future__ import annotations

import copy
import functools
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

import celpy
import pytest
from celpy import celtypes
from hypothesis import strategies as st
from pydantic import ValidationError

from specdecode import api
from specdecode.crd import custom_resource_definition

from ..spec_corpus import MINIMAL_SPEC, SECTIONS, generated, walk_schema

EXAMPLES_PER_RULE = 300


# ------------------------------------------------------------------------- the CRD's rules


@dataclass(frozen=True)
class CrdRule:
    path: str  # schema path: spec.speculation, spec.speculation.perBatchSizeK[*], spec.metrics.selector
    cel: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.cel!r}"


def spec_schema() -> dict[str, Any]:
    return custom_resource_definition()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def crd_rules(schema: dict[str, Any], path: str = "spec") -> Iterator[CrdRule]:
    for where, node in walk_schema(schema, path, items="[*]", values="{*}"):
        for validation in node.get("x-kubernetes-validations", []):
            yield CrdRule(where, validation["rule"], validation.get("message", ""))


def with_defaults(schema: dict[str, Any], value: Any) -> Any:
    """The apiserver's structural defaulting: a property absent from an object that is there
    takes its schema default, recursively (before any CEL rule runs)."""
    if isinstance(value, dict) and "properties" in schema:
        for name, child in schema["properties"].items():
            if name not in value and "default" in child:
                value[name] = copy.deepcopy(child["default"])
            if name in value:
                value[name] = with_defaults(child, value[name])
    elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        for key in value:
            value[key] = with_defaults(schema["additionalProperties"], value[key])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        value = [with_defaults(schema["items"], item) for item in value]
    return value


def nodes(schema: dict[str, Any], value: Any, path: str = "spec", concrete: str = "spec") -> Iterator[tuple[str, str, Any]]:
    """(schema path, concrete path as api's messages write it, value) of every value present."""
    yield path, concrete, value
    if isinstance(value, dict) and "properties" in schema:
        for name, child in schema["properties"].items():
            if name in value:
                yield from nodes(child, value[name], f"{path}.{name}", f"{concrete}.{name}")
    elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        for key, item in value.items():
            yield from nodes(schema["additionalProperties"], item, f"{path}{{*}}", f"{concrete}.{key}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            yield from nodes(schema["items"], item, f"{path}[*]", f"{concrete}[{index}]")


# ------------------------------------------------------------------------- CEL, as Kubernetes has it

_GO_UNITS_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "m": 60_000_000_000,
                "h": 3_600_000_000_000}
_GO_PART = re.compile(r"([0-9]*)(?:\.([0-9]*))?(ns|us|µs|ms|s|m|h)")


def go_duration(text: Any) -> "GoDuration":
    """Go's time.ParseDuration, which Kubernetes' CEL `duration()` calls: each part's whole
    number times its unit in int64 nanoseconds, plus the fraction as float64(f) * (unit /
    scale) truncated, the sum refused past 1<<63 - 1. (cel-python computes in floats: it
    reads `0.000001ms` as 0 where Go reads 1 ns, and it accepts `2562048h`, which Go refuses.)"""
    text = str(text)
    sign, rest = (-1, text[1:]) if text[:1] == "-" else (1, text.lstrip("+"))
    if rest == "0":
        return GoDuration(0)
    total, position = 0, 0
    if not rest:
        raise ValueError(f"time: invalid duration {text!r}")
    while position < len(rest):
        match = _GO_PART.match(rest, position)
        if not match or (not match.group(1) and not match.group(2)):
            raise ValueError(f"time: invalid duration {text!r}")
        whole, fraction, unit = match.group(1) or "0", match.group(2) or "", match.group(3)
        scale_ns = _GO_UNITS_NS[unit]
        value = int(whole)
        if value > (1 << 63) // scale_ns:
            raise ValueError(f"time: invalid duration {text!r}")
        value *= scale_ns
        digits, scale = 0, 1.0
        for ch in fraction:  # Go's leadingFraction: digits past int64 are ignored
            if digits > ((1 << 63) - 1) // 10:
                break
            digits, scale = digits * 10 + int(ch), scale * 10
        if digits:
            value += int(float(digits) * (scale_ns / scale))
        total += value
        if total > (1 << 63) - 1:
            raise ValueError(f"time: invalid duration {text!r}")
        position = match.end()
    return GoDuration(sign * total)


class GoDuration(celtypes.DurationType):
    """A CEL duration to the nanosecond, as Go's (cel-python's is a timedelta: microseconds)."""

    nanoseconds: int

    def __new__(cls, nanoseconds: int) -> "GoDuration":
        seconds, nanos = divmod(nanoseconds, 10**9)
        made = super().__new__(cls, seconds, nanos)
        made.nanoseconds = nanoseconds
        return made

    def _ns(self, other: Any) -> int:
        if not isinstance(other, GoDuration):
            raise TypeError(f"no such overload: duration and {type(other).__name__}")
        return other.nanoseconds

    def __lt__(self, other: Any) -> bool:
        return self.nanoseconds < self._ns(other)

    def __le__(self, other: Any) -> bool:
        return self.nanoseconds <= self._ns(other)

    def __gt__(self, other: Any) -> bool:
        return self.nanoseconds > self._ns(other)

    def __ge__(self, other: Any) -> bool:
        return self.nanoseconds >= self._ns(other)

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, GoDuration) and self.nanoseconds == other.nanoseconds

    def __ne__(self, other: Any) -> bool:
        return not self == other

    __hash__ = celtypes.DurationType.__hash__


ENV = celpy.Environment()
# Kubernetes' CEL functions cel-python lacks or computes otherwise.
KUBERNETES_FUNCTIONS = {"duration": go_duration}


class Compiled:
    def __init__(self) -> None:
        self._programs: dict[str, Any] = {}

    def evaluate(self, rule: str, value: Any) -> str:
        """'pass', 'fail' or 'error' (the apiserver refuses on an evaluation error too)."""
        if rule not in self._programs:
            self._programs[rule] = ENV.program(ENV.compile(rule), functions=KUBERNETES_FUNCTIONS)
        try:
            result = self._programs[rule].evaluate({"self": celpy.json_to_cel(value)})
        except (celpy.CELEvalError, ValueError, OverflowError):
            return "error"
        if isinstance(result, celpy.CELEvalError):
            return "error"
        return "pass" if bool(result) else "fail"


CEL = Compiled()


def test_go_duration_reads_strings_as_go_does():
    ns = lambda text: go_duration(text).nanoseconds  # noqa: E731
    assert ns("1h30m") == 5400 * 10**9
    assert ns("0.000001ms") == 1
    assert ns("0.0000000001ms") == 0
    assert ns("250ms") == 250_000_000
    assert ns("2562047h") == 2562047 * 3600 * 10**9
    for bad in ("2562048h", "9999999999999h", "5 minutes", "", "1d", ".s"):
        with pytest.raises(ValueError):
            go_duration(bad)
    assert CEL.evaluate("duration(self) > duration('0s')", "0.000001ms") == "pass"
    assert CEL.evaluate("duration(self) > duration('0s')", "0.0000000001ms") == "fail"
    assert CEL.evaluate("duration(self) > duration('0s')", "2562048h") == "error"


# ------------------------------------------------------------------------- the Python twins


def _all_models() -> list[type[api.ApiModel]]:
    found, todo = [], [api.ApiModel]
    while todo:
        model = todo.pop()
        found.append(model)
        todo.extend(model.__subclasses__())
    return found


PYTHON_RULES = {rule.cel: (model, rule) for model in _all_models() for rule in model.__dict__.get("rules", ())}


@dataclass
class PythonVerdict:
    refused: bool  # the twin refused this object
    judged: bool  # the schema held under the object, so the twin had its say


def python_verdict(rule: CrdRule, concrete: str, spec: dict[str, Any], monkeypatch) -> PythonVerdict:
    """api.parse_spec's verdict on `spec` for this rule alone: the other rules of its object are
    off (pydantic stops at the first that fails); a rule of an object under it that fails
    leaves this one unjudged, as any schema error there does."""
    owner = PYTHON_RULES.get(rule.cel)
    with monkeypatch.context() as patch:
        if owner:
            patch.setattr(owner[0], "rules", (owner[1],))
        try:
            api.SpecDecodeServiceSpec.model_validate(spec)
            return PythonVerdict(refused=False, judged=True)
        except ValidationError as err:
            errors = err.errors(include_url=False)
    mine, others = [], []
    for error in errors:
        loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and "[" in p))
        where = api._field_path(loc, "spec")
        ours = (where == concrete and error["type"] == "value_error"
                and _said(rule, error["msg"].removeprefix("Value error, "), owner is not None))
        if ours:
            mine.append(error)
        elif where == concrete or where.startswith(concrete + ".") or where.startswith(concrete + "["):
            others.append(error)
    return PythonVerdict(refused=bool(mine), judged=bool(mine) or not others)


def _said(rule: CrdRule, message: str, exact: bool) -> bool:
    """Whether Python's message is this rule's: the same text for a cross-field rule; for a
    field's own rule (a duration, a map's keys) the clause before the first ':'."""
    if exact:
        return message == rule.message
    return rule.message.split(":")[0] in message or "too long" in message


# ------------------------------------------------------------------------- the property


def sections_read(rule: CrdRule) -> list[str]:
    """The spec sections a rule reads: its own, or for a rule on the spec those it names."""
    parts = rule.path.split(".")
    if len(parts) > 1:
        return [re.sub(r"[\[{].*", "", parts[1])]
    return sorted(set(re.findall(r"self\.(\w+)", rule.cel)))


def examples_for(rule: CrdRule) -> list[dict[str, Any]]:
    read = tuple(sections_read(rule))
    missing = [name for name in read if name not in SECTIONS]
    assert not missing, f"rule {rule} reads {missing}: add a generator to tests/spec_corpus.py SECTIONS"
    return _examples(read)


@functools.lru_cache(maxsize=None)
def _examples(sections: tuple[str, ...]) -> list[dict[str, Any]]:
    """Drawn once per set of sections (most rules share theirs)."""
    return generated(st.fixed_dictionaries({}, optional={name: SECTIONS[name] for name in sections}),
                     EXAMPLES_PER_RULE)


RULES = list(crd_rules(spec_schema()))


def test_the_crd_has_the_rules_this_test_enumerates():
    assert len(RULES) >= 25
    cross_field = [r for r in RULES if r.cel in PYTHON_RULES]
    assert len(cross_field) == len(PYTHON_RULES), "a Rule of api.py is missing from the CRD"


@dataclass
class Tally:
    satisfied: int = 0
    violated: int = 0
    disagreements: list[str] = field(default_factory=list)


@pytest.mark.parametrize("rule", RULES, ids=[f"{r.path}:{r.cel[:60]}" for r in RULES])
def test_each_cel_rule_and_its_python_twin_agree(rule: CrdRule, monkeypatch):
    schema = spec_schema()
    tally = Tally()
    for change in examples_for(rule):
        spec = {**copy.deepcopy(MINIMAL_SPEC), **copy.deepcopy(change)}
        defaulted = with_defaults(schema, copy.deepcopy(spec))
        for path, concrete, value in nodes(schema, defaulted):
            if path != rule.path:
                continue
            python = python_verdict(rule, concrete, spec, monkeypatch)
            if not python.judged:
                continue
            cel = CEL.evaluate(rule.cel, value)
            if cel == "pass":
                tally.satisfied += 1
            else:
                tally.violated += 1
            if (cel != "pass") != python.refused:
                tally.disagreements.append(
                    f"{concrete}: CEL {cel}, Python {'refuses' if python.refused else 'accepts'}: {spec}")
    assert tally.disagreements == [], (
        f"rule {rule} (message {rule.message!r}) and its Python twin disagree on "
        f"{len(tally.disagreements)} specs, e.g.:\n" + "\n".join(tally.disagreements[:5])
        + "\n(a rule without a twin: add the same check in api.py, as a Rule or a field validator)")
    assert tally.satisfied and tally.violated, (
        f"rule {rule}: the generators reached it satisfied {tally.satisfied} and violated "
        f"{tally.violated} times; make tests/spec_corpus.py SECTIONS reach both sides")
