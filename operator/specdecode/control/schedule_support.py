"""Whether a service's spec lets the operator run a per-batch-size K schedule it chose.

Pure: the spec and the feature table only. Low in the control package on purpose: the
reconcile's choice (`state`), the canary's cancel check (`experiments`), the settings and the
schedules path all ask the same question, and a schedule in status is dropped for exactly the
reasons the policy would not choose one.
"""

from __future__ import annotations

from typing import Any

from specdecode import api
from specdecode.render import features, vllm_args


def unsupported_reason(spec: Any) -> str | None:
    """Why this service cannot run a schedule the operator chooses (None: it can): a declared
    table, a vLLM without tables, or a method and layout that would ignore one."""
    s, engine = spec.speculation, spec.engine
    if s.per_batch_size_k:
        return "speculation.perBatchSizeK is declared: the user's fixed table runs as declared"
    version = engine.version
    if vllm_args.release(version) is not None and not features.supports(features.PER_BATCH_SIZE_K_TABLE, version):
        return (f"vLLM {version} has no num_speculative_tokens_per_batch_size (from "
                f"{features.PER_BATCH_SIZE_K_TABLE.first_version}): plain K")
    method = s.method.value if hasattr(s.method, "value") else str(s.method)
    if vllm_args.release(version) is not None:
        dropped = features.per_batch_size_table_dropped(
            method, version, vllm_args.data_parallel_size(engine.extra_args)
        )
        if dropped:
            return f"a per-batch-size K table would be ignored ({dropped}): plain K"
    return None


def blocked_reason(spec: Any) -> str | None:
    """Why a schedule the operator chose may not run under this spec (None: it may):
    autotune.schedules is not Auto, or `unsupported_reason`."""
    if spec.autotune.schedules != api.ScheduleMode.AUTO:
        return f"spec.autotune.schedules is {spec.autotune.schedules.value}: no schedule is chosen"
    return unsupported_reason(spec)
