"""`specdecode bench trace`: why the policy did what it did on one scenario, as it happened.

The suite's figures say how well the policy did; its JSON lists the changes. Neither says
why it held where a user would have moved, which is what tuning or reviewing the policy
needs: the reason of every hold (a restart priced against staying, a move refused at the
peak, a canary still measuring), as `status.recommendation.reason` carries it in a cluster.
This turns the evaluations of a replay (`run.run_policy`, ``on_evaluation``) into lines;
no I/O (the command prints them), the simulated time passed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specdecode import api
from specdecode.control.evaluation import NUMBER, EvaluationResult
from specdecode.control.explain import label


def clock(t: float) -> str:
    """Simulated time since the scenario's start, as ``2h05m`` (seconds dropped: evaluations
    run on the minute)."""
    minutes = int(t // 60)
    return f"{minutes // 60}h{minutes % 60:02d}m"


def in_effect(status: api.SpecDecodeServiceStatus) -> str:
    """The config every replica is told to run after the evaluation, named as the reasons name
    it (`ControlState.config_label`, from status here): ``off``, ``K=3`` or the schedule
    (``1-64:K3,65+:off``)."""
    speculation = status.speculation
    on = speculation is not None and speculation.enabled
    return (on and speculation.schedule) or label(speculation.k if on else None)


@dataclass
class DecisionTrace:
    """Lines for the evaluations a reader wants: one every ``every_s`` of simulated time, every
    change of config (marked ``*``), every canary experiment started or ended (the reason
    says which and why), and the schedule's reason whenever its words change (the rules'
    reason says why K holds; this one why no schedule runs)."""

    every_s: float
    _note: str | None = field(default=None, init=False)

    def lines(self, t: float, result: EvaluationResult) -> list[str]:
        decision = result.decision
        speculation = result.status.speculation
        note = speculation.schedule_reason if speculation is not None else None
        # Changed as the operator writes it to status: in words, not in today's figures. An
        # evaluation that says nothing of schedules (a guard's) leaves the last one standing.
        shape = NUMBER.sub("#", note) if note else None
        note_changed = shape is not None and shape != self._note
        self._note = shape or self._note
        due = round(t) % round(self.every_s) == 0
        if not (due or result.rerender or result.experiments_started or result.experiments_ended or note_changed):
            return []
        rule = decision.rule.value
        if decision.held is not None:
            rule += f" (held: {decision.held.value})"
        mark = "*" if result.rerender else " "
        out = [f"{clock(t):>7} {mark} {in_effect(result.status):<18} {rule:<28} {decision.reason}"]
        if note_changed:
            out.append(f"{'':>9} schedule: {note}")
        return out
