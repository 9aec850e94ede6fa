"""`specdecode validate --vllm`: the installed vLLM's own checks on what the renderer runs.

Needs vLLM in the same Python environment (the optional extra `specdecode-operator[vllm]`,
or a vLLM you already have); nothing here reimplements vLLM's rules, it calls them:

1. the `vllm serve` argument parser, built as `vllm/entrypoints/cli/main.py` builds it
   (`FlexibleArgumentParser`, `ServeSubcommand.subparser_init`; on a machine without a GPU
   with vLLM's CPU platform, as its `vllm bench` does), then `ServeSubcommand.validate` on
   the parsed arguments;
2. every key of `--speculative-config` against `SpeculativeConfig`'s own fields and their
   annotated types (pydantic, `extra="forbid"` as vLLM's `@config` sets it). Building the
   whole `SpeculativeConfig` needs the target's and the draft's configs (the Hub or the
   model cache): those checks (vocabulary, draft tensor parallelism) stay with the
   operator's preflight and the pod's log;
3. a per-batch-size K table through vLLM's
   `vllm.v1.spec_decode.dynamic.utils.validate_and_normalize_dynamic_sd_schedule`;
4. what vLLM would silently drop: `VllmConfig.use_v2_model_runner` and
   `VllmConfig._maybe_disable_dynamic_sd_for_data_parallel` / `_for_v1` run on the parsed
   values (the releases that have them: 0.26.0 / 0.33.0), and the warning vLLM logs is
   reported.

It checks every config the operator may render for the service: speculation off and each
K from `minK` to `maxK`.
"""

from __future__ import annotations

import contextlib
import io
import logging
import types
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from .. import api
from . import workload as render

REFUSED = "refused"
IGNORED = "ignored"

INSTALL_HINT = (
    "vLLM is not installed in this Python environment: pip install 'specdecode-operator[vllm]' "
    "(vLLM and its PyTorch, several GB), or run where vLLM is installed"
)


class VllmMissing(RuntimeError):
    """vLLM cannot be imported here."""


@dataclass(frozen=True)
class Finding:
    """What vLLM would do with one rendered config: refuse it, or ignore part of it."""

    kind: str  # REFUSED or IGNORED
    config: str  # which config: "off", "K=3"
    check: str  # which of vLLM's checks said so
    message: str

    @property
    def refused(self) -> bool:
        return self.kind == REFUSED


def configs_to_check(spec: api.SpecDecodeServiceSpec) -> list[render.SpeculationChoice]:
    """Every config the operator may render: speculation off, and K = minK .. maxK."""
    s = spec.speculation
    return [render.SpeculationChoice.off()] + [render.SpeculationChoice(k=k) for k in range(s.min_k, s.max_k + 1)]


def installed_version() -> str:
    """The installed vLLM's version; VllmMissing when there is none."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("vllm")
    except PackageNotFoundError:
        raise VllmMissing(INSTALL_HINT) from None


def _cpu_platform_without_gpu() -> None:
    """On a machine without a GPU (a CI runner) vLLM detects no platform and cannot even build
    its parser (DeviceConfig's default needs a device type). vLLM's own CLI then switches to its
    CPU platform for `vllm bench` (vllm/entrypoints/cli/main.py:73-86); do the same. Only
    device-dependent defaults differ from the pod's; the arguments are checked alike."""
    from vllm import platforms

    if platforms.current_platform.is_unspecified():
        from vllm.platforms.cpu import CpuPlatform

        platforms.current_platform = CpuPlatform()


class _Checker:
    """vLLM's parser and config classes, imported once."""

    def __init__(self) -> None:
        try:
            from vllm.config.speculative import SpeculativeConfig
            from vllm.entrypoints.cli.serve import ServeSubcommand
            from vllm.utils.argparse_utils import FlexibleArgumentParser
        except ImportError as err:
            raise VllmMissing(f"{INSTALL_HINT} (import failed: {err})") from None
        _cpu_platform_without_gpu()
        self.speculative_config_class = SpeculativeConfig
        self.serve = ServeSubcommand()
        parser = FlexibleArgumentParser(description="vLLM CLI")
        subparsers = parser.add_subparsers(required=False, dest="subparser")
        self.serve.subparser_init(subparsers)
        self.parser = parser

    # --- 1. the parser -----------------------------------------------------------------

    def parse(self, args: Sequence[str]) -> tuple[Optional[Any], Optional[str]]:
        """vLLM's parse of `vllm serve ARGS`: (namespace, None) or (None, vLLM's message)."""
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                parsed = self.parser.parse_args(["serve", *args])
        except SystemExit:
            lines = [line for line in stderr.getvalue().splitlines() if line.strip()]
            return None, lines[-1] if lines else "the argument parser exited"
        except (ValueError, TypeError) as err:
            return None, str(err)
        try:
            self.serve.validate(parsed)
        except (ValueError, TypeError) as err:
            return None, str(err)
        return parsed, None

    # --- 2. speculative config fields ------------------------------------------------------

    def speculative_field_errors(self, config: dict[str, Any]) -> list[str]:
        import dataclasses
        import typing

        from pydantic import TypeAdapter, ValidationError

        cls = self.speculative_config_class
        fields = {f.name for f in dataclasses.fields(cls) if f.init}
        try:
            hints = typing.get_type_hints(cls, include_extras=True)
        except (NameError, TypeError):
            hints = {}
        errors = []
        for key, value in config.items():
            if key not in fields:
                errors.append(f"{key}: not a field of vLLM's SpeculativeConfig (unexpected keyword argument)")
                continue
            hint = hints.get(key)
            if hint is None:
                continue
            try:
                TypeAdapter(hint).validate_python(value)
            except ValidationError as err:
                first = err.errors()[0]
                errors.append(f"{key}: {first['msg']} (got {value!r})")
            except Exception:  # noqa: BLE001 - an annotation pydantic cannot build: not checkable
                continue
        return errors

    # --- 3. the per-batch-size table ------------------------------------------------------

    @staticmethod
    def table_error(table: Any) -> Optional[str]:
        try:
            from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule
        except ImportError:
            return None  # a release without the table: the field check refuses the key
        try:
            validate_and_normalize_dynamic_sd_schedule(table)
        except (ValueError, TypeError) as err:
            return str(err)
        return None

    # --- 4. what vLLM would drop -----------------------------------------------------------

    def dropped_table(self, config: dict[str, Any], parsed: Any) -> Optional[str]:
        """Run VllmConfig's own decisions on stand-ins holding the parsed values; the warning
        vLLM logs when it drops the table, or None."""
        from vllm.config.vllm import VllmConfig

        steps = [
            getattr(VllmConfig, "_maybe_disable_dynamic_sd_for_data_parallel", None),
            getattr(VllmConfig, "_maybe_disable_dynamic_sd_for_v1", None),
        ]
        if not any(steps) or not config.get("num_speculative_tokens_per_batch_size"):
            return None
        cls = self.speculative_config_class
        speculative = types.SimpleNamespace(
            method=config.get("method") or ("ngram" if config.get("model") in ("ngram", "[ngram]") else "draft_model"),
            num_speculative_tokens=config.get("num_speculative_tokens"),
            num_speculative_tokens_per_batch_size=config["num_speculative_tokens_per_batch_size"],
            parallel_drafting=bool(config.get("parallel_drafting", False)),
            use_heterogeneous_vocab=bool(config.get("use_heterogeneous_vocab", False)),
        )
        speculative.uses_dynamic_speculative_decoding = types.MethodType(
            cls.uses_dynamic_speculative_decoding, speculative
        )
        stand_in = types.SimpleNamespace(
            speculative_config=speculative,
            parallel_config=types.SimpleNamespace(
                data_parallel_size=getattr(parsed, "data_parallel_size", 1) or 1,
                pipeline_parallel_size=getattr(parsed, "pipeline_parallel_size", 1) or 1,
                distributed_executor_backend=getattr(parsed, "distributed_executor_backend", None),
                use_ubatching=False,
            ),
            attention_config=types.SimpleNamespace(hisparse_config=None),
            watermark_config=None,
        )
        for name in ("_get_v2_model_runner_unsupported_features", "_get_dbo_unsupported_features"):
            if hasattr(VllmConfig, name):
                setattr(stand_in, name, types.MethodType(getattr(VllmConfig, name), stand_in))
        runner = getattr(VllmConfig, "use_v2_model_runner", None)
        if isinstance(runner, property):
            stand_in.use_v2_model_runner = runner.fget(stand_in)
        warnings = _Captured()
        vllm_logger = logging.getLogger("vllm")
        vllm_logger.addHandler(warnings)
        try:
            for step in steps:
                if step is not None:
                    step(stand_in)
        finally:
            vllm_logger.removeHandler(warnings)
        if speculative.num_speculative_tokens_per_batch_size is not None:
            return None
        return warnings.last or "vLLM sets num_speculative_tokens_per_batch_size to None"

    # --- all of it -------------------------------------------------------------------------

    def check(self, label: str, args: Sequence[str]) -> list[Finding]:
        parsed, error = self.parse(args)
        if error is not None:
            return [Finding(REFUSED, label, "vllm serve argument parser", error)]
        config = getattr(parsed, "speculative_config", None)
        if not isinstance(config, dict):
            return []
        findings = [
            Finding(REFUSED, label, "SpeculativeConfig fields", message)
            for message in self.speculative_field_errors(config)
        ]
        table = config.get("num_speculative_tokens_per_batch_size")
        if table is not None:
            error = self.table_error(table)
            if error:
                findings.append(Finding(REFUSED, label, "per-batch-size K table", error))
        if findings:
            return findings
        dropped = self.dropped_table(config, parsed)
        if dropped:
            findings.append(Finding(IGNORED, label, "VllmConfig", f"speculation.perBatchSizeK is dropped: {dropped}"))
        return findings


class _Captured(logging.Handler):
    """The last warning vLLM logs while a check runs."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.last: Optional[str] = None

    def emit(self, record: logging.LogRecord) -> None:
        self.last = record.getMessage()


def check_service(service: api.SpecDecodeService) -> list[Finding]:
    """What the installed vLLM refuses or ignores in each config the operator may render
    for ``service`` (render errors are the caller's: `render.RenderError`)."""
    checker = _Checker()
    findings: list[Finding] = []
    for choice in configs_to_check(service.spec):
        label = "off" if not choice.enabled else f"K={choice.k}"
        findings += checker.check(label, render.vllm_args(service.spec, choice))
    return findings


def describe(findings: Sequence[Finding]) -> list[str]:
    """One line per finding, as `validate --vllm` prints them."""
    return [f"{f.kind}: {f.config}: {f.check}: {f.message}" for f in findings]
